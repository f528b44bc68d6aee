// GPU k-means: assignment by exact search (k = 1), centroid sums by atomics
// on the device, empty clusters split from the largest one on the host. The
// random choices (subsample, initial centroids, split signs) are the CPU
// engine's, drawn on the host from the same Rng (src/engine/kmeans.h).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "context_impl.h"
#include "cuda_check.h"
#include "gpu_ivfpq/device_buffer.h"
#include "gpu_ivfpq/exact_search.h"
#include "gpu_ivfpq/kmeans_gpu.h"
#include "ivfpq_kernels.h"

namespace gpuivfpq::gpu {

namespace {

// A warp per point: lanes add its coordinates into its centroid's sum.
__global__ void accumulate_kernel(const float* x, int64_t n, int d, const int32_t* assign,
                                  float* sums, int* counts)
{
    const int64_t i = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (i >= n)
        return;
    const int c = assign[i];
    const float* p = x + i * d;
    float* s = sums + static_cast<int64_t>(c) * d;
    for (int j = lane; j < d; j += 32)
        atomicAdd(s + j, p[j]);
    if (lane == 0)
        atomicAdd(counts + c, 1);
}

// Empty clusters keep their old centroid here; the host re-seeds them.
__global__ void update_kernel(float* centroids, const float* sums, const int* counts, int64_t k,
                              int d)
{
    const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (e >= k * d)
        return;
    const int c = static_cast<int>(e / d);
    if (counts[c] > 0)
        centroids[e] = sums[e] / static_cast<float>(counts[c]);
}

// k-means++ pass: mind[i] = min(mind[i], ||x_i - c||^2) (a thread per point),
// the distance computed exactly as the engine's seeding_distance (one fma
// chain in coordinate order) so that both draw the same rows.
__global__ void plusplus_kernel(const float* x, int64_t n, int d, const float* c, float* mind, bool first)
{
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    const float* p = x + i * d;
    float s = 0.0f;
    for (int j = 0; j < d; ++j) {
        const float df = p[j] - c[j];
        s = fmaf(df, df, s);
    }
    mind[i] = first ? s : fminf(mind[i], s);
}

// Copies rows[i] of x (device, d columns) to out row i (device).
void gather_host_rows(GpuContext& ctx, const float* x, const std::vector<size_t>& rows, size_t d,
                      float* out)
{
    if (rows.empty())
        return;
    std::vector<int64_t> idx(rows.begin(), rows.end());
    Scratch didx(ctx, idx.size() * sizeof(int64_t));
    copy_to_device(ctx, didx.data(), idx.data(), idx.size() * sizeof(int64_t));
    launch_gather_rows(x, didx.as<int64_t>(), static_cast<int64_t>(idx.size()), static_cast<int>(d), out,
                       stream_of(ctx));
    ctx.synchronize();  // idx is a host vector about to go
}

}  // namespace

void assign_nearest_gpu(GpuContext& ctx, const float* x, size_t n, const float* centroids, size_t k,
                        size_t d, int32_t* assign, float* dist)
{
    if (dist) {
        exact_knn_i32(ctx, x, n, centroids, k, d, Metric::L2, 1, dist, assign);
        return;
    }
    Scratch tmp(ctx, std::max<size_t>(n, 1) * sizeof(float));
    exact_knn_i32(ctx, x, n, centroids, k, d, Metric::L2, 1, tmp.as<float>(), assign);
}

void kmeans_train_gpu(GpuContext& ctx, const float* x, size_t n, size_t d, size_t k,
                      const KMeansParams& params, float* centroids, KMeansGpuStats* stats)
{
    require(n >= 1 && k >= 1 && d >= 1, "k-means needs n >= 1, k >= 1, d >= 1");
    require(k < (size_t(1) << 31) && n < (size_t(1) << 31), "k-means: too many points or centroids");
    require(params.max_points_per_centroid >= 1, "k-means: max_points_per_centroid must be >= 1");
    cudaStream_t st = stream_of(ctx);
    Rng rng(params.seed);

    // Subsample as the CPU does: at most k * max_points_per_centroid points.
    const float* xs = x;
    size_t ns = n;
    DeviceBuffer sub;
    const std::vector<size_t> rows = kmeans_subsample(n, k, params.max_points_per_centroid, rng);
    if (!rows.empty()) {
        ns = rows.size();
        sub = DeviceBuffer(ctx, ns * d * sizeof(float));
        gather_host_rows(ctx, x, rows, d, sub.as<float>());
        xs = sub.as<float>();
    }

    // Initial centroids: the rows the CPU would pick. k-means++ distances are
    // computed on the device, the weighted draws made on the host.
    DeviceBuffer mind;
    const std::vector<size_t> init =
        kmeans_initial_rows(ns, k, rng, [&](size_t row, bool first, float* min_dist) {
            if (mind.empty())
                mind = DeviceBuffer(ctx, ns * sizeof(float));
            plusplus_kernel<<<static_cast<unsigned>((ns + 255) / 256), 256, 0, st>>>(
                xs, static_cast<int64_t>(ns), static_cast<int>(d), xs + row * d, mind.as<float>(),
                first);
            GPU_KERNEL_CHECK();
            mind.download(min_dist, ns * sizeof(float));
        });
    mind.reset();
    gather_host_rows(ctx, xs, init, d, centroids);
    if (ns <= k) {
        // Every point is a centroid already (then seeded repeats), as the CPU.
        if (stats)
            *stats = KMeansGpuStats{params.iterations, 0.0, 0.0, ns, 0};
        return;
    }
    // Data scale for perturbing split clusters (RMS coordinate), as the CPU.
    float scale = 1.0f;
    {
        DeviceBuffer nrm(ctx, ns * sizeof(float));
        row_norms(ctx, xs, ns, d, nrm.as<float>());
        std::vector<float> hn(ns);
        nrm.download(hn.data(), ns * sizeof(float));
        double sq = 0;
        for (float v : hn)
            sq += v;
        scale = static_cast<float>(std::sqrt(sq / double(ns * d)));
    }

    DeviceBuffer assign(ctx, ns * sizeof(int32_t)), dist(ctx, ns * sizeof(float));
    DeviceBuffer sums(ctx, k * d * sizeof(float)), counts(ctx, k * sizeof(int));
    std::vector<int> hcounts(k);
    std::vector<float> hdist;
    cudaEvent_t e0, e1;
    GPU_CUDA_CHECK(cudaEventCreate(&e0));
    GPU_CUDA_CHECK(cudaEventCreate(&e1));
    double total_ms = 0;
    size_t splits = 0;
    double objective = 0;
    try {
        for (int it = 0; it < params.iterations; ++it) {
            GPU_CUDA_CHECK(cudaEventRecord(e0, st));
            assign_nearest_gpu(ctx, xs, ns, centroids, k, d, assign.as<int32_t>(), dist.as<float>());
            sums.fill_zero();
            counts.fill_zero();
            accumulate_kernel<<<static_cast<unsigned>((ns + 7) / 8), 256, 0, st>>>(
                xs, static_cast<int64_t>(ns), static_cast<int>(d), assign.as<int32_t>(),
                sums.as<float>(), counts.as<int>());
            GPU_KERNEL_CHECK();
            update_kernel<<<static_cast<unsigned>((k * d + 255) / 256), 256, 0, st>>>(
                centroids, sums.as<float>(), counts.as<int>(), static_cast<int64_t>(k),
                static_cast<int>(d));
            GPU_KERNEL_CHECK();
            GPU_CUDA_CHECK(cudaEventRecord(e1, st));
            counts.download(hcounts.data(), k * sizeof(int));  // waits
            float ms = 0;
            GPU_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
            total_ms += ms;
            if (it == params.iterations - 1) {
                hdist.resize(ns);
                dist.download(hdist.data(), ns * sizeof(float));
                objective = std::accumulate(hdist.begin(), hdist.end(), 0.0);
            }
            // Empty cluster: split the largest one in two, nudging both copies
            // apart (additive, sign-randomised, relative 1/1024 of |x| + the
            // data scale: the CPU's rule). Not after the last update: nothing
            // would re-assign the points and the nudge would only add error.
            if (it == params.iterations - 1)
                continue;
            std::vector<float> big(d), empty(d);
            for (size_t c = 0; c < k; ++c) {
                if (hcounts[c] != 0)
                    continue;
                size_t b = std::max_element(hcounts.begin(), hcounts.end()) - hcounts.begin();
                if (hcounts[b] <= 1)
                    break;  // nothing left to split
                copy_to_host(ctx, big.data(), centroids + b * d, d * sizeof(float));
                split_centroid(big.data(), empty.data(), d, scale, rng);
                copy_to_device(ctx, centroids + b * d, big.data(), d * sizeof(float));
                copy_to_device(ctx, centroids + c * d, empty.data(), d * sizeof(float));
                ctx.synchronize();  // host vectors are reused
                hcounts[c] = hcounts[b] / 2;
                hcounts[b] -= hcounts[c];
                ++splits;
            }
        }
        GPU_CUDA_CHECK(cudaStreamSynchronize(st));
    } catch (...) {
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        throw;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    if (stats) {
        stats->iterations = params.iterations;
        stats->seconds_per_iteration = params.iterations ? total_ms / 1000.0 / params.iterations : 0;
        stats->objective = objective;
        stats->points_used = ns;
        stats->empty_splits = splits;
    }
}

void kmeans_train_gpu_host(GpuContext& ctx, const float* x, size_t n, size_t d, size_t k,
                           const KMeansParams& params, float* centroids, KMeansGpuStats* stats)
{
    DeviceBuffer dx(ctx, n * d * sizeof(float)), dc(ctx, k * d * sizeof(float));
    dx.upload(x, n * d * sizeof(float));
    kmeans_train_gpu(ctx, dx.as<float>(), n, d, k, params, dc.as<float>(), stats);
    dc.download(centroids, k * d * sizeof(float));
}

}  // namespace gpuivfpq::gpu
