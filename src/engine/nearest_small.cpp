// Nearest-centroid search for small dimensions (PQ sub-vectors), where BLAS
// GEMM with a tiny inner dimension is slow: a fused multiply-add + argmin
// kernel over a transposed codebook.
#include <algorithm>
#include <limits>

#include "distances.h"
#include "internal.h"

namespace gpuivfpq::detail {

namespace {

// Codewords per padded block: a multiple of every kernel's block (8 x W).
constexpr size_t kPad = 64;

// For each row, accumulates <x, c> for blocks of 8*W codewords in registers
// (one broadcast FMA per coordinate), turns them into norms - 2<x,c> and keeps
// a lane-wise running minimum with its index; the final merge prefers the
// smaller index on equal values, so the result is the first nearest codeword.
template <int W>
inline __attribute__((always_inline)) void nearest_impl(const float* x, size_t n, size_t ldx,
                                                        const SmallCodebook& cb, int32_t* out)
{
    typedef typename Lanes<W>::F F;
    typedef typename Lanes<W>::FU FU;
    typedef typename Lanes<W>::I I;
    constexpr int U = 8;
    constexpr size_t B = size_t(U) * W;
    const size_t d = cb.d, kpad = cb.kpad;
    const float* ct = cb.ct.data();
    const float* norms = cb.norms.data();
    const float inf = std::numeric_limits<float>::infinity();
    I lane;
    for (int l = 0; l < W; l++)
        lane[l] = l;

    for (size_t i = 0; i < n; i++) {
        const float* xi = x + i * ldx;
        // Two running minima (even / odd vectors) halve the compare chain.
        F best[2] = {F{} + inf, F{} + inf};
        I bidx[2] = {I{}, I{}};
        for (size_t c0 = 0; c0 < kpad; c0 += B) {
            F acc[U];
            for (int u = 0; u < U; u++)
                acc[u] = F{};
            for (size_t t = 0; t < d; t++) {
                const float xt = xi[t];
                const float* row = ct + t * kpad + c0;
                for (int u = 0; u < U; u++)
                    acc[u] += xt * *reinterpret_cast<const FU*>(row + u * W);
            }
            for (int u = 0; u < U; u++) {
                const F v = *reinterpret_cast<const FU*>(norms + c0 + u * W) - 2.0f * acc[u];
                const I lt = v < best[u & 1];
                best[u & 1] = lt ? v : best[u & 1];
                bidx[u & 1] = lt ? lane + int32_t(c0 + u * W) : bidx[u & 1];
            }
        }
        float bv = inf;
        int32_t bi = 0;
        for (int s = 0; s < 2; s++) {
            for (int l = 0; l < W; l++) {
                if (best[s][l] < bv || (best[s][l] == bv && bidx[s][l] < bi)) {
                    bv = best[s][l];
                    bi = bidx[s][l];
                }
            }
        }
        out[i] = bi;
    }
}

#if GPU_IVFPQ_X86_DISPATCH
__attribute__((target("arch=x86-64-v3"))) void nearest_avx2(const float* x, size_t n,
                                                             size_t ldx, const SmallCodebook& cb,
                                                             int32_t* out)
{
    nearest_impl<8>(x, n, ldx, cb, out);
}
#endif

}  // namespace

SmallCodebook make_small_codebook(const float* centroids, size_t k, size_t d)
{
    SmallCodebook cb;
    cb.k = k;
    cb.d = d;
    cb.kpad = (k + kPad - 1) / kPad * kPad;
    cb.ct.assign(checked_mul(cb.kpad, d, "small codebook"), 0.0f);
    // Padding codewords get norm +inf: norms - 2<x,0> = +inf never wins.
    cb.norms.assign(cb.kpad, std::numeric_limits<float>::infinity());
    for (size_t c = 0; c < k; c++) {
        for (size_t t = 0; t < d; t++)
            cb.ct[t * cb.kpad + c] = centroids[c * d + t];
        cb.norms[c] = norm_sqr(centroids + c * d, d);
    }
    return cb;
}

void nearest_small(const float* x, size_t n, size_t ldx, const SmallCodebook& cb, int32_t* out)
{
#if GPU_IVFPQ_X86_DISPATCH
    if (cpu_has_avx2()) {
        nearest_avx2(x, n, ldx, cb, out);
        return;
    }
#endif
    nearest_impl<4>(x, n, ldx, cb, out);
}

}  // namespace gpuivfpq::detail
