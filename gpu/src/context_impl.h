// GpuContext internals: stream, cuBLAS handle, budget accounting, scratch arena.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpu_ivfpq/gpu_context.h"

namespace gpuivfpq::gpu {

struct GpuContext::Impl {
    int device = 0;
    cudaStream_t stream = nullptr;
    cudaStream_t aux = nullptr;  // second stream: overlaps selection with the next GEMM
    bool exact_overlap = true;   // bench aid: off runs exact search's selections on `stream`
    bool radix_select = true;    // set_radix_select (exact_search.h)
    cublasHandle_t cublas = nullptr;
    cudaDeviceProp props{};
    bool async_alloc = false;  // stream-ordered allocator available
    size_t budget = 0, in_use = 0, peak = 0;
    GpuContext::WaitHandover handover;  // set_wait_handover

    // Scratch arena: a stack of bump allocations reused across calls, so
    // that small searches (batch 1) do not pay cudaMalloc each time.
    void* arena = nullptr;
    size_t arena_bytes = 0, arena_top = 0, arena_high = 0;
    int arena_depth = 0;
    // Counts the arena's allocations: a CUDA graph keyed by it never
    // replays against an arena reallocated (smaller, maybe at the same address).
    uint64_t arena_generation = 0;
    // True while a stream capture records a CUDA graph (GpuIvfPqIndex's
    // search graphs): scratch must then come from the arena as it is, since
    // an allocation or a free would be recorded into the graph.
    bool capturing = false;
    // cuBLAS's workspace, ours once a graph is captured: left to itself,
    // cuBLAS allocates it inside the capture, and a graph holding an
    // allocation it does not free cannot be launched twice.
    void* cublas_workspace = nullptr;
    size_t cublas_workspace_bytes = 0;
    void own_cublas_workspace(size_t bytes);  // throws like allocate

    void* allocate(size_t bytes);          // budget-checked, throws OutOfMemory
    void release(void* p, size_t bytes);   // stream-ordered free
};

// A scratch region for the duration of one operation (RAII, LIFO). Taken
// from the context's arena when it fits, else from its own allocation; when
// the outermost scope closes, the arena grows to the high-water mark seen.
class Scratch {
public:
    Scratch(GpuContext& ctx, size_t bytes);
    ~Scratch();
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;
    void* data() const { return ptr_; }
    template <typename T>
    T* as() const { return static_cast<T*>(ptr_); }

private:
    GpuContext::Impl& ctx_;
    void* ptr_ = nullptr;
    size_t bytes_ = 0;
    bool own_ = false;
    size_t saved_top_ = 0;
};

// Queues a device-to-host copy on the context's stream without waiting
// (the caller synchronises before it reads host).
void copy_to_host_async(GpuContext& ctx, void* host, const void* src, size_t bytes);

// Carves aligned sub-regions out of a byte count: first pass sizes, second
// pass hands out pointers (the same sequence of calls both times).
class Carver {
public:
    explicit Carver(void* base = nullptr) : base_(static_cast<char*>(base)) {}
    template <typename T>
    T* take(size_t count)
    {
        off_ = (off_ + 255) / 256 * 256;
        T* p = base_ ? reinterpret_cast<T*>(base_ + off_) : nullptr;
        off_ += count * sizeof(T);
        return p;
    }
    size_t size() const { return (off_ + 255) / 256 * 256; }

private:
    char* base_;
    size_t off_ = 0;
};

inline cudaStream_t stream_of(GpuContext& ctx) { return ctx.impl().stream; }

}  // namespace gpuivfpq::gpu
