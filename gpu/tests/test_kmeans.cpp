// GPU k-means against the CPU engine: the same start for a seed, assignment,
// objective, empty clusters.
#include <cmath>
#include <cstring>

#include "engine/kmeans.h"
#include "gpu_ivfpq/ivfpq_index.h"
#include "gpu_ivfpq/kmeans_gpu.h"
#include "gpu_test_util.h"

using namespace gputest;
using gpuivfpq::Metric;

namespace {

double objective(const std::vector<float>& x, size_t n, size_t d, const std::vector<float>& c, size_t k)
{
    std::vector<int32_t> a(n);
    std::vector<float> dist(n);
    gpuivfpq::assign_nearest(x.data(), n, c.data(), k, d, a.data(), dist.data());
    double s = 0;
    for (float v : dist)
        s += v;
    return s;
}

}  // namespace

TEST(KMeansGpu, AssignmentMatchesCpu)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(1401);
    const size_t n = 20000, d = 24, k = 300;
    auto x = clustered(n, d, 50, 3.0f, s);
    auto c = clustered(k, d, 50, 3.0f, s + 1);
    std::vector<int32_t> ca(n), ga(n);
    std::vector<float> cd(n), gd(n);
    gpuivfpq::assign_nearest(x.data(), n, c.data(), k, d, ca.data(), cd.data());
    DeviceBuffer dx = to_device(x), dc = to_device(c);
    DeviceBuffer da(ctx(), n * 4), ddist(ctx(), n * 4);
    gpuivfpq::gpu::assign_nearest_gpu(ctx(), dx.as<float>(), n, dc.as<float>(), k, d, da.as<int32_t>(),
                                      ddist.as<float>());
    ga = to_host<int32_t>(da, n);
    gd = to_host<float>(ddist, n);
    size_t same = 0;
    for (size_t i = 0; i < n; ++i) {
        same += ca[i] == ga[i];
        ASSERT_NEAR(cd[i], gd[i], 1e-4 * (1 + cd[i])) << shape("assign", {{"i", double(i)}}, s);
    }
    EXPECT_GE(double(same) / n, 0.999) << shape("assign", {}, s);
}

TEST(KMeansGpu, ObjectiveComparableToCpu)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(1502);
    const size_t n = 30000, d = 16, k = 64;
    auto x = clustered(n, d, 64, 5.0f, s);
    gpuivfpq::KMeansParams p;
    p.iterations = 15;
    p.seed = s;
    std::vector<float> cc(k * d), gc(k * d);
    gpuivfpq::kmeans_train(x.data(), n, d, k, p, cc.data());
    gpuivfpq::gpu::KMeansGpuStats st;
    gpuivfpq::gpu::kmeans_train_gpu_host(ctx(), x.data(), n, d, k, p, gc.data(), &st);
    for (float v : gc)
        ASSERT_TRUE(std::isfinite(v));
    const double oc = objective(x, n, d, cc, k), og = objective(x, n, d, gc, k);
    // Same start (see SameStartAsCpuForASeed); float rounding in the
    // iterations and the GPU's rule of no split after the last may lead
    // elsewhere: allow 10%.
    EXPECT_LT(og, oc * 1.10) << shape("kmeans", {{"cpu", oc}, {"gpu", og}}, s);
    EXPECT_EQ(st.iterations, 15);
    EXPECT_GT(st.seconds_per_iteration, 0.0);
    // The reported objective is over the points used (a subsample), per point
    // about what the final centroids give on all points.
    EXPECT_NEAR(st.objective / st.points_used, og / n, 0.1 * og / n);
}

TEST(KMeansGpu, EmptyClustersAndFewPoints)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(1603);
    const size_t d = 8;
    // 200 points on 5 distinct locations, 12 centroids: clusters go empty
    // and are split from the largest; no NaN may appear.
    auto base = uniform(5 * d, s, -10.0f, 10.0f);
    std::vector<float> x;
    for (size_t i = 0; i < 200; ++i)
        x.insert(x.end(), base.begin() + (i % 5) * d, base.begin() + (i % 5 + 1) * d);
    gpuivfpq::KMeansParams p;
    p.iterations = 5;
    p.seed = s;
    std::vector<float> c(12 * d);
    gpuivfpq::gpu::KMeansGpuStats st;
    gpuivfpq::gpu::kmeans_train_gpu_host(ctx(), x.data(), 200, d, 12, p, c.data(), &st);
    for (float v : c)
        ASSERT_TRUE(std::isfinite(v));
    EXPECT_LT(objective(x, 200, d, c, 12), 1e-3);
    // Fewer points than centroids.
    std::vector<float> c2(20 * d);
    gpuivfpq::gpu::kmeans_train_gpu_host(ctx(), x.data(), 7, d, 20, p, c2.data(), &st);
    for (float v : c2)
        ASSERT_TRUE(std::isfinite(v));
    EXPECT_LT(objective(x, 7, d, c2, 20), 1e-3);
}

TEST(KMeansGpu, SameStartAsCpuForASeed)
{
    // No iterations: the centroids are the initial rows, which must be the
    // CPU's for the same seed, bit for bit (the draws are the engine's; the
    // k-means++ distances are one fma chain on both sides).
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(1704);
    struct Case {
        size_t n, d, k, mppc;
    };
    for (const Case& c : {Case{7, 8, 20, 256},      // fewer points than centroids
                          Case{3000, 9, 50, 256},   // k-means++ on all points
                          Case{20000, 16, 64, 16},  // subsample, then k-means++
                          Case{40000, 4, 1000, 8},  // subsample, then random rows
                          Case{6000, 3, 2048, 256}}) {  // random rows on all points
        const std::string what = shape("start", {{"n", double(c.n)}, {"d", double(c.d)},
                                                 {"k", double(c.k)}, {"mppc", double(c.mppc)}}, s);
        SCOPED_TRACE(what);
        auto x = clustered(c.n, c.d, 30, 4.0f, s + c.n);
        gpuivfpq::KMeansParams p;
        p.iterations = 0;
        p.seed = s;
        p.max_points_per_centroid = c.mppc;
        std::vector<float> cc(c.k * c.d), gc(c.k * c.d);
        gpuivfpq::kmeans_train(x.data(), c.n, c.d, c.k, p, cc.data());
        gpuivfpq::gpu::kmeans_train_gpu_host(ctx(), x.data(), c.n, c.d, c.k, p, gc.data());
        size_t differ = 0;
        for (size_t j = 0; j < c.k; ++j)
            differ += std::memcmp(cc.data() + j * c.d, gc.data() + j * c.d, c.d * sizeof(float)) != 0;
        EXPECT_EQ(differ, 0u) << "initial centroids that differ from the CPU's";
    }
}

TEST(KMeansGpu, IvfPqTrainingSameStartAsCpu)
{
    // train_ivfpq_gpu with no iterations starts from the CPU's rows: the
    // coarse centroids equal IvfPqModel::train's bit for bit, and so do the
    // codebooks where every PQ row goes to the same list on both sides (the
    // residuals are then equal too).
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(1805);
    const size_t n = 6000, d = 32, lists = 24, m = 8;
    auto x = clustered(n, d, 40, 4.0f, s);
    gpuivfpq::IvfPqTrainParams tp;
    tp.iterations = 0;
    tp.seed = s;
    tp.pq_max_training = 5000;
    gpuivfpq::IvfPqModel model(d, lists, m, Metric::L2);
    model.train(x.data(), n, tp);
    std::vector<float> cents(lists * d), cbs(m * 256 * (d / m));
    gpuivfpq::gpu::train_ivfpq_gpu(ctx(), x.data(), n, d, lists, m, Metric::L2, tp, cents.data(),
                                   cbs.data());
    ASSERT_EQ(std::memcmp(cents.data(), model.centroids().data(), cents.size() * sizeof(float)), 0)
        << shape("coarse start", {}, s);
    // The PQ rows' lists on both sides.
    const auto rows = gpuivfpq::ivfpq_training_rows(n, lists, tp.seed, tp.max_points_per_centroid,
                                                    tp.pq_max_training);
    std::vector<float> px;
    for (size_t r : rows.pq)
        px.insert(px.end(), x.begin() + r * d, x.begin() + (r + 1) * d);
    const size_t np = rows.pq.size();
    std::vector<int32_t> ca(np);
    gpuivfpq::assign_nearest(px.data(), np, cents.data(), lists, d, ca.data(), nullptr);
    DeviceBuffer dpx = to_device(px), dc = to_device(cents), da(ctx(), np * sizeof(int32_t));
    gpuivfpq::gpu::assign_nearest_gpu(ctx(), dpx.as<float>(), np, dc.as<float>(), lists, d,
                                      da.as<int32_t>(), nullptr);
    if (to_host<int32_t>(da, np) != ca)
        GTEST_SKIP() << "a PQ row is a near-tie between two lists (GEMM rounding): codebooks not "
                        "comparable; " << shape("pq start", {}, s);
    const auto& want = model.pq().codebooks();
    size_t differ = 0;
    for (size_t e = 0; e < want.size(); e += d / m)
        differ += std::memcmp(want.data() + e, cbs.data() + e, (d / m) * sizeof(float)) != 0;
    EXPECT_EQ(differ, 0u) << "PQ centroids that differ from the CPU's; " << shape("pq start", {}, s);
}
