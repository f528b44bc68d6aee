// The metric search's kernels as its host code launches them: the device
// arrays they read, the append buffers they fill, and the launchers of the
// distance kernels (edit_distance.cu) used by the searches (metric_range.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "edit_distance.cuh"
#include "gpu_ivfpq/device_buffer.h"
#include "gpu_ivfpq/metric_search.h"

namespace gpuivfpq::gpu {

class GpuContext;

namespace metric {

// A batch's patterns, info[0] being the first query a launch sees (the
// host offsets info to a tile of queries; peq and table stay whole).
struct DevPatterns {
    const PatternInfo* info;
    const uint64_t* peq;
    const SymbolEntry* table;
};

// Words: word i is cps[offsets[i], offsets[i + 1]).
struct DevWords {
    const uint32_t* cps;
    const uint64_t* offsets;
};

// The kernels' view of a batch's patterns from query `first` on.
DevPatterns dev_patterns(const QueryPatterns& patterns, size_t first = 0);

// Throws Error(InvalidArgument) unless nq queries and n words fit the
// kernels' 32-bit indices; who names the caller.
void check_metric_sizes(size_t nq, size_t n, const char* who);

// Objects per tile of the SSS table on the device: tile t holds the
// pivots' columns of kTableTile bytes for objects t * kTableTile + [0,
// kTableTile), so that a warp's consecutive objects read a column coalesced.
constexpr uint32_t kTableTile = 64;

// The byte of (object x, pivot p) in a tiled table of `pivots` columns.
GPU_METRIC_HD uint64_t table_at(uint32_t x, uint32_t p, uint32_t pivots)
{
    return (uint64_t(x / kTableTile) * pivots + p) * kTableTile + x % kTableTile;
}

// Patterns of up to kLocalBlocks blocks keep their column state in a
// thread's own arrays (128 bytes of local memory); longer ones in `scratch`,
// 2 x blocks words per thread of the grid (see multi_block's stride).
constexpr uint32_t kLocalBlocks = 8;
struct LongState {
    uint64_t* scratch = nullptr;  // null when no pattern of the launch needs it
    uint32_t blocks = 0;
};

// Most bytes of long-pattern scratch a launch takes: the grid shrinks
// (each thread then takes more pairs) rather than exceed it.
constexpr uint64_t kLongScratchBytes = uint64_t(64) << 20;

constexpr int kMetricThreads = 256;

// A grid-stride launch: its blocks of kMetricThreads and the long-pattern
// state its threads use.
struct Grid {
    unsigned blocks = 1;
    LongState state;
};

// The grid for `work` items of a grid-stride kernel (no distances).
unsigned plain_grid(GpuContext& ctx, uint64_t work);

// The grid for `work` distances of patterns of up to max_blocks blocks;
// where they need long-pattern state, `scratch` is (re)allocated for it.
Grid distance_grid(GpuContext& ctx, uint64_t work, uint32_t max_blocks, DeviceBuffer& scratch);

// A candidate: tile-local query q and object x.
struct alignas(8) MetricPair {
    uint32_t q;
    uint32_t x;
};

// Hits appended as sort keys: q << key_shift | distance << 32 | id, so
// that one radix sort orders them by (query, distance, id). count goes on
// past capacity (the host then grows the buffer and reruns).
struct HitSink {
    uint64_t* keys;
    unsigned long long* count;
    uint64_t capacity;
    uint32_t key_shift;
};

// Candidates appended for their bounded distance (count as HitSink's).
struct PairSink {
    MetricPair* pairs;
    unsigned long long* count;
    uint64_t capacity;
};

#if defined(__CUDACC__)
__device__ __forceinline__ void push_hit(const HitSink& s, uint32_t q, uint32_t x, uint32_t d)
{
    const unsigned long long at = atomicAdd(s.count, 1ull);
    if (at < s.capacity)
        s.keys[at] = (uint64_t(q) << s.key_shift) | (uint64_t(d) << 32) | x;
}
#endif

// out[q * ntargets + j] = within(query q, word targets[j] (null: j),
// saturating_add(target_radius[j] (null: 0), query_bound[q])) for q < nq.
void launch_distance_matrix(const DevPatterns& patterns, const DevWords& words, uint32_t nq,
                            const uint32_t* targets, uint32_t ntargets,
                            const uint32_t* target_radius, const uint32_t* query_bound,
                            uint32_t* out, const Grid& grid, cudaStream_t st);

// For every pair (q, x) of pairs[0, npairs) with x not removed: d =
// within(query q, word x, radius[q]); a hit when d <= radius[q].
void launch_pair_hits(const DevPatterns& patterns, const DevWords& words, const uint8_t* removed,
                      const MetricPair* pairs, uint64_t npairs, const uint32_t* radius,
                      const HitSink& hits, const Grid& grid, cudaStream_t st);

}  // namespace metric
}  // namespace gpuivfpq::gpu
