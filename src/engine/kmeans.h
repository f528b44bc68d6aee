// k-means (Lloyd) on the CPU: trains the coarse quantizer and PQ codebooks.
#pragma once

#include <cstddef>
#include <cstdint>

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
void assign_nearest(const float* x, size_t n, const float* centroids, size_t k, size_t d,
                    int32_t* assign, float* dist, int threads = 1);

}  // namespace gpuivfpq
