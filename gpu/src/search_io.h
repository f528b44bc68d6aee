// The host side of a mirror's search call (GpuIvfPqIndex, GpuRabitqIndex):
// the queries and key ranges staged in page-locked memory and copied to the
// device at once, the device work (a CUDA graph replayed for small
// batches), the answers copied back at once, one wait; and the stage
// events of set_stage_timing.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <thread>

#include "context_impl.h"
#include "cuda_check.h"
#include "gpu_ivfpq/gpu_context.h"
#include "gpu_ivfpq/ivfpq_index.h"
#include "list_store.h"
#include "search_graphs.h"

namespace gpuivfpq::gpu {

struct SearchIo {
    explicit SearchIo(GpuContext& c) : io_ctx(c) {}
    SearchIo(const SearchIo&) = delete;
    SearchIo& operator=(const SearchIo&) = delete;
    ~SearchIo()
    {
        for (cudaEvent_t e : ev)
            if (e)
                cudaEventDestroy(e);  // nothing to report from a destructor
        for (IoSlot& s : io_slots)
            if (s.done)
                cudaEventDestroy(s.done);
    }

    GpuContext& io_ctx;
    // A small search's inputs and answers staged in page-locked memory (one
    // copy each way instead of a driver-staged copy per pageable buffer):
    // a slot per call in flight. A call that hands the context over while
    // it waits (GpuContext::WaitHandover) keeps its slot until it has read
    // its answers, so that the calls other threads queue meanwhile stage
    // theirs in other slots. Slots are taken under the context's exclusive
    // use and never move (a deque), and given back from any thread.
    struct IoSlot {
        PinnedHost host;
        cudaEvent_t done = nullptr;  // recorded after the call's device work
        std::atomic<bool> busy{false};
    };
    std::deque<IoSlot> io_slots;
    // At most this many slots an index (each up to kStagedIoBytes of
    // page-locked memory): a call finding them all taken waits for one,
    // which its holder gives back once it has read its answers, without the
    // context (so the wait cannot be for the caller itself).
    static constexpr size_t kMaxIoSlots = 4;
    IoSlot& take_slot()
    {
        for (;;) {
            for (IoSlot& s : io_slots) {
                bool idle = false;
                if (s.busy.compare_exchange_strong(idle, true, std::memory_order_acquire))
                    return s;
            }
            if (io_slots.size() < kMaxIoSlots) {
                IoSlot& s = io_slots.emplace_back();
                s.busy.store(true, std::memory_order_relaxed);
                return s;
            }
            std::this_thread::yield();
        }
    }
    struct SlotHeld {
        IoSlot* s;
        void release()
        {
            if (s)
                s->busy.store(false, std::memory_order_release);
            s = nullptr;
        }
        ~SlotHeld() { release(); }
    };
    // Between a call's yield and reclaim (GpuContext::WaitHandover):
    // reclaimed at the end of the scope, a failed wait included.
    struct HandedOver {
        GpuContext::WaitHandover h;
        explicit HandedOver(const GpuContext::WaitHandover& w) : h(w)
        {
            if (!h.yield || !h.reclaim)
                h = GpuContext::WaitHandover{};  // both or none
            if (h.yield)
                h.yield(h.arg);
        }
        ~HandedOver()
        {
            if (h.reclaim)
                h.reclaim(h.arg);
        }
        HandedOver(const HandedOver&) = delete;
        HandedOver& operator=(const HandedOver&) = delete;
    };
    size_t zero_copy_calls = 0;  // host_search calls that read or wrote their staging in place
    SearchGraphs graphs;

    // Bench aid (set_stage_timing): events at the stage boundaries of a
    // call, in order: start, uploaded, coarse, prefix, scan, merge, decode,
    // reranked, downloaded (a search marks those it has).
    SearchStages* stages = nullptr;
    enum {
        kEvStart,
        kEvUpload,
        kEvCoarse,
        kEvPrefix,
        kEvScan,
        kEvMerge,
        kEvDecode,
        kEvRerank,
        kEvDownload,
        kEvents
    };
    cudaEvent_t ev[kEvents] = {};
    void mark(int which)
    {
        if (stages)
            GPU_CUDA_CHECK(cudaEventRecord(ev[which], io_ctx.impl().stream));
    }
    void set_stage_timing(SearchStages* s)
    {
        if (s && !ev[0])
            for (cudaEvent_t& e : ev)
                GPU_CUDA_CHECK(cudaEventCreate(&e));
        stages = s;
    }

    // The host variants' ranges (nq each) copied to device scratch lo / hi
    // (the caller's, alive for the whole search); dev points at them.
    void upload_ranges(const KeyRange& host, size_t nq, int64_t* lo, int64_t* hi, KeyRange& dev)
    {
        copy_to_device(io_ctx, lo, host.lo, nq * sizeof(int64_t));
        copy_to_device(io_ctx, hi, host.hi, nq * sizeof(int64_t));
        dev.lo = lo;
        dev.hi = hi;
    }

    // The host entry point of a search: queries (and key
    // ranges) staged on the device, run(dq, dd, dl, ranges) searching there,
    // the answers (and in-range counts) copied back, one wait at the end.
    // For a small batch the device work between the copies replays a CUDA
    // graph (search_graphs.h; the copies stay outside it; with zero copy
    // below its kernel holds pointers into its staging slot, and graphs are
    // keyed by them, so one replays only with the slot it was captured on);
    // with timed and a stage timer
    // (set_stage_timing), the call's stages are added to it instead.
    // Calls whose inputs and answers take at most this many bytes stage them
    // in a staging slot.
    static constexpr size_t kStagedIoBytes = size_t(4) << 20;
    // zero_copy (kZeroCopyIn, kZeroCopyOut): the device work reads its
    // inputs from, or writes its answers into, the page-locked staging
    // itself (mapped into the device's address space), with no copy; only
    // where the call is staged there and the staging is mapped.
    static constexpr int kZeroCopyIn = 1, kZeroCopyOut = 2;
    // Inputs read in place only up to this many dimensions: each of a
    // query's blocks reads its query over the bus. H200, 200k x 768, m 96,
    // nprobe 32 (gpu_bench --small-ab), answers in place against both: batch
    // 1 93.7 against 97.0 us, 16: 210.3 against 212.5; at 128 dimensions the
    // two are within 1%, and both in place was 1-8% faster on another host.
    static constexpr size_t kZeroCopyInMaxDim = 256;
    // d: the queries' width; key_fn(): the call's graph key without its
    // staging (its shape and every device address of the index it reads),
    // to which the scratch arena and the staged buffers are added here.
    template <typename Dist, typename KeyFn, typename Run>
    void host_search(size_t d, const float* queries, size_t nq, size_t k, const KeyRange* ranges,
                     Dist* dist, int64_t* labels, bool timed, KeyFn&& key_fn, Run&& run,
                     int zero_copy = 0)
    {
        GpuContext& ctx = io_ctx;
        const cudaStream_t stream = ctx.impl().stream;
        const size_t nr = ranges ? nq : 0;
        const size_t nm = ranges && ranges->matched ? nq : 0;
        timed = timed && stages != nullptr;
        const auto wall0 = std::chrono::steady_clock::now();
        // Inputs (queries, ranges) and answers (distances, labels, counts)
        // each in one contiguous run of the scratch; a small call stages
        // them in page-locked memory and copies each run at once.
        Carver in_sz, out_sz;
        in_sz.take<float>(nq * d);
        in_sz.take<int64_t>(nr);
        in_sz.take<int64_t>(nr);
        out_sz.take<Dist>(nq * k);
        out_sz.take<int64_t>(nq * k);
        out_sz.take<int64_t>(nm);
        const size_t in_bytes = in_sz.size(), out_bytes = out_sz.size();
        const bool staged_io = in_bytes + out_bytes <= kStagedIoBytes;
        SlotHeld held{staged_io ? &take_slot() : nullptr};
        char* in_host = staged_io ? held.s->host.reserve(in_bytes + out_bytes) : nullptr;
        char* out_host = staged_io ? in_host + in_bytes : nullptr;
        if (staged_io && !held.s->done)
            GPU_CUDA_CHECK(cudaEventCreateWithFlags(&held.s->done, cudaEventDisableTiming));
        if (!staged_io || !held.s->host.mapped())
            zero_copy = 0;
        const bool zc_in = zero_copy & kZeroCopyIn, zc_out = zero_copy & kZeroCopyOut;
        zero_copy_calls += zero_copy != 0;
        // An error after device work was queued leaves that work reading or
        // writing the staging: the stream is drained before the staging
        // can be written again (by the next call) or freed.
        // Once the call's event is recorded, that event is what is waited
        // for: the call may no longer hold the context (a handover), and
        // another thread may be capturing a graph on its stream.
        struct DrainOnError {
            cudaStream_t s;
            bool armed;
            cudaEvent_t ev = nullptr;
            ~DrainOnError()
            {
                if (armed && std::uncaught_exceptions() > 0 &&
                    (ev ? cudaEventSynchronize(ev) : cudaStreamSynchronize(s)) != cudaSuccess)
                    (void)cudaGetLastError();
            }
        } drain{stream, staged_io};
        Dist* hd = nullptr;
        int64_t* hl = nullptr;
        int64_t* hm = nullptr;
        {
            Scratch s(ctx, (zc_in ? 0 : in_bytes) + (zc_out ? 0 : out_bytes));
            char* in_dev = zc_in ? in_host : static_cast<char*>(s.data());
            char* out_dev =
                zc_out ? out_host : static_cast<char*>(s.data()) + (zc_in ? 0 : in_bytes);
            Carver c(in_dev), co(out_dev);
            float* dq = c.take<float>(nq * d);
            int64_t* dlo = c.take<int64_t>(nr);
            int64_t* dhi = c.take<int64_t>(nr);
            Dist* dd = co.take<Dist>(nq * k);
            int64_t* dl = co.take<int64_t>(nq * k);
            int64_t* dmatched = co.take<int64_t>(nm);
            if (staged_io) {
                Carver hc(in_host), ho(out_host);
                std::memcpy(hc.take<float>(nq * d), queries, nq * d * sizeof(float));
                if (nr) {
                    std::memcpy(hc.take<int64_t>(nr), ranges->lo, nr * sizeof(int64_t));
                    std::memcpy(hc.take<int64_t>(nr), ranges->hi, nr * sizeof(int64_t));
                }
                hd = ho.take<Dist>(nq * k);
                hl = ho.take<int64_t>(nq * k);
                hm = ho.take<int64_t>(nm);
            }
            mark(kEvStart);
            KeyRange dr;
            if (staged_io) {
                if (!zc_in)
                    GPU_CUDA_CHECK(
                        cudaMemcpyAsync(in_dev, in_host, in_bytes, cudaMemcpyHostToDevice, stream));
                if (ranges) {
                    dr.lo = dlo;
                    dr.hi = dhi;
                }
            } else {
                copy_to_device(io_ctx, dq, queries, nq * d * sizeof(float));
                if (ranges)
                    upload_ranges(*ranges, nq, dlo, dhi, dr);
            }
            if (ranges)
                dr.matched = nm ? dmatched : nullptr;
            mark(kEvUpload);
            auto work = [&] { run(dq, dd, dl, ranges ? &dr : nullptr); };
            bool done = false;
            if (stages == nullptr && graphs.eligible(nq)) {
                const GpuContext::Impl& c = ctx.impl();
                SearchGraphs::Key key = key_fn();
                for (const void* p :
                     {static_cast<const void*>(dq), static_cast<const void*>(dd),
                      static_cast<const void*>(dl), static_cast<const void*>(nr ? dlo : nullptr),
                      static_cast<const void*>(nr ? dhi : nullptr),
                      static_cast<const void*>(nm ? dmatched : nullptr),
                      static_cast<const void*>(c.arena)})
                    key.push_back(reinterpret_cast<uintptr_t>(p));
                // The context's switches choose kernels the graph records
                // (the coarse step's selection and stream use).
                for (size_t v : {c.arena_bytes, size_t(c.arena_generation), c.arena_top, nq, k,
                                 size_t(c.radix_select), size_t(c.exact_overlap)})
                    key.push_back(v);
                done = graphs.run(ctx, key, work);
            }
            if (!done)
                work();
            if (staged_io) {
                if (!zc_out)
                    GPU_CUDA_CHECK(cudaMemcpyAsync(out_host, out_dev, out_bytes,
                                                   cudaMemcpyDeviceToHost, stream));
            } else {
                copy_to_host_async(ctx, dist, dd, nq * k * sizeof(Dist));
                copy_to_host_async(ctx, labels, dl, nq * k * sizeof(int64_t));
                if (nm)
                    copy_to_host_async(ctx, ranges->matched, dmatched, nq * sizeof(int64_t));
            }
            mark(kEvDownload);
            // The scratch scope ends here; later work on the stream is ordered after it.
        }
        if (!staged_io) {
            ctx.synchronize();
        } else {
            // The wait is for this call's work alone (an event, not the
            // stream): with the context handed over, other threads' calls
            // may be queued behind it meanwhile.
            GPU_CUDA_CHECK(cudaEventRecord(held.s->done, stream));
            drain.ev = held.s->done;
            HandedOver over(stages != nullptr ? GpuContext::WaitHandover{} : ctx.wait_handover());
            GPU_CUDA_CHECK(cudaEventSynchronize(held.s->done));
            std::memcpy(dist, hd, nq * k * sizeof(Dist));
            std::memcpy(labels, hl, nq * k * sizeof(int64_t));
            if (nm)
                std::memcpy(ranges->matched, hm, nq * sizeof(int64_t));
            held.release();  // before the reclaim: a slot never waits on the context
        }
        if (!timed)
            return;
        const double wall =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - wall0)
                .count();
        double* sum[] = {&stages->upload, &stages->coarse, &stages->prefix, &stages->scan,
                         &stages->merge,  &stages->decode, &stages->rerank, &stages->download};
        for (int e = 0; e < kEvents - 1; ++e) {
            float ms = 0;
            GPU_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[e], ev[e + 1]));
            *sum[e] += ms;
        }
        stages->wall += wall;
        stages->calls++;
    }
};

}  // namespace gpuivfpq::gpu
