// Exact re-rank of IVFADC candidates (GpuIvfPqIndex::search_exact): each
// candidate's exact distance from its stored vector, by the shared header
// src/engine/exact_distance.h, then a per-query sort by exact_less.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../../src/engine/distances.h"

namespace gpuivfpq::gpu {

// For each query q < nq (queries nq x d, as given: never normalised) and its
// k candidates cand[q * k + j] (list << 32 | offset, -1 = none, as
// LabelKind::ListOffset labels), in any order: out_dist[q * k + j] =
// exact_distance(metric, query, list_vectors[list] + offset * d) and
// out_labels = list_ids[list][offset], sorted by exact_less, the missing
// candidates last as (+inf, -1). cand may alias out_labels (a block reads its
// row whole before writing it). k <= kMaxSelectK.
void launch_exact_rerank(const float* queries, int64_t nq, int d, int k, Metric metric,
                         const int64_t* cand, const float* const* list_vectors,
                         const int64_t* const* list_ids, double* out_dist, int64_t* out_labels,
                         cudaStream_t st);

}  // namespace gpuivfpq::gpu
