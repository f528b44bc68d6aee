// One-launch search of a RaBitQ mirror (GpuRabitqIndex) for small batches:
// a thread-block cluster per query runs the coarse step, each probed list's
// terms, the list scan with each list's nibble tables built in shared
// memory, and the k-selection, the cross-block selections through
// distributed shared memory, as the IVFPQ one-launch search does
// (small_search.h; the same coarse step, selections and merge:
// small_parts.cuh). It gives the staged search's keys and labels bit for
// bit (RabitqModel::scan_keys's keys, equal keys by position in the probed
// lists' concatenation).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "engine/distances.h"
#include "small_search.h"

namespace gpuivfpq::gpu {

struct RabitqSmallArgs {
    int nq = 0, d = 0, lists = 0, nprobe = 0, k = 0;
    int bits = 0, plane_bytes = 0, code_bytes = 0, row_bytes = 0;
    bool interleaved = false;  // the lists' rows (list_layout.cuh)
    Metric metric = Metric::L2;
    float eps0 = 0.0f;                      // > 0: rank by lower bounds
    const float* queries = nullptr;         // nq x d (device), normalised for Cosine
    const double* rotated = nullptr;        // nq x d (device): P q of those
    const float* centroids = nullptr;       // lists x d
    const float* centroid_norms = nullptr;  // lists (L2 / cosine coarse step)
    const double* pc = nullptr;             // lists x d: P c
    // The batch's coarse keys (nq x lists, launch_coarse_keys on the
    // queries as given here, metric L2 for Cosine), or null: each block
    // computes its share of them.
    const float* coarse_keys = nullptr;
    const uint8_t* const* list_rows = nullptr;
    const int32_t* list_len = nullptr;
    const int64_t* const* list_ids = nullptr;
    // Filtered search: key_lo null = no filter.
    const int64_t* const* list_keys = nullptr;
    const int64_t* key_lo = nullptr;
    const int64_t* key_hi = nullptr;
    int64_t* key_matched = nullptr;  // nq, or null: set (not added to)
    float* out_dist = nullptr;       // nq x k: the keys, +inf padding
    int64_t* out_labels = nullptr;   // nq x k: the ids, -1 padding
};

// The launch for a's nq queries (blocks per query as small_search_plan
// chooses them, forced_cluster 1 .. 16 forcing it), or cluster 0 when the
// shape does not fit (k or nprobe above kSmallSearchMaxK, shared memory).
SmallLaunch rabitq_small_plan(const RabitqSmallArgs& a, int sms, int forced_cluster);

// Runs the search; plan from rabitq_small_plan (cluster > 0).
void launch_rabitq_small(const RabitqSmallArgs& a, const SmallLaunch& plan, cudaStream_t st);

}  // namespace gpuivfpq::gpu
