// search_exact: the ADC candidates of search() re-ranked on the GPU by the
// shared exact distance (src/engine/exact_distance.h). Checked against the
// host's own evaluation of that header, bit for bit, for every metric and
// code width; the order, the padding, NaN, ties, removal and the stored
// vectors' bookkeeping.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <set>

#include "exact_fixture.h"
#include "gpu_ivfpq/ivfpq_index.h"
#include "gpu_test_util.h"

using namespace gputest;
using gpuivfpq::Error;
using gpuivfpq::ErrorKind;
using gpuivfpq::IvfPqModel;
using gpuivfpq::Metric;
using gpuivfpq::gpu::GpuIvfPqIndex;
using gpuivfpq::gpu::GpuIvfPqOptions;
using gpuivfpq::gpu::ScanAlgo;

namespace {

using gputest::kind_of;

const Metric kMetrics[] = {Metric::L2, Metric::InnerProduct, Metric::Cosine};

}  // namespace

TEST(IvfPqExact, BitIdenticalToHostExactDistance)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(2101);
    for (Metric metric : kMetrics)
        // m = 48: a 48 KiB table, which with the selection's own shared
        // arrays passes the default 48 KiB a block may use (opt-in needed).
        for (size_t m : {8, 32, 48, 128}) {
            const size_t d = m == 128 ? 256 : m == 48 ? 96 : 128;
            const std::string what =
                shape("exact", {{"d", double(d)}, {"m", double(m)}, {"metric", double(int(metric))}}, s + m);
            SCOPED_TRACE(what);
            ExactFixture f(d, 32, m, 3000, 40, metric, s + m);
            auto idx = f.empty({});
            f.add_rows(*idx, 0, f.n);
            ASSERT_EQ(idx->ntotal(), f.n);
            // One batch into empty lists: each list's buffer is exactly its size.
            EXPECT_EQ(idx->memory_use().vectors, f.n * f.d * sizeof(float));
            EXPECT_LE(idx->memory_use().total(), ctx().bytes_in_use());
            for (size_t k : {size_t(1), size_t(10), size_t(100), size_t(300)})
                for (size_t nprobe : {1, 8})
                    check_exact(f, *idx, f.q, k, nprobe,
                                what + " k=" + std::to_string(k) + " nprobe=" + std::to_string(nprobe));
            // k above the largest list, one probe: every query is padded.
            size_t kpad = 0;
            for (size_t l = 0; l < f.lists; ++l)
                kpad = std::max(kpad, idx->list_size(l) + 1);
            ASSERT_LE(kpad, gpuivfpq::kMaxSelectK);
            EXPECT_EQ(check_exact(f, *idx, f.q, kpad, 1, what + " padded").padded_queries, f.nq);
            // The device entry point: the same results, left on the device.
            const size_t k = 50, nprobe = 4;
            const ExactResult host = check_exact(f, *idx, f.q, k, nprobe, what + " device");
            DeviceBuffer dq = to_device(f.q), dd(ctx(), f.nq * k * sizeof(double)),
                         dl(ctx(), f.nq * k * sizeof(int64_t));
            idx->search_exact_device(dq.as<float>(), f.nq, k, nprobe, dd.as<double>(), dl.as<int64_t>());
            const auto gd = to_host<double>(dd, f.nq * k);
            const auto gl = to_host<int64_t>(dl, f.nq * k);
            for (size_t e = 0; e < f.nq * k; ++e) {
                ASSERT_EQ(bits_of(gd[e]), bits_of(host.dist[e])) << "entry " << e;
                ASSERT_EQ(gl[e], host.labels[e]) << "entry " << e;
            }
        }
}

// Wide vectors (d = 4096, 16 KiB each) at a small k and at the largest
// (k = 2048, a sort of 34 KiB in shared memory): bit for bit the host's.
TEST(IvfPqExact, WideVectorsSmallAndLargestK)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(2102);
    for (Metric metric : {Metric::L2, Metric::Cosine}) {
        const std::string what = shape("wide", {{"d", 4096.0}, {"metric", double(int(metric))}}, s);
        SCOPED_TRACE(what);
        ExactFixture f(4096, 4, 16, 700, 4, metric, s);
        auto idx = f.empty({});
        f.add_rows(*idx, 0, f.n);
        for (size_t k : {size_t(10), size_t(2048)})
            check_exact(f, *idx, f.q, k, 4, what + " k=" + std::to_string(k));
    }
}

TEST(IvfPqExact, EveryScanLayoutAndFullK)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(2202);
    ExactFixture f(128, 32, 16, 4000, 20, Metric::L2, s);
    // The paper's per-list tables, fp16 tables and the two-pass scan give the
    // candidates too; the largest k sorts kMaxSelectK entries (and pads: 4 of
    // 32 lists hold far fewer).
    for (int variant = 0; variant < 3; ++variant) {
        GpuIvfPqOptions opt;
        opt.scan = variant == 1 ? ScanAlgo::TwoPass : ScanAlgo::Auto;
        opt.term1_per_vector = variant != 2;
        opt.float16_tables = variant == 2;
        auto idx = f.empty(opt);
        f.add_rows(*idx, 0, f.n);
        const std::string what = shape("layout", {{"variant", double(variant)}}, s);
        for (size_t k : {size_t(7), size_t(1000)})
            check_exact(f, *idx, f.q, k, 8, what + " k=" + std::to_string(k));
        const ExactResult r = check_exact(f, *idx, f.q, gpuivfpq::kMaxSelectK, 4, what + " full k");
        EXPECT_GT(r.padded_queries, 0u);
    }
}

TEST(IvfPqExact, RemoveAndReAddKeepVectorsWithTheirIds)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(2303);
    for (Metric metric : kMetrics) {
        const std::string what = shape("remove", {{"metric", double(int(metric))}}, s);
        SCOPED_TRACE(what);
        ExactFixture f(128, 16, 32, 3000, 30, metric, s);
        auto idx = f.empty({});
        // Two batches: the second grows the lists, copying the vectors held.
        f.add_rows(*idx, 0, f.n / 2);
        f.add_rows(*idx, f.n / 2, f.n);
        EXPECT_GE(idx->memory_use().vectors, f.n * f.d * sizeof(float));
        check_exact(f, *idx, f.q, 50, 4, what + " two batches");
        // Every third id: the lists are compacted; a vector left behind its
        // id would give another vector's distance.
        std::vector<int64_t> gone;
        for (size_t i = 0; i < f.n; i += 3)
            gone.push_back(f.ids[i]);
        ASSERT_EQ(idx->remove_ids(gone.data(), gone.size()), gone.size());
        const ExactResult r = check_exact(f, *idx, f.q, 50, 4, what + " after remove");
        const std::set<int64_t> goneset(gone.begin(), gone.end());
        for (int64_t l : r.labels)
            EXPECT_FALSE(goneset.count(l)) << "removed id " << l << " returned";
        // All of one list's entries plus more: lists emptied and refilled.
        std::vector<int64_t> more(f.cpu.ids[0].begin(), f.cpu.ids[0].end());
        for (size_t i = 1; i < f.n; i += 7)
            more.push_back(f.ids[i]);
        idx->remove_ids(more.data(), more.size());
        EXPECT_EQ(idx->list_size(0), 0u);
        check_exact(f, *idx, f.q, 100, 6, what + " after second remove");
        // The removed rows back (appended after the survivors).
        std::set<int64_t> all_gone(gone.begin(), gone.end());
        all_gone.insert(more.begin(), more.end());
        std::vector<int32_t> al;
        std::vector<uint8_t> ac;
        std::vector<int64_t> ai;
        std::vector<float> av;
        for (size_t i = 0; i < f.n; ++i)
            if (all_gone.count(f.ids[i])) {
                al.push_back(f.cpu.all_lists[i]);
                ac.insert(ac.end(), f.cpu.all_codes.begin() + i * f.m, f.cpu.all_codes.begin() + (i + 1) * f.m);
                ai.push_back(f.ids[i]);
                av.insert(av.end(), f.x.begin() + i * f.d, f.x.begin() + (i + 1) * f.d);
            }
        idx->add_encoded(ai.size(), al.data(), ac.data(), ai.data(), av.data());
        EXPECT_EQ(idx->ntotal(), f.n);
        check_exact(f, *idx, f.q, 100, 6, what + " after re-adding");
    }
}

TEST(IvfPqExact, TiesComeBackInIdOrder)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(2404);
    for (Metric metric : kMetrics) {
        const std::string what = shape("ties", {{"metric", double(int(metric))}}, s);
        SCOPED_TRACE(what);
        ExactFixture f(128, 16, 8, 2000, 10, metric, s);
        auto idx = f.empty({});
        f.add_rows(*idx, 0, f.n);
        // Five copies of row r under ids out of order: same list, same code,
        // so the same ADC distance, and the same exact distance as row r.
        const size_t r = 11;
        const std::vector<int64_t> dup_ids = {900001, 5, 900000, 17, 4};
        std::vector<float> dups;
        for (size_t c = 0; c < dup_ids.size(); ++c)
            dups.insert(dups.end(), f.x.begin() + r * f.d, f.x.begin() + (r + 1) * f.d);
        f.add_extra(*idx, dups, dup_ids);
        std::vector<int64_t> group = dup_ids;
        group.push_back(f.ids[r]);
        std::sort(group.begin(), group.end());
        // Query 0 is row r itself; all lists probed.
        std::vector<float> queries = f.q;
        std::copy(f.x.begin() + r * f.d, f.x.begin() + (r + 1) * f.d, queries.begin());
        const size_t k = 200;
        const ExactResult res = check_exact(f, *idx, queries, k, f.lists, what);
        const int64_t* el = res.labels.data();
        const auto first = std::find(el, el + k, group[0]);
        ASSERT_NE(first, el + k) << "id " << group[0] << " of the tied group not among the candidates";
        const size_t at = size_t(first - el);
        ASSERT_LE(at + group.size(), k);
        for (size_t g = 0; g < group.size(); ++g) {
            EXPECT_EQ(el[at + g], group[g]) << "tied rank " << g;
            EXPECT_EQ(bits_of(res.dist[at + g]), bits_of(res.dist[at])) << "tied rank " << g;
        }
    }
}

TEST(IvfPqExact, CosineZeroVectorIsNanBeforePadding)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(2505);
    ExactFixture f(64, 8, 16, 500, 5, Metric::Cosine, s);
    auto idx = f.empty({});
    f.add_rows(*idx, 0, f.n);
    const int64_t zero_id = 123456;
    f.add_extra(*idx, std::vector<float>(f.d, 0.0f), {zero_id});
    // Every list probed and k above the entries: all 501 come back, the zero
    // vector's NaN after every number, then the padding.
    const size_t k = 600, total = f.n + 1;
    const ExactResult r = check_exact(f, *idx, f.q, k, f.lists, "cosine zero");
    for (size_t i = 0; i < f.nq; ++i) {
        const double* ed = r.dist.data() + i * k;
        const int64_t* el = r.labels.data() + i * k;
        EXPECT_TRUE(std::isfinite(ed[total - 2])) << "query " << i;
        EXPECT_TRUE(std::isnan(ed[total - 1])) << "query " << i;
        EXPECT_EQ(el[total - 1], zero_id) << "query " << i;
        EXPECT_EQ(el[total], -1) << "query " << i;
        EXPECT_EQ(ed[total], std::numeric_limits<double>::infinity()) << "query " << i;
    }
}

TEST(IvfPqExact, GpuEncodedAddStoresVectorsAsGiven)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(2606);
    for (Metric metric : {Metric::L2, Metric::Cosine}) {
        const std::string what = shape("add", {{"metric", double(int(metric))}}, s);
        SCOPED_TRACE(what);
        ExactFixture f(128, 16, 16, 2000, 20, metric, s);
        auto idx = f.empty({});
        idx->add(f.n, f.x.data(), f.ids.data());  // Cosine: encoded from a normalised copy
        EXPECT_EQ(idx->memory_use().vectors, f.n * f.d * sizeof(float));
        check_exact(f, *idx, f.q, 30, 4, what);
    }
}

TEST(IvfPqExact, ArgumentsAndUnsupported)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(2707);
    ExactFixture f(32, 8, 8, 600, 3, Metric::L2, s);
    std::vector<double> dd(f.nq * 10);
    std::vector<int64_t> dl(f.nq * 10);
    {
        // Without store_vectors: no vectors kept, none accepted, no exact search.
        auto idx = f.empty({}, false);
        EXPECT_EQ(kind_of([&] {
                      idx->add_encoded(f.n, f.cpu.all_lists.data(), f.cpu.all_codes.data(), f.ids.data(),
                                       f.x.data());
                  }),
                  ErrorKind::InvalidArgument);
        EXPECT_EQ(idx->ntotal(), 0u);
        f.add_rows(*idx, 0, f.n, false);
        EXPECT_EQ(idx->ntotal(), f.n);
        EXPECT_EQ(idx->memory_use().vectors, 0u);
        EXPECT_EQ(kind_of([&] { idx->search_exact(f.q.data(), f.nq, 10, 4, dd.data(), dl.data()); }),
                  ErrorKind::Unsupported);
        DeviceBuffer dq = to_device(f.q), od(ctx(), dd.size() * sizeof(double)),
                     ol(ctx(), dl.size() * sizeof(int64_t));
        EXPECT_EQ(kind_of([&] {
                      idx->search_exact_device(dq.as<float>(), f.nq, 10, 4, od.as<double>(), ol.as<int64_t>());
                  }),
                  ErrorKind::Unsupported);
    }
    {
        // With store_vectors: vectors required; a refused batch changes nothing.
        auto idx = f.empty({});
        EXPECT_EQ(kind_of([&] {
                      idx->add_encoded(f.n, f.cpu.all_lists.data(), f.cpu.all_codes.data(), f.ids.data());
                  }),
                  ErrorKind::InvalidArgument);
        EXPECT_EQ(idx->ntotal(), 0u);
        EXPECT_EQ(idx->memory_use().vectors, 0u);
        // Searching an empty index: all padding.
        idx->search_exact(f.q.data(), f.nq, 10, 4, dd.data(), dl.data());
        for (size_t e = 0; e < dd.size(); ++e) {
            EXPECT_EQ(dd[e], std::numeric_limits<double>::infinity());
            EXPECT_EQ(dl[e], -1);
        }
        f.add_rows(*idx, 0, f.n);
        EXPECT_EQ(idx->memory_use().vectors, f.n * f.d * sizeof(float));
        // k outside [1, kMaxSelectK] as search() refuses it.
        std::vector<double> big_d(gpuivfpq::kMaxSelectK + 1);
        std::vector<int64_t> big_l(gpuivfpq::kMaxSelectK + 1);
        EXPECT_EQ(kind_of([&] {
                      idx->search_exact(f.q.data(), 1, gpuivfpq::kMaxSelectK + 1, 4, big_d.data(), big_l.data());
                  }),
                  ErrorKind::InvalidArgument);
        EXPECT_EQ(kind_of([&] { idx->search_exact(f.q.data(), 1, 0, 4, big_d.data(), big_l.data()); }),
                  ErrorKind::InvalidArgument);
        check_exact(f, *idx, f.q, 10, 4, "after refused calls");
    }
}
