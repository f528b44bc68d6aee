// Filter keys (GpuIvfPqOptions::filter_keys) and per-query key ranges: a
// filtered search must behave as the unfiltered search of an index holding
// only the entries in range. Checked against such subset indexes for every
// metric, several code widths and every scan layout, with many ranges in one
// batch (empty, everything, single keys, the int64 extremes, keys equal in
// their low 32 bits); against the in-range entries themselves where every
// list is probed (padding); and through search_exact, removal, re-adding,
// GPU encoding, the device entry points and the argument checks.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "exact_fixture.h"
#include "gpu_ivfpq/ivfpq_index.h"
#include "gpu_test_util.h"

using namespace gputest;
using gpuivfpq::ErrorKind;
using gpuivfpq::Metric;
using gpuivfpq::gpu::GpuIvfPqIndex;
using gpuivfpq::gpu::GpuIvfPqOptions;
using gpuivfpq::gpu::KeyRange;
using gpuivfpq::gpu::LabelKind;
using gpuivfpq::gpu::ScanAlgo;

namespace {

using gputest::kind_of;

constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kHigh = int64_t(1) << 32;  // the fixture's keys: (r - 32) * kHigh + (0..2)

// One (lo, hi) per query, host.
struct Ranges {
    std::vector<int64_t> lo, hi;
    KeyRange view() const { return KeyRange{lo.data(), hi.data()}; }
};

// Query i gets the (i % 7)-th of: everything; empty (lo > hi); a band of
// keys across zero; one key (a handful of entries); key 0 alone (not 2^32,
// equal to it in the low 32 bits); the low end with INT64_MIN; the high end
// with INT64_MAX.
Ranges mixed_ranges(size_t nq)
{
    const int64_t los[] = {kMin, 5, -4 * kHigh, 7 * kHigh + 1, 0, kMin, 25 * kHigh};
    const int64_t his[] = {kMax, 4, 6 * kHigh + 1, 7 * kHigh + 1, 0, -20 * kHigh, kMax};
    Ranges r;
    for (size_t i = 0; i < nq; ++i) {
        r.lo.push_back(los[i % 7]);
        r.hi.push_back(his[i % 7]);
    }
    return r;
}

Ranges uniform_ranges(size_t nq, int64_t lo, int64_t hi)
{
    return Ranges{std::vector<int64_t>(nq, lo), std::vector<int64_t>(nq, hi)};
}

bool in_range(int64_t key, int64_t lo, int64_t hi) { return key >= lo && key <= hi; }

// The filtered search of idx (ranges per query, over the rows marked
// present) against, for each distinct range, an index with the same options
// holding only the present rows in that range, searched unfiltered with the
// same query batch (so the coarse step and the tables are the same): per
// rank the same distance, the same ids but where distances tie at the k-th,
// the same padding; every id distinct and its key in range.
void check_subsets(const ExactFixture& f, const GpuIvfPqIndex& idx, GpuIvfPqOptions opt, const Ranges& r,
                   const std::vector<char>& present, size_t k, size_t nprobe, const std::string& what)
{
    SCOPED_TRACE(what);
    const size_t nq = f.nq;
    std::vector<float> gd(nq * k);
    std::vector<int64_t> gl(nq * k);
    const KeyRange kr = r.view();
    idx.search(f.q.data(), nq, k, nprobe, gd.data(), gl.data(), LabelKind::Ids, &kr);
    std::map<std::pair<int64_t, int64_t>, std::vector<size_t>> groups;  // range -> queries
    for (size_t i = 0; i < nq; ++i)
        groups[{r.lo[i], r.hi[i]}].push_back(i);
    opt.filter_keys = false;
    int bad = 0;
    for (const auto& g : groups) {
        const int64_t lo = g.first.first, hi = g.first.second;
        std::vector<size_t> rows;
        for (size_t i = 0; i < f.n; ++i)
            if (present[i] && in_range(f.keys[i], lo, hi))
                rows.push_back(i);
        auto sub = f.empty(opt, false);
        f.add_picked(*sub, rows, false);
        std::vector<float> sd(nq * k);
        std::vector<int64_t> sl(nq * k);
        sub->search(f.q.data(), nq, k, nprobe, sd.data(), sl.data());
        for (size_t i : g.second) {
            if (bad >= 5)
                return;
            const float* a = gd.data() + i * k;
            const int64_t* al = gl.data() + i * k;
            const float* b = sd.data() + i * k;
            const int64_t* bl = sl.data() + i * k;
            size_t cnt = 0;  // results in the subset's row
            while (cnt < k && bl[cnt] >= 0)
                ++cnt;
            std::set<int64_t> seen;
            for (size_t j = 0; j < k; ++j) {
                if (j >= cnt) {
                    if (!(std::isinf(a[j]) && a[j] > 0 && al[j] == -1)) {
                        ADD_FAILURE() << "query " << i << " [" << lo << ", " << hi << "] rank " << j << ": ("
                                      << a[j] << ", " << al[j] << ") where padding belongs (" << cnt
                                      << " entries in range)";
                        ++bad;
                        break;
                    }
                    continue;
                }
                const double tol = 1e-5 * std::max(1.0, std::fabs(double(b[j])));
                const auto kt = f.key_of.find(al[j]);
                if (al[j] < 0 || kt == f.key_of.end() || !in_range(kt->second, lo, hi) ||
                    !seen.insert(al[j]).second || std::fabs(double(a[j]) - b[j]) > tol) {
                    ADD_FAILURE() << "query " << i << " [" << lo << ", " << hi << "] rank " << j << ": ("
                                  << a[j] << ", " << al[j] << ") against the subset's (" << b[j] << ", "
                                  << bl[j] << ")";
                    ++bad;
                    break;
                }
            }
            // The same ids, but those tied with the row's last distance (a
            // full row may keep any of a tied group).
            std::set<int64_t> ia, ib;
            const double last = cnt ? b[cnt - 1] : 0.0;
            const double tol = 1e-5 * std::max(1.0, std::fabs(last));
            for (size_t j = 0; j < cnt; ++j) {
                if (cnt < k || b[j] < last - tol)
                    ib.insert(bl[j]);
                if (cnt < k || a[j] < last - tol)
                    ia.insert(al[j]);
            }
            if (ia != ib) {
                ADD_FAILURE() << "query " << i << " [" << lo << ", " << hi << "]: " << ia.size() << " ids against "
                              << ib.size() << " of the subset, not the same";
                ++bad;
            }
        }
    }
}

const Metric kMetrics[] = {Metric::L2, Metric::InnerProduct, Metric::Cosine};

}  // namespace

TEST(IvfPqFilterKeys, MatchesSubsetIndexEveryMetricAndWidth)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(3101);
    for (Metric metric : kMetrics)
        for (size_t m : {8, 32, 128}) {
            const std::string what =
                shape("filter", {{"m", double(m)}, {"metric", double(int(metric))}}, s + m);
            SCOPED_TRACE(what);
            ExactFixture f(128, 16, m, 3000, 28, metric, s + m);
            GpuIvfPqOptions opt;
            opt.filter_keys = true;
            auto idx = f.keyed(opt);
            // One batch into empty lists: each list's key buffer is exactly its size.
            EXPECT_EQ(idx->memory_use().keys, f.n * sizeof(int64_t));
            EXPECT_LE(idx->memory_use().total(), ctx().bytes_in_use());
            const std::vector<char> all(f.n, 1);
            const Ranges r = mixed_ranges(f.nq);
            const KeyRange kr = r.view();
            for (size_t k : {size_t(1), size_t(10), size_t(100)})
                for (size_t nprobe : {1, 4}) {
                    const std::string at = what + " k=" + std::to_string(k) + " nprobe=" + std::to_string(nprobe);
                    check_subsets(f, *idx, opt, r, all, k, nprobe, at);
                    check_exact(f, *idx, f.q, k, nprobe, at + " exact", &kr);
                }
        }
}

TEST(IvfPqFilterKeys, EveryScanLayout)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(3202);
    for (Metric metric : {Metric::L2, Metric::InnerProduct}) {
        ExactFixture f(64, 16, 16, 3000, 21, metric, s);
        const std::vector<char> all(f.n, 1);
        const Ranges r = mixed_ranges(f.nq);
        const KeyRange kr = r.view();
        // The fused scan (default), the two-pass scan (its distance pass
        // writes +inf for out-of-range entries, k = 1 goes through the
        // arg-min), the paper's per-list tables (Auto: two-pass) and fp16.
        for (int variant = 0; variant < 4; ++variant) {
            GpuIvfPqOptions opt;
            opt.filter_keys = true;
            opt.scan = variant == 1 ? ScanAlgo::TwoPass : ScanAlgo::Auto;
            opt.term1_per_vector = variant != 2;
            opt.float16_tables = variant == 3;
            auto idx = f.empty(opt);
            f.add_rows(*idx, 0, f.n, true, true);
            const std::string what =
                shape("layout", {{"variant", double(variant)}, {"metric", double(int(metric))}}, s);
            for (size_t k : {size_t(1), size_t(7), size_t(300)})
                for (size_t nprobe : {2, 16}) {
                    const std::string at = what + " k=" + std::to_string(k) + " nprobe=" + std::to_string(nprobe);
                    check_subsets(f, *idx, opt, r, all, k, nprobe, at);
                    check_exact(f, *idx, f.q, k, nprobe, at + " exact", &kr);
                }
            // (list, offset) labels of a filtered search name in-range entries.
            const size_t k = 20, nprobe = 4;
            std::vector<float> d1(f.nq * k), d2(f.nq * k);
            std::vector<int64_t> l1(f.nq * k), l2(f.nq * k);
            idx->search(f.q.data(), f.nq, k, nprobe, d1.data(), l1.data(), LabelKind::Ids, &kr);
            idx->search(f.q.data(), f.nq, k, nprobe, d2.data(), l2.data(), LabelKind::ListOffset, &kr);
            for (size_t e = 0; e < f.nq * k; ++e) {
                ASSERT_EQ(d1[e], d2[e]) << what << " entry " << e;
                ASSERT_EQ(l1[e] < 0, l2[e] < 0) << what << " entry " << e;
                if (l2[e] < 0)
                    continue;
                const int64_t list = l2[e] >> 32, off = l2[e] & 0xffffffff;
                ASSERT_LT(size_t(off), f.cpu.ids[list].size());
                EXPECT_EQ(f.cpu.ids[list][off], l1[e]) << what << " entry " << e;
            }
        }
    }
}

// Appends of one row and of a few (the change log's runs), with lists
// growing under them, build the index one batch builds: codes, ids, stored
// vectors, filter keys and per-vector terms all in place, so that every
// search returns the same bits.
TEST(IvfPqFilterKeys, SmallAppendsEqualOneBatch)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(3307);
    for (Metric metric : kMetrics) {
        SCOPED_TRACE(shape("small appends", {{"metric", double(int(metric))}}, s));
        ExactFixture f(64, 16, 16, 1200, 12, metric, s);
        GpuIvfPqOptions opt;
        opt.store_vectors = true;
        opt.filter_keys = true;
        auto one = f.empty(opt);
        f.add_rows(*one, 0, f.n, true, true);
        auto many = f.empty(opt);
        size_t i = 0;
        for (size_t step = 1; i < f.n; step = step % 5 + 1) {
            const size_t e = std::min(f.n, i + step);
            f.add_rows(*many, i, e, true, true);
            i = e;
        }
        ASSERT_EQ(many->ntotal(), one->ntotal());
        for (size_t l = 0; l < f.lists; ++l)
            ASSERT_EQ(many->list_size(l), one->list_size(l)) << "list " << l;
        const size_t k = 20, nprobe = 6;
        const Ranges half = uniform_ranges(f.nq, kMin, 0);
        const KeyRange hk = half.view();
        for (const KeyRange* kr : {static_cast<const KeyRange*>(nullptr), &hk}) {
            std::vector<double> od(f.nq * k), md(f.nq * k);
            std::vector<int64_t> ol(f.nq * k), ml(f.nq * k);
            one->search_exact(f.q.data(), f.nq, k, nprobe, od.data(), ol.data(), kr);
            many->search_exact(f.q.data(), f.nq, k, nprobe, md.data(), ml.data(), kr);
            for (size_t e = 0; e < f.nq * k; ++e) {
                ASSERT_EQ(bits_of(od[e]), bits_of(md[e])) << "entry " << e;
                ASSERT_EQ(ol[e], ml[e]) << "entry " << e;
            }
            std::vector<float> oa(f.nq * k), ma(f.nq * k);
            one->search(f.q.data(), f.nq, k, nprobe, oa.data(), ol.data(), LabelKind::Ids, kr);
            many->search(f.q.data(), f.nq, k, nprobe, ma.data(), ml.data(), LabelKind::Ids, kr);
            for (size_t e = 0; e < f.nq * k; ++e) {
                ASSERT_EQ(bits_of(oa[e]), bits_of(ma[e])) << "entry " << e;
                ASSERT_EQ(ol[e], ml[e]) << "entry " << e;
            }
        }
    }
}

TEST(IvfPqFilterKeys, EmptyFullAndPaddedRanges)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(3303);
    for (Metric metric : kMetrics) {
        const std::string what = shape("ranges", {{"metric", double(int(metric))}}, s);
        SCOPED_TRACE(what);
        ExactFixture f(64, 16, 16, 2500, 12, metric, s);
        auto idx = f.keyed();
        const size_t k = 50, nprobe = 4;
        std::vector<float> ud(f.nq * k), fd(f.nq * k);
        std::vector<int64_t> ul(f.nq * k), fl(f.nq * k);

        // A range holding every key: the unfiltered search exactly (same
        // entries, same order, same selection).
        idx->search(f.q.data(), f.nq, k, nprobe, ud.data(), ul.data());
        const Ranges every = uniform_ranges(f.nq, kMin, kMax);
        const KeyRange ek = every.view();
        idx->search(f.q.data(), f.nq, k, nprobe, fd.data(), fl.data(), LabelKind::Ids, &ek);
        for (size_t e = 0; e < f.nq * k; ++e) {
            ASSERT_EQ(bits_of(ud[e]), bits_of(fd[e])) << "entry " << e;
            ASSERT_EQ(ul[e], fl[e]) << "entry " << e;
        }
        std::vector<double> ued(f.nq * k), fed(f.nq * k);
        std::vector<int64_t> uel(f.nq * k), fel(f.nq * k);
        idx->search_exact(f.q.data(), f.nq, k, nprobe, ued.data(), uel.data());
        idx->search_exact(f.q.data(), f.nq, k, nprobe, fed.data(), fel.data(), &ek);
        for (size_t e = 0; e < f.nq * k; ++e) {
            ASSERT_EQ(bits_of(ued[e]), bits_of(fed[e])) << "entry " << e;
            ASSERT_EQ(uel[e], fel[e]) << "entry " << e;
        }

        // Empty ranges (lo > hi, also by one): every row all padding.
        const std::vector<std::pair<int64_t, int64_t>> empties = {{1, 0}, {kMax, kMin}, {7 * kHigh + 1, 7 * kHigh}};
        for (const auto& lh : empties) {
            const Ranges none = uniform_ranges(f.nq, lh.first, lh.second);
            const KeyRange nk = none.view();
            idx->search(f.q.data(), f.nq, k, f.lists, fd.data(), fl.data(), LabelKind::Ids, &nk);
            idx->search_exact(f.q.data(), f.nq, k, f.lists, fed.data(), fel.data(), &nk);
            for (size_t e = 0; e < f.nq * k; ++e) {
                ASSERT_EQ(fd[e], std::numeric_limits<float>::infinity()) << "entry " << e;
                ASSERT_EQ(fl[e], -1) << "entry " << e;
                ASSERT_EQ(fed[e], std::numeric_limits<double>::infinity()) << "entry " << e;
                ASSERT_EQ(fel[e], -1) << "entry " << e;
            }
        }

        // Every list probed, k above the entries in range: exactly those
        // entries, sorted, then padding. The mixed ranges hold from none to
        // about half of the entries; k = 1 (arg-min when the scan is
        // two-pass) and a single entry (INT64_MIN, INT64_MAX) included.
        const Ranges r = mixed_ranges(f.nq);
        const KeyRange kr = r.view();
        for (size_t kk : {size_t(1), size_t(40), size_t(2048)}) {
            std::vector<float> pd(f.nq * kk);
            std::vector<int64_t> pl(f.nq * kk);
            // With every list probed, the in-range counts are the range's entries.
            std::vector<int64_t> matched(f.nq, -1), matched_exact(f.nq, -1);
            KeyRange counted = kr;
            counted.matched = matched.data();
            idx->search(f.q.data(), f.nq, kk, f.lists, pd.data(), pl.data(), LabelKind::Ids, &counted);
            const ExactResult ex = check_exact(f, *idx, f.q, kk, f.lists, what + " all lists", &kr);
            std::vector<double> cd(f.nq * kk);
            std::vector<int64_t> cl(f.nq * kk);
            counted.matched = matched_exact.data();
            idx->search_exact(f.q.data(), f.nq, kk, f.lists, cd.data(), cl.data(), &counted);
            for (size_t i = 0; i < f.nq; ++i) {
                std::set<int64_t> want;
                for (size_t row = 0; row < f.n; ++row)
                    if (in_range(f.keys[row], r.lo[i], r.hi[i]))
                        want.insert(f.ids[row]);
                EXPECT_EQ(matched[i], int64_t(want.size())) << "query " << i << " k=" << kk << ": in-range count";
                EXPECT_EQ(matched_exact[i], int64_t(want.size()))
                    << "query " << i << " k=" << kk << ": in-range count (search_exact)";
                std::set<int64_t> got, got_exact;
                size_t cnt = 0;
                for (size_t j = 0; j < kk; ++j) {
                    if (pl[i * kk + j] < 0) {
                        EXPECT_EQ(pd[i * kk + j], std::numeric_limits<float>::infinity());
                        continue;
                    }
                    ++cnt;
                    EXPECT_EQ(j + 1, cnt) << "query " << i << ": a result after padding";
                    got.insert(pl[i * kk + j]);
                    if (j > 0) {
                        EXPECT_LE(pd[i * kk + j - 1], pd[i * kk + j]) << "query " << i << " rank " << j;
                    }
                }
                for (size_t j = 0; j < kk; ++j)
                    if (ex.labels[i * kk + j] >= 0)
                        got_exact.insert(ex.labels[i * kk + j]);
                if (want.size() <= kk) {
                    EXPECT_EQ(got, want) << "query " << i << " k=" << kk;
                    EXPECT_EQ(got_exact, want) << "query " << i << " k=" << kk;
                } else {
                    EXPECT_EQ(got.size(), kk) << "query " << i << " k=" << kk;
                    EXPECT_TRUE(std::includes(want.begin(), want.end(), got.begin(), got.end()))
                        << "query " << i << " k=" << kk;
                }
            }
        }
    }
}

TEST(IvfPqFilterKeys, RemoveAndReAddKeepKeysWithTheirIds)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(3404);
    for (bool per_vector : {true, false}) {
        const std::string what = shape("remove", {{"per_vector", double(per_vector)}}, s);
        SCOPED_TRACE(what);
        ExactFixture f(64, 16, 32, 3000, 21, Metric::L2, s);
        GpuIvfPqOptions opt;
        opt.filter_keys = true;
        opt.term1_per_vector = per_vector;
        auto idx = f.empty(opt);
        // Two batches: the second grows the lists, copying the keys held.
        f.add_rows(*idx, 0, f.n / 2, true, true);
        f.add_rows(*idx, f.n / 2, f.n, true, true);
        EXPECT_GE(idx->memory_use().keys, f.n * sizeof(int64_t));
        std::vector<char> present(f.n, 1);
        const Ranges r = mixed_ranges(f.nq);
        const KeyRange kr = r.view();
        check_subsets(f, *idx, opt, r, present, 30, 4, what + " two batches");
        // Every third id and all of list 0: the lists are compacted; a key
        // left behind its entry would filter another entry.
        std::vector<int64_t> gone(f.cpu.ids[0].begin(), f.cpu.ids[0].end());
        for (size_t i = 0; i < f.n; i += 3)
            gone.push_back(f.ids[i]);
        const std::set<int64_t> goneset(gone.begin(), gone.end());
        std::vector<size_t> back;
        for (size_t i = 0; i < f.n; ++i)
            if (goneset.count(f.ids[i])) {
                present[i] = 0;
                back.push_back(i);
            }
        ASSERT_EQ(idx->remove_ids(gone.data(), gone.size()), back.size());
        EXPECT_EQ(idx->list_size(0), 0u);
        check_subsets(f, *idx, opt, r, present, 30, 4, what + " after remove");
        check_subsets(f, *idx, opt, r, present, 200, 16, what + " after remove, all lists");
        const ExactResult ex = check_exact(f, *idx, f.q, 30, 4, what + " exact after remove", &kr);
        for (int64_t l : ex.labels)
            EXPECT_FALSE(goneset.count(l)) << "removed id " << l << " returned";
        // The removed rows back, appended after the survivors with their keys.
        f.add_picked(*idx, back, true, true);
        EXPECT_EQ(idx->ntotal(), f.n);
        std::fill(present.begin(), present.end(), 1);
        check_subsets(f, *idx, opt, r, present, 30, 4, what + " after re-adding");
        check_exact(f, *idx, f.q, 30, 4, what + " exact after re-adding", &kr);
    }
}

TEST(IvfPqFilterKeys, GpuEncodedAddAndDeviceEntryPoints)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(3505);
    ExactFixture f(64, 16, 16, 2000, 14, Metric::Cosine, s);
    GpuIvfPqOptions opt;
    opt.filter_keys = true;
    auto idx = f.empty(opt);
    idx->add(f.n, f.x.data(), f.ids.data(), f.keys.data());  // encoded on the GPU, keys beside
    EXPECT_EQ(idx->ntotal(), f.n);
    EXPECT_EQ(idx->memory_use().keys, f.n * sizeof(int64_t));
    const Ranges r = mixed_ranges(f.nq);
    const KeyRange kr = r.view();
    const size_t k = 40, nprobe = 4;
    const ExactResult host_exact = check_exact(f, *idx, f.q, k, nprobe, "gpu encoded", &kr);
    std::vector<float> hd(f.nq * k);
    std::vector<int64_t> hl(f.nq * k);
    idx->search(f.q.data(), f.nq, k, nprobe, hd.data(), hl.data(), LabelKind::Ids, &kr);
    // The device entry points take device ranges: the same results.
    DeviceBuffer dq = to_device(f.q), dlo = to_device(r.lo), dhi = to_device(r.hi);
    DeviceBuffer od(ctx(), f.nq * k * sizeof(float)), ol(ctx(), f.nq * k * sizeof(int64_t));
    DeviceBuffer oed(ctx(), f.nq * k * sizeof(double));
    const KeyRange dk{dlo.as<int64_t>(), dhi.as<int64_t>()};
    idx->search_device(dq.as<float>(), f.nq, k, nprobe, od.as<float>(), ol.as<int64_t>(), LabelKind::Ids, &dk);
    const auto gd = to_host<float>(od, f.nq * k);
    const auto gl = to_host<int64_t>(ol, f.nq * k);
    for (size_t e = 0; e < f.nq * k; ++e) {
        ASSERT_EQ(bits_of(gd[e]), bits_of(hd[e])) << "entry " << e;
        ASSERT_EQ(gl[e], hl[e]) << "entry " << e;
    }
    idx->search_exact_device(dq.as<float>(), f.nq, k, nprobe, oed.as<double>(), ol.as<int64_t>(), &dk);
    const auto ged = to_host<double>(oed, f.nq * k);
    const auto gel = to_host<int64_t>(ol, f.nq * k);
    for (size_t e = 0; e < f.nq * k; ++e) {
        ASSERT_EQ(bits_of(ged[e]), bits_of(host_exact.dist[e])) << "entry " << e;
        ASSERT_EQ(gel[e], host_exact.labels[e]) << "entry " << e;
    }
}

TEST(IvfPqFilterKeys, Arguments)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(3606);
    ExactFixture f(32, 8, 8, 600, 3, Metric::L2, s);
    const size_t k = 10, nprobe = 4;
    std::vector<float> dd(f.nq * k);
    std::vector<double> ed(f.nq * k);
    std::vector<int64_t> dl(f.nq * k);
    const Ranges r = uniform_ranges(f.nq, kMin, kMax);
    const KeyRange kr = r.view();
    DeviceBuffer dq = to_device(f.q), dlo = to_device(r.lo), dhi = to_device(r.hi);
    DeviceBuffer od(ctx(), ed.size() * sizeof(double)), ol(ctx(), dl.size() * sizeof(int64_t));
    const KeyRange dk{dlo.as<int64_t>(), dhi.as<int64_t>()};
    {
        // Without filter_keys: no keys accepted, no ranges either.
        auto idx = f.empty({});
        EXPECT_EQ(kind_of([&] {
                      idx->add_encoded(f.n, f.cpu.all_lists.data(), f.cpu.all_codes.data(), f.ids.data(),
                                       f.x.data(), f.keys.data());
                  }),
                  ErrorKind::InvalidArgument);
        EXPECT_EQ(kind_of([&] { idx->add(f.n, f.x.data(), f.ids.data(), f.keys.data()); }),
                  ErrorKind::InvalidArgument);
        EXPECT_EQ(idx->ntotal(), 0u);
        f.add_rows(*idx, 0, f.n);
        EXPECT_EQ(idx->memory_use().keys, 0u);
        EXPECT_EQ(kind_of([&] {
                      idx->search(f.q.data(), f.nq, k, nprobe, dd.data(), dl.data(), LabelKind::Ids, &kr);
                  }),
                  ErrorKind::InvalidArgument);
        EXPECT_EQ(kind_of([&] {
                      idx->search_device(dq.as<float>(), f.nq, k, nprobe, od.as<float>(), ol.as<int64_t>(),
                                         LabelKind::Ids, &dk);
                  }),
                  ErrorKind::InvalidArgument);
        EXPECT_EQ(kind_of([&] { idx->search_exact(f.q.data(), f.nq, k, nprobe, ed.data(), dl.data(), &kr); }),
                  ErrorKind::InvalidArgument);
        EXPECT_EQ(kind_of([&] {
                      idx->search_exact_device(dq.as<float>(), f.nq, k, nprobe, od.as<double>(),
                                               ol.as<int64_t>(), &dk);
                  }),
                  ErrorKind::InvalidArgument);
        check_exact(f, *idx, f.q, k, nprobe, "unfiltered index after refused calls");
    }
    {
        // With filter_keys: keys required (add_encoded and add); a refused
        // batch changes nothing; a range needs both bounds.
        GpuIvfPqOptions opt;
        opt.filter_keys = true;
        auto idx = f.empty(opt);
        EXPECT_EQ(kind_of([&] { f.add_rows(*idx, 0, f.n); }), ErrorKind::InvalidArgument);
        EXPECT_EQ(kind_of([&] { idx->add(f.n, f.x.data(), f.ids.data()); }), ErrorKind::InvalidArgument);
        EXPECT_EQ(idx->ntotal(), 0u);
        EXPECT_EQ(idx->memory_use().keys, 0u);
        // An empty index, filtered: all padding.
        idx->search(f.q.data(), f.nq, k, nprobe, dd.data(), dl.data(), LabelKind::Ids, &kr);
        for (size_t e = 0; e < dd.size(); ++e) {
            EXPECT_EQ(dd[e], std::numeric_limits<float>::infinity());
            EXPECT_EQ(dl[e], -1);
        }
        f.add_rows(*idx, 0, f.n, true, true);
        EXPECT_EQ(idx->memory_use().keys, f.n * sizeof(int64_t));
        const KeyRange half{r.lo.data(), nullptr};
        EXPECT_EQ(kind_of([&] {
                      idx->search(f.q.data(), f.nq, k, nprobe, dd.data(), dl.data(), LabelKind::Ids, &half);
                  }),
                  ErrorKind::InvalidArgument);
        EXPECT_EQ(kind_of([&] { idx->search_exact(f.q.data(), f.nq, k, nprobe, ed.data(), dl.data(), &half); }),
                  ErrorKind::InvalidArgument);
        // No queries: nothing to do, ranges or not.
        idx->search(f.q.data(), 0, k, nprobe, dd.data(), dl.data(), LabelKind::Ids, &kr);
        idx->search_exact(f.q.data(), 0, k, nprobe, ed.data(), dl.data(), &kr);
        // Unfiltered searches of a keyed index stay as they were.
        check_exact(f, *idx, f.q, k, nprobe, "keyed index, no ranges");
        check_exact(f, *idx, f.q, k, nprobe, "keyed index, every key", &kr);
    }
}
