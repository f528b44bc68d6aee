// Exact k-NN (GEMM + fused k-selection) against the CPU engine's brute force.
#include <algorithm>
#include <cmath>

#include "engine/distances.h"
#include "gpu_ivfpq/exact_search.h"
#include "gpu_test_util.h"

using namespace gputest;
using gpuivfpq::Metric;

namespace {

double true_dist(Metric metric, const float* a, const float* b, size_t d)
{
    double ab = 0, aa = 0, bb = 0, l2 = 0;
    for (size_t i = 0; i < d; ++i) {
        ab += double(a[i]) * b[i];
        aa += double(a[i]) * a[i];
        bb += double(b[i]) * b[i];
        l2 += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    }
    if (metric == Metric::L2)
        return l2;
    if (metric == Metric::InnerProduct)
        return -ab;
    return aa > 0 && bb > 0 ? 1.0 - ab / std::sqrt(aa * bb) : 1.0;
}

// GPU results equal the CPU's up to ties: sorted distances agree within tol,
// and every GPU label's true distance is no worse than the CPU's k-th + tol.
void compare_knn(Metric metric, const std::vector<float>& q, size_t nq, const std::vector<float>& x,
                 size_t n, size_t d, size_t k, size_t tile_bytes, const std::string& what)
{
    SCOPED_TRACE(what);
    std::vector<float> cd(nq * k);
    std::vector<int64_t> cl(nq * k);
    gpuivfpq::brute_force_knn(q.data(), nq, x.data(), n, d, metric, k, cd.data(), cl.data());
    DeviceBuffer dq = to_device(q), dx = to_device(x);
    DeviceBuffer dd(ctx(), nq * k * sizeof(float)), dl(ctx(), nq * k * sizeof(int64_t));
    gpuivfpq::gpu::exact_knn(ctx(), dq.as<float>(), nq, dx.as<float>(), n, d, metric, k,
                             dd.as<float>(), dl.as<int64_t>(), nullptr, tile_bytes);
    auto gd = to_host<float>(dd, nq * k);
    auto gl = to_host<int64_t>(dl, nq * k);
    int bad = 0;
    for (size_t i = 0; i < nq && bad < 5; ++i) {
        const double kth = cd[i * k + std::min(k, n) - 1];
        for (size_t j = 0; j < k; ++j) {
            const float c = cd[i * k + j], g = gd[i * k + j];
            if (j >= n) {
                if (!(std::isinf(g) && gl[i * k + j] == -1)) {
                    ADD_FAILURE() << "query " << i << " rank " << j << " not padded";
                    ++bad;
                }
                continue;
            }
            const double tol = 1e-4 * (1.0 + std::fabs(c)) + 1e-5 * d;
            if (std::fabs(double(c) - g) > tol) {
                ADD_FAILURE() << "query " << i << " rank " << j << ": cpu " << c << " gpu " << g;
                ++bad;
                break;
            }
            const int64_t lab = gl[i * k + j];
            if (lab < 0 || size_t(lab) >= n) {
                ADD_FAILURE() << "query " << i << " rank " << j << ": bad label " << lab;
                ++bad;
                break;
            }
            const double td = true_dist(metric, q.data() + i * d, x.data() + lab * d, d);
            if (td > kth + tol) {
                ADD_FAILURE() << "query " << i << " rank " << j << ": label " << lab << " at " << td
                              << " beyond the cpu k-th " << kth;
                ++bad;
                break;
            }
        }
    }
}

}  // namespace

TEST(ExactSearch, MatchesCpuOnRandomShapes)
{
    GPU_REQUIRE_DEVICE();
    uint64_t s = seed(505);
    std::mt19937_64 g(s);
    for (int trial = 0; trial < 18; ++trial) {
        const Metric metric = static_cast<Metric>(trial % 3);
        const size_t d = std::vector<size_t>{3, 17, 32, 128}[g() % 4];
        const size_t n = 1 + g() % 6000;
        const size_t nq = 1 + g() % 200;
        const size_t k = std::vector<size_t>{1, 10, 100, 300}[g() % 4];
        auto x = uniform(n * d, s + 2 * trial);
        auto q = uniform(nq * d, s + 2 * trial + 1);
        compare_knn(metric, q, nq, x, n, d, k, 0,
                    shape("exact", {{"metric", double(trial % 3)}, {"d", double(d)}, {"n", double(n)},
                                    {"nq", double(nq)}, {"k", double(k)}},
                          s + 2 * trial));
    }
}

TEST(ExactSearch, TiledMatchesCpu)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(606);
    const size_t n = 20000, nq = 300, d = 64;
    auto x = clustered(n, d, 50, 3.0f, s);
    auto q = clustered(nq, d, 50, 3.0f, s + 1);
    // 64 KiB tiles: many query and base tiles, the running top-k carried over.
    for (size_t k : {1, 10, 100})
        for (Metric metric : {Metric::L2, Metric::InnerProduct})
            compare_knn(metric, q, nq, x, n, d, k, 1 << 16,
                        shape("tiled", {{"k", double(k)}, {"metric", double(int(metric))}}, s));
}

TEST(ExactSearch, LargeKAndFewBase)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(707);
    auto x = uniform(500 * 8, s);
    auto q = uniform(20 * 8, s + 1);
    compare_knn(Metric::L2, q, 20, x, 500, 8, 2048, 0, shape("k > n", {{"k", 2048}}, s));
    compare_knn(Metric::L2, q, 20, x, 500, 8, 1024, 0, shape("k > n", {{"k", 1024}}, s));
}

// The radix selection (set_radix_select) of one tile of few queries, the
// coarse step of small batches: the CPU's answers, and the default
// selection's keys bit for bit.
TEST(ExactSearch, RadixSelectionSameKeys)
{
    GPU_REQUIRE_DEVICE();
    struct Reset {
        ~Reset() { gpuivfpq::gpu::set_radix_select(ctx(), true); }  // the default
    } reset;
    uint64_t s = seed(808);
    std::mt19937_64 g(s);
    for (int trial = 0; trial < 16; ++trial) {
        const Metric metric = static_cast<Metric>(trial % 3);
        const size_t d = std::vector<size_t>{3, 32, 128}[g() % 3];
        const size_t n = std::vector<size_t>{5, 700, 4096, 9000, 40000}[g() % 5];
        const size_t nq = 1 + g() % 40;
        const size_t k = std::vector<size_t>{2, 10, 100, 256}[g() % 4];
        auto x = clustered(n, d, 20, 3.0f, s + 2 * trial);
        auto q = clustered(nq, d, 20, 3.0f, s + 2 * trial + 1);
        const std::string what = shape("radix", {{"metric", double(trial % 3)}, {"d", double(d)}, {"n", double(n)},
                                                 {"nq", double(nq)}, {"k", double(k)}},
                                       s + 2 * trial);
        DeviceBuffer dq = to_device(q), dx = to_device(x);
        std::vector<float> keys[2];
        for (int radix = 0; radix < 2; radix++) {
            gpuivfpq::gpu::set_radix_select(ctx(), radix != 0);
            DeviceBuffer dd(ctx(), nq * k * sizeof(float)), dl(ctx(), nq * k * sizeof(int32_t));
            gpuivfpq::gpu::exact_knn_i32(ctx(), dq.as<float>(), nq, dx.as<float>(), n, d, metric, k, dd.as<float>(),
                                         dl.as<int32_t>());
            keys[radix] = to_host<float>(dd, nq * k);
            if (radix)
                compare_knn(metric, q, nq, x, n, d, k, 0, what);
        }
        for (size_t i = 0; i < nq * k; i++)
            ASSERT_EQ(keys[0][i], keys[1][i]) << what << ": entry " << i;
    }
}
