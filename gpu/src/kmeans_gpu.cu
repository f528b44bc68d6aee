// GPU k-means: assignment by exact search (k = 1), centroid sums by atomics
// on the device, empty clusters split from the largest one on the host.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
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

// k-means++ pass: mind[i] = min(mind[i], ||x_i - c||^2) (a thread per point).
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

// Distinct random indices (partial Fisher-Yates), seeded.
std::vector<int64_t> sample_indices(size_t n, size_t count, std::mt19937_64& rng)
{
    std::vector<int64_t> perm(n);
    std::iota(perm.begin(), perm.end(), 0);
    for (size_t i = 0; i < count; ++i) {
        std::uniform_int_distribution<size_t> u(i, n - 1);
        std::swap(perm[i], perm[u(rng)]);
    }
    perm.resize(count);
    return perm;
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
    cudaStream_t st = stream_of(ctx);
    std::mt19937_64 rng(params.seed);
    if (n <= k) {
        // Too few points to cluster: the points, then seeded repeats (as the CPU).
        GPU_CUDA_CHECK(cudaMemcpyAsync(centroids, x, n * d * sizeof(float), cudaMemcpyDeviceToDevice, st));
        std::uniform_int_distribution<size_t> u(0, n - 1);
        for (size_t c = n; c < k; ++c)
            GPU_CUDA_CHECK(cudaMemcpyAsync(centroids + c * d, x + u(rng) * d, d * sizeof(float),
                                           cudaMemcpyDeviceToDevice, st));
        ctx.synchronize();
        if (stats)
            *stats = KMeansGpuStats{params.iterations, 0.0, 0.0, n, 0};
        return;
    }

    // Subsample as the CPU does: at most k * max_points_per_centroid points.
    const float* xs = x;
    size_t ns = n;
    DeviceBuffer sub;
    if (params.max_points_per_centroid > 0 && n > k * params.max_points_per_centroid) {
        ns = k * params.max_points_per_centroid;
        std::vector<int64_t> idx = sample_indices(n, ns, rng);
        std::sort(idx.begin(), idx.end());
        DeviceBuffer didx(ctx, ns * sizeof(int64_t));
        didx.upload(idx.data(), ns * sizeof(int64_t));
        sub = DeviceBuffer(ctx, ns * d * sizeof(float));
        launch_gather_rows(x, didx.as<int64_t>(), static_cast<int64_t>(ns), static_cast<int>(d),
                           sub.as<float>(), st);
        xs = sub.as<float>();
    }

    // k-means++ seeding where its k sequential passes are cheap (the CPU
    // engine's rule: points x centroids <= 2^22), k distinct random points
    // otherwise. Distances on the device, the weighted draw on the host.
    if (double(ns) * double(k) <= double(1 << 22)) {
        DeviceBuffer mind(ctx, ns * sizeof(float));
        std::vector<float> hm(ns);
        std::uniform_real_distribution<double> unit(0.0, 1.0);
        size_t pick = std::uniform_int_distribution<size_t>(0, ns - 1)(rng);
        for (size_t c = 0; c < k; ++c) {
            GPU_CUDA_CHECK(cudaMemcpyAsync(centroids + c * d, xs + pick * d, d * sizeof(float),
                                           cudaMemcpyDeviceToDevice, st));
            if (c + 1 == k)
                break;
            plusplus_kernel<<<static_cast<unsigned>((ns + 255) / 256), 256, 0, st>>>(
                xs, static_cast<int64_t>(ns), static_cast<int>(d), centroids + c * d, mind.as<float>(),
                c == 0);
            GPU_KERNEL_CHECK();
            mind.download(hm.data(), ns * sizeof(float));
            double total = 0;
            for (float v : hm)
                total += v;
            if (!(total > 0)) {
                pick = std::uniform_int_distribution<size_t>(0, ns - 1)(rng);
                continue;
            }
            const double target = unit(rng) * total;
            double acc = 0;
            pick = ns - 1;
            for (size_t i = 0; i < ns; ++i) {
                acc += hm[i];
                if (acc > target && hm[i] > 0) {
                    pick = i;
                    break;
                }
            }
        }
    } else {
        std::vector<int64_t> idx = sample_indices(ns, k, rng);
        DeviceBuffer didx(ctx, k * sizeof(int64_t));
        didx.upload(idx.data(), k * sizeof(int64_t));
        launch_gather_rows(xs, didx.as<int64_t>(), static_cast<int64_t>(k), static_cast<int>(d),
                           centroids, st);
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
                const float eps = 1.0f / 1024.0f;
                for (size_t j = 0; j < d; ++j) {
                    const float delta = eps * (std::fabs(big[j]) + scale);
                    const float sgn = (rng() & 1) ? 1.0f : -1.0f;
                    empty[j] = big[j] + sgn * delta;
                    big[j] = big[j] - sgn * delta;
                }
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
