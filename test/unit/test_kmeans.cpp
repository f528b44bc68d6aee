// k-means: cluster recovery, degenerate inputs, determinism; assign_nearest vs naive.
#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/kmeans.h"
#include "test_util.h"

using namespace gpuivfpq;
using testutil::test_seed;

namespace {

// `clusters` centres spaced far apart (grid-like, 50 units) with N(0,1) noise.
std::vector<float> separated_data(size_t n, size_t d, size_t clusters, uint64_t seed,
                                  std::vector<float>& centres)
{
    std::mt19937_64 gen(seed);
    std::normal_distribution<float> g(0.0f, 1.0f);
    centres.assign(clusters * d, 0.0f);
    for (size_t c = 0; c < clusters; c++)
        for (size_t t = 0; t < d; t++)
            centres[c * d + t] = 50.0f * float((c >> t) & 1) + 100.0f * float(c) * (t == 0);
    std::vector<float> x(n * d);
    for (size_t i = 0; i < n; i++)
        for (size_t t = 0; t < d; t++)
            x[i * d + t] = centres[(i % clusters) * d + t] + g(gen);
    return x;
}

}  // namespace

TEST(KMeans, RecoversWellSeparatedClusters)
{
    const uint64_t seed = test_seed(401);
    const size_t n = 3000, d = 8, k = 12;
    for (int threads : {1, 2}) {
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " n=" << n << " d=" << d
                                        << " k=" << k << " threads=" << threads);
        std::vector<float> centres;
        const auto x = separated_data(n, d, k, seed, centres);
        KMeansParams p;
        p.iterations = 25;
        p.seed = seed;
        p.threads = threads;
        std::vector<float> cent(k * d);
        kmeans_train(x.data(), n, d, k, p, cent.data());
        // Every true centre has a learnt centroid within noise distance.
        std::vector<int> used(k, 0);
        for (size_t c = 0; c < k; c++) {
            double best = 1e30;
            size_t arg = 0;
            for (size_t j = 0; j < k; j++) {
                const double dd = testutil::l2_ref(centres.data() + c * d, cent.data() + j * d, d);
                if (dd < best) {
                    best = dd;
                    arg = j;
                }
            }
            EXPECT_LT(best, 0.5) << "centre " << c;
            used[arg]++;
        }
        for (size_t j = 0; j < k; j++)
            EXPECT_EQ(used[j], 1) << "centroid " << j;
    }
}

TEST(KMeans, FewerPointsThanCentroids)
{
    const uint64_t seed = test_seed(402);
    const size_t n = 5, d = 3, k = 9;
    SCOPED_TRACE(testing::Message() << "seed=" << seed << " n=" << n << " k=" << k);
    const auto x = testutil::uniform_vectors(n, d, seed);
    KMeansParams p;
    p.seed = seed;
    std::vector<float> cent(k * d);
    kmeans_train(x.data(), n, d, k, p, cent.data());
    for (size_t i = 0; i < n * d; i++)
        EXPECT_EQ(cent[i], x[i]);
    for (size_t c = n; c < k; c++) {
        bool is_point = false;
        for (size_t i = 0; i < n; i++)
            is_point |= std::equal(x.begin() + i * d, x.begin() + (i + 1) * d,
                                   cent.begin() + c * d);
        EXPECT_TRUE(is_point) << "centroid " << c;
    }
    // n == k: exactly the points.
    std::vector<float> cent2(n * d);
    kmeans_train(x.data(), n, d, n, p, cent2.data());
    EXPECT_EQ(cent2, x);
}

TEST(KMeans, IdenticalPointsStayFinite)
{
    const size_t n = 500, d = 5, k = 16;
    std::vector<float> x(n * d);
    for (size_t i = 0; i < n; i++)
        for (size_t t = 0; t < d; t++)
            x[i * d + t] = float(t) - 2.0f;  // includes a zero coordinate
    for (float scale : {1.0f, 0.0f}) {  // also the all-zero data set
        SCOPED_TRACE(testing::Message() << "scale=" << scale);
        std::vector<float> xs(x);
        for (float& v : xs)
            v *= scale;
        KMeansParams p;
        p.iterations = 20;
        std::vector<float> cent(k * d);
        kmeans_train(xs.data(), n, d, k, p, cent.data());
        for (size_t c = 0; c < k; c++)
            for (size_t t = 0; t < d; t++) {
                ASSERT_TRUE(std::isfinite(cent[c * d + t]));
                EXPECT_NEAR(cent[c * d + t], xs[t], 0.05);
            }
    }
}

TEST(KMeans, DeterministicForSeedAndThreads)
{
    const uint64_t seed = test_seed(403);
    // d = 10 takes the small-d kernel, d = 24 the GEMM path.
    for (size_t d : {10, 24}) {
        const size_t n = 4000, k = 32;
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " n=" << n << " d=" << d
                                        << " k=" << k);
        const auto x = testutil::clustered_vectors(n, d, 20, 2.0f, seed);
        KMeansParams p;
        p.seed = seed;
        p.max_points_per_centroid = 64;  // forces the subsample path (n > 32*64)
        std::vector<float> cent[2][2];
        for (int threads : {1, 2}) {
            p.threads = threads;
            for (int rep = 0; rep < 2; rep++) {
                cent[threads - 1][rep].resize(k * d);
                kmeans_train(x.data(), n, d, k, p, cent[threads - 1][rep].data());
            }
            EXPECT_EQ(cent[threads - 1][0], cent[threads - 1][1]) << "threads=" << threads;
        }
        // One thread vs two may differ by GEMM rounding (BLAS vs the portable
        // kernel) but must reach an equally good clustering.
        auto objective = [&](const std::vector<float>& c) {
            std::vector<int32_t> as(n);
            std::vector<float> dist(n);
            assign_nearest(x.data(), n, c.data(), k, d, as.data(), dist.data());
            double s = 0;
            for (float v : dist)
                s += v;
            return s / double(n);
        };
        const double o1 = objective(cent[0][0]), o2 = objective(cent[1][0]);
        EXPECT_NEAR(o1, o2, 0.02 * o1);
        std::vector<float> other(k * d);
        p.seed = seed + 1;
        kmeans_train(x.data(), n, d, k, p, other.data());
        EXPECT_NE(cent[1][0], other);
    }
}

TEST(KMeans, ImprovesOverInitialisation)
{
    // Lloyd iterations never increase the objective; after 10 it must be
    // clearly below the random-init objective (iterations = 0).
    const uint64_t seed = test_seed(404);
    const size_t n = 5000, d = 16, k = 50;
    SCOPED_TRACE(testing::Message() << "seed=" << seed);
    const auto x = testutil::clustered_vectors(n, d, 50, 3.0f, seed);
    auto objective = [&](const std::vector<float>& cent) {
        std::vector<int32_t> as(n);
        std::vector<float> dist(n);
        assign_nearest(x.data(), n, cent.data(), k, d, as.data(), dist.data());
        double s = 0;
        for (float v : dist)
            s += v;
        return s / double(n);
    };
    KMeansParams p;
    p.seed = seed;
    p.iterations = 0;
    std::vector<float> c0(k * d), c10(k * d);
    kmeans_train(x.data(), n, d, k, p, c0.data());
    p.iterations = 10;
    kmeans_train(x.data(), n, d, k, p, c10.data());
    const double o0 = objective(c0), o10 = objective(c10);
    std::printf("k-means objective: init %.3f -> 10 iterations %.3f\n", o0, o10);
    EXPECT_LT(o10, 0.8 * o0);
}

TEST(KMeans, AssignNearestMatchesNaive)
{
    const uint64_t seed = test_seed(405);
    struct Case {
        size_t n, k, d;
    };
    for (const Case& cs : {Case{1000, 37, 17}, Case{50, 5000, 4}, Case{2100, 256, 8},
                           Case{3, 1, 1}}) {
        for (int threads : {1, 2}) {
            SCOPED_TRACE(testing::Message() << "seed=" << seed << " n=" << cs.n << " k=" << cs.k
                                            << " d=" << cs.d << " threads=" << threads);
            const auto x = testutil::uniform_vectors(cs.n, cs.d, seed + cs.n);
            const auto c = testutil::uniform_vectors(cs.k, cs.d, seed + cs.k);
            std::vector<int32_t> as(cs.n);
            std::vector<float> dist(cs.n);
            assign_nearest(x.data(), cs.n, c.data(), cs.k, cs.d, as.data(), dist.data(), threads);
            for (size_t i = 0; i < cs.n; i++) {
                double best = 1e30;
                for (size_t j = 0; j < cs.k; j++)
                    best = std::min(best, testutil::l2_ref(x.data() + i * cs.d,
                                                           c.data() + j * cs.d, cs.d));
                ASSERT_GE(as[i], 0);
                ASSERT_LT(size_t(as[i]), cs.k);
                const double mine = testutil::l2_ref(x.data() + i * cs.d,
                                                     c.data() + size_t(as[i]) * cs.d, cs.d);
                // GEMM rounding may swap near-ties only.
                ASSERT_NEAR(mine, best, 1e-5 * double(cs.d)) << "i=" << i;
                ASSERT_NEAR(dist[i], mine, 1e-5 * (mine + 1e-3)) << "i=" << i;
            }
        }
    }
}

TEST(KMeans, RejectsBadArguments)
{
    const float x[4] = {1, 2, 3, 4};
    float c[4];
    int32_t a[2];
    KMeansParams p;
    EXPECT_THROW(kmeans_train(x, 0, 2, 1, p, c), Error);
    EXPECT_THROW(kmeans_train(x, 2, 2, 0, p, c), Error);
    EXPECT_THROW(kmeans_train(x, 2, 0, 1, p, c), Error);
    p.iterations = -1;
    EXPECT_THROW(kmeans_train(x, 2, 2, 1, p, c), Error);
    EXPECT_THROW(assign_nearest(x, 2, c, 0, 2, a, nullptr), Error);
    EXPECT_THROW(assign_nearest(x, 2, c, 1, 0, a, nullptr), Error);
}

// Points near the float range: their squared distances overflow float, the
// k-means++ weights with them; the seeding still starts from the far points
// (each becomes a centroid of its own) and every centroid stays finite,
// also where splitting an empty cluster would step past the range.
TEST(KMeans, HugeValuesGiveFiniteCentroids)
{
    const size_t d = 4, small = 200, k = 12;
    const float big = std::numeric_limits<float>::max();
    std::vector<float> x;
    std::mt19937_64 gen(test_seed(612));
    std::normal_distribution<float> g(0.0f, 1.0f);
    for (size_t i = 0; i < small; i++)
        for (size_t t = 0; t < d; t++)
            x.push_back(g(gen));
    const std::vector<std::vector<float>> far = {
        {big, 0, 0, 0}, {-big, 0, 0, 0}, {0, big, -big, 0}, {3e38f, 3e38f, 3e38f, 3e38f}, {1e20f, 0, 0, 0}};
    for (const auto& v : far)
        x.insert(x.end(), v.begin(), v.end());
    const size_t n = x.size() / d;
    KMeansParams p;
    p.iterations = 10;
    std::vector<float> cent(k * d);
    kmeans_train(x.data(), n, d, k, p, cent.data());
    for (float v : cent)
        ASSERT_TRUE(std::isfinite(v));
    // Every far point is a centroid (nothing else is near it).
    for (const auto& v : far) {
        bool found = false;
        for (size_t c = 0; c < k && !found; c++)
            found = std::equal(v.begin(), v.end(), cent.begin() + c * d);
        EXPECT_TRUE(found) << v[0] << "," << v[1] << "," << v[2] << "," << v[3];
    }
    // Splits at the edge of the range stop at it.
    Rng rng(1);
    std::vector<float> b = {big, -big, 1.0f, 0.0f}, e(d);
    split_centroid(b.data(), e.data(), d, 1e38f, rng);
    for (size_t t = 0; t < d; t++) {
        EXPECT_TRUE(std::isfinite(b[t]));
        EXPECT_TRUE(std::isfinite(e[t]));
    }
    std::vector<float> bad = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                              std::nanf(""), 2.0f};
    clamp_to_finite(bad.data(), bad.size());
    EXPECT_EQ(bad, (std::vector<float>{big, -big, 0.0f, 2.0f}));
}
