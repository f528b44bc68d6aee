// The RaBitQ list scan on the GPU against the CPU engine's
// (RabitqModel::scan): every estimate and bound bit for bit, for every
// metric, code widths 1 to 8, dimensions with and without plane padding
// (100, 128) and a sentence-embedding size (768, whose tables need more
// than 48 KiB of shared memory), many (query, list) pairs in one launch;
// then the argument checks.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "engine/distances.h"
#include "engine/rabitq.h"
#include "gpu_ivfpq/rabitq_scan.h"
#include "gpu_test_util.h"

using namespace gputest;
using gpuivfpq::ErrorKind;
using gpuivfpq::Metric;
using gpuivfpq::RabitqFactors;
using gpuivfpq::RabitqListQuery;
using gpuivfpq::RabitqModel;
using gpuivfpq::RabitqQuery;
using gpuivfpq::RabitqRotation;
using gpuivfpq::gpu::RabitqPair;

namespace {

// Rows encoded with `bits` bits against `lists` centroids (rows of the set),
// sorted by list; queries scanned over their `probes` nearest lists on both
// engines.
void check_scan(size_t d, int bits, Metric metric, uint64_t s)
{
    const size_t n = d >= 512 ? 400 : 1500, lists = 12, nq = 5, probes = 4;
    const float eps0 = gpuivfpq::kRabitqDefaultEps0;
    std::vector<float> x = clustered(n, d, 8, 3.0f, s);
    std::vector<float> q = clustered(nq, d, 8, 3.0f, s + 1);
    RabitqModel model(d, lists, bits, metric, RabitqRotation::generate(d, s, 4));
    std::vector<float> cent(x.begin(), x.begin() + lists * d);
    if (metric == Metric::Cosine)
        gpuivfpq::normalize_rows(cent.data(), lists, d);
    model.set_centroids(cent.data());
    std::vector<int32_t> list_ids(n);
    model.assign(x.data(), n, list_ids.data(), 4);
    // Rows by list (stable), so that each list is a contiguous range.
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return list_ids[a] < list_ids[b]; });
    std::vector<float> xs(n * d);
    std::vector<int32_t> ls(n);
    for (size_t i = 0; i < n; i++) {
        std::copy(x.begin() + order[i] * d, x.begin() + (order[i] + 1) * d, xs.begin() + i * d);
        ls[i] = list_ids[order[i]];
    }
    const size_t cb = model.code_bytes();
    std::vector<uint8_t> codes(n * cb);
    std::vector<RabitqFactors> factors(n);
    model.encode(xs.data(), n, ls.data(), codes.data(), factors.data(), 4);
    std::vector<size_t> first(lists + 1, 0);
    for (size_t i = 0; i < n; i++)
        first[ls[i] + 1]++;
    for (size_t l = 0; l < lists; l++)
        first[l + 1] += first[l];

    // The CPU's estimates, pair by pair; the GPU's in one launch.
    std::vector<RabitqPair> pairs;
    std::vector<float> luts, want_est, want_bound;
    for (size_t i = 0; i < nq; i++) {
        RabitqQuery query;
        model.prepare_query(q.data() + i * d, query);
        for (int32_t l : model.probe_lists(query, probes)) {
            RabitqListQuery lq;
            model.prepare_list(query, l, lq);
            const size_t count = first[l + 1] - first[l];
            pairs.push_back(gpuivfpq::gpu::rabitq_pair(lq, first[l], uint32_t(count), want_est.size()));
            luts.insert(luts.end(), lq.lut.begin(), lq.lut.end());
            std::vector<float> e(count), b(count);
            model.scan(lq, codes.data() + first[l] * cb, cb, factors.data() + first[l], count, eps0, e.data(),
                       b.data());
            want_est.insert(want_est.end(), e.begin(), e.end());
            want_bound.insert(want_bound.end(), b.begin(), b.end());
        }
    }
    DeviceBuffer dpairs = to_device(pairs), dluts = to_device(luts), dcodes = to_device(codes);
    DeviceBuffer dfactors = to_device(factors);
    DeviceBuffer dest(ctx(), want_est.size() * sizeof(float)), dbound(ctx(), want_est.size() * sizeof(float));
    gpuivfpq::gpu::rabitq_scan(ctx(), dpairs.as<RabitqPair>(), pairs.size(), dluts.as<float>(), d, bits,
                               dcodes.as<uint8_t>(), cb, dfactors.as<RabitqFactors>(), eps0, dest.as<float>(),
                               dbound.as<float>());
    const std::vector<float> est = to_host<float>(dest, want_est.size());
    const std::vector<float> bound = to_host<float>(dbound, want_est.size());
    ASSERT_GT(want_est.size(), 0u);
    for (size_t i = 0; i < want_est.size(); i++) {
        ASSERT_EQ(bits_of(est[i]), bits_of(want_est[i])) << "estimate " << i << ": " << est[i] << " vs "
                                                         << want_est[i];
        ASSERT_EQ(bits_of(bound[i]), bits_of(want_bound[i])) << "bound " << i;
    }
    // Without bounds: the same estimates.
    dest.fill_zero();
    gpuivfpq::gpu::rabitq_scan(ctx(), dpairs.as<RabitqPair>(), pairs.size(), dluts.as<float>(), d, bits,
                               dcodes.as<uint8_t>(), cb, dfactors.as<RabitqFactors>(), eps0, dest.as<float>(),
                               nullptr);
    const std::vector<float> est2 = to_host<float>(dest, want_est.size());
    for (size_t i = 0; i < want_est.size(); i++)
        ASSERT_EQ(bits_of(est2[i]), bits_of(want_est[i])) << "estimate " << i << " (no bounds)";
}

}  // namespace

TEST(RabitqScan, SameBitsAsCpu)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(4401);
    for_each_rabitq_shape("rabitq scan", s, {1, 2, 4, 7, 8},
                          [s](size_t d, int bits, Metric metric) { check_scan(d, bits, metric, s); });
}

TEST(RabitqScan, SentenceEmbeddingSize)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(4402);
    for (int bits : {4, 7}) {
        SCOPED_TRACE(shape("rabitq scan 768", {{"bits", double(bits)}}, s));
        check_scan(768, bits, Metric::Cosine, s);
    }
}

TEST(RabitqScan, ArgumentChecks)
{
    GPU_REQUIRE_DEVICE();
    DeviceBuffer b(ctx(), 1 << 16);
    const auto p = b.as<RabitqPair>();
    const auto f = b.as<float>();
    const auto c = b.as<uint8_t>();
    const auto fa = b.as<RabitqFactors>();
    auto call = [&](size_t d, int bits, size_t stride, float eps0) {
        return kind_of([&] { gpuivfpq::gpu::rabitq_scan(ctx(), p, 1, f, d, bits, c, stride, fa, eps0, f, nullptr); });
    };
    EXPECT_EQ(call(0, 4, 64, 1.9f), ErrorKind::InvalidArgument);
    EXPECT_EQ(call(gpuivfpq::kRabitqMaxDims + 1, 4, 4096, 1.9f), ErrorKind::InvalidArgument);
    EXPECT_EQ(call(128, 0, 64, 1.9f), ErrorKind::InvalidArgument);
    EXPECT_EQ(call(128, 9, 256, 1.9f), ErrorKind::InvalidArgument);
    EXPECT_EQ(call(128, 4, 63, 1.9f), ErrorKind::InvalidArgument);  // shorter than a code
    EXPECT_EQ(call(128, 4, 66, 1.9f), ErrorKind::InvalidArgument);  // not a multiple of 4
    EXPECT_EQ(call(128, 4, 64, -1.0f), ErrorKind::InvalidArgument);
    // No pairs: nothing to do, whatever the pointers.
    gpuivfpq::gpu::rabitq_scan(ctx(), nullptr, 0, nullptr, 128, 4, nullptr, 64, nullptr, 1.9f, nullptr, nullptr);
}
