// GPU k-means against the CPU engine: assignment, objective, empty clusters.
#include <cmath>

#include "gpu_ivfpq/kmeans_gpu.h"
#include "gpu_test_util.h"
#include "kmeans.h"

using namespace gputest;

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
    // Different seeding (the CPU may use k-means++): allow 10% either way.
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
