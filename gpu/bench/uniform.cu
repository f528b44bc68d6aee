// Uniform random matrices for the k-selection benchmark, filled on the
// device: 5 GB of input would take longer to make on the host and upload
// than the benchmark itself.
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "uniform.h"

namespace {

// splitmix64's finaliser: a counter-based hash, so each element is
// independent of the launch shape.
__device__ __forceinline__ uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__global__ void uniform_kernel(float* x, int64_t n, uint64_t seed)
{
    const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (e < n)
        x[e] = ((mix(seed ^ (e * 0x9E3779B1ull)) >> 40) + 0.5f) * (1.0f / 16777216.0f);
}

}  // namespace

void fill_uniform(float* x, int64_t n, uint64_t seed, void* stream)
{
    uniform_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
        x, n, seed);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        throw std::runtime_error(std::string("uniform_kernel: ") + cudaGetErrorString(e));
}
