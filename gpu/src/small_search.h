// One-launch search_exact for small batches (GpuIvfPqIndex::search_exact
// below GpuIvfPqOptions::small_batch_max queries): a thread-block cluster
// per query runs the coarse step, the lookup table, the list scan with its
// running top-k, the exact re-rank and the final order in one kernel, the
// cross-block selections through distributed shared memory.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "engine/distances.h"

namespace gpuivfpq::gpu {

// Largest k and nprobe the one-launch path takes (its warp queues); larger
// ones run the staged pipeline.
constexpr int kSmallSearchMaxK = 128;

struct SmallSearchArgs {
    int nq = 0, d = 0, m = 0, lists = 0, nprobe = 0, k = 0;
    Metric metric = Metric::L2;
    const float* queries = nullptr;         // nq x d as given (device)
    const float* centroids = nullptr;       // lists x d
    const float* centroid_norms = nullptr;  // lists (L2 / cosine coarse step)
    const float* codebooks = nullptr;       // m x 256 x (d / m)
    const uint8_t* const* list_codes = nullptr;
    const int32_t* list_len = nullptr;
    const float* const* list_term1 = nullptr;  // per stored vector, or null (inner product)
    const float* const* list_vectors = nullptr;
    const int64_t* const* list_ids = nullptr;
    // The batch's coarse keys (nq x lists, launch_coarse_keys), or null:
    // each block computes its share of them from the centroids.
    const float* coarse_keys = nullptr;
    // Filtered search (as IvfScanArgs): key_lo null = no filter.
    const int64_t* const* list_keys = nullptr;
    const int64_t* key_lo = nullptr;
    const int64_t* key_hi = nullptr;
    int64_t* key_matched = nullptr;  // nq, or null: set (not added to)
    double* out_dist = nullptr;      // nq x k
    int64_t* out_labels = nullptr;   // nq x k
    // Bench aid: block 0's clock64() at the end of each phase (kSmallTracePoints), or null:
    // points 0 .. 15 the kernel's phases, 16 .. 19 inside the scan's radix
    // selection (radix, pick, rank, broadcast; left 0 when the block's
    // candidates stream through WarpSelect), 20 after the re-rank's staging,
    // 21 after its positions reached every block; 22 and 23 the global timer
    // (ns) at points 0 and 15. Then, for each of the first kSmallTraceBlocks
    // blocks, three words: its global timer (ns) at its start and its end,
    // and the multiprocessor it ran on.
    unsigned long long* trace = nullptr;
    int scan_prefetch = 1;  // GpuIvfPqOptions::small_scan_prefetch
};

constexpr int kSmallTracePoints = 24;
constexpr int kSmallTraceBlocks = 4096;
constexpr int kSmallTraceWords = kSmallTracePoints + 3 * kSmallTraceBlocks;

// How a one-launch search runs: blocks per query (a thread-block cluster)
// and the dynamic shared memory each block asks for.
struct SmallLaunch {
    int cluster = 0;  // 0: the shape does not fit the one-launch path
    size_t smem = 0;
};

// The launch for nq queries on a device of sms multiprocessors, or cluster
// 0 when the shape does not fit the one-launch path (k or nprobe above
// kSmallSearchMaxK, shared memory). forced_cluster 0 chooses the blocks per
// query (about two blocks per multiprocessor over the batch; 16 while the
// batch's blocks fit one per multiprocessor, else at most 8; then the
// largest size at or below that whose nq clusters can all be resident at
// once, so that the call runs in one round); 1 .. 16 forces it (bench and
// test aid; it still falls back to smaller clusters that fit). spread: when the batch's
// blocks are fewer than the multiprocessors, each block asks for more than
// half of a multiprocessor's shared memory, so that no two blocks of the
// launch share one (the blocks of a cluster otherwise may).
SmallLaunch small_search_plan(const SmallSearchArgs& a, int sms, int forced_cluster, bool spread);

// Bench aid: the shared memory a block of a cluster of `cluster` blocks
// needs for a's shape, how many such clusters can be resident at once when
// each block asks for smem bytes (0: what it needs), and the kernel's
// registers per thread.
struct SmallOccupancy {
    size_t smem = 0;
    int clusters = 0, registers = 0;
};
SmallOccupancy small_search_occupancy(const SmallSearchArgs& a, int cluster, size_t smem);


// The coarse keys of a's nq queries into keys (nq x a.lists, device), from
// GpuIvfPqOptions::small_shared_coarse_from queries on: each centroid row
// read once per 4 queries instead of once per query. For
// query q and centroid c the key the one-launch kernel's coarse step makes,
// bit for bit (the query as it sees it, the dot product summed in column
// order, the same transform).
void launch_coarse_keys(const SmallSearchArgs& a, float* keys, cudaStream_t st);

// Runs the search; a.k, a.nprobe <= kSmallSearchMaxK, plan from
// small_search_plan (cluster > 0).
void launch_small_search(const SmallSearchArgs& a, const SmallLaunch& plan, cudaStream_t st);

}  // namespace gpuivfpq::gpu
