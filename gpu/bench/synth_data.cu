// Deterministic synthetic data for the benchmark, generated on the GPU:
// SIFT-like clustered vectors (non-negative integers, skewed dimensions).
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "synth_data.h"

namespace {

__device__ __forceinline__ uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ float unit(uint64_t h) { return ((h >> 40) + 0.5f) * (1.0f / 16777216.0f); }

__device__ __forceinline__ float gauss(uint64_t h)
{
    const float u1 = unit(h), u2 = unit(mix(h));
    return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

// Centres: each coordinate 128 * u^3 (most SIFT bins are small, a few large).
__global__ void centres_kernel(float* c, int64_t total, uint64_t seed)
{
    const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (e >= total)
        return;
    const float u = unit(mix(seed ^ (0x1234567ull + e)));
    c[e] = 128.0f * u * u * u;
}

// Point i: a centre picked by hash, a per-centre spread in [6, 14], gaussian
// noise, rounded to integers and clamped to [0, 255] like SIFT.
__global__ void points_kernel(float* x, int64_t n, int d, const float* c, int nc, uint64_t seed)
{
    const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (e >= n * d)
        return;
    const int64_t i = e / d;
    const int j = static_cast<int>(e - i * d);
    const int k = static_cast<int>(mix(seed * 31 + i) % nc);
    const float spread = 6.0f + 8.0f * unit(mix(0xabcdefull + k));
    const float v = c[static_cast<int64_t>(k) * d + j] + spread * gauss(mix(seed ^ (e * 0x2545F491ull)));
    x[e] = fminf(fmaxf(rintf(v), 0.0f), 255.0f);
}

__global__ void uniform_kernel(float* x, int64_t n, uint64_t seed)
{
    const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (e < n)
        x[e] = unit(mix(seed ^ (e * 0x9E3779B1ull)));
}

void check(cudaError_t e, const char* what)
{
    if (e != cudaSuccess)
        throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

}  // namespace

void synth_sift_like(float* x, int64_t n, int d, float* centres, int nc, uint64_t centre_seed,
                     uint64_t seed, void* stream)
{
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    const int64_t tc = static_cast<int64_t>(nc) * d;
    centres_kernel<<<static_cast<unsigned>((tc + 255) / 256), 256, 0, st>>>(centres, tc, centre_seed);
    check(cudaGetLastError(), "centres_kernel");
    points_kernel<<<static_cast<unsigned>((n * d + 255) / 256), 256, 0, st>>>(x, n, d, centres, nc, seed);
    check(cudaGetLastError(), "points_kernel");
}

void synth_uniform(float* x, int64_t n, uint64_t seed, void* stream)
{
    uniform_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
        x, n, seed);
    check(cudaGetLastError(), "uniform_kernel");
}
