// The RaBitQ list scan (gpu_ivfpq/rabitq_scan.h): a block per (query, list)
// pair, its byte tables in shared memory, a thread per row. A row's sum
// runs over its planes and their bytes in RabitqModel::scan's order, with
// round-to-nearest intrinsics so that nvcc fuses no multiply-add: the
// estimate is the CPU engine's bit for bit.
#include <algorithm>

#include "context_impl.h"
#include "cuda_check.h"
#include "engine/error.h"
#include "engine/search_limits.h"
#include "gpu_ivfpq/gpu_context.h"
#include "gpu_ivfpq/rabitq_scan.h"

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
        const uint8_t* code = codes + row * code_stride;
        float ip = 0.0f;
        for (int p = 0; p < bits; p++) {
            const uint32_t* plane = reinterpret_cast<const uint32_t*>(code + size_t(p) * plane_bytes);
            float s = 0.0f;
            for (int w = 0; w < plane_bytes / 4; w++) {
                const uint32_t word = plane[w];  // bytes 4w .. 4w + 3, little endian
                for (int b = 0; b < 4; b++)
                    s = __fadd_rn(s, lut[(4 * w + b) * 256 + ((word >> (8 * b)) & 0xff)]);
            }
            ip = __fadd_rn(__fmul_rn(2.0f, ip), s);
        }
        const RabitqFactors f = factors[row];
        const float est = __fadd_rn(__fadd_rn(pair.base, __fmul_rn(pair.add_scale, f.add)),
                                    __fmul_rn(pair.ip_scale, __fmul_rn(f.rescale, ip)));
        estimate[pair.out + r] = rank_distance(est);
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
