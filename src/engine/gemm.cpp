// The engine's one GEMM shape (C = A B^T, both row-major) over BLAS or a
// portable register-blocked kernel.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <climits>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "internal.h"

#ifdef GPU_IVFPQ_HAVE_CBLAS
#include <cblas.h>
#endif

namespace gpuivfpq::detail {

namespace {

std::atomic<bool> g_force_portable{false};

#ifdef GPU_IVFPQ_HAVE_CBLAS
// Debian's serial OpenBLAS is built without locking: concurrent calls from
// several threads share its packing buffers and return wrong results
// (reproduced: ~3% of concurrent sgemm calls differ). So parallel_for chunks
// use the portable kernel, and this lock guards the remaining BLAS calls
// against a host that calls the engine from several threads.
std::mutex g_blas_mutex;
#endif

// Register-blocked micro-kernel: MR rows of A times one packed panel of
// 2*W columns of B^T (kb x 2W floats), accumulated in MR x 2 vectors; written
// to C (or added, for later K blocks), only the first ncols columns.
template <int W, int MR>
inline __attribute__((always_inline)) void micro_kernel(const float* A, size_t lda,
                                                        const float* panel, size_t kb, float* C,
                                                        size_t ldc, size_t ncols, bool add)
{
    typedef typename Lanes<W>::F F;
    typedef typename Lanes<W>::FU FU;
    F acc[MR][2];
    for (int r = 0; r < MR; r++)
        acc[r][0] = acc[r][1] = F{};
    for (size_t k = 0; k < kb; k++) {
        const F b0 = *reinterpret_cast<const FU*>(panel + k * 2 * W);
        const F b1 = *reinterpret_cast<const FU*>(panel + k * 2 * W + W);
        for (int r = 0; r < MR; r++) {
            const float a = A[r * lda + k];
            acc[r][0] += a * b0;
            acc[r][1] += a * b1;
        }
    }
    for (int r = 0; r < MR; r++) {
        float* c = C + r * ldc;
        if (ncols == size_t(2 * W)) {
            FU* c0 = reinterpret_cast<FU*>(c);
            FU* c1 = reinterpret_cast<FU*>(c + W);
            *c0 = add ? F(*c0) + acc[r][0] : acc[r][0];
            *c1 = add ? F(*c1) + acc[r][1] : acc[r][1];
        } else {
            float tmp[2 * W];
            *reinterpret_cast<FU*>(tmp) = acc[r][0];
            *reinterpret_cast<FU*>(tmp + W) = acc[r][1];
            for (size_t j = 0; j < ncols; j++)
                c[j] = add ? c[j] + tmp[j] : tmp[j];
        }
    }
}

// Blocked GEMM (C = A B^T): blocks of B^T (KB x NB) are packed into panels of
// 2*W columns that stay in L2, and every 4-row group of A sweeps them.
template <int W>
inline __attribute__((always_inline)) void gemm_blocked(size_t M, size_t N, size_t K,
                                                        const float* A, size_t lda,
                                                        const float* B, size_t ldb, float* C,
                                                        size_t ldc)
{
    constexpr size_t NR = 2 * W, KB = 256, NB = 128;
    std::vector<float> packed(KB * NB);
    for (size_t j0 = 0; j0 < N; j0 += NB) {
        const size_t nb = std::min(NB, N - j0), npanels = (nb + NR - 1) / NR;
        for (size_t k0 = 0; k0 < K; k0 += KB) {
            const size_t kb = std::min(KB, K - k0);
            for (size_t p = 0; p < npanels; p++) {
                float* panel = packed.data() + p * kb * NR;
                for (size_t c = 0; c < NR; c++) {
                    const size_t col = j0 + p * NR + c;
                    const float* src = B + col * ldb + k0;
                    for (size_t k = 0; k < kb; k++)
                        panel[k * NR + c] = col < N ? src[k] : 0.0f;
                }
            }
            const bool add = k0 > 0;
            for (size_t i0 = 0; i0 < M; i0 += 4) {
                const size_t mr = std::min<size_t>(4, M - i0);
                const float* a = A + i0 * lda + k0;
                for (size_t p = 0; p < npanels; p++) {
                    const float* panel = packed.data() + p * kb * NR;
                    float* c = C + i0 * ldc + j0 + p * NR;
                    const size_t nc = std::min(NR, nb - p * NR);
                    switch (mr) {
                    case 4: micro_kernel<W, 4>(a, lda, panel, kb, c, ldc, nc, add); break;
                    case 3: micro_kernel<W, 3>(a, lda, panel, kb, c, ldc, nc, add); break;
                    case 2: micro_kernel<W, 2>(a, lda, panel, kb, c, ldc, nc, add); break;
                    default: micro_kernel<W, 1>(a, lda, panel, kb, c, ldc, nc, add); break;
                    }
                }
            }
        }
    }
}

#if GPU_IVFPQ_X86_DISPATCH
__attribute__((target("arch=x86-64-v3"))) void gemm_blocked_avx2(size_t M, size_t N, size_t K,
                                                                  const float* A, size_t lda,
                                                                  const float* B, size_t ldb,
                                                                  float* C, size_t ldc)
{
    gemm_blocked<8>(M, N, K, A, lda, B, ldb, C, ldc);
}
#endif

}  // namespace

void gemm_nt_portable(size_t M, size_t N, size_t K, const float* A, size_t lda, const float* B,
                      size_t ldb, float* C, size_t ldc)
{
    if (M == 0 || N == 0)
        return;
    if (K == 0) {
        for (size_t i = 0; i < M; i++)
            std::fill(C + i * ldc, C + i * ldc + N, 0.0f);
        return;
    }
#if GPU_IVFPQ_X86_DISPATCH
    if (cpu_has_avx2()) {
        gemm_blocked_avx2(M, N, K, A, lda, B, ldb, C, ldc);
        return;
    }
#endif
    gemm_blocked<4>(M, N, K, A, lda, B, ldb, C, ldc);
}

#ifdef GPU_IVFPQ_HAVE_CBLAS
namespace {

// Whether OpenBLAS runs an AVX2-class kernel here, or our portable kernel
// cannot do better. OpenBLAS 0.3.21 falls back to its SSE3 "Prescott" kernel
// on CPUs it does not know (measured on a Sapphire Rapids VM: 3x slower than
// the portable AVX2 kernel), so then the portable kernel is used instead. A
// per-machine rule, not a timing, keeps results deterministic.
bool blas_kernel_is_fast()
{
#if defined(OPENBLAS_VERSION) && GPU_IVFPQ_X86_DISPATCH
    static const bool fast = [] {
        if (!cpu_has_avx2())
            return true;
        const char* core = openblas_get_corename();
        std::string name = core ? core : "";
        for (char& ch : name)
            ch = char(std::tolower(static_cast<unsigned char>(ch)));
        for (const char* good : {"haswell", "skylake", "cooperlake", "sapphire", "zen"})
            if (name.find(good) != std::string::npos)
                return true;
        return false;
    }();
    return fast;
#else
    return true;
#endif
}

}  // namespace
#endif

bool gemm_uses_blas()
{
#ifdef GPU_IVFPQ_HAVE_CBLAS
    return !g_force_portable.load(std::memory_order_relaxed) && !in_parallel_region() &&
           blas_kernel_is_fast();
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
#ifdef GPU_IVFPQ_HAVE_CBLAS
    // cblas takes int dimensions: split M and N, fall back when strides overflow.
    const size_t kMaxDim = size_t(1) << 30;
    const size_t kIntMax = size_t(INT_MAX);
    if (gemm_uses_blas() && K >= 1 && K <= kIntMax && lda <= kIntMax && ldb <= kIntMax &&
        ldc <= kIntMax) {
        std::lock_guard<std::mutex> lock(g_blas_mutex);
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

}  // namespace gpuivfpq::detail
