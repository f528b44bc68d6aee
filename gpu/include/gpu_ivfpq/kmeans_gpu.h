// k-means (Lloyd) on the GPU: assignment by exact search with k = 1,
// centroid update on the device, empty clusters split from the largest.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/kmeans.h"

namespace gpuivfpq::gpu {

class GpuContext;

struct KMeansGpuStats {
    int iterations = 0;
    double seconds_per_iteration = 0;  // device time, events around each iteration
    double objective = 0;              // sum of squared distances after the last assignment
    size_t points_used = 0;            // after the max_points_per_centroid subsample
    size_t empty_splits = 0;           // empty clusters re-seeded over all iterations
};

// Trains k centroids on n points, all on the device: x (n x d) and
// centroids (k x d) are device pointers. Uses params.iterations, seed and
// max_points_per_centroid (params.threads is ignored). Requires n >= 1, k >= 1.
// Subsample and initial centroids are kmeans_train's for the same seed (the
// engine's kmeans_subsample / kmeans_initial_rows); the iterations differ
// from the CPU's by float rounding, and no cluster is split after the last.
void kmeans_train_gpu(GpuContext& ctx, const float* x, size_t n, size_t d, size_t k,
                      const KMeansParams& params, float* centroids, KMeansGpuStats* stats = nullptr);

// Host-pointer convenience wrapper (copies in and out).
void kmeans_train_gpu_host(GpuContext& ctx, const float* x, size_t n, size_t d, size_t k,
                           const KMeansParams& params, float* centroids,
                           KMeansGpuStats* stats = nullptr);

// Nearest centroid of each point (device pointers): assign[i] in [0, k),
// dist[i] = ||x_i - c||^2 (dist may be null).
void assign_nearest_gpu(GpuContext& ctx, const float* x, size_t n, const float* centroids, size_t k,
                        size_t d, int32_t* assign, float* dist);

}  // namespace gpuivfpq::gpu
