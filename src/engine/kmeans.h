// k-means (Lloyd) on the CPU: trains the coarse quantizer and PQ codebooks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "sampling.h"

namespace gpuivfpq {

struct KMeansParams {
    int iterations = 10;
    uint64_t seed = 1234;
    // Training uses at most k * max_points_per_centroid points (a seeded
    // subsample); more adds time but little quality.
    size_t max_points_per_centroid = 256;
    // Worker threads (1 = run on the caller's thread).
    int threads = 1;
};

// Trains k centroids (k x d, row-major, written to centroids) on n points.
// Requires n >= 1 and k >= 1. With n < k, the first n centroids are the
// points and the rest are copies of points chosen by the seed (a valid but
// redundant codebook). Empty clusters are re-seeded by splitting the largest
// cluster. Deterministic for a given seed and thread count.
void kmeans_train(const float* x, size_t n, size_t d, size_t k, const KMeansParams& params,
                  float* centroids);

// For each of the n points, the nearest of the k centroids by L2:
// assign[i] in [0, k), dist[i] = ||x_i - c||^2 (dist may be null).
// centroid_norms: norm_sqr of each centroid, kept by a caller that assigns
// often (an insert assigns one row), or null: computed here (above 16
// dimensions; below, the small-dimension kernel computes its own).
void assign_nearest(const float* x, size_t n, const float* centroids, size_t k, size_t d,
                    int32_t* assign, float* dist, int threads = 1, const float* centroid_norms = nullptr);

// ---- The random choices of k-means, made on the host by kmeans_train and
// by the GPU k-means (gpu/) alike, so that one seed starts both from the same
// rows. Both draw from one Rng(params.seed), in this order:
// kmeans_subsample, kmeans_initial_rows, then split_centroid for each empty
// cluster they re-seed. ----

// The rows of the n points that k-means trains on: empty when all of them
// are used (n <= k * max_points_per_centroid), else that many distinct rows,
// ascending.
std::vector<size_t> kmeans_subsample(size_t n, size_t k, size_t max_points_per_centroid, Rng& rng);

// ||a - b||^2 as k-means++ seeding measures it: one fused multiply-add chain
// over the coordinates in order, which the GPU's seeding kernel reproduces
// bit for bit (a GEMM or vectorised sum would round differently and could
// change which row is drawn).
float seeding_distance(const float* a, const float* b, size_t d);

// Called by kmeans_initial_rows during k-means++ with a chosen row r of the
// ns training points: sets min_dist[i] (i < ns) to seeding_distance(x_i, x_r)
// when first, else to the smaller of that and min_dist[i].
using SeedingUpdate = std::function<void(size_t row, bool first, float* min_dist)>;

// The k rows of the ns training points (ns >= 1, k >= 1) that become the
// initial centroids: with ns <= k every row, then seeded repeats; else
// k-means++ when its k sequential passes are cheap (ns * k <= 2^22; update
// supplies the distances), k distinct random rows otherwise. Points whose
// seeding distance overflowed float outweigh all others: while there are
// such, the next is drawn uniformly among them.
std::vector<size_t> kmeans_initial_rows(size_t ns, size_t k, Rng& rng, const SeedingUpdate& update);

// Re-seeds an empty cluster from a large one: both become big +- a
// sign-randomised nudge of (|big_t| + scale) / 1024 per coordinate (one
// rng.next() bit each), so they separate even where a coordinate is 0; a
// nudge past the float range stops at its end (clamp_to_finite).
void split_centroid(float* big, float* empty, size_t d, float scale, Rng& rng);

// Replaces each of the n values of x that is not finite: +-inf by the
// largest float of that sign, NaN by 0. A model's centroids and codebooks
// stay finite so (sums near the float range overflow on the GPU, residuals
// of values far apart overflow anywhere): every vector is then nearest to
// some centroid, and no lookup table is NaN throughout.
void clamp_to_finite(float* x, size_t n);

}  // namespace gpuivfpq
