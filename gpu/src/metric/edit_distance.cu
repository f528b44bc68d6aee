// The edit-distance kernels of the metric search: the queries' patterns on
// the device, the distances of queries x targets (pivots, centres) and of
// candidate pairs, one thread per distance in grid-stride loops.
#include <algorithm>
#include <cstdio>

#include "engine/error.h"
#include "../context_impl.h"
#include "../cuda_check.h"
#include "gpu_ivfpq/gpu_context.h"
#include "gpu_ivfpq/metric_search.h"
#include "metric_kernels.h"
#include "metric_patterns.h"

namespace gpuivfpq::gpu {

namespace metric {

namespace {

// One thread's bounded distance: the column state of a long pattern in the
// thread's column of the grid's scratch, else in its own arrays.
__device__ __forceinline__ uint32_t thread_within(const PatternView& p, const uint32_t* text,
                                                  uint32_t n, uint32_t k, const LongState& ls,
                                                  uint64_t tid, uint64_t threads)
{
    uint64_t pv[kLocalBlocks], mv[kLocalBlocks];
    if (p.blocks <= kLocalBlocks)
        return within(p, text, n, k, pv, mv, 1);
    uint64_t* own = ls.scratch + tid;
    return within(p, text, n, k, own, own + uint64_t(ls.blocks) * threads, threads);
}

// Threads of consecutive t share a query (its pattern is read by the whole
// warp) and take consecutive targets.
__global__ void __launch_bounds__(kMetricThreads)
    distance_matrix_kernel(DevPatterns pats, DevWords words, uint32_t nq, const uint32_t* targets,
                           uint32_t ntargets, const uint32_t* target_radius,
                           const uint32_t* query_bound, uint32_t* out, LongState ls)
{
    const uint64_t threads = uint64_t(gridDim.x) * blockDim.x;
    const uint64_t tid = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const uint64_t total = uint64_t(nq) * ntargets;
    for (uint64_t t = tid; t < total; t += threads) {
        const uint32_t q = uint32_t(t / ntargets), j = uint32_t(t % ntargets);
        const uint32_t x = targets ? targets[j] : j;
        const PatternView p = pattern_view(pats.info[q], pats.peq, pats.table);
        const uint64_t begin = words.offsets[x];
        const uint32_t n = uint32_t(words.offsets[x + 1] - begin);
        const uint32_t bound =
            saturating_add(target_radius ? target_radius[j] : 0u, query_bound[q]);
        out[t] = thread_within(p, words.cps + begin, n, bound, ls, tid, threads);
    }
}

__global__ void __launch_bounds__(kMetricThreads)
    pair_hits_kernel(DevPatterns pats, DevWords words, const uint8_t* removed,
                     const MetricPair* pairs, uint64_t npairs, const uint32_t* radius,
                     HitSink hits, LongState ls)
{
    const uint64_t threads = uint64_t(gridDim.x) * blockDim.x;
    const uint64_t tid = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    for (uint64_t t = tid; t < npairs; t += threads) {
        const MetricPair pair = pairs[t];
        if (removed[pair.x])
            continue;  // never a candidate (its word may still route)
        const uint32_t r = radius[pair.q];
        const PatternView p = pattern_view(pats.info[pair.q], pats.peq, pats.table);
        const uint64_t begin = words.offsets[pair.x];
        const uint32_t n = uint32_t(words.offsets[pair.x + 1] - begin);
        const uint32_t d = thread_within(p, words.cps + begin, n, r, ls, tid, threads);
        if (d <= r)
            push_hit(hits, pair.q, pair.x, d);
    }
}

}  // namespace

unsigned plain_grid(GpuContext& ctx, uint64_t work)
{
    // Enough blocks to fill the device; a grid-stride loop takes the rest.
    const uint64_t cap = uint64_t(std::max(1, ctx.multiprocessors())) * 16;
    const uint64_t want = (work + kMetricThreads - 1) / kMetricThreads;
    return unsigned(std::max<uint64_t>(1, std::min(want, cap)));
}

Grid distance_grid(GpuContext& ctx, uint64_t work, uint32_t max_blocks, DeviceBuffer& scratch)
{
    Grid grid;
    grid.blocks = plain_grid(ctx, work);
    if (max_blocks <= kLocalBlocks)
        return grid;
    // Long patterns: fewer threads rather than more scratch than
    // kLongScratchBytes (each then takes more of the work).
    const uint64_t per_thread = 2 * uint64_t(max_blocks) * sizeof(uint64_t);
    const uint64_t max_threads = std::max<uint64_t>(kMetricThreads, kLongScratchBytes / per_thread);
    grid.blocks = unsigned(std::min<uint64_t>(grid.blocks, std::max<uint64_t>(1, max_threads / kMetricThreads)));
    const uint64_t need = uint64_t(grid.blocks) * kMetricThreads * per_thread;
    if (scratch.bytes() < need)
        scratch = DeviceBuffer(ctx, size_t(need));
    grid.state = LongState{scratch.as<uint64_t>(), max_blocks};
    return grid;
}

void launch_distance_matrix(const DevPatterns& patterns, const DevWords& words, uint32_t nq,
                            const uint32_t* targets, uint32_t ntargets,
                            const uint32_t* target_radius, const uint32_t* query_bound,
                            uint32_t* out, const Grid& grid, cudaStream_t st)
{
    if (nq == 0 || ntargets == 0)
        return;
    distance_matrix_kernel<<<grid.blocks, kMetricThreads, 0, st>>>(
        patterns, words, nq, targets, ntargets, target_radius, query_bound, out, grid.state);
    GPU_KERNEL_CHECK();
}

void launch_pair_hits(const DevPatterns& patterns, const DevWords& words, const uint8_t* removed,
                      const MetricPair* pairs, uint64_t npairs, const uint32_t* radius,
                      const HitSink& hits, const Grid& grid, cudaStream_t st)
{
    if (npairs == 0)
        return;
    pair_hits_kernel<<<grid.blocks, kMetricThreads, 0, st>>>(patterns, words, removed, pairs,
                                                             npairs, radius, hits, grid.state);
    GPU_KERNEL_CHECK();
}

DevPatterns dev_patterns(const QueryPatterns& patterns, size_t first)
{
    return DevPatterns{static_cast<const PatternInfo*>(patterns.info()) + first, patterns.peq(),
                       static_cast<const SymbolEntry*>(patterns.table())};
}

void check_metric_sizes(size_t nq, size_t n, const char* who)
{
    if (nq < UINT32_MAX && n < UINT32_MAX)
        return;
    char msg[200];
    std::snprintf(msg, sizeof msg, "%s: %zu queries over %zu words; both must stay below 2^32 - 1",
                  who, nq, n);
    throw Error(ErrorKind::InvalidArgument, msg);
}

}  // namespace metric

QueryPatterns::QueryPatterns(GpuContext& ctx, const WordList& queries)
{
    const metric::HostPatterns host = metric::build_patterns(queries);
    lengths_.resize(host.info.size());
    for (size_t q = 0; q < host.info.size(); q++)
        lengths_[q] = host.info[q].length;
    max_length_ = host.max_length;
    max_blocks_ = host.max_blocks;
    info_ = DeviceBuffer(ctx, host.info.size() * sizeof(metric::PatternInfo));
    peq_ = DeviceBuffer(ctx, host.peq.size() * sizeof(uint64_t));
    table_ = DeviceBuffer(ctx, host.table.size() * sizeof(metric::SymbolEntry));
    info_.upload(host.info.data(), info_.bytes());
    peq_.upload(host.peq.data(), peq_.bytes());
    table_.upload(host.table.data(), table_.bytes());
}

void edit_distance_matrix(GpuContext& ctx, const QueryPatterns& patterns, const DeviceWords& words,
                          const uint32_t* targets, size_t ntargets, const uint32_t* target_radius,
                          const uint32_t* query_bound, uint32_t* out)
{
    metric::check_metric_sizes(patterns.size(), ntargets, "edit distance matrix");
    DeviceBuffer scratch;
    const metric::Grid grid = metric::distance_grid(ctx, uint64_t(patterns.size()) * ntargets,
                                                    patterns.max_blocks(), scratch);
    metric::launch_distance_matrix(metric::dev_patterns(patterns),
                                   metric::DevWords{words.code_points, words.offsets},
                                   uint32_t(patterns.size()), targets, uint32_t(ntargets),
                                   target_radius, query_bound, out, grid, stream_of(ctx));
}

std::vector<uint32_t> edit_distance_matrix(GpuContext& ctx, const WordList& queries,
                                           const WordList& targets,
                                           const std::vector<uint32_t>& bounds)
{
    const size_t nq = queries.size(), nt = targets.size();
    if (bounds.size() != nq && bounds.size() != 1) {
        char msg[160];
        std::snprintf(msg, sizeof msg,
                      "edit distance matrix: %zu bounds for %zu queries; give one per query, or "
                      "one for all",
                      bounds.size(), nq);
        throw Error(ErrorKind::InvalidArgument, msg);
    }
    metric::check_metric_sizes(nq, nt, "edit distance matrix");
    std::vector<uint32_t> out(nq * nt);
    if (out.empty())
        return out;
    const QueryPatterns patterns(ctx, queries);
    const size_t cps = size_t(targets.offsets()[nt]);
    DeviceBuffer dcps(ctx, std::max<size_t>(1, cps) * sizeof(uint32_t));
    DeviceBuffer doff(ctx, (nt + 1) * sizeof(uint64_t));
    DeviceBuffer dbound(ctx, nq * sizeof(uint32_t));
    DeviceBuffer dout(ctx, out.size() * sizeof(uint32_t));
    dcps.upload(targets.code_points(), cps * sizeof(uint32_t));
    doff.upload(targets.offsets(), (nt + 1) * sizeof(uint64_t));
    const std::vector<uint32_t> per_query =
        bounds.size() == nq ? bounds : std::vector<uint32_t>(nq, bounds[0]);
    dbound.upload(per_query.data(), nq * sizeof(uint32_t));
    edit_distance_matrix(ctx, patterns, DeviceWords{dcps.as<uint32_t>(), doff.as<uint64_t>(), nt},
                         nullptr, nt, nullptr, dbound.as<uint32_t>(), dout.as<uint32_t>());
    dout.download(out.data(), out.size() * sizeof(uint32_t));
    return out;
}

}  // namespace gpuivfpq::gpu
