// Exact re-rank of IVFADC candidates (GpuIvfPqIndex::search_exact): each
// candidate's exact distance from its stored vector, by the shared header
// src/engine/exact_distance.h, then a per-query sort by exact_less.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/distances.h"

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

// The same over row candidates of one contiguous base (search_brute_force):
// query q's k_in candidates cand[q * k_in + j] are rows of base (n x d,
// -1 = none) with ids base_ids[row]; the first k_out (1 <= k_out <= k_in <=
// kMaxSelectK) in exact_less order go to out_dist / out_labels[q * k_out ..],
// padded with (+inf, -1). cand must not alias the outputs.
void launch_exact_rerank_rows(const float* queries, int64_t nq, int d, int k_in, int k_out,
                              Metric metric, const int64_t* cand, const float* base,
                              const int64_t* base_ids, double* out_dist, int64_t* out_labels,
                              cudaStream_t st);

// Copies the n entries of the inverted lists (list_vectors[l]: d floats per
// entry, list_ids[l]: one id per entry; device arrays of lists pointers) into
// one contiguous base (n x d) and ids (n), list after list: list l's entries
// go to rows offsets[l] .. offsets[l + 1] - 1 (offsets: device, lists + 1
// prefix sums of the list sizes, offsets[lists] = n).
void launch_gather_lists(const float* const* list_vectors, const int64_t* const* list_ids,
                         const int64_t* offsets, int64_t lists, int64_t n, int d, float* base,
                         int64_t* ids, cudaStream_t st);

}  // namespace gpuivfpq::gpu
