// Exact k-NN on the GPU: cuBLAS GEMM + norms with k-selection fused into the
// pass over each distance tile.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/distances.h"

namespace gpuivfpq::gpu {

class GpuContext;

// For each of nq queries (device, nq x d), the k nearest of the n base
// vectors (device, n x d) under metric, as ranking distances of
// metric_distance (L2: squared, clamped at 0; InnerProduct: -<q,y>;
// Cosine: 1 - cos), sorted ascending; out_label is the base row, rows with
// fewer than k candidates padded with (+inf, -1). base_norms (device, n
// values of ||y||^2) may be null. tile_bytes bounds the distance tile
// (0 = min(1 GiB, a quarter of the free budget)). All outputs on the device.
void exact_knn(GpuContext& ctx, const float* queries, size_t nq, const float* base, size_t n,
               size_t d, Metric metric, size_t k, float* out_dist, int64_t* out_label,
               const float* base_norms = nullptr, size_t tile_bytes = 0);

// Same, with int32 labels (the form k-means assignment and the coarse
// quantizer use).
void exact_knn_i32(GpuContext& ctx, const float* queries, size_t nq, const float* base, size_t n,
                   size_t d, Metric metric, size_t k, float* out_dist, int32_t* out_label,
                   const float* base_norms = nullptr, size_t tile_bytes = 0);

// ||x_i||^2 for the n rows of x (device, n x d) into out (device).
void row_norms(GpuContext& ctx, const float* x, size_t n, size_t d, float* out);

// Scales each row to unit length in place (zero rows stay zero).
void normalize_rows(GpuContext& ctx, float* x, size_t n, size_t d);

// ---- Bench aids: used only by gpu/bench/gpu_bench.cpp to take exact_knn
// apart; the service never calls them. ----

// The GEMM tiles of exact_knn alone (same tiling, no selection), so that the
// cost of selection can be read off.
void gemm_tiles_only(GpuContext& ctx, const float* queries, size_t nq, const float* base, size_t n,
                     size_t d, size_t tile_bytes = 0);

// Whether exact_knn on ctx overlaps the selection of one distance tile (on a
// second stream) with the GEMM of the next (default on; off: each selection
// runs after its GEMM on the main stream), to measure what the overlap gains.
void set_exact_overlap(GpuContext& ctx, bool on);

// Whether small selections on ctx run as a block radix select (a block per
// chunk of about 2048 columns, then a block per row; k from 2 to 256): the
// one-tile selections of exact_knn (the coarse step of small batches) where
// a block per row is wanted (so also the PQ mirror's staged coarse step
// of batches too large for its one-launch path, and small exact searches),
// and every RaBitQ mirror search's selection of candidates. On by default:
// on an H200 (gpu_bench --rabitq) a RaBitQ search of 1 to 1000 queries took
// 1-15% less than with WarpSelect / BlockSelect (off), at 10,000 the same
// on even lists and 6-8% less on skewed ones; the PQ path was not timed
// apart. The same keys either way; equal keys at the k-th place may differ
// (every GPU test passes with either).
void set_radix_select(GpuContext& ctx, bool on);

}  // namespace gpuivfpq::gpu
