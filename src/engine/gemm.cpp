// The engine's one GEMM shape (C = A B^T, both row-major) over BLAS or a
// portable blocked loop, plus the row argmin that consumes its output.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <limits>
#include <string>

#include "error.h"
#include "internal.h"

#ifdef GPU_IVFPQ_HAVE_CBLAS
#include <cblas.h>
#endif

namespace gpuivfpq::detail {

namespace {

std::atomic<bool> g_force_portable{false};

// Dot products of one A row with four B rows; 8 independent lanes per
// product so GCC vectorises the loop without reassociating (no -ffast-math).
inline __attribute__((always_inline)) void dot4(const float* a, const float* b0,
                                                const float* b1, const float* b2,
                                                const float* b3, size_t K, float* out)
{
    float s0[8] = {}, s1[8] = {}, s2[8] = {}, s3[8] = {};
    size_t t = 0;
    for (; t + 8 <= K; t += 8) {
        for (size_t l = 0; l < 8; l++) {
            const float av = a[t + l];
            s0[l] += av * b0[t + l];
            s1[l] += av * b1[t + l];
            s2[l] += av * b2[t + l];
            s3[l] += av * b3[t + l];
        }
    }
    float r0 = 0.0f, r1 = 0.0f, r2 = 0.0f, r3 = 0.0f;
    for (; t < K; t++) {
        r0 += a[t] * b0[t];
        r1 += a[t] * b1[t];
        r2 += a[t] * b2[t];
        r3 += a[t] * b3[t];
    }
    for (size_t l = 0; l < 8; l++) {
        r0 += s0[l];
        r1 += s1[l];
        r2 += s2[l];
        r3 += s3[l];
    }
    out[0] = r0;
    out[1] = r1;
    out[2] = r2;
    out[3] = r3;
}

}  // namespace

GPU_IVFPQ_HOT
void gemm_nt_portable(size_t M, size_t N, size_t K, const float* A, size_t lda, const float* B,
                      size_t ldb, float* C, size_t ldc)
{
    // Blocks of B rows small enough to stay in L2 while every A row visits.
    constexpr size_t kBlockB = 64;
    for (size_t j0 = 0; j0 < N; j0 += kBlockB) {
        const size_t j1 = std::min(N, j0 + kBlockB);
        for (size_t i = 0; i < M; i++) {
            const float* a = A + i * lda;
            float* c = C + i * ldc;
            size_t j = j0;
            for (; j + 4 <= j1; j += 4)
                dot4(a, B + j * ldb, B + (j + 1) * ldb, B + (j + 2) * ldb, B + (j + 3) * ldb, K,
                     c + j);
            for (; j < j1; j++) {
                float tmp[4];
                const float* b = B + j * ldb;
                dot4(a, b, b, b, b, K, tmp);
                c[j] = tmp[0];
            }
        }
    }
}

bool gemm_uses_blas()
{
#ifdef GPU_IVFPQ_HAVE_CBLAS
    return !g_force_portable.load(std::memory_order_relaxed);
#else
    return false;
#endif
}

void set_force_portable_gemm(bool on)
{
    g_force_portable.store(on, std::memory_order_relaxed);
}

void gemm_nt(size_t M, size_t N, size_t K, const float* A, size_t lda, const float* B,
             size_t ldb, float* C, size_t ldc)
{
    if (M == 0 || N == 0)
        return;
    if (K == 0) {
        // BLAS wants lda >= 1 here; the empty sum is simply zero.
        for (size_t i = 0; i < M; i++)
            std::fill(C + i * ldc, C + i * ldc + N, 0.0f);
        return;
    }
#ifdef GPU_IVFPQ_HAVE_CBLAS
    // cblas takes int dimensions: split M and N, fall back when strides overflow.
    const size_t kMaxDim = size_t(1) << 30;
    const size_t kIntMax = size_t(INT_MAX);
    if (gemm_uses_blas() && K <= kIntMax && lda <= kIntMax && ldb <= kIntMax && ldc <= kIntMax) {
        for (size_t i0 = 0; i0 < M; i0 += kMaxDim) {
            const size_t mi = std::min(kMaxDim, M - i0);
            for (size_t j0 = 0; j0 < N; j0 += kMaxDim) {
                const size_t nj = std::min(kMaxDim, N - j0);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(mi), int(nj), int(K),
                            1.0f, A + i0 * lda, int(lda), B + j0 * ldb, int(ldb), 0.0f,
                            C + i0 * ldc + j0, int(ldc));
            }
        }
        return;
    }
#endif
    gemm_nt_portable(M, N, K, A, lda, B, ldb, C, ldc);
}

namespace {

// GCC vector extensions of W floats / int32 lanes (unaligned, aliasing loads):
// the argmin below needs compare+blend, which the auto-vectoriser will not
// produce from scalar code.
template <int W>
struct Lanes {
    typedef float F __attribute__((vector_size(W * 4)));
    typedef float FU __attribute__((vector_size(W * 4), aligned(4), may_alias));
    typedef int32_t I __attribute__((vector_size(W * 4)));
};

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

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
__attribute__((target("arch=x86-64-v3"))) size_t argmin_avx2(const float* ip,
                                                              const float* norms, size_t n)
{
    return argmin_impl<8>(ip, norms, n);
}
#endif

}  // namespace

size_t argmin_l2(const float* ip, const float* norms, size_t n)
{
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
    static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (avx2)
        return argmin_avx2(ip, norms, n);
#endif
    return argmin_impl<4>(ip, norms, n);
}

size_t checked_mul(size_t a, size_t b, const char* what)
{
    if (a != 0 && b > std::numeric_limits<size_t>::max() / a)
        throw Error(ErrorKind::InvalidArgument, std::string(what) + ": size overflows");
    return a * b;
}

}  // namespace gpuivfpq::detail
