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
    // Filtered search (as IvfScanArgs): key_lo null = no filter.
    const int64_t* const* list_keys = nullptr;
    const int64_t* key_lo = nullptr;
    const int64_t* key_hi = nullptr;
    int64_t* key_matched = nullptr;  // nq, or null: set (not added to)
    double* out_dist = nullptr;      // nq x k
    int64_t* out_labels = nullptr;   // nq x k
    // Bench aid: block 0's clock64() at the end of each phase (kSmallTracePoints), or null.
    unsigned long long* trace = nullptr;
};

constexpr int kSmallTracePoints = 16;

// Blocks per query (a cluster) that the launch would use for nq queries on
// a device of sms multiprocessors, or 0 when the shape does not fit the
// one-launch path (k or nprobe above kSmallSearchMaxK, shared memory).
int small_search_cluster(const SmallSearchArgs& a, int sms);

// Runs the search; a.k, a.nprobe <= kSmallSearchMaxK, cluster from
// small_search_cluster.
void launch_small_search(const SmallSearchArgs& a, int cluster, cudaStream_t st);

}  // namespace gpuivfpq::gpu
