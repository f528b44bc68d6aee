// The training randomness shared by the CPU engine and the GPU k-means: the
// generator's stream, the k-means start (subsample, initial rows) as
// kmeans_train uses it, and the IVFPQ training draws.
#include <algorithm>
#include <cstring>
#include <set>

#include "engine/ivfpq.h"
#include "engine/kmeans.h"
#include "engine/sampling.h"
#include "test_util.h"

using namespace gpuivfpq;
using testutil::test_seed;

namespace {

// The start the GPU k-means makes for params: the shared draws, with the
// k-means++ distances from a plain per-row seeding_distance (the GPU's
// kernel computes the same fma chain), returned as centroids.
std::vector<float> shared_start(const std::vector<float>& x, size_t n, size_t d, size_t k,
                                const KMeansParams& p)
{
    Rng rng(p.seed);
    const std::vector<size_t> sub = kmeans_subsample(n, k, p.max_points_per_centroid, rng);
    std::vector<float> data;
    if (sub.empty()) {
        data = x;
    } else {
        for (size_t r : sub)
            data.insert(data.end(), x.begin() + r * d, x.begin() + (r + 1) * d);
    }
    const size_t ns = data.size() / d;
    const std::vector<size_t> rows =
        kmeans_initial_rows(ns, k, rng, [&](size_t row, bool first, float* mind) {
            for (size_t i = 0; i < ns; i++) {
                const float v = seeding_distance(data.data() + i * d, data.data() + row * d, d);
                mind[i] = first ? v : std::min(mind[i], v);
            }
        });
    EXPECT_EQ(rows.size(), k);
    std::vector<float> out;
    for (size_t r : rows)
        out.insert(out.end(), data.begin() + r * d, data.begin() + (r + 1) * d);
    return out;
}

}  // namespace

TEST(Sampling, RngIsSplitmix64)
{
    // The reference splitmix64 stream for seed 0: the same on every platform.
    Rng rng(0);
    EXPECT_EQ(rng.next(), 0xE220A8397B1DCDAFULL);
    EXPECT_EQ(rng.next(), 0x6E789E6AA1B965F4ULL);
    EXPECT_EQ(rng.next(), 0x06C45D188009454FULL);
    Rng a(42), b(42);
    for (int i = 0; i < 100; i++) {
        const size_t x = a.below(1000);
        EXPECT_LT(x, 1000u);
        EXPECT_EQ(x, b.below(1000));
        const float u = a.unit();
        EXPECT_GE(u, 0.0f);
        EXPECT_LT(u, 1.0f);
        EXPECT_EQ(u, b.unit());
    }
}

TEST(Sampling, SampleIndicesDistinctAscending)
{
    const uint64_t seed = test_seed(601);
    for (size_t n : {10, 1000}) {
        for (size_t k : {size_t(0), size_t(1), n / 10, n / 2, n}) {
            SCOPED_TRACE(testing::Message() << "seed=" << seed << " n=" << n << " k=" << k);
            Rng rng(seed);
            const auto idx = sample_indices(n, k, rng);
            ASSERT_EQ(idx.size(), k);
            EXPECT_TRUE(std::is_sorted(idx.begin(), idx.end()));
            EXPECT_EQ(std::set<size_t>(idx.begin(), idx.end()).size(), k);
            if (k)
                EXPECT_LT(idx.back(), n);
        }
    }
    Rng rng(1);
    EXPECT_THROW(sample_indices(3, 4, rng), Error);
}

TEST(Sampling, SeedingDistanceIsSquaredL2)
{
    const uint64_t seed = test_seed(602);
    const size_t d = 37;
    const auto x = testutil::uniform_vectors(2, d, seed, -10.0f, 10.0f);
    const double ref = testutil::l2_ref(x.data(), x.data() + d, d);
    EXPECT_NEAR(seeding_distance(x.data(), x.data() + d, d), ref, 1e-5 * ref);
    // Integer coordinates: exact.
    const float a[3] = {1, -2, 3}, b[3] = {4, 2, 3};
    EXPECT_EQ(seeding_distance(a, b, 3), 25.0f);
    EXPECT_EQ(seeding_distance(a, a, 3), 0.0f);
}

TEST(Sampling, InitialRowsCases)
{
    const uint64_t seed = test_seed(603);
    const auto none = [](size_t, bool, float*) { FAIL() << "no k-means++ expected"; };
    {
        // Fewer points than centroids: all of them, then repeats.
        Rng rng(seed);
        const auto rows = kmeans_initial_rows(5, 9, rng, none);
        ASSERT_EQ(rows.size(), 9u);
        for (size_t c = 0; c < 5; c++)
            EXPECT_EQ(rows[c], c);
        for (size_t c = 5; c < 9; c++)
            EXPECT_LT(rows[c], 5u);
    }
    {
        // Past the k-means++ budget (ns * k > 2^22): k distinct random rows.
        Rng rng(seed);
        const auto rows = kmeans_initial_rows(100000, 100, rng, none);
        EXPECT_EQ(std::set<size_t>(rows.begin(), rows.end()).size(), 100u);
    }
    {
        // k-means++ on 4 far-apart groups of identical points: one row per group.
        const size_t ns = 400, d = 2, k = 4;
        std::vector<float> x(ns * d);
        for (size_t i = 0; i < ns; i++) {
            x[i * d] = 100.0f * float(i % 4);
            x[i * d + 1] = -50.0f * float(i % 4);
        }
        Rng rng(seed);
        size_t calls = 0;
        const auto rows = kmeans_initial_rows(ns, k, rng, [&](size_t row, bool first, float* mind) {
            EXPECT_EQ(first, calls == 0);
            calls++;
            for (size_t i = 0; i < ns; i++) {
                const float v = seeding_distance(x.data() + i * d, x.data() + row * d, d);
                mind[i] = first ? v : std::min(mind[i], v);
            }
        });
        EXPECT_EQ(calls, k - 1);  // no distances needed after the last pick
        std::set<size_t> groups;
        for (size_t r : rows)
            groups.insert(r % 4);
        EXPECT_EQ(groups.size(), k);
    }
}

TEST(Sampling, KMeansStartsFromTheSharedDraws)
{
    // kmeans_train with no iterations returns its initial centroids: they
    // must be what the shared draws give (what the GPU k-means starts from).
    const uint64_t seed = test_seed(604);
    struct Case {
        size_t n, d, k, mppc;
    };
    for (const Case& c : {Case{7, 8, 20, 256},      // fewer points than centroids
                          Case{3000, 9, 50, 256},   // k-means++ on all points
                          Case{20000, 16, 64, 16},  // subsample, then k-means++
                          Case{40000, 4, 1000, 8},  // subsample, then random rows
                          Case{6000, 3, 2048, 256}}) {  // random rows on all points
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " n=" << c.n << " d=" << c.d
                                        << " k=" << c.k << " mppc=" << c.mppc);
        const auto x = testutil::clustered_vectors(c.n, c.d, 30, 4.0f, seed + c.n);
        KMeansParams p;
        p.iterations = 0;
        p.seed = seed;
        p.max_points_per_centroid = c.mppc;
        for (int threads : {1, 2}) {
            p.threads = threads;
            std::vector<float> cent(c.k * c.d);
            kmeans_train(x.data(), c.n, c.d, c.k, p, cent.data());
            const auto want = shared_start(x, c.n, c.d, c.k, p);
            ASSERT_EQ(want.size(), cent.size());
            EXPECT_EQ(std::memcmp(want.data(), cent.data(), cent.size() * sizeof(float)), 0)
                << "threads=" << threads;
        }
    }
}

TEST(Sampling, IvfPqTrainingRows)
{
    const uint64_t seed = test_seed(605);
    const auto a = ivfpq_training_rows(10000, 16, seed, 64, 3000);
    const auto b = ivfpq_training_rows(10000, 16, seed, 64, 3000);
    EXPECT_EQ(a.coarse, b.coarse);
    EXPECT_EQ(a.pq, b.pq);
    EXPECT_EQ(a.coarse.size(), 16u * 64u);
    EXPECT_EQ(a.pq.size(), 3000u);
    EXPECT_TRUE(std::is_sorted(a.pq.begin(), a.pq.end()));
    // Fewer rows than the bounds: all of them.
    const auto c = ivfpq_training_rows(500, 16, seed, 64, 3000);
    EXPECT_EQ(c.coarse.size(), 500u);
    EXPECT_EQ(c.pq.size(), 500u);
    // The PQ seed of each sub-quantizer differs.
    const KMeansParams pq = ivfpq_pq_params(IvfPqTrainParams{}, 100);
    EXPECT_EQ(pq.max_points_per_centroid, 100u);
    EXPECT_NE(pq_subquantizer_seed(pq.seed, 0), pq_subquantizer_seed(pq.seed, 1));
}
