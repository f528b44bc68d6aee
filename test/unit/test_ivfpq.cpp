// IvfPqModel: three-term ADC tables vs reconstructions, probes, encoding, errors.
#include <cmath>
#include <limits>

#include "engine/ivfpq.h"
#include "test_util.h"

using namespace gpuivfpq;
using testutil::test_seed;

namespace {

const Metric kMetrics[] = {Metric::L2, Metric::InnerProduct, Metric::Cosine};

// A small trained model on clustered data.
IvfPqModel small_model(Metric metric, size_t d, size_t lists, size_t m, const std::vector<float>& x,
                       size_t n, uint64_t seed)
{
    IvfPqModel model(d, lists, m, metric);
    IvfPqTrainParams p;
    p.seed = seed;
    p.threads = 2;
    p.iterations = 8;
    model.train(x.data(), n, p);
    return model;
}

// The distance the model's tables should reproduce for a reconstruction:
// L2 on the (normalised, for Cosine) query, -<q, rec> for IP.
double model_distance(Metric metric, const std::vector<float>& q, const float* rec, size_t d)
{
    if (metric == Metric::InnerProduct)
        return -testutil::ip_ref(q.data(), rec, d);
    return testutil::l2_ref(q.data(), rec, d);
}

}  // namespace

TEST(IvfPq, ListTablesEqualDistanceToReconstruction)
{
    const uint64_t seed = test_seed(601);
    const size_t d = 16, lists = 8, m = 4, n = 2000;
    const auto x = testutil::clustered_vectors(n, d, 10, 3.0f, seed);
    const auto queries = testutil::clustered_vectors(5, d, 10, 3.0f, seed + 1);
    for (Metric metric : kMetrics) {
        IvfPqModel model = small_model(metric, d, lists, m, x, n, seed);
        std::vector<int32_t> ids(n);
        std::vector<uint8_t> codes(n * m);
        model.encode(x.data(), n, ids.data(), codes.data(), nullptr, 2);
        for (bool pre : {false, true}) {
            SCOPED_TRACE(testing::Message() << "seed=" << seed << " metric="
                                            << testutil::metric_name(metric) << " d=" << d
                                            << " lists=" << lists << " m=" << m
                                            << " precomputed=" << pre);
            const bool used = model.precompute_tables(pre ? (size_t(1) << 30) : 0);
            EXPECT_EQ(used, pre && metric != Metric::InnerProduct);
            EXPECT_EQ(model.has_precomputed(), used);
            EXPECT_EQ(model.precomputed_bytes(), used ? lists * m * 256 * sizeof(float) : 0u);
            std::vector<float> table(m * 256), rec(d);
            for (size_t qi = 0; qi < 5; qi++) {
                IvfPqQuery query;
                model.prepare_query(queries.data() + qi * d, lists, query);
                ASSERT_EQ(query.lists.size(), lists);
                for (size_t probe = 0; probe < lists; probe++) {
                    float base;
                    model.list_table(query, probe, table.data(), &base);
                    const int32_t l = query.lists[probe];
                    for (size_t i = 0; i < n; i++) {
                        if (ids[i] != l)
                            continue;
                        const uint8_t* code = codes.data() + i * m;
                        model.reconstruct(l, code, rec.data());
                        const double ref = model_distance(metric, query.q, rec.data(), d);
                        const double got = base + adc_lookup(code, table.data(), m);
                        const double scale = testutil::ip_ref(query.q.data(), query.q.data(), d) +
                                             testutil::ip_ref(rec.data(), rec.data(), d) + 1.0;
                        ASSERT_NEAR(got, ref, 2e-6 * scale * d)
                            << "query " << qi << " list " << l << " vector " << i;
                    }
                }
            }
        }
    }
}

TEST(IvfPq, PrepareQueryOrdersProbesAndClampsNprobe)
{
    const uint64_t seed = test_seed(602);
    const size_t d = 8, lists = 20, m = 2, n = 1500;
    const auto x = testutil::clustered_vectors(n, d, 30, 4.0f, seed);
    for (Metric metric : kMetrics) {
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " metric="
                                        << testutil::metric_name(metric));
        IvfPqModel model = small_model(metric, d, lists, m, x, n, seed);
        const auto q = testutil::gaussian_vectors(1, d, seed + 5);
        IvfPqQuery all, few;
        model.prepare_query(q.data(), 1000, all);
        model.prepare_query(q.data(), 5, few);
        ASSERT_EQ(all.lists.size(), lists);
        ASSERT_EQ(few.lists.size(), 5u);
        ASSERT_EQ(all.term3.size(), m * 256);
        // Coarse distances are exact, ascending, and few = prefix of all.
        for (size_t i = 0; i < lists; i++) {
            const float* c = model.centroids().data() + size_t(all.lists[i]) * d;
            const double ref = metric == Metric::InnerProduct
                                   ? -testutil::ip_ref(all.q.data(), c, d)
                                   : testutil::l2_ref(all.q.data(), c, d);
            EXPECT_NEAR(all.coarse[i], ref, 1e-4 * (std::fabs(ref) + 1));
            if (i > 0)
                EXPECT_LE(all.coarse[i - 1], all.coarse[i]);
            if (i < 5)
                EXPECT_EQ(few.lists[i], all.lists[i]);
        }
        if (metric == Metric::Cosine)
            EXPECT_NEAR(testutil::ip_ref(all.q.data(), all.q.data(), d), 1.0, 1e-5);
        EXPECT_THROW(model.prepare_query(q.data(), 0, all), Error);
    }
}

TEST(IvfPq, EncodeAssignsNearestListWithRadius)
{
    const uint64_t seed = test_seed(603);
    const size_t d = 12, lists = 16, m = 3, n = 3000;
    const auto x = testutil::clustered_vectors(n, d, 16, 3.0f, seed);
    for (Metric metric : kMetrics) {
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " metric="
                                        << testutil::metric_name(metric));
        IvfPqModel model = small_model(metric, d, lists, m, x, n, seed);
        std::vector<int32_t> ids(n), ids2(n);
        std::vector<uint8_t> codes(n * m), codes2(n * m);
        std::vector<float> radius(n);
        model.encode(x.data(), n, ids.data(), codes.data(), radius.data(), 1);
        model.encode(x.data(), n, ids2.data(), codes2.data(), nullptr, 3);
        EXPECT_EQ(ids, ids2);  // small d: same kernels whatever the thread count
        EXPECT_EQ(codes, codes2);
        std::vector<float> v(d);
        for (size_t i = 0; i < n; i++) {
            std::copy(x.begin() + i * d, x.begin() + (i + 1) * d, v.begin());
            if (metric == Metric::Cosine)
                normalize_rows(v.data(), 1, d);
            double best = 1e30;
            for (size_t l = 0; l < lists; l++)
                best = std::min(best, testutil::l2_ref(v.data(), model.centroids().data() + l * d, d));
            const double mine =
                testutil::l2_ref(v.data(), model.centroids().data() + size_t(ids[i]) * d, d);
            ASSERT_NEAR(mine, best, 1e-4 * (best + 1)) << "i=" << i;
            ASSERT_NEAR(radius[i], std::sqrt(mine), 1e-4 * (std::sqrt(mine) + 1)) << "i=" << i;
        }
    }
}

TEST(IvfPq, LoadedModelEncodesIdentically)
{
    const uint64_t seed = test_seed(604);
    const size_t d = 8, lists = 6, m = 4, n = 800;
    SCOPED_TRACE(testing::Message() << "seed=" << seed);
    const auto x = testutil::gaussian_vectors(n, d, seed);
    IvfPqModel a = small_model(Metric::L2, d, lists, m, x, n, seed);
    IvfPqModel b(d, lists, m, Metric::L2);
    b.set_centroids(a.centroids().data());
    b.set_codebooks(a.pq().codebooks().data());
    std::vector<int32_t> ia(n), ib(n);
    std::vector<uint8_t> ca(n * m), cb(n * m);
    a.encode(x.data(), n, ia.data(), ca.data());
    b.encode(x.data(), n, ib.data(), cb.data());
    EXPECT_EQ(ia, ib);
    EXPECT_EQ(ca, cb);
    // Loading new parameters drops stale precomputed tables.
    ASSERT_TRUE(b.precompute_tables(size_t(1) << 20));
    b.set_codebooks(a.pq().codebooks().data());
    EXPECT_FALSE(b.has_precomputed());
    ASSERT_TRUE(b.precompute_tables(size_t(1) << 20));
    b.set_centroids(a.centroids().data());
    EXPECT_FALSE(b.has_precomputed());
}

TEST(IvfPq, TrainsWithFewerVectorsThanLists)
{
    const uint64_t seed = test_seed(605);
    SCOPED_TRACE(testing::Message() << "seed=" << seed);
    const size_t d = 4, lists = 10, m = 2, n = 3;
    const auto x = testutil::gaussian_vectors(n, d, seed);
    IvfPqModel model = small_model(Metric::L2, d, lists, m, x, n, seed);
    for (float v : model.centroids())
        ASSERT_TRUE(std::isfinite(v));
    std::vector<int32_t> ids(n);
    std::vector<uint8_t> codes(n * m);
    std::vector<float> rec(d);
    model.encode(x.data(), n, ids.data(), codes.data());
    for (size_t i = 0; i < n; i++) {
        model.reconstruct(ids[i], codes.data() + i * m, rec.data());
        EXPECT_NEAR(testutil::l2_ref(rec.data(), x.data() + i * d, d), 0.0, 1e-6);
    }
}

TEST(IvfPq, PrecomputeRespectsByteLimit)
{
    IvfPqModel model(8, 4, 2, Metric::L2);
    const size_t need = 4 * 2 * 256 * sizeof(float);
    EXPECT_FALSE(model.precompute_tables(need - 1));
    EXPECT_FALSE(model.has_precomputed());
    EXPECT_TRUE(model.precompute_tables(need));
    EXPECT_EQ(model.precomputed_bytes(), need);
    EXPECT_FALSE(model.precompute_tables(0));
    EXPECT_EQ(model.precomputed_bytes(), 0u);
}

TEST(IvfPq, RejectsBadArguments)
{
    EXPECT_THROW(IvfPqModel(10, 4, 3, Metric::L2), Error);  // d % m != 0
    EXPECT_THROW(IvfPqModel(8, 0, 2, Metric::L2), Error);
    EXPECT_THROW(IvfPqModel(0, 4, 1, Metric::L2), Error);
    EXPECT_THROW(IvfPqModel(8, 4, 2, Metric(9)), Error);
    IvfPqModel model(8, 4, 2, Metric::L2);
    const std::vector<float> x(8, 1.0f);
    IvfPqTrainParams p;
    EXPECT_THROW(model.train(x.data(), 0, p), Error);
    IvfPqQuery q;
    model.prepare_query(x.data(), 2, q);
    std::vector<float> table(2 * 256);
    float base;
    EXPECT_THROW(model.list_table(q, 2, table.data(), &base), Error);
    const uint8_t code[2] = {0, 0};
    float out[8];
    EXPECT_THROW(model.reconstruct(4, code, out), Error);
    EXPECT_THROW(model.reconstruct(-1, code, out), Error);
    IvfPqModel other(16, 4, 2, Metric::L2);
    EXPECT_THROW(other.list_table(q, 0, table.data(), &base), Error);  // foreign query
}

// Rows and queries near the float range: training leaves every centroid
// and codeword finite, every row gets a list, a query's lists are all
// probed (those whose distance overflowed after the others), and the ADC
// distances are numbers or the overflow mark, never NaN or +inf. Whether
// a query is short enough to rank is decided by its squared norm.
TEST(IvfPq, HugeValuesTrainAndRank)
{
    const uint64_t seed = test_seed(611);
    const size_t d = 4, lists = 6, m = 2;
    const float big = std::numeric_limits<float>::max();
    std::vector<float> x = testutil::gaussian_vectors(300, d, seed);
    const std::vector<float> far = {big, -big, 1, 1, 3e38f, 0, 0, 0, 1e20f, 1e20f, 1e20f, 1e20f,
                                    -2e19f, 5, 5, 5, 0, 0, -big, big};
    x.insert(x.end(), far.begin(), far.end());
    const size_t n = x.size() / d;
    for (Metric metric : kMetrics) {
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " metric=" << testutil::metric_name(metric));
        IvfPqModel model = small_model(metric, d, lists, m, x, n, seed);
        for (float v : model.centroids())
            ASSERT_TRUE(std::isfinite(v));
        for (float v : model.pq().codebooks())
            ASSERT_TRUE(std::isfinite(v));
        std::vector<int32_t> ids(n);
        std::vector<uint8_t> codes(n * m);
        model.encode(x.data(), n, ids.data(), codes.data());
        for (int32_t l : ids)
            ASSERT_TRUE(l >= 0 && size_t(l) < lists);
        for (size_t qi : {size_t(0), n - 6, n - 5, n - 4, n - 1}) {
            IvfPqQuery prepared;
            model.prepare_query(x.data() + qi * d, lists, prepared);
            ASSERT_EQ(prepared.lists.size(), lists);
            std::vector<float> table(m * kPqCentroids), out(n);
            for (size_t p = 0; p < lists; p++) {
                float base = 0;
                model.list_table(prepared, p, table.data(), &base);
                adc_scan(codes.data(), n, m, table.data(), m, base, out.data());
                for (float v : out)
                    ASSERT_TRUE(!std::isnan(v) && v != std::numeric_limits<float>::infinity()) << v;
            }
        }
    }
    const float ranked[] = {1e18f, -1e18f, 1e18f, 0};
    const float unranked[] = {2e19f, 0, 0, 0};
    EXPECT_TRUE(ivfpq_ranks_query(ranked, d));
    EXPECT_FALSE(ivfpq_ranks_query(unranked, d));
}
