// The RaBitQ list scan (gpu_ivfpq/rabitq_scan.h): a block per (query, list)
// pair, its byte tables in shared memory, a thread per row; each row's
// estimate is the CPU engine's bit for bit (rabitq_row.cuh).
#include <algorithm>

#include "context_impl.h"
#include "cuda_check.h"
#include "engine/error.h"
#include "engine/search_limits.h"
#include "gpu_ivfpq/gpu_context.h"
#include "gpu_ivfpq/rabitq_scan.h"
#include "rabitq_row.cuh"

namespace gpuivfpq::gpu {

namespace {

constexpr int kScanThreads = 256;

__global__ void __launch_bounds__(kScanThreads)
    rabitq_scan_kernel(const RabitqPair* pairs, const float* luts, int plane_bytes, int bits,
                       const uint8_t* codes, uint64_t code_stride, const RabitqFactors* factors, float eps0,
                       float* estimate, float* bound)
{
    extern __shared__ float lut[];
    const RabitqPair pair = pairs[blockIdx.x];
    const int entries = plane_bytes * 256;
    const float* src = luts + uint64_t(blockIdx.x) * entries;
    for (int i = threadIdx.x; i < entries; i += blockDim.x)
        lut[i] = src[i];
    __syncthreads();
    for (uint32_t r = threadIdx.x; r < pair.count; r += blockDim.x) {
        const uint64_t row = pair.first + r;
        const float ip = rabitq_code_ip(lut, codes + row * code_stride, plane_bytes, bits);
        const RabitqFactors f = factors[row];
        estimate[pair.out + r] = rabitq_estimate(pair.base, pair.add_scale, pair.ip_scale, f, ip);
        if (bound != nullptr) {
            const float b = __fmul_rn(__fmul_rn(pair.bound_scale, f.error), eps0);
            bound[pair.out + r] = b >= 0.0f ? b : __int_as_float(0x7f800000);  // NaN: +inf
        }
    }
}

}  // namespace

RabitqPair rabitq_pair(const RabitqListQuery& lq, uint64_t first, uint32_t count, uint64_t out)
{
    RabitqPair p;
    p.first = first;
    p.count = count;
    p.out = out;
    p.base = lq.base;
    p.add_scale = lq.add_scale;
    p.ip_scale = lq.ip_scale;
    p.bound_scale = lq.bound_scale;
    return p;
}

void rabitq_scan(GpuContext& ctx, const RabitqPair* pairs, size_t npairs, const float* luts, size_t d,
                 int bits, const uint8_t* codes, size_t code_stride, const RabitqFactors* factors, float eps0,
                 float* estimate, float* bound)
{
    require(d >= 1 && d <= kRabitqMaxDims, "RaBitQ scan: d outside [1, kRabitqMaxDims]");
    require(bits >= kRabitqMinBits && bits <= kRabitqMaxBits, "RaBitQ scan: bits outside [1, 8]");
    require(code_stride >= rabitq_code_bytes(d, bits) && code_stride % 4 == 0,
            "RaBitQ scan: code stride shorter than a code or not a multiple of 4");
    require(eps0 >= 0.0f, "RaBitQ scan: eps0 must not be negative");
    require(npairs < (size_t(1) << 31), "RaBitQ scan: more than 2^31 pairs");
    if (npairs == 0)
        return;
    require(pairs && luts && codes && factors && estimate, "RaBitQ scan: null pointer");
    const int plane_bytes = int(rabitq_plane_words(d) * 4);
    const size_t smem = size_t(plane_bytes) * 256 * sizeof(float);  // 16 KiB at d = 128, 96 KiB at 768
    int dev = 0, optin = 0;
    GPU_CUDA_CHECK(cudaGetDevice(&dev));
    GPU_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (smem > size_t(optin))
        throw Error(ErrorKind::Unsupported, "RaBitQ scan: the byte tables of d = " + std::to_string(d) +
                                                " do not fit a block's shared memory");
    if (smem > 48 * 1024)
        GPU_CUDA_CHECK(cudaFuncSetAttribute(rabitq_scan_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            int(smem)));
    rabitq_scan_kernel<<<unsigned(npairs), kScanThreads, smem, ctx.impl().stream>>>(
        pairs, luts, plane_bytes, bits, codes, code_stride, factors, eps0, estimate, bound);
    GPU_KERNEL_CHECK();
}

}  // namespace gpuivfpq::gpu
