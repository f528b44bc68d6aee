// GEMM-backed blocks (BLAS and the portable fallback) vs float64 references.
#include <cmath>
#include <atomic>
#include <thread>

#include "engine/parallel.h"

#include "test_util.h"

using namespace gpuivfpq;
using testutil::test_seed;

namespace {

struct Shape {
    size_t nx, ny, d;
};

// Edge cases of the blocking: single rows/columns, M % 4 != 0, N beyond one
// column block (128) and not a multiple of 16, K beyond one K block (256).
const Shape kShapes[] = {{1, 1, 1},     {1, 7, 3},      {5, 1, 17},   {37, 53, 17},
                         {64, 64, 128}, {3, 300, 784},  {130, 67, 33}, {2, 9, 1000},
                         {9, 1100, 520}, {258, 130, 257}};

// Checks out (nx x ny, stride ldc) against float64 dot products of x and y.
void expect_ip_block(const float* x, const float* y, const Shape& s, const float* out,
                     size_t ldc)
{
    for (size_t i = 0; i < s.nx; i++) {
        for (size_t j = 0; j < s.ny; j++) {
            const float* a = x + i * s.d;
            const float* b = y + j * s.d;
            double abs_sum = 0.0;
            for (size_t t = 0; t < s.d; t++)
                abs_sum += std::fabs(double(a[t]) * b[t]);
            ASSERT_NEAR(out[i * ldc + j], testutil::ip_ref(a, b, s.d),
                        (double(s.d) * 1.2e-7 + 1e-6) * abs_sum + 1e-30)
                << "i=" << i << " j=" << j;
        }
    }
}

}  // namespace

TEST(Gemm, InnerProductsMatchFloat64)
{
    const uint64_t seed = test_seed(201);
    for (const Shape& s : kShapes) {
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " nx=" << s.nx << " ny=" << s.ny
                                        << " d=" << s.d);
        const auto x = testutil::uniform_vectors(s.nx, s.d, seed + s.nx);
        const auto y = testutil::uniform_vectors(s.ny, s.d, seed + 1000 + s.ny);
        std::vector<float> out(s.nx * s.ny);
        inner_products(x.data(), s.nx, y.data(), s.ny, s.d, out.data());
        expect_ip_block(x.data(), y.data(), s, out.data(), s.ny);
    }
}

TEST(Gemm, L2PairwiseMatchesFloat64WithAndWithoutNorms)
{
    const uint64_t seed = test_seed(202);
    for (const Shape& s : kShapes) {
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " nx=" << s.nx << " ny=" << s.ny
                                        << " d=" << s.d);
        const auto x = testutil::uniform_vectors(s.nx, s.d, seed + s.nx);
        const auto y = testutil::uniform_vectors(s.ny, s.d, seed + 1000 + s.ny);
        std::vector<float> norms(s.ny), out1(s.nx * s.ny), out2(s.nx * s.ny);
        for (size_t j = 0; j < s.ny; j++)
            norms[j] = norm_sqr(y.data() + j * s.d, s.d);
        l2_sqr_pairwise(x.data(), s.nx, y.data(), s.ny, s.d, out1.data());
        l2_sqr_pairwise(x.data(), s.nx, y.data(), s.ny, s.d, out2.data(), norms.data());
        for (size_t i = 0; i < s.nx; i++) {
            for (size_t j = 0; j < s.ny; j++) {
                const float* a = x.data() + i * s.d;
                const float* b = y.data() + j * s.d;
                // The norms+GEMM form errs relative to ||a||^2 + ||b||^2.
                const double tol =
                    (double(s.d) * 2e-7 + 2e-6) * (testutil::ip_ref(a, a, s.d) +
                                                   testutil::ip_ref(b, b, s.d));
                const double ref = testutil::l2_ref(a, b, s.d);
                ASSERT_NEAR(out1[i * s.ny + j], ref, tol) << "i=" << i << " j=" << j;
                ASSERT_EQ(out1[i * s.ny + j], out2[i * s.ny + j]);
            }
        }
    }
}

TEST(Gemm, L2PairwiseClampsAtZero)
{
    const uint64_t seed = test_seed(203);
    SCOPED_TRACE(testing::Message() << "seed=" << seed);
    const auto x = testutil::uniform_vectors(50, 61, seed, 100.0f, 101.0f);
    std::vector<float> out(50 * 50);
    l2_sqr_pairwise(x.data(), 50, x.data(), 50, 61, out.data());
    for (size_t i = 0; i < 50; i++) {
        for (size_t j = 0; j < 50; j++)
            ASSERT_GE(out[i * 50 + j], 0.0f);
        // Only cancellation error is left on the diagonal (|x|^2 ~ 6e5).
        const double n2 = testutil::ip_ref(x.data() + i * 61, x.data() + i * 61, 61);
        EXPECT_LE(out[i * 50 + i], 2.0 * n2 * (61 * 2e-7 + 2e-6));
    }
}

TEST(Gemm, PortableKernelMatchesFloat64WithStrides)
{
    const uint64_t seed = test_seed(204);
    for (const Shape& s : kShapes) {
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " nx=" << s.nx << " ny=" << s.ny
                                        << " d=" << s.d);
        // Pad every leading dimension so strided access is exercised.
        const size_t lda = s.d + 3, ldb = s.d + 5, ldc = s.ny + 2;
        const auto xa = testutil::uniform_vectors(s.nx, lda, seed + s.nx);
        const auto yb = testutil::uniform_vectors(s.ny, ldb, seed + 77 + s.ny);
        std::vector<float> out(s.nx * ldc, -12345.0f);
        detail::gemm_nt_portable(s.nx, s.ny, s.d, xa.data(), lda, yb.data(), ldb, out.data(),
                                 ldc);
        // Compact copies for the reference.
        std::vector<float> x(s.nx * s.d), y(s.ny * s.d);
        for (size_t i = 0; i < s.nx; i++)
            std::copy(xa.begin() + i * lda, xa.begin() + i * lda + s.d, x.begin() + i * s.d);
        for (size_t j = 0; j < s.ny; j++)
            std::copy(yb.begin() + j * ldb, yb.begin() + j * ldb + s.d, y.begin() + j * s.d);
        expect_ip_block(x.data(), y.data(), s, out.data(), ldc);
        for (size_t i = 0; i < s.nx; i++)
            for (size_t j = s.ny; j < ldc; j++)
                ASSERT_EQ(out[i * ldc + j], -12345.0f) << "wrote past N";
    }
}

TEST(Gemm, ForcedPortablePathAgreesWithDefault)
{
    const uint64_t seed = test_seed(205);
    SCOPED_TRACE(testing::Message() << "seed=" << seed << " blas=" << detail::gemm_uses_blas());
    std::printf("single-threaded GEMM here: %s\n",
                detail::gemm_uses_blas() ? "BLAS" : "portable kernel");
    const size_t nx = 70, ny = 90, d = 45;
    const auto x = testutil::uniform_vectors(nx, d, seed);
    const auto y = testutil::uniform_vectors(ny, d, seed + 1);
    std::vector<float> a(nx * ny), b(nx * ny);
    inner_products(x.data(), nx, y.data(), ny, d, a.data());
    {
        testutil::ScopedPortableGemm portable;
        EXPECT_FALSE(detail::gemm_uses_blas());
        inner_products(x.data(), nx, y.data(), ny, d, b.data());
    }
    for (size_t i = 0; i < nx * ny; i++)
        ASSERT_NEAR(a[i], b[i], 1e-5) << "i=" << i;
}

TEST(Gemm, ZeroInnerDimensionGivesZeros)
{
    std::vector<float> out(6, 7.0f);
    const float dummy = 1.0f;
    detail::gemm_nt(2, 3, 0, &dummy, 1, &dummy, 1, out.data(), 3);
    for (float v : out)
        EXPECT_EQ(v, 0.0f);
}

TEST(Gemm, ArgminL2FindsFirstMinimum)
{
    const uint64_t seed = test_seed(206);
    std::mt19937_64 gen(seed);
    for (size_t n : {1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 255, 256, 257, 1000}) {
        for (int variant = 0; variant < 3; variant++) {
            SCOPED_TRACE(testing::Message() << "seed=" << seed << " n=" << n
                                            << " variant=" << variant);
            // variant 0: continuous; 1: few levels (ties); 2: ties plus NaNs.
            std::vector<float> ip(n), norms(n);
            for (size_t j = 0; j < n; j++) {
                ip[j] = variant == 0 ? float(gen() % 100000) * 1e-4f : float(gen() % 3);
                norms[j] = variant == 0 ? float(gen() % 100000) * 1e-4f : float(gen() % 3);
                if (variant == 2 && gen() % 4 == 0)
                    ip[j] = std::nanf("");
            }
            size_t want = 0;
            float best = std::numeric_limits<float>::infinity();
            for (size_t j = 0; j < n; j++) {
                const float v = norms[j] - 2.0f * ip[j];
                if (v < best) {
                    best = v;
                    want = j;
                }
            }
            ASSERT_EQ(detail::argmin_l2(ip.data(), norms.data(), n), want);
        }
    }
}

TEST(Gemm, ConcurrentCallersGetCorrectResults)
{
    // Serial OpenBLAS returns wrong results when called from several threads
    // at once; the engine must hide that from a multi-threaded host. (Without
    // the engine's lock this fails in roughly half the runs on a busy 2-core
    // box: a race can only be caught when the threads really overlap.)
    const uint64_t seed = test_seed(207);
    SCOPED_TRACE(testing::Message() << "seed=" << seed << " blas=" << detail::gemm_uses_blas());
    const size_t nx = 16, ny = 64, d = 16, nthreads = 4, calls = 20000;
    std::vector<std::vector<float>> x(nthreads), want(nthreads);
    const auto y = testutil::uniform_vectors(ny, d, seed);
    for (size_t t = 0; t < nthreads; t++) {
        x[t] = testutil::uniform_vectors(nx, d, seed + 1 + t);
        want[t].resize(nx * ny);
        inner_products(x[t].data(), nx, y.data(), ny, d, want[t].data());
    }
    std::vector<size_t> bad(nthreads, 0);
    std::vector<std::thread> pool;
    std::atomic<size_t> ready{0};
    for (size_t t = 0; t < nthreads; t++)
        pool.emplace_back([&, t] {
            std::vector<float> out(nx * ny);
            // Start together so the calls really overlap.
            ready++;
            while (ready.load() < nthreads)
                std::this_thread::yield();
            for (size_t c = 0; c < calls; c++) {
                inner_products(x[t].data(), nx, y.data(), ny, d, out.data());
                bad[t] += out != want[t];
            }
        });
    for (auto& th : pool)
        th.join();
    for (size_t t = 0; t < nthreads; t++)
        EXPECT_EQ(bad[t], 0u) << "thread " << t;
}

TEST(Gemm, ParallelChunksAvoidBlas)
{
    EXPECT_FALSE(detail::in_parallel_region());
    std::atomic<int> inside{0}, blas{0};
    parallel_for(2, 2, [&](size_t, size_t) {
        inside += detail::in_parallel_region();
        blas += detail::gemm_uses_blas();
    });
    EXPECT_EQ(inside.load(), 2);
    EXPECT_EQ(blas.load(), 0);
    EXPECT_FALSE(detail::in_parallel_region());  // restored on the caller
    parallel_for(2, 1, [&](size_t, size_t) { EXPECT_FALSE(detail::in_parallel_region()); });
}
