// Engine-internal helpers shared by the engine's .cpp files (not a public API):
// the GEMM entry point, row argmin and checked sizes (the seeded RNG is
// public: sampling.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "error.h"

// Hot loops get an AVX2+FMA clone picked at load time, so the library stays
// runnable on any x86-64 without -march=native.
// (Not under ThreadSanitizer: its runtime crashes in ifunc resolvers.)
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && \
    !defined(__SANITIZE_THREAD__)
#define GPU_IVFPQ_HOT __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define GPU_IVFPQ_HOT
#endif

// Explicit AVX2+FMA variants of kernels written with vector extensions,
// chosen at run time (cpu_has_avx2), where target_clones cannot help.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define GPU_IVFPQ_X86_DISPATCH 1
#else
#define GPU_IVFPQ_X86_DISPATCH 0
#endif

namespace gpuivfpq::detail {

// GCC vector extensions of W floats / int32 lanes; FU is for unaligned,
// aliasing loads and stores through float pointers.
template <int W>
struct Lanes {
    typedef float F __attribute__((vector_size(W * 4)));
    typedef float FU __attribute__((vector_size(W * 4), aligned(4), may_alias));
    typedef int32_t I __attribute__((vector_size(W * 4)));
};

#if GPU_IVFPQ_X86_DISPATCH
// Whether this CPU runs the x86-64-v3 (AVX2 + FMA) kernel variants.
inline bool cpu_has_avx2()
{
    static const bool yes = [] {
        __builtin_cpu_init();  // harmless if libgcc's constructor already ran
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }();
    return yes;
}
#endif

// C[i*ldc + j] = sum_t A[i*lda + t] * B[j*ldb + t] for i < M, j < N (C = A B^T):
// cblas_sgemm (serialised by a lock) when gemm_uses_blas(), else the portable
// kernel. Results are deterministic for a given thread count; one thread and
// several may differ by float rounding.
void gemm_nt(size_t M, size_t N, size_t K, const float* A, size_t lda, const float* B,
             size_t ldb, float* C, size_t ldc);

// The portable register-blocked kernel behind gemm_nt (exposed so tests
// cover it even when BLAS is linked); thread-safe, unlike serial OpenBLAS.
void gemm_nt_portable(size_t M, size_t N, size_t K, const float* A, size_t lda, const float* B,
                      size_t ldb, float* C, size_t ldc);

// Whether the calling thread runs a chunk of a multi-threaded parallel_for.
bool in_parallel_region();

// Whether gemm_nt, called from this thread now, uses BLAS: only with BLAS
// built in, outside multi-threaded parallel_for chunks (serial OpenBLAS is
// not thread-safe), when OpenBLAS runs an AVX2-class kernel on this CPU (see
// gemm.cpp) and when not forced portable.
bool gemm_uses_blas();

// Routes gemm_nt through the portable loop process-wide (for tests).
void set_force_portable_gemm(bool on);

// Index of the smallest norms[j] - 2*ip[j] over j < n (first on ties), i.e.
// the L2-nearest row given the inner products of one query row; n >= 1.
size_t argmin_l2(const float* ip, const float* norms, size_t n);

// Codebook laid out for nearest_small: transposed (d x kpad, kpad = k
// rounded up to 64) with padding codewords at norm +inf.
struct SmallCodebook {
    size_t k = 0, d = 0, kpad = 0;
    std::vector<float> ct;     // ct[t * kpad + c] = centroid c, coordinate t
    std::vector<float> norms;  // kpad values, ||c||^2 (+inf for padding)
};

// Dimensions up to which nearest_small beats BLAS GEMM + argmin (BLAS is
// slow with a tiny inner dimension; measured on x86-64 with OpenBLAS).
constexpr size_t kSmallDimMax = 16;

SmallCodebook make_small_codebook(const float* centroids, size_t k, size_t d);

// out[i] = index of the L2-nearest codeword (first on ties) for each of the n
// rows of d floats at stride ldx.
void nearest_small(const float* x, size_t n, size_t ldx, const SmallCodebook& cb, int32_t* out);

// Nearest centroids past the float range. The float form norms - 2<x, c>
// ranks nothing once it overflows (every centroid +inf or NaN): the nearest
// of x (d floats) is then found in double precision over all k centroids
// (k x d; first on ties). nearest_or_exact returns chosen, the float
// argmin whose value (its norm minus twice the inner product) is value,
// unless that could be wrong: x past gpuivfpq::kMaxRankedNormSqr or value
// not finite.
size_t exact_nearest(const float* x, const float* centroids, size_t k, size_t d);
size_t nearest_or_exact(const float* x, const float* centroids, size_t k, size_t d, size_t chosen,
                        float value);

// a * b, throwing Error(InvalidArgument) with what on size_t overflow.
inline size_t checked_mul(size_t a, size_t b, const char* what)
{
    if (a != 0 && b > std::numeric_limits<size_t>::max() / a)
        throw Error(ErrorKind::InvalidArgument, std::string(what) + ": size overflows");
    return a * b;
}

}  // namespace gpuivfpq::detail
