// Row argmin of norms - 2*ip: turns a GEMM block into nearest-centroid ids.
#include <limits>

#include "internal.h"

namespace gpuivfpq::detail {

namespace {

// Lane-wise running minimum of norms - 2*ip with the index where each lane
// first reached it (two independent sets for ILP), then a scalar merge that
// prefers the smaller index on equal values: the first index of the minimum.
template <int W>
inline __attribute__((always_inline)) size_t argmin_impl(const float* ip, const float* norms,
                                                         size_t n)
{
    typedef typename Lanes<W>::F F;
    typedef typename Lanes<W>::FU FU;
    typedef typename Lanes<W>::I I;
    const float inf = std::numeric_limits<float>::infinity();
    F b0, b1;
    I i0, i1, c0, c1;
    for (int l = 0; l < W; l++) {
        b0[l] = b1[l] = inf;
        i0[l] = i1[l] = 0;
        c0[l] = l;
        c1[l] = W + l;
    }
    size_t j = 0;
    // int32 lane indices: callers pass n <= 2^31 (centroid counts).
    for (; j + 2 * W <= n; j += 2 * W) {
        const F v0 = *reinterpret_cast<const FU*>(norms + j) -
                     2.0f * *reinterpret_cast<const FU*>(ip + j);
        const F v1 = *reinterpret_cast<const FU*>(norms + j + W) -
                     2.0f * *reinterpret_cast<const FU*>(ip + j + W);
        const I lt0 = v0 < b0, lt1 = v1 < b1;
        b0 = lt0 ? v0 : b0;
        i0 = lt0 ? c0 : i0;
        b1 = lt1 ? v1 : b1;
        i1 = lt1 ? c1 : i1;
        c0 += 2 * W;
        c1 += 2 * W;
    }
    float best = inf;
    size_t bi = 0;
    for (int l = 0; l < W; l++) {
        if (b0[l] < best || (b0[l] == best && size_t(i0[l]) < bi)) {
            best = b0[l];
            bi = size_t(i0[l]);
        }
        if (b1[l] < best || (b1[l] == best && size_t(i1[l]) < bi)) {
            best = b1[l];
            bi = size_t(i1[l]);
        }
    }
    for (; j < n; j++) {
        const float v = norms[j] - 2.0f * ip[j];
        if (v < best) {
            best = v;
            bi = j;
        }
    }
    return bi;  // 0 when every value is NaN: any answer is as good
}

#if GPU_IVFPQ_X86_DISPATCH
__attribute__((target("arch=x86-64-v3"))) size_t argmin_avx2(const float* ip,
                                                              const float* norms, size_t n)
{
    return argmin_impl<8>(ip, norms, n);
}
#endif

}  // namespace

size_t argmin_l2(const float* ip, const float* norms, size_t n)
{
#if GPU_IVFPQ_X86_DISPATCH
    if (cpu_has_avx2())
        return argmin_avx2(ip, norms, n);
#endif
    return argmin_impl<4>(ip, norms, n);
}

}  // namespace gpuivfpq::detail
