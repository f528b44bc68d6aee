// TopK against std::sort (with ties), and brute_force_knn against a naive scan.
#include <algorithm>
#include <cmath>
#include <set>

#include "engine/topk.h"
#include "test_util.h"

using namespace gpuivfpq;
using testutil::test_seed;

namespace {

// The k smallest of (dists[i], i) under neighbor_less, by full sort.
std::vector<Neighbor> sorted_prefix(const std::vector<float>& dists, size_t k)
{
    std::vector<Neighbor> all;
    for (size_t i = 0; i < dists.size(); i++)
        all.push_back({dists[i], int64_t(i)});
    std::sort(all.begin(), all.end(), neighbor_less);
    all.resize(std::min(k, all.size()));
    return all;
}

}  // namespace

TEST(TopK, MatchesSortForManyKWithTies)
{
    const uint64_t seed = test_seed(301);
    std::mt19937_64 gen(seed);
    const size_t n = 1000;
    for (size_t k : {1, 2, 3, 5, 10, 64, 100, 999, 1000, 1500}) {
        for (int variant = 0; variant < 2; variant++) {
            SCOPED_TRACE(testing::Message() << "seed=" << seed << " n=" << n << " k=" << k
                                            << " ties=" << (variant == 0));
            // variant 0: values from 16 levels (many ties); 1: continuous.
            std::vector<float> dists(n);
            for (float& v : dists)
                v = variant == 0 ? float(gen() % 16) : float(gen() % 1000000) * 1e-3f;
            const auto want = sorted_prefix(dists, k);

            TopK one(k), range(k);
            // Push in a shuffled order: the result must not depend on order.
            std::vector<size_t> order(n);
            for (size_t i = 0; i < n; i++)
                order[i] = i;
            std::shuffle(order.begin(), order.end(), gen);
            for (size_t i : order)
                one.push(dists[i], int64_t(i));
            range.push_range(dists.data(), 400, 0);
            range.push_range(dists.data() + 400, n - 400, 400);
            EXPECT_EQ(one.size(), std::min(k, n));
            if (k <= n)
                EXPECT_EQ(one.threshold(), want.back().dist);
            else
                EXPECT_TRUE(std::isinf(one.threshold()));

            for (TopK* h : {&one, &range}) {
                const auto got = h->take_sorted();
                ASSERT_EQ(got.size(), want.size());
                for (size_t r = 0; r < got.size(); r++) {
                    ASSERT_EQ(got[r].dist, want[r].dist) << "rank " << r;
                    ASSERT_EQ(got[r].label, want[r].label) << "rank " << r;
                }
                EXPECT_EQ(h->size(), 0u);
            }
        }
    }
}

TEST(TopK, ThresholdAndNaN)
{
    TopK h(2);
    EXPECT_TRUE(std::isinf(h.threshold()));
    h.push(std::nanf(""), 5);
    h.push(3.0f, 1);
    EXPECT_EQ(h.threshold(), std::numeric_limits<float>::infinity());  // NaN ranks as +inf
    h.push(1.0f, 2);
    EXPECT_EQ(h.threshold(), 3.0f);
    h.push(3.0f, 0);  // same distance, smaller label: wins the tie
    const auto got = h.take_sorted();
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(got[0].label, 2);
    EXPECT_EQ(got[1].label, 0);
}

TEST(TopK, RejectsZeroK)
{
    EXPECT_THROW(TopK(0), Error);
}

namespace {

// Checks one metric's brute force on (n, nq, d, k) against float64 distances:
// per-rank distances agree within tol, labels are distinct, and each returned
// label is truly within tol of the k-th best distance.
void check_brute_force(Metric metric, size_t n, size_t nq, size_t d, size_t k, uint64_t seed)
{
    SCOPED_TRACE(testing::Message() << "seed=" << seed << " metric="
                                    << testutil::metric_name(metric) << " n=" << n
                                    << " nq=" << nq << " d=" << d << " k=" << k);
    const auto base = testutil::gaussian_vectors(n, d, seed);
    const auto q = testutil::gaussian_vectors(nq, d, seed + 1);
    std::vector<float> dist(nq * k);
    std::vector<int64_t> label(nq * k);
    brute_force_knn(q.data(), nq, base.data(), n, d, metric, k, dist.data(), label.data());
    const double tol = metric == Metric::Cosine ? 1e-5 : 1e-4 * double(d);
    for (size_t i = 0; i < nq; i++) {
        std::vector<double> ref(n);
        for (size_t j = 0; j < n; j++)
            ref[j] = testutil::metric_ref(metric, q.data() + i * d, base.data() + j * d, d);
        std::vector<double> sorted = ref;
        std::sort(sorted.begin(), sorted.end());
        std::set<int64_t> seen;
        for (size_t r = 0; r < k; r++) {
            const float got = dist[i * k + r];
            const int64_t lab = label[i * k + r];
            if (r >= n) {
                ASSERT_EQ(lab, -1);
                ASSERT_TRUE(std::isinf(got) && got > 0);
                continue;
            }
            ASSERT_GE(lab, 0);
            ASSERT_LT(size_t(lab), n);
            ASSERT_TRUE(seen.insert(lab).second) << "duplicate label " << lab;
            ASSERT_NEAR(got, sorted[r], tol) << "query " << i << " rank " << r;
            ASSERT_NEAR(ref[size_t(lab)], sorted[r], 2 * tol) << "query " << i << " rank " << r;
            if (r > 0)
                ASSERT_LE(dist[i * k + r - 1], got);
        }
    }
}

}  // namespace

TEST(BruteForce, MatchesNaiveAllMetrics)
{
    const uint64_t seed = test_seed(311);
    for (Metric metric : {Metric::L2, Metric::InnerProduct, Metric::Cosine}) {
        check_brute_force(metric, 5000, 300, 24, 10, seed);  // > one tile each way
        check_brute_force(metric, 40, 3, 7, 50, seed + 1);   // k > n: padding
        check_brute_force(metric, 1, 1, 1, 1, seed + 2);
    }
}

TEST(BruteForce, PortableGemmPath)
{
    testutil::ScopedPortableGemm portable;
    check_brute_force(Metric::L2, 3000, 40, 33, 7, test_seed(312));
}

TEST(BruteForce, ExactDuplicatesTieByLabel)
{
    // Four identical base vectors: all at the same distance, smaller labels first.
    const float base[4 * 2] = {1, 1, 1, 1, 1, 1, 1, 1};
    const float q[2] = {0, 0};
    float dist[3];
    int64_t label[3];
    brute_force_knn(q, 1, base, 4, 2, Metric::L2, 3, dist, label);
    EXPECT_EQ(label[0], 0);
    EXPECT_EQ(label[1], 1);
    EXPECT_EQ(label[2], 2);
    EXPECT_EQ(dist[0], 2.0f);
}

TEST(BruteForce, RejectsBadArguments)
{
    const float v[2] = {0, 0};
    float dist[1];
    int64_t label[1];
    EXPECT_THROW(brute_force_knn(v, 1, v, 1, 2, Metric::L2, 0, dist, label), Error);
    EXPECT_THROW(brute_force_knn(v, 1, v, 1, 0, Metric::L2, 1, dist, label), Error);
    EXPECT_THROW(brute_force_knn(v, 1, v, 1, 2, Metric(7), 1, dist, label), Error);
}
