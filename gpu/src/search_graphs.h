// CUDA graphs of small search calls. A batch of a few queries costs about
// fifteen launches whose host-side cost (3-10 us each) can exceed the
// kernels' work, so the GPU waits on the host; one graph launch replays the
// device work between the call's copies. A call shape is run the ordinary
// way the first time it is seen (which also grows the scratch arena to what
// it needs, so the next sight may have a new key), captured at the next
// sight, and replayed from then on. What a graph bakes in (shape, host and device addresses) is its key:
// a reallocated buffer gives a new key, never a stale replay.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <vector>

#include "context_impl.h"
#include "cuda_check.h"

namespace gpuivfpq::gpu {

class SearchGraphs {
public:
    using Key = std::vector<uint64_t>;
    // Larger batches are kernel-bound: a graph would save a few percent.
    static constexpr size_t kMaxBatch = 128;
    static constexpr size_t kMaxEntries = 256;
    // cuBLAS's recommended workspace on Hopper is 32 MiB; the coarse
    // quantizer's small GEMMs need far less, and cuBLAS picks algorithms
    // that fit what it is given.
    static constexpr size_t kCublasWorkspace = size_t(4) << 20;

    SearchGraphs() = default;
    SearchGraphs(const SearchGraphs&) = delete;
    SearchGraphs& operator=(const SearchGraphs&) = delete;
    ~SearchGraphs() { clear(); }

    bool eligible(size_t nq) const { return enabled_ && nq >= 1 && nq <= kMaxBatch; }
    void set_enabled(bool on)
    {
        enabled_ = on;
        if (!on)
            clear();
    }
    size_t launches() const { return launches_; }
    size_t captures() const { return captures_; }

    // Queues the device work (enqueue: queues it on ctx's stream; no copies
    // from or to host memory, no waits) as one graph launch; false: not
    // queued, the caller queues it itself.
    template <typename Enqueue>
    bool run(GpuContext& ctx, const Key& key, Enqueue&& enqueue)
    {
        auto it = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.key == key; });
        if (it == entries_.end()) {
            if (entries_.size() >= kMaxEntries)
                evict();
            entries_.push_back(Entry{key, nullptr, 0, ++tick_});
            return false;  // first sight: the ordinary run sizes the arena
        }
        it->used = ++tick_;
        if (it->exec == nullptr) {
            if (it->failures >= 2)
                return false;
            it->exec = capture(ctx, enqueue);
            if (it->exec == nullptr) {
                it->failures++;
                return false;
            }
            captures_++;
        }
        if (cudaGraphLaunch(it->exec, ctx.impl().stream) != cudaSuccess) {
            // Refused (not a fault of the work: nothing ran): never again
            // for this shape; a sticky error shows in the ordinary run.
            (void)cudaGetLastError();
            cudaGraphExecDestroy(it->exec);
            it->exec = nullptr;
            it->failures = 2;
            return false;
        }
        launches_++;
        return true;
    }

private:
    struct Entry {
        Key key;
        cudaGraphExec_t exec;
        int failures;
        uint64_t used;
    };

    // The call recorded into an executable graph, or null when it could
    // not be (a copy the capture refuses, scratch beyond the arena): the
    // stream is left out of capture mode and no error stays pending.
    template <typename Enqueue>
    static cudaGraphExec_t capture(GpuContext& ctx, Enqueue& enqueue)
    {
        GpuContext::Impl& c = ctx.impl();
        try {
            c.own_cublas_workspace(kCublasWorkspace);
        } catch (const Error&) {
            (void)cudaGetLastError();
            return nullptr;  // no room: the ordinary calls go on
        }
        if (cudaStreamBeginCapture(c.stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
            (void)cudaGetLastError();
            return nullptr;  // the ordinary calls go on; a sticky error shows there
        }
        c.capturing = true;
        std::exception_ptr other;
        bool ok = true;
        try {
            enqueue();
        } catch (const Error&) {
            ok = false;
        } catch (...) {
            other = std::current_exception();
        }
        c.capturing = false;
        cudaGraph_t g = nullptr;
        const cudaError_t end = cudaStreamEndCapture(c.stream, &g);
        cudaGraphExec_t exec = nullptr;
        if (ok && !other && end == cudaSuccess && g != nullptr && only_work(g) &&
            cudaGraphInstantiate(&exec, g, 0) != cudaSuccess)
            exec = nullptr;
        if (g != nullptr)
            cudaGraphDestroy(g);
        (void)cudaGetLastError();  // a refused capture is not an error of the call
        if (other)
            std::rethrow_exception(other);
        return exec;
    }

    // False when the graph allocates or frees memory (a library call that
    // did so inside the capture): such a graph could not be replayed.
    static bool only_work(cudaGraph_t g)
    {
        size_t n = 0;
        if (cudaGraphGetNodes(g, nullptr, &n) != cudaSuccess)
            return false;
        std::vector<cudaGraphNode_t> nodes(n);
        if (n && cudaGraphGetNodes(g, nodes.data(), &n) != cudaSuccess)
            return false;
        for (cudaGraphNode_t node : nodes) {
            cudaGraphNodeType t;
            if (cudaGraphNodeGetType(node, &t) != cudaSuccess || t == cudaGraphNodeTypeMemAlloc ||
                t == cudaGraphNodeTypeMemFree)
                return false;
        }
        return true;
    }

    void evict()
    {
        auto old = std::min_element(entries_.begin(), entries_.end(),
                                    [](const Entry& a, const Entry& b) { return a.used < b.used; });
        if (old->exec)
            cudaGraphExecDestroy(old->exec);
        entries_.erase(old);
    }

    void clear()
    {
        for (Entry& e : entries_)
            if (e.exec)
                cudaGraphExecDestroy(e.exec);  // nothing to report from here
        entries_.clear();
    }

    std::vector<Entry> entries_;
    uint64_t tick_ = 0;
    size_t launches_ = 0, captures_ = 0;
    bool enabled_ = true;
};

}  // namespace gpuivfpq::gpu
