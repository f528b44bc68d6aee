// The one-launch search_exact of small batches (GpuIvfPqOptions::
// small_batch_max, gpu/src/small_search.cu) against the staged pipeline
// (the same index with the one-launch path off), the host's exact distance
// (check_exact) and the CPU engine's IVFADC: batches 1, 2, 31 and 64, every
// metric, code widths with 16-, 4- and 1-byte code loads, odd dimensions,
// k and nprobe up to the path's limit, key ranges, and the shapes that must
// keep the staged path.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "exact_fixture.h"
#include "gpu_ivfpq/ivfpq_index.h"
#include "gpu_test_util.h"

using namespace gputest;
using gpuivfpq::Metric;
using gpuivfpq::gpu::GpuIvfPqIndex;
using gpuivfpq::gpu::GpuIvfPqOptions;
using gpuivfpq::gpu::KeyRange;
using gpuivfpq::gpu::ScanAlgo;

namespace {

// The tests set small_batch_max to this (the default's value, set
// explicitly: the path's answers must not depend on where the dispatch
// switches).
constexpr size_t kForcedMax = 128;

const Metric kMetrics[] = {Metric::L2, Metric::InnerProduct, Metric::Cosine};

// The first nq queries of the fixture (rows repeat when nq > f.nq).
std::vector<float> first_queries(const ExactFixture& f, size_t nq)
{
    std::vector<float> q(nq * f.d);
    for (size_t i = 0; i < nq; ++i)
        std::copy(f.q.begin() + (i % f.nq) * f.d, f.q.begin() + (i % f.nq + 1) * f.d, q.begin() + i * f.d);
    return q;
}

// Queries whose k-th and (k+1)-th ADC distances tie (search() of k + 1):
// there either path may keep either candidate.
std::set<size_t> boundary_ties(const GpuIvfPqIndex& idx, const std::vector<float>& q, size_t d, size_t k,
                               size_t nprobe, const KeyRange* ranges)
{
    const size_t nq = q.size() / d, ka = k + 1;
    std::vector<float> ad(nq * ka);
    std::vector<int64_t> al(nq * ka);
    idx.search(q.data(), nq, ka, nprobe, ad.data(), al.data(), gpuivfpq::gpu::LabelKind::Ids, ranges);
    std::set<size_t> ties;
    for (size_t i = 0; i < nq; ++i)
        if (al[i * ka + k] >= 0 && ad[i * ka + k - 1] == ad[i * ka + k])
            ties.insert(i);
    return ties;
}

// The one-launch answers of idx (which must take that path) against the
// staged pipeline's on the same index, row by row, bit for bit (queries
// with an ADC tie at the k-th candidate excepted), and check_exact.
void check_small(const ExactFixture& f, GpuIvfPqIndex& idx, const std::vector<float>& q, size_t k, size_t nprobe,
                 const std::string& what, const KeyRange* ranges = nullptr)
{
    SCOPED_TRACE(what);
    const size_t nq = q.size() / f.d;
    idx.set_small_batch_max(kForcedMax);
    ASSERT_TRUE(idx.small_batch_path(nq, k, nprobe)) << "the one-launch path should take this shape";
    std::vector<int64_t> matched(nq, -7), matched_staged(nq, -9);
    KeyRange r1, r2;
    if (ranges) {
        r1 = KeyRange{ranges->lo, ranges->hi, matched.data()};
        r2 = KeyRange{ranges->lo, ranges->hi, matched_staged.data()};
    }
    std::vector<double> d1(nq * k, -1.0), d2(nq * k, -2.0);
    std::vector<int64_t> l1(nq * k, -5), l2(nq * k, -6);
    idx.search_exact(q.data(), nq, k, nprobe, d1.data(), l1.data(), ranges ? &r1 : nullptr);
    idx.set_small_batch_max(0);
    ASSERT_FALSE(idx.small_batch_path(nq, k, nprobe));
    idx.search_exact(q.data(), nq, k, nprobe, d2.data(), l2.data(), ranges ? &r2 : nullptr);
    idx.set_small_batch_max(kForcedMax);
    const std::set<size_t> ties = boundary_ties(idx, q, f.d, k, nprobe, ranges);
    int bad = 0;
    for (size_t i = 0; i < nq && bad < 5; ++i) {
        if (ranges && matched[i] != matched_staged[i]) {
            ADD_FAILURE() << "query " << i << ": " << matched[i] << " entries in range, staged path "
                          << matched_staged[i];
            ++bad;
        }
        if (ties.count(i))
            continue;
        for (size_t j = 0; j < k; ++j)
            if (l1[i * k + j] != l2[i * k + j] || bits_of(d1[i * k + j]) != bits_of(d2[i * k + j])) {
                ADD_FAILURE() << "query " << i << " rank " << j << ": one launch (" << d1[i * k + j] << ", "
                              << l1[i * k + j] << "), staged (" << d2[i * k + j] << ", " << l2[i * k + j] << ")";
                ++bad;
                break;
            }
    }
    check_exact(f, idx, q, k, nprobe, what + " check_exact", ranges);
}

// The re-ranked ids against the CPU engine's ADC candidates: an id of the
// one-launch answer missing from the CPU's k only where the CPU's k-th
// distance has a near tie (within rel_tol) that could take its place.
void check_against_cpu(const ExactFixture& f, GpuIvfPqIndex& idx, const std::vector<float>& q, size_t k,
                       size_t nprobe, const std::string& what)
{
    SCOPED_TRACE(what);
    const size_t nq = q.size() / f.d;
    std::vector<double> dd(nq * k);
    std::vector<int64_t> dl(nq * k);
    idx.search_exact(q.data(), nq, k, nprobe, dd.data(), dl.data());
    int bad = 0;
    for (size_t i = 0; i < nq && bad < 5; ++i) {
        const auto ref = f.cpu.search(q.data() + i * f.d, k, nprobe);
        std::set<int64_t> cpu;
        for (const auto& nb : ref)
            cpu.insert(nb.label);
        size_t near = 0;  // CPU candidates within the tolerance of its k-th
        if (!ref.empty()) {
            const double kth = ref.back().dist, tol = 1e-4 * std::max(1.0, std::fabs(kth));
            for (const auto& nb : ref)
                near += std::fabs(double(nb.dist) - kth) <= tol;
        }
        size_t missing = 0, present = 0;
        for (size_t j = 0; j < k; ++j) {
            if (dl[i * k + j] < 0)
                continue;
            ++present;
            missing += !cpu.count(dl[i * k + j]);
        }
        if (present != ref.size() || (missing > 0 && missing > near)) {
            ADD_FAILURE() << "query " << i << ": " << present << " candidates (cpu " << ref.size() << "), "
                          << missing << " not among the cpu's (" << near << " near its k-th)";
            ++bad;
        }
    }
}

}  // namespace

TEST(SmallBatch, MatchesStagedPathEveryMetricAndWidth)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(3101);
    struct Shape {
        size_t d, m;
    };
    // 16-byte code loads (m 32, 96 and 128: each a batched scan of its own),
    // 4-byte (m 8), bytes (m 5 and 3, odd d).
    const Shape shapes[] = {{128, 32}, {64, 8}, {256, 128}, {768, 96}, {40, 5}, {33, 3}};
    for (Metric metric : kMetrics)
        for (const Shape& sh : shapes) {
            const std::string what = shape(
                "small", {{"d", double(sh.d)}, {"m", double(sh.m)}, {"metric", double(int(metric))}}, s + sh.m);
            SCOPED_TRACE(what);
            ExactFixture f(sh.d, 64, sh.m, 4000, 64, metric, s + sh.m);
            auto idx = f.empty({});
            f.add_rows(*idx, 0, f.n);
            for (size_t nq : {1, 2, 31, 64}) {
                const std::vector<float> q = first_queries(f, nq);
                for (size_t k : {1, 10, 100, 128})
                    for (size_t nprobe : {1, 8, 64}) {
                        if (nq > 2 && k != 100 && nprobe != 8)
                            continue;  // the full grid at batches 1 and 2
                        check_small(f, *idx, q, k, nprobe,
                                    what + " nq=" + std::to_string(nq) + " k=" + std::to_string(k) +
                                        " nprobe=" + std::to_string(nprobe));
                    }
                check_against_cpu(f, *idx, q, 100, 8, what + " cpu nq=" + std::to_string(nq));
            }
        }
}

// The batch's coarse keys computed once for all its queries (forced from
// one query on) or by each query's blocks: the same answers bit for bit,
// every metric, d of 128, 40 (no 16-byte rows) and 33 (odd), whole and
// partial blocks of 8 queries.
TEST(SmallBatch, SharedCoarseKeysSameBits)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(3131);
    struct Shape {
        size_t d, m;
    };
    const Shape shapes[] = {{128, 32}, {40, 5}, {33, 3}};
    for (Metric metric : kMetrics)
        for (const Shape& sh : shapes) {
            const std::string what = shape(
                "shared coarse", {{"d", double(sh.d)}, {"m", double(sh.m)}, {"metric", double(int(metric))}},
                s + sh.m);
            SCOPED_TRACE(what);
            ExactFixture f(sh.d, 300, sh.m, 5000, 70, metric, s + sh.m);
            auto idx = f.empty({});
            f.add_rows(*idx, 0, f.n);
            for (size_t nq : {1, 2, 9, 16, 40, 48, 70}) {
                idx->set_small_batch_max(kForcedMax);
                const std::vector<float> q = first_queries(f, nq);
                const size_t k = 100, nprobe = 12;
                std::vector<double> d[2];
                std::vector<int64_t> l[2];
                for (int shared = 0; shared < 2; ++shared) {
                    idx->set_small_shared_coarse_from(shared == 1 ? 1 : 0);
                    ASSERT_TRUE(idx->small_batch_path(nq, k, nprobe));
                    d[shared].assign(nq * k, -1.0);
                    l[shared].assign(nq * k, -5);
                    idx->search_exact(q.data(), nq, k, nprobe, d[shared].data(), l[shared].data());
                }
                for (size_t e = 0; e < nq * k; ++e) {
                    ASSERT_EQ(l[1][e], l[0][e]) << "nq " << nq << " entry " << e;
                    ASSERT_EQ(bits_of(d[1][e]), bits_of(d[0][e])) << "nq " << nq << " entry " << e;
                }
                idx->set_small_shared_coarse_from(GpuIvfPqOptions().small_shared_coarse_from);
                check_small(f, *idx, q, k, nprobe, what + " nq=" + std::to_string(nq));
            }
        }
}

TEST(SmallBatch, KeyRanges)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(3102);
    for (Metric metric : kMetrics) {
        const std::string what = shape("small ranges", {{"metric", double(int(metric))}}, s);
        SCOPED_TRACE(what);
        ExactFixture f(128, 32, 16, 4000, 31, metric, s);
        auto idx = f.keyed();
        // Per query: empty, everything, single keys, a band, the extremes.
        const int64_t kMin = std::numeric_limits<int64_t>::min(), kMax = std::numeric_limits<int64_t>::max();
        std::vector<int64_t> lo(f.nq), hi(f.nq);
        for (size_t i = 0; i < f.nq; ++i) {
            switch (i % 6) {
            case 0: lo[i] = 5; hi[i] = 4; break;
            case 1: lo[i] = kMin; hi[i] = kMax; break;
            case 2: lo[i] = hi[i] = (int64_t(i % 64) - 32) * (int64_t(1) << 32) + 1; break;
            case 3: lo[i] = -(int64_t(8) << 32); hi[i] = int64_t(8) << 32; break;
            case 4: lo[i] = kMin; hi[i] = kMin; break;
            default: lo[i] = 0; hi[i] = kMax; break;
            }
        }
        const KeyRange kr{lo.data(), hi.data()};
        for (size_t nq : {1, 2, 31}) {
            const std::vector<float> q = first_queries(f, nq);
            for (size_t k : {1, 50, 128})
                check_small(f, *idx, q, k, 16,
                            what + " nq=" + std::to_string(nq) + " k=" + std::to_string(k), &kr);
        }
    }
}

// The kernel reading its queries and key ranges from, and writing its
// answers and in-range counts into, the call's page-locked staging
// (small_zero_copy 1 and 2) answers as it does through device copies:
// every metric, with and without ranges, batches below and above
// small_shared_coarse_from (where the queries are copied again). Before
// each checked call another call of the same shape (other queries, other
// ranges) leaves other answers in the staging, so that a kernel that wrote
// nothing there would fail; each mode runs its pair three times, so that
// the checked call also replays its CUDA graph.
TEST(SmallBatch, ZeroCopySameAnswers)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(3107);
    const int64_t kMin = std::numeric_limits<int64_t>::min(), kMax = std::numeric_limits<int64_t>::max();
    for (Metric metric : kMetrics) {
        const std::string what = shape("small zero copy", {{"metric", double(int(metric))}}, s);
        SCOPED_TRACE(what);
        ExactFixture f(128, 32, 16, 4000, 40, metric, s);
        auto idx = f.keyed();
        idx->set_small_batch_max(kForcedMax);
        std::vector<int64_t> lo(f.nq), hi(f.nq), lo2(f.nq, kMin), hi2(f.nq, kMax);
        for (size_t i = 0; i < f.nq; ++i) {
            lo[i] = i % 3 == 0 ? 5 : -(int64_t(8) << 32);  // every third range empty
            hi[i] = i % 3 == 0 ? 4 : int64_t(8) << 32;
        }
        for (size_t nq : {1, 5, 40}) {
            const std::vector<float> q = first_queries(f, nq);
            std::vector<float> q2(nq * f.d);  // the other call's: each row the next query's
            for (size_t i = 0; i < nq; ++i)
                std::copy(f.q.begin() + ((i + 1) % f.nq) * f.d, f.q.begin() + ((i + 1) % f.nq + 1) * f.d,
                          q2.begin() + i * f.d);
            const size_t k = 50;
            ASSERT_TRUE(idx->small_batch_path(nq, k, 16));
            for (bool ranged : {false, true}) {
                const std::string at0 = what + " nq=" + std::to_string(nq) + " ranged=" + std::to_string(ranged);
                auto call = [&](const std::vector<float>& qq, const std::vector<int64_t>& l,
                                const std::vector<int64_t>& h, std::vector<double>& dd, std::vector<int64_t>& dl,
                                std::vector<int64_t>& matched) {
                    dd.assign(nq * k, -1.0);
                    dl.assign(nq * k, -5);
                    matched.assign(nq, -7);
                    const KeyRange kr{l.data(), h.data(), matched.data()};
                    idx->search_exact(qq.data(), nq, k, 16, dd.data(), dl.data(), ranged ? &kr : nullptr);
                };
                std::vector<double> want_d, dd;
                std::vector<int64_t> want_l, want_m, dl, matched;
                idx->set_small_zero_copy(0);
                call(q, lo, hi, want_d, want_l, want_m);
                for (int mode : {1, 2, 0}) {
                    idx->set_small_zero_copy(mode);
                    const size_t zc0 = idx->zero_copy_calls();
                    for (int rep = 0; rep < 3; ++rep) {
                        const std::string at = at0 + " mode=" + std::to_string(mode) + " rep=" + std::to_string(rep);
                        call(q2, lo2, hi2, dd, dl, matched);
                        ASSERT_NE(dl, want_l) << at << ": the other call should leave other answers";
                        call(q, lo, hi, dd, dl, matched);
                        EXPECT_EQ(dl, want_l) << at;
                        EXPECT_EQ(0, std::memcmp(dd.data(), want_d.data(), dd.size() * sizeof(double))) << at;
                        if (ranged)
                            EXPECT_EQ(matched, want_m) << at;
                    }
                    // Every call of modes 1 and 2 went in place, none of mode 0.
                    EXPECT_EQ(idx->zero_copy_calls() - zc0, mode == 0 ? 0u : 6u) << at0 << " mode=" << mode;
                }
            }
        }
        idx->set_small_zero_copy(GpuIvfPqOptions().small_zero_copy);
    }
}

TEST(SmallBatch, DeviceEntryPointAndRemovals)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(3103);
    ExactFixture f(128, 32, 32, 4000, 16, Metric::L2, s);
    auto idx = f.empty({});
    f.add_rows(*idx, 0, f.n / 2);
    f.add_rows(*idx, f.n / 2, f.n);
    std::vector<int64_t> gone;
    for (size_t i = 0; i < f.n; i += 4)
        gone.push_back(f.ids[i]);
    ASSERT_EQ(idx->remove_ids(gone.data(), gone.size()), gone.size());
    check_small(f, *idx, f.q, 100, 12, "after removal");
    // search_exact_device: the host entry point's answers, left on the device.
    const size_t k = 40, nprobe = 6;
    std::vector<double> hd(f.nq * k);
    std::vector<int64_t> hl(f.nq * k);
    idx->search_exact(f.q.data(), f.nq, k, nprobe, hd.data(), hl.data());
    DeviceBuffer dq = to_device(f.q), dd(ctx(), f.nq * k * sizeof(double)), dl(ctx(), f.nq * k * sizeof(int64_t));
    ASSERT_TRUE(idx->small_batch_path(f.nq, k, nprobe));
    idx->search_exact_device(dq.as<float>(), f.nq, k, nprobe, dd.as<double>(), dl.as<int64_t>());
    const auto gd = to_host<double>(dd, f.nq * k);
    const auto gl = to_host<int64_t>(dl, f.nq * k);
    for (size_t e = 0; e < f.nq * k; ++e) {
        ASSERT_EQ(bits_of(gd[e]), bits_of(hd[e])) << "entry " << e;
        ASSERT_EQ(gl[e], hl[e]) << "entry " << e;
    }
    // Repeated calls (graphs capture the launch from the third on): the same.
    for (int rep = 0; rep < 4; ++rep) {
        std::vector<double> rd(f.nq * k);
        std::vector<int64_t> rl(f.nq * k);
        idx->search_exact(f.q.data(), f.nq, k, nprobe, rd.data(), rl.data());
        ASSERT_EQ(rl, hl) << "call " << rep;
    }
}

TEST(SmallBatch, OtherShapesKeepTheStagedPath)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(3104);
    ExactFixture f(64, 16, 8, 2000, 8, Metric::L2, s);
    auto idx = f.empty({});
    f.add_rows(*idx, 0, f.n);
    EXPECT_TRUE(idx->small_batch_path(1, 128, 16));
    EXPECT_FALSE(idx->small_batch_path(1, 129, 16));  // k above the warp queues
    EXPECT_FALSE(idx->small_batch_path(GpuIvfPqOptions().small_batch_max + 1, 10, 4));
    EXPECT_FALSE(idx->small_batch_path(0, 10, 4));
    check_exact(f, *idx, f.q, 129, 16, "k 129, staged");
    for (int variant = 0; variant < 3; ++variant) {
        GpuIvfPqOptions opt;
        opt.scan = variant == 0 ? ScanAlgo::TwoPass : ScanAlgo::Auto;
        opt.term1_per_vector = variant != 1;
        opt.float16_tables = variant == 2;
        auto other = f.empty(opt);
        f.add_rows(*other, 0, f.n);
        EXPECT_FALSE(other->small_batch_path(1, 10, 4)) << "variant " << variant;
    }
    auto bare = f.empty({}, false);  // no vectors: no search_exact at all
    f.add_rows(*bare, 0, f.n, false);
    EXPECT_FALSE(bare->small_batch_path(1, 10, 4));
}

// Long probed lists: a block's share of the entries past what its shared
// memory holds keeps only the keys below a running bar, cut to the best k
// whenever the buffer fills (batch 64: 4 blocks a query, 10000 entries
// each), with the same answers.
TEST(SmallBatch, LongListsPastSharedMemory)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(3105);
    for (Metric metric : {Metric::L2, Metric::InnerProduct}) {
        const std::string what = shape("long lists", {{"metric", double(int(metric))}}, s);
        SCOPED_TRACE(what);
        ExactFixture f(32, 8, 8, 40000, 64, metric, s);
        auto idx = f.empty({});
        f.add_rows(*idx, 0, f.n);
        for (size_t nq : {1, 64})
            for (size_t k : {10, 128})
                check_small(f, *idx, first_queries(f, nq), k, 8,
                            what + " nq=" + std::to_string(nq) + " k=" + std::to_string(k));
    }
}

// Many lists: a block's share of the centroids past its key buffer (5000
// lists and one block a query: 5000 centroids a block) keeps only the keys
// below a running bar, from each query's own coarse keys and from the
// batch's shared ones; the same answers as the staged path and the host.
TEST(SmallBatch, ManyListsPastTheKeyBuffer)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(3110);
    const std::string what = shape("many lists", {}, s);
    SCOPED_TRACE(what);
    ExactFixture f(16, 5000, 4, 20000, 8, Metric::L2, s);
    auto idx = f.empty({});
    f.add_rows(*idx, 0, f.n);
    for (int cluster : {1, 2, 0})
        for (int shared : {0, 1}) {
            idx->set_small_cluster(cluster);
            idx->set_small_shared_coarse_from(shared);
            for (size_t nq : {1, 8})
                check_small(f, *idx, first_queries(f, nq), 10, 16,
                            what + " cluster=" + std::to_string(cluster) + " shared=" + std::to_string(shared) +
                                " nq=" + std::to_string(nq));
        }
    idx->set_small_cluster(GpuIvfPqOptions().small_cluster);
    idx->set_small_shared_coarse_from(GpuIvfPqOptions().small_shared_coarse_from);
}

// Hundreds of entries with one code in one list (the same ADC distance)
// across the k-th candidate: the radix select resolves the tie by
// position, the same way on every call, and the rows stay exact.
TEST(SmallBatch, TiedCandidatesAcrossTheKth)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(3106);
    ExactFixture f(64, 16, 8, 3000, 4, Metric::L2, s);
    auto idx = f.empty({});
    f.add_rows(*idx, 0, f.n);
    const size_t r = 5, copies = 300;
    std::vector<float> dups;
    std::vector<int64_t> dup_ids;
    for (size_t c = 0; c < copies; ++c) {
        dups.insert(dups.end(), f.x.begin() + r * f.d, f.x.begin() + (r + 1) * f.d);
        dup_ids.push_back(int64_t(5000000 + (c * 7919) % copies));
    }
    f.add_extra(*idx, dups, dup_ids);
    std::vector<float> q = f.q;
    std::copy(f.x.begin() + r * f.d, f.x.begin() + (r + 1) * f.d, q.begin());
    for (size_t k : {10, 100}) {
        ASSERT_TRUE(idx->small_batch_path(f.nq, k, 4));
        check_exact(f, *idx, q, k, 4, "ties k=" + std::to_string(k));
        std::vector<double> d1(f.nq * k), d2(f.nq * k);
        std::vector<int64_t> l1(f.nq * k), l2(f.nq * k);
        idx->search_exact(q.data(), f.nq, k, 4, d1.data(), l1.data());
        idx->search_exact(q.data(), f.nq, k, 4, d2.data(), l2.data());
        EXPECT_EQ(l1, l2) << "k=" << k;
        // Query 0 is the duplicated row: its first answer a copy of it.
        EXPECT_EQ(d1[0], 0.0) << "k=" << k;
    }
}

// Blocks per query (forced 1 .. 16, powers of two or not, or chosen) and one block per
// multiprocessor or not: the same answers bit for bit, and the staged
// path's. Code widths of the batched scan (m 16, 32, 48, 64: one to four
// 16-byte words an entry) and one outside it (m 8).
TEST(SmallBatch, EveryClusterSizeAndSpreadSameAnswers)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(3107);
    struct Shape {
        size_t d, m;
    };
    const Shape shapes[] = {{128, 16}, {128, 32}, {96, 48}, {128, 64}, {192, 96}, {256, 128}, {64, 8}};
    for (const Shape& sh : shapes) {
        const std::string what =
            shape("small clusters", {{"d", double(sh.d)}, {"m", double(sh.m)}}, s + sh.m);
        SCOPED_TRACE(what);
        ExactFixture f(sh.d, 64, sh.m, 6000, 24, Metric::L2, s + sh.m);
        auto idx = f.empty({});
        f.add_rows(*idx, 0, f.n);
        for (size_t nq : {1, 5, 24}) {
            const std::vector<float> q = first_queries(f, nq);
            const size_t k = 100, nprobe = 16;
            idx->set_small_batch_max(kForcedMax);
            std::vector<double> want_d(nq * k);
            std::vector<int64_t> want_l(nq * k);
            idx->search_exact(q.data(), nq, k, nprobe, want_d.data(), want_l.data());
            for (int cluster : {0, 1, 2, 3, 4, 5, 7, 8, 12, 16})
                for (bool spread : {true, false}) {
                    idx->set_small_cluster(cluster);
                    idx->set_small_spread(spread);
                    ASSERT_TRUE(idx->small_batch_path(nq, k, nprobe));
                    std::vector<double> d(nq * k, -1.0);
                    std::vector<int64_t> l(nq * k, -5);
                    idx->search_exact(q.data(), nq, k, nprobe, d.data(), l.data());
                    for (size_t e = 0; e < nq * k; ++e) {
                        ASSERT_EQ(l[e], want_l[e]) << "nq " << nq << " cluster " << cluster << " spread "
                                                   << spread << " entry " << e;
                        ASSERT_EQ(bits_of(d[e]), bits_of(want_d[e])) << "nq " << nq << " cluster " << cluster
                                                                      << " spread " << spread << " entry " << e;
                    }
                }
            idx->set_small_cluster(0);
            idx->set_small_spread(true);
            check_small(f, *idx, q, k, nprobe, what + " nq=" + std::to_string(nq));
        }
    }
    {
        ExactFixture f(64, 16, 8, 500, 2, Metric::L2, s);
        auto idx = f.empty({});
        EXPECT_THROW(idx->set_small_cluster(17), gpuivfpq::Error);
        EXPECT_THROW(idx->set_small_cluster(-1), gpuivfpq::Error);
    }
}

// Every candidate of every block with the same ADC distance (one vector
// stored many times): the radix select finds no bit in which the keys
// differ and takes the first k by position, on every block size alike.
TEST(SmallBatch, AllCandidatesEqual)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(3108);
    ExactFixture f(64, 8, 16, 400, 3, Metric::L2, s);
    auto idx = f.empty({});
    f.add_rows(*idx, 0, f.n);
    std::vector<float> dups;
    std::vector<int64_t> dup_ids;
    // 9000 copies: with one block a query its share (9400 entries) passes
    // its shared memory, so the buffer is cut among equal keys (by
    // position) before the last select; with four, each share fits.
    const size_t copies = 9000;
    for (size_t c = 0; c < copies; ++c) {
        dups.insert(dups.end(), f.x.begin(), f.x.begin() + f.d);
        dup_ids.push_back(int64_t(9000000 + (c * 7919) % copies));
    }
    f.add_extra(*idx, dups, dup_ids);
    std::vector<float> q = f.q;
    std::copy(f.x.begin(), f.x.begin() + f.d, q.begin());  // query 0: the duplicated row itself
    idx->set_small_batch_max(kForcedMax);
    for (size_t k : {10, 128}) {
        std::vector<int64_t> first;
        for (int cluster : {0, 1, 4, 16}) {
            idx->set_small_cluster(cluster);
            ASSERT_TRUE(idx->small_batch_path(f.nq, k, 1));
            std::vector<double> d(f.nq * k);
            std::vector<int64_t> l(f.nq * k);
            idx->search_exact(q.data(), f.nq, k, 1, d.data(), l.data());
            if (first.empty())
                first = l;
            EXPECT_EQ(l, first) << "k " << k << " cluster " << cluster;
            EXPECT_EQ(d[0], 0.0) << "k " << k << " cluster " << cluster;
        }
        idx->set_small_cluster(0);
        check_exact(f, *idx, q, k, 1, "all equal k=" + std::to_string(k));
    }
}

// The re-rank's two ways to one row's exact distance: a warp per row (few
// rows a block: many blocks per query) and a thread per row (one block per
// query), against the staged path and the host bit for bit, with
// dimensions past the warp's 256-product chunk and a tail past the last
// multiple of 4.
TEST(SmallBatch, WarpAndThreadRowsSameBits)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(3109);
    for (Metric metric : kMetrics)
        for (size_t d : {302, 512}) {
            const size_t m = d == 302 ? 2 : 16;
            const std::string what = shape("rerank rows", {{"d", double(d)}, {"metric", double(int(metric))}}, s + d);
            SCOPED_TRACE(what);
            ExactFixture f(d, 16, m, 3000, 4, metric, s + d);
            auto idx = f.empty({});
            f.add_rows(*idx, 0, f.n);
            const std::vector<float> q = first_queries(f, 2);
            for (int cluster : {16, 1}) {
                idx->set_small_cluster(cluster);
                check_small(f, *idx, q, 100, 4, what + " cluster=" + std::to_string(cluster));
            }
            idx->set_small_cluster(0);
        }
}

// Calls that hand the context over while they wait (GpuContext::
// WaitHandover, as the GPU process's device lease does): four threads take
// turns on one context through a mutex, each call letting go of it once its
// work is queued, so that other threads' calls queue behind it and wait at
// the same time. Every answer must be the one the same call gets alone, on
// both paths (one launch, and the staged pipeline past small_batch_max), and
// calls must have overlapped.
namespace {
struct TakeTurns {
    std::mutex m;
    gpuivfpq::gpu::GpuContext* c = nullptr;
    std::atomic<int> waiting{0}, most{0};
    std::atomic<int> pending_at_yield{0};  // yields with the call's work not yet done
};
struct Turn {
    TakeTurns* t;
    static void yield(void* p)
    {
        Turn& u = *static_cast<Turn*>(p);
        // Yielded before the wait: the call's own work is still queued.
        if (cudaStreamQuery(static_cast<cudaStream_t>(u.t->c->stream())) == cudaErrorNotReady)
            u.t->pending_at_yield++;
        const int w = u.t->waiting.fetch_add(1) + 1;
        int most = u.t->most.load();
        while (w > most && !u.t->most.compare_exchange_weak(most, w)) {
        }
        u.t->m.unlock();
    }
    static void reclaim(void* p)
    {
        Turn& u = *static_cast<Turn*>(p);
        u.t->waiting.fetch_sub(1);  // its wait is over: it no longer counts
        u.t->m.lock();
        u.t->c->set_wait_handover({&Turn::yield, &Turn::reclaim, p});
    }
};
}  // namespace

TEST(SmallBatch, HandedOverCallsQueueBehindEachOther)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(4403);
    ExactFixture f(128, 64, 32, 8000, 64, Metric::L2, s);
    auto idx = f.keyed();
    idx->set_small_batch_max(8);  // 16 and 33 take the staged pipeline
    const size_t k = 20, nprobe = 12;
    const size_t sizes[] = {1, 5, 8, 16, 33};
    auto queries = [&](size_t call) {
        const size_t nq = sizes[call % 5];
        std::vector<float> q(nq * f.d);
        for (size_t i = 0; i < nq; ++i) {
            const size_t r = (call * 7 + i) % f.nq;
            std::copy(f.q.begin() + r * f.d, f.q.begin() + (r + 1) * f.d, q.begin() + i * f.d);
        }
        return q;
    };
    const size_t kCalls = 40;
    std::vector<std::vector<double>> want_d(kCalls);
    std::vector<std::vector<int64_t>> want_l(kCalls);
    for (size_t c = 0; c < kCalls; ++c) {
        const std::vector<float> q = queries(c);
        const size_t nq = q.size() / f.d;
        want_d[c].resize(nq * k);
        want_l[c].resize(nq * k);
        idx->search_exact(q.data(), nq, k, nprobe, want_d[c].data(), want_l[c].data());
    }
    TakeTurns turns;
    turns.c = &ctx();
    std::atomic<int> wrong{0};
    std::vector<std::thread> threads;
    for (int th = 0; th < 4; ++th)
        threads.emplace_back([&, th] {
            Turn me{&turns};
            for (int rep = 0; rep < 3; ++rep)
                for (size_t c = size_t(th); c < kCalls; c += 4) {
                    const std::vector<float> q = queries(c);
                    const size_t nq = q.size() / f.d;
                    std::vector<double> dd(nq * k, -1.0);
                    std::vector<int64_t> dl(nq * k, -5);
                    std::lock_guard<std::mutex> g(turns.m);
                    ctx().set_wait_handover({&Turn::yield, &Turn::reclaim, &me});
                    try {
                        idx->search_exact(q.data(), nq, k, nprobe, dd.data(), dl.data());
                    } catch (...) {
                        wrong++;
                    }
                    ctx().set_wait_handover({});
                    if (dl != want_l[c] || std::memcmp(dd.data(), want_d[c].data(), dd.size() * sizeof(double)) != 0)
                        wrong++;
                }
        });
    for (auto& t : threads)
        t.join();
    EXPECT_EQ(wrong.load(), 0);
    EXPECT_GE(turns.most.load(), 2) << "no two calls waited at once";
    EXPECT_GT(turns.pending_at_yield.load(), 0) << "no call yielded before its work was done";
    EXPECT_EQ(turns.waiting.load(), 0);
}
