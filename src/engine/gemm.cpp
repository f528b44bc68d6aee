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

GPU_IVFPQ_HOT
size_t argmin_l2(const float* ip, const float* norms, size_t n)
{
    // Pass 1: lane-wise minimum (vectorises; `v < m ? v : m` is exactly minps).
    constexpr size_t kLanes = 16;
    float mins[kLanes];
    for (size_t l = 0; l < kLanes; l++)
        mins[l] = std::numeric_limits<float>::infinity();
    size_t j = 0;
    for (; j + kLanes <= n; j += kLanes) {
        for (size_t l = 0; l < kLanes; l++) {
            const float v = norms[j + l] - 2.0f * ip[j + l];
            mins[l] = v < mins[l] ? v : mins[l];
        }
    }
    float best = std::numeric_limits<float>::infinity();
    for (; j < n; j++) {
        const float v = norms[j] - 2.0f * ip[j];
        best = v < best ? v : best;
    }
    for (size_t l = 0; l < kLanes; l++)
        best = mins[l] < best ? mins[l] : best;
    // Pass 2: the first index reaching it (2*ip is exact, so recomputing v
    // gives the same bits whether or not the compiler fused it).
    for (j = 0; j < n; j++)
        if (norms[j] - 2.0f * ip[j] == best)
            return j;
    return 0;  // all NaN: any answer is as good
}

size_t checked_mul(size_t a, size_t b, const char* what)
{
    if (a != 0 && b > std::numeric_limits<size_t>::max() / a)
        throw Error(ErrorKind::InvalidArgument, std::string(what) + ": size overflows");
    return a * b;
}

}  // namespace gpuivfpq::detail
