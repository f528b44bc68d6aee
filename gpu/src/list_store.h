// The inverted lists of a device index (GpuIvfPqIndex, GpuRabitqIndex): per
// list, its entries' codes (m bytes each) and ids and, where the index keeps
// them, one float term per entry, the entries' vectors (d floats each) and
// their filter keys; the per-list pointer and length arrays the kernels
// read; appends in one launch and removals that compact each list in place.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "cuda_check.h"
#include "gpu_ivfpq/device_buffer.h"

namespace gpuivfpq::gpu {

class GpuContext;

// Page-locked host memory, grown on demand: copies from it are truly
// asynchronous, where a copy from pageable memory blocks the host for each
// call (an append used to make a dozen such copies). An owner that returns
// before its copies ran marks them with after_copy: reserve, which hands the
// memory out for writing, first waits for them; other owners synchronise
// their stream before they write the memory again or free it.
class PinnedHost {
public:
    PinnedHost() = default;
    PinnedHost(const PinnedHost&) = delete;
    PinnedHost& operator=(const PinnedHost&) = delete;
    ~PinnedHost()
    {
        // Nothing to report from a destructor: the last copies from the
        // memory end before it is freed.
        if (pending_)
            cudaEventSynchronize(done_);
        if (done_)
            cudaEventDestroy(done_);
        if (p_)
            cudaFreeHost(p_);
    }
    // At least bytes of memory, no copy from it still queued; the contents
    // are not kept when it grows.
    char* reserve(size_t bytes)
    {
        if (pending_) {
            pending_ = false;
            GPU_CUDA_CHECK(cudaEventSynchronize(done_));
        }
        if (bytes > bytes_) {
            if (p_)
                GPU_CUDA_CHECK(cudaFreeHost(p_));
            p_ = nullptr;
            bytes_ = 0;
            void* p = nullptr;
            GPU_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocMapped));
            p_ = static_cast<char*>(p);
            bytes_ = bytes;
            // With unified addressing a kernel reaches the memory through
            // the host's own pointer.
            void* dp = nullptr;
            const cudaError_t e = cudaHostGetDevicePointer(&dp, p, 0);
            if (e != cudaSuccess)
                (void)cudaGetLastError();
            mapped_ = e == cudaSuccess && dp == p;
        }
        return p_;
    }
    // Kernels may read and write the memory at data() (reserve made it).
    bool mapped() const { return mapped_; }
    // The copies from this memory queued on stream so far are its last
    // readers: the next reserve waits for them (the caller's device current).
    void after_copy(cudaStream_t stream)
    {
        if (!done_)
            GPU_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
        GPU_CUDA_CHECK(cudaEventRecord(done_, stream));
        pending_ = true;
    }
    char* data() const { return p_; }

private:
    char* p_ = nullptr;
    size_t bytes_ = 0;
    cudaEvent_t done_ = nullptr;
    bool pending_ = false, mapped_ = false;
};

struct ListStore {
    GpuContext& ctx;
    size_t d = 0, lists = 0, m = 0;
    // What each entry keeps besides its code and id.
    bool has_vt = false, has_vectors = false, has_keys = false;
    // Codes interleaved (list_layout.cuh; m a multiple of 4), capacities
    // whole blocks of kInterleaveRows; row-major otherwise.
    bool interleaved = false;

    struct List {
        DeviceBuffer codes, ids, vt;  // vt: one float term per entry (has_vt)
        DeviceBuffer vecs;            // vectors, d floats each (has_vectors)
        DeviceBuffer keys;            // filter keys, one int64 each (has_keys)
        size_t size = 0, cap = 0;
    };
    std::vector<List> lst;
    // vt_ptrs: has_vt only (nulls otherwise); vec_ptrs: has_vectors only;
    // key_ptrs: has_keys only.
    DeviceBuffer code_ptrs, id_ptrs, vt_ptrs, vec_ptrs, key_ptrs, lens;
    size_t ntotal = 0, max_len = 0;
    // The sum of the lists' squared sizes: ntotal_sq / ntotal is the size of
    // the list holding a random entry, what a query that falls where the
    // entries are probes on average (mass_mean_len).
    double ntotal_sq = 0;
    double mass_mean_len() const { return ntotal ? ntotal_sq / double(ntotal) : 0.0; }
    // Host side of the per-list arrays (six sections of lists entries, in
    // the order of upload_meta) and the staging of appended entries.
    PinnedHost meta_host, add_host;

    explicit ListStore(GpuContext& c) : ctx(c) {}

    // Allocates lists empty lists and their pointer arrays (on the device,
    // uploaded). d may be 0 without vectors.
    void init_lists(size_t d, size_t lists, size_t m, bool vt, bool vectors, bool keys, bool interleave = false);

    // Grows list l to hold need entries (contents kept; capacity by half
    // at least).
    void grow(size_t l, size_t need);

    // The per-list pointer and length arrays the kernels read, for lists
    // [lo, hi) (all by default). An append touches a few lists: only their
    // range is uploaded (six whole arrays per call cost ~0.1 ms, most of an
    // append's time under a stream of single-row inserts). Lists only grow
    // in between full uploads, so max_len only rises here.
    void upload_meta(size_t lo = 0, size_t hi = SIZE_MAX);

    // Computes the entries' float terms on the device before they are
    // written: (codes n x m, list ids n, n, terms out n), device pointers.
    using TermFn = std::function<void(const uint8_t*, const int32_t*, size_t, float*)>;

    // Appends n entries (host): list_ids[i], codes[i*m..], ids[i], with
    // has_vectors their vectors[i*d..] and with has_keys their keys[i];
    // with has_vt, term computes their terms. Each of vectors and keys is
    // required when kept and refused otherwise (Error(InvalidArgument), the
    // lists unchanged; who names the caller in the message); an
    // out-of-memory error leaves them as they were.
    void append(const char* who, size_t n, const int32_t* list_ids, const uint8_t* codes, const int64_t* ids,
                const float* vectors, const int64_t* keys, const TermFn& term);

    // Removes every entry whose id is in ids[0..n) (duplicates and unknown
    // ids allowed); returns how many went. The ids are found on the device
    // and each list is compacted in place, order kept.
    size_t remove(const int64_t* ids, size_t n);

    // Bytes of the lists: codes, ids, terms, vectors, keys; and of the
    // per-list arrays.
    size_t code_bytes() const;
    size_t id_bytes() const;
    size_t vt_bytes() const;
    size_t vector_bytes() const;
    size_t key_bytes() const;
    size_t meta_bytes() const;
};

}  // namespace gpuivfpq::gpu
