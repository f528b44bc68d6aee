// Single-pair distances, normalisation and metric_distance vs float64 references.
#include <cmath>
#include <limits>

#include "test_util.h"

using namespace gpuivfpq;
using testutil::test_seed;

namespace {

const size_t kDims[] = {1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 100, 128, 784, 1000};

// Float rounding bound for a d-term sum whose terms have absolute sum s.
double sum_tol(size_t d, double s)
{
    return (double(d) * 1.2e-7 + 1e-6) * s + 1e-30;
}

}  // namespace

TEST(Distances, PairKernelsMatchFloat64)
{
    const uint64_t seed = test_seed(101);
    for (size_t d : kDims) {
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " d=" << d);
        const auto a = testutil::uniform_vectors(20, d, seed + d, -3.0f, 3.0f);
        const auto b = testutil::uniform_vectors(20, d, seed + 7 * d, -3.0f, 3.0f);
        for (size_t i = 0; i < 20; i++) {
            const float* x = a.data() + i * d;
            const float* y = b.data() + i * d;
            double abs_ip = 0.0, sq = testutil::l2_ref(x, y, d);
            for (size_t t = 0; t < d; t++)
                abs_ip += std::fabs(double(x[t]) * y[t]);
            EXPECT_NEAR(l2_sqr(x, y, d), sq, sum_tol(d, sq));
            EXPECT_NEAR(inner_product(x, y, d), testutil::ip_ref(x, y, d), sum_tol(d, abs_ip));
            const double nx = testutil::ip_ref(x, x, d);
            EXPECT_NEAR(norm_sqr(x, d), nx, sum_tol(d, nx));
            EXPECT_EQ(l2_sqr(x, x, d), 0.0f);
        }
    }
}

TEST(Distances, MetricDistanceAllMetrics)
{
    const uint64_t seed = test_seed(102);
    for (size_t d : kDims) {
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " d=" << d);
        const auto a = testutil::gaussian_vectors(10, d, seed + d);
        const auto b = testutil::gaussian_vectors(10, d, seed + 3 * d);
        for (size_t i = 0; i < 10; i++) {
            const float* x = a.data() + i * d;
            const float* y = b.data() + i * d;
            const double scale = std::sqrt(testutil::ip_ref(x, x, d) * testutil::ip_ref(y, y, d));
            EXPECT_NEAR(metric_distance(Metric::L2, x, y, d),
                        testutil::metric_ref(Metric::L2, x, y, d),
                        sum_tol(d, testutil::l2_ref(x, y, d)));
            EXPECT_NEAR(metric_distance(Metric::InnerProduct, x, y, d),
                        testutil::metric_ref(Metric::InnerProduct, x, y, d), sum_tol(d, scale));
            EXPECT_NEAR(metric_distance(Metric::Cosine, x, y, d),
                        testutil::metric_ref(Metric::Cosine, x, y, d), 1e-5);
        }
    }
}

TEST(Distances, CosineOfZeroVectorIsOne)
{
    const float zero[4] = {0, 0, 0, 0}, v[4] = {1, 2, 3, 4};
    EXPECT_EQ(metric_distance(Metric::Cosine, zero, v, 4), 1.0f);
    EXPECT_EQ(metric_distance(Metric::Cosine, v, zero, 4), 1.0f);
    EXPECT_EQ(metric_distance(Metric::Cosine, zero, zero, 4), 1.0f);
    EXPECT_NEAR(metric_distance(Metric::Cosine, v, v, 4), 0.0f, 1e-6);
}

TEST(Distances, NormalizeRows)
{
    const uint64_t seed = test_seed(103);
    for (size_t d : kDims) {
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " d=" << d);
        auto x = testutil::gaussian_vectors(8, d, seed + d);
        std::fill(x.begin() + 3 * d, x.begin() + 4 * d, 0.0f);  // a zero row
        const auto orig = x;
        normalize_rows(x.data(), 8, d);
        for (size_t i = 0; i < 8; i++) {
            const double n = testutil::ip_ref(x.data() + i * d, x.data() + i * d, d);
            if (i == 3) {
                EXPECT_EQ(n, 0.0);
                continue;
            }
            EXPECT_NEAR(n, 1.0, 1e-5);
            // Same direction as before.
            EXPECT_NEAR(testutil::metric_ref(Metric::Cosine, x.data() + i * d,
                                             orig.data() + i * d, d),
                        0.0, 1e-6);
        }
    }
}

// Rows whose squared norm overflows float or leaves its normal range still
// get their direction (scaled by a power of two first); others keep their
// bits.
TEST(Distances, NormalizeExtremeRows)
{
    for (float scale : {1e19f, 1e30f, 5e37f, 1e-20f, 1e-30f, 1e-40f}) {
        std::vector<float> v = {1.0f * scale, 2.0f * scale, -2.0f * scale, 4.0f * scale};
        gpuivfpq::normalize_rows(v.data(), 1, 4);
        double n = 0;
        for (float x : v)
            n += double(x) * x;
        EXPECT_NEAR(n, 1.0, 1e-5) << "scale " << scale;
        EXPECT_NEAR(v[0], 0.2f, 1e-5) << "scale " << scale;  // 1 / 5
        EXPECT_NEAR(v[3], 0.8f, 1e-5) << "scale " << scale;
    }
    std::vector<float> zero(5, 0.0f);
    gpuivfpq::normalize_rows(zero.data(), 1, 5);
    for (float x : zero)
        EXPECT_EQ(x, 0.0f);
    // An ordinary row: exactly 1 / ||v|| times each, as before.
    std::vector<float> v = {3.0f, 4.0f};
    gpuivfpq::normalize_rows(v.data(), 1, 2);
    EXPECT_EQ(v[0], 3.0f * (1.0f / 5.0f));
    EXPECT_EQ(v[1], 4.0f * (1.0f / 5.0f));
}
