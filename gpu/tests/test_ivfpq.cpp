// IVFPQ on the GPU against the CPU engine: lookup tables per (query, list),
// encoding, end-to-end search (same neighbours up to ties, same recall),
// appends and removals, memory report.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "../../src/engine/exact_distance.h"
#include "gpu_ivfpq/exact_search.h"
#include "gpu_ivfpq/ivfpq_index.h"
#include "gpu_test_util.h"

using namespace gputest;
using gpuivfpq::IvfPqModel;
using gpuivfpq::Metric;
using gpuivfpq::Neighbor;
using gpuivfpq::gpu::GpuIvfPqIndex;
using gpuivfpq::gpu::GpuIvfPqOptions;
using gpuivfpq::gpu::LabelKind;
using gpuivfpq::gpu::ScanAlgo;

namespace {

struct Fixture {
    size_t d, lists, m, n, nq;
    Metric metric;
    std::vector<float> x, q;
    std::vector<int64_t> ids;
    std::unique_ptr<IvfPqModel> model;
    CpuIvf cpu;

    Fixture(size_t d_, size_t lists_, size_t m_, size_t n_, size_t nq_, Metric metric_, uint64_t s,
            bool precompute = true)
        : d(d_), lists(lists_), m(m_), n(n_), nq(nq_), metric(metric_)
    {
        x = clustered(n, d, 40, 4.0f, s);
        q = clustered(nq, d, 40, 4.0f, s + 1);
        ids.resize(n);
        for (size_t i = 0; i < n; ++i)
            ids[i] = int64_t(i) * 3 + 7;  // ids unlike positions
        model = std::make_unique<IvfPqModel>(d, lists, m, metric);
        gpuivfpq::IvfPqTrainParams tp;
        tp.iterations = 6;
        tp.seed = s;
        model->train(x.data(), n, tp);
        if (precompute)
            model->precompute_tables(size_t(1) << 30);
        cpu.build(*model, x.data(), n, ids.data());
    }

    std::unique_ptr<GpuIvfPqIndex> gpu(const GpuIvfPqOptions& opt) const
    {
        auto idx = std::make_unique<GpuIvfPqIndex>(ctx(), d, lists, m, metric, model->centroids().data(),
                                                   model->pq().codebooks().data(), opt);
        idx->add_encoded(n, cpu.all_lists.data(), cpu.all_codes.data(), ids.data());
        return idx;
    }
};

// 1-recall@r: fraction of queries whose exact nearest id is in the first r.
double recall_at(const std::vector<int64_t>& labels, size_t k, const std::vector<int64_t>& gt, size_t r)
{
    size_t hit = 0;
    for (size_t i = 0; i < gt.size(); ++i)
        for (size_t j = 0; j < std::min(r, k); ++j)
            if (labels[i * k + j] == gt[i]) {
                ++hit;
                break;
            }
    return double(hit) / gt.size();
}

std::vector<int64_t> exact_nn(const Fixture& f)
{
    std::vector<float> dd(f.nq);
    std::vector<int64_t> ll(f.nq);
    gpuivfpq::brute_force_knn(f.q.data(), f.nq, f.x.data(), f.n, f.d, f.metric, 1, dd.data(), ll.data());
    for (auto& l : ll)
        l = f.ids[l];
    return ll;
}

// GPU search = CPU search up to ties: distances per rank within tol, and a
// GPU id missing from the CPU list only where its distance ties the CPU k-th.
void compare_search(const Fixture& f, const GpuIvfPqIndex& idx, size_t k, size_t nprobe, double rel_tol,
                    const std::string& what, std::vector<int64_t>* gpu_labels = nullptr)
{
    SCOPED_TRACE(what);
    std::vector<float> gd(f.nq * k);
    std::vector<int64_t> gl(f.nq * k);
    idx.search(f.q.data(), f.nq, k, nprobe, gd.data(), gl.data());
    int bad = 0;
    for (size_t i = 0; i < f.nq && bad < 5; ++i) {
        auto ref = f.cpu.search(f.q.data() + i * f.d, k, nprobe);
        std::map<int64_t, float> cpu_ids;
        for (auto& nb : ref)
            cpu_ids[nb.label] = nb.dist;
        const double scale = ref.empty() ? 1.0 : std::max(1.0, std::fabs(double(ref.back().dist)));
        const double tol = rel_tol * scale;
        for (size_t j = 0; j < k; ++j) {
            const float g = gd[i * k + j];
            const int64_t l = gl[i * k + j];
            if (j >= ref.size()) {
                if (!(std::isinf(g) && l == -1)) {
                    ADD_FAILURE() << "query " << i << " rank " << j << ": expected padding";
                    ++bad;
                }
                continue;
            }
            if (std::fabs(double(g) - ref[j].dist) > tol) {
                ADD_FAILURE() << "query " << i << " rank " << j << ": cpu " << ref[j].dist << " gpu " << g
                              << " (tol " << tol << ")";
                ++bad;
                break;
            }
            if (!cpu_ids.count(l) && std::fabs(double(g) - ref.back().dist) > tol) {
                ADD_FAILURE() << "query " << i << " rank " << j << ": id " << l << " not in cpu result";
                ++bad;
                break;
            }
        }
    }
    if (gpu_labels)
        *gpu_labels = gl;
}

}  // namespace

TEST(IvfPqTables, MatchCpuListTables)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(808);
    struct Case { size_t d, m; Metric metric; bool pre; };
    const Case cases[] = {{64, 1, Metric::L2, true},  {40, 5, Metric::L2, true},
                          {64, 8, Metric::L2, false}, {64, 16, Metric::InnerProduct, true},
                          {64, 32, Metric::Cosine, true}, {64, 64, Metric::L2, true},
                          {64, 16, Metric::Cosine, false}, {128, 128, Metric::L2, true},
                          {256, 128, Metric::InnerProduct, false}};
    for (const Case& c : cases)
        for (bool half : {false, true}) {
            const std::string what = shape("tables", {{"d", double(c.d)}, {"m", double(c.m)},
                                                      {"metric", double(int(c.metric))},
                                                      {"pre", double(c.pre)}, {"half", double(half)}}, s);
            SCOPED_TRACE(what);
            Fixture f(c.d, 16, c.m, 2000, 7, c.metric, s, c.pre);
            GpuIvfPqOptions opt;
            opt.term1_per_vector = false;  // the paper's per-list tables
            opt.precompute_term1 = c.pre;
            opt.float16_tables = half;
            GpuIvfPqIndex idx(ctx(), f.d, f.lists, f.m, f.metric, f.model->centroids().data(),
                              f.model->pq().codebooks().data(), opt);
            const size_t nprobe = 5, row = f.m * 256;
            std::vector<int32_t> gl(f.nq * nprobe);
            std::vector<float> gb(f.nq * nprobe), gt(f.nq * nprobe * row), ct(row);
            idx.compute_tables(f.q.data(), f.nq, nprobe, gl.data(), gb.data(), gt.data());
            int bad = 0;
            for (size_t i = 0; i < f.nq && bad < 3; ++i) {
                gpuivfpq::IvfPqQuery pq;
                f.model->prepare_query(f.q.data() + i * f.d, nprobe, pq);
                for (size_t p = 0; p < nprobe && bad < 3; ++p) {
                    // Same list on both sides (the order may differ on near-ties).
                    size_t gp = nprobe;
                    for (size_t t = 0; t < nprobe; ++t)
                        if (gl[i * nprobe + t] == pq.lists[p])
                            gp = t;
                    if (gp == nprobe)
                        continue;
                    float cb = 0;
                    f.model->list_table(pq, p, ct.data(), &cb);
                    double tmax = 0;
                    for (float v : ct)
                        tmax = std::max(tmax, std::fabs(double(v)));
                    const double ttol = half ? 2e-3 * tmax + 1e-3 : 1e-5 * tmax + 1e-5;
                    const double btol = 1e-5 * (1.0 + std::fabs(cb));
                    if (std::fabs(double(cb) - gb[i * nprobe + gp]) > btol) {
                        ADD_FAILURE() << "query " << i << " probe " << p << " base cpu " << cb << " gpu "
                                      << gb[i * nprobe + gp];
                        ++bad;
                    }
                    const float* g = gt.data() + (i * nprobe + gp) * row;
                    for (size_t e = 0; e < row; ++e)
                        if (std::fabs(double(ct[e]) - g[e]) > ttol) {
                            ADD_FAILURE() << "query " << i << " probe " << p << " entry " << e << " cpu "
                                          << ct[e] << " gpu " << g[e];
                            ++bad;
                            break;
                        }
                }
            }
        }
}

TEST(IvfPqEncode, MatchesCpuEncode)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(909);
    for (size_t m : {8, 16, 128}) {
        Fixture f(m == 128 ? 256 : 32, 32, m, 3000, 1, Metric::L2, s + m);
        GpuIvfPqIndex idx(ctx(), f.d, f.lists, f.m, f.metric, f.model->centroids().data(),
                          f.model->pq().codebooks().data());
        std::vector<int32_t> gl(f.n);
        std::vector<uint8_t> gc(f.n * f.m);
        idx.encode(f.x.data(), f.n, gl.data(), gc.data());
        size_t list_same = 0, code_same = 0, codes = 0;
        for (size_t i = 0; i < f.n; ++i) {
            list_same += gl[i] == f.cpu.all_lists[i];
            if (gl[i] == f.cpu.all_lists[i])
                for (size_t j = 0; j < f.m; ++j, ++codes)
                    code_same += gc[i * f.m + j] == f.cpu.all_codes[i * f.m + j];
        }
        // Near-ties may round either way; anything more is a bug.
        EXPECT_GE(double(list_same) / f.n, 0.995) << shape("encode", {{"m", double(m)}}, s + m);
        EXPECT_GE(double(code_same) / codes, 0.995) << shape("encode", {{"m", double(m)}}, s + m);
    }
}

TEST(IvfPqSearch, SameNeighboursAsCpu)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(1001);
    struct Case { size_t d, m; Metric metric; bool pre; };
    const Case cases[] = {{32, 8, Metric::L2, true},   {32, 8, Metric::L2, false},
                          {64, 16, Metric::InnerProduct, true}, {64, 64, Metric::Cosine, true},
                          {30, 3, Metric::L2, true},   {64, 32, Metric::L2, true},
                          {128, 128, Metric::L2, true}, {256, 128, Metric::Cosine, false}};
    for (const Case& c : cases) {
        Fixture f(c.d, 32, c.m, 5000, 60, c.metric, s + c.m, c.pre);
        for (int variant = 0; variant < 4; ++variant) {
            const ScanAlgo algo = variant % 2 ? ScanAlgo::TwoPass : ScanAlgo::Fused;
            const bool per_vector = variant < 2;
            GpuIvfPqOptions opt;
            opt.precompute_term1 = c.pre;
            opt.term1_per_vector = per_vector;
            opt.scan = algo;
            auto idx = f.gpu(opt);
            EXPECT_EQ(idx->ntotal(), f.n);
            EXPECT_EQ(idx->has_precomputed(), c.pre && !per_vector && c.metric != Metric::InnerProduct);
            for (size_t k : {1, 10, 100})
                for (size_t nprobe : {1, 4, 16})
                    compare_search(f, *idx, k, nprobe, 2e-4,
                                   shape("search", {{"d", double(c.d)}, {"m", double(c.m)},
                                                    {"metric", double(int(c.metric))}, {"pre", double(c.pre)},
                                                    {"twopass", double(algo == ScanAlgo::TwoPass)},
                                                    {"per_vector", double(per_vector)},
                                                    {"k", double(k)}, {"nprobe", double(nprobe)}},
                                         s + c.m));
        }
    }
}

// Rows and a query past the float range, whose coarse and ADC distances
// overflow: with every list probed and k = every entry, the GPU selects
// every entry, as the CPU engine does (an overflowed distance is
// kOverflowDistance, after every finite one, never the +inf of padding),
// in the fused and the two-pass scan; search_exact re-ranks all of them by
// exact distance, the huge query's own row first; the GPU's encoding gives
// every such row a list.
TEST(IvfPqSearch, OverflowedEntriesStillCompete)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(1101);
    const size_t d = 16, lists = 8, m = 4, n = 1000;
    for (Metric metric : {Metric::L2, Metric::InnerProduct, Metric::Cosine}) {
        SCOPED_TRACE("metric " + std::to_string(int(metric)));
        Fixture f(d, lists, m, n, 2, metric, s);
        for (size_t i = 0; i < 10; ++i)
            for (size_t t = 0; t < d; ++t)
                f.x[i * 97 * d + t] = (t + i) % 2 ? -3e38f : 1e20f * float(t + 1);
        std::copy(f.x.begin() + 97 * d, f.x.begin() + 98 * d, f.q.begin() + d);
        f.cpu.build(*f.model, f.x.data(), n, f.ids.data());
        std::vector<int64_t> all(f.ids);
        std::sort(all.begin(), all.end());
        for (ScanAlgo algo : {ScanAlgo::Fused, ScanAlgo::TwoPass}) {
            SCOPED_TRACE(algo == ScanAlgo::Fused ? "fused" : "two-pass");
            GpuIvfPqOptions opt;
            opt.scan = algo;
            opt.store_vectors = true;
            GpuIvfPqIndex idx(ctx(), d, lists, m, metric, f.model->centroids().data(),
                              f.model->pq().codebooks().data(), opt);
            idx.add_encoded(n, f.cpu.all_lists.data(), f.cpu.all_codes.data(), f.ids.data(), f.x.data());
            const size_t k = n;
            std::vector<float> gd(f.nq * k);
            std::vector<int64_t> gl(f.nq * k), el(f.nq * k);
            std::vector<double> ed(f.nq * k);
            idx.search(f.q.data(), f.nq, k, lists, gd.data(), gl.data());
            idx.search_exact(f.q.data(), f.nq, k, lists, ed.data(), el.data());
            for (size_t i = 0; i < f.nq; ++i) {
                SCOPED_TRACE("query " + std::to_string(i));
                std::vector<int64_t> got(gl.begin() + i * k, gl.begin() + (i + 1) * k);
                std::sort(got.begin(), got.end());
                EXPECT_EQ(got, all);
                for (size_t j = 0; j < k; ++j)
                    ASSERT_TRUE(gd[i * k + j] <= gpuivfpq::kOverflowDistance) << "rank " << j << ": " << gd[i * k + j];
                std::vector<int64_t> exact(el.begin() + i * k, el.begin() + (i + 1) * k);
                std::sort(exact.begin(), exact.end());
                EXPECT_EQ(exact, all);
                for (size_t j = 1; j < k; ++j)
                    EXPECT_TRUE(gpuivfpq::exact_less(ed[i * k + j - 1], el[i * k + j - 1], ed[i * k + j],
                                                     el[i * k + j]))
                        << "rank " << j;
            }
            if (metric == Metric::L2) {
                EXPECT_EQ(el[k], f.ids[97]);
            }
            std::vector<int32_t> enc_lists(n);
            std::vector<uint8_t> enc_codes(n * m);
            idx.encode(f.x.data(), n, enc_lists.data(), enc_codes.data());
            for (size_t i = 0; i < n; ++i)
                ASSERT_TRUE(enc_lists[i] >= 0 && size_t(enc_lists[i]) < lists) << "row " << i;
        }
    }
}

TEST(IvfPqSearch, RecallMatchesCpu)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(1102);
    for (bool half : {false, true}) {
        Fixture f(64, 64, 16, 20000, 300, Metric::L2, s);
        GpuIvfPqOptions opt;
        opt.float16_tables = half;
        auto idx = f.gpu(opt);
        auto gt = exact_nn(f);
        const size_t k = 10;
        for (size_t nprobe : {1, 8, 32}) {
            std::vector<float> gd(f.nq * k);
            std::vector<int64_t> gl(f.nq * k), cl(f.nq * k);
            idx->search(f.q.data(), f.nq, k, nprobe, gd.data(), gl.data());
            for (size_t i = 0; i < f.nq; ++i) {
                auto r = f.cpu.search(f.q.data() + i * f.d, k, nprobe);
                for (size_t j = 0; j < k; ++j)
                    cl[i * k + j] = j < r.size() ? r[j].label : -1;
            }
            const double rg = recall_at(gl, k, gt, 10), rc = recall_at(cl, k, gt, 10);
            EXPECT_NEAR(rg, rc, half ? 0.02 : 0.005)
                << shape("recall@10", {{"nprobe", double(nprobe)}, {"half", double(half)}}, s);
            if (half && nprobe == 8)
                compare_search(f, *idx, k, nprobe, 5e-3, shape("half search", {{"nprobe", 8}}, s));
        }
    }
}

TEST(IvfPqIndex, ListOffsetLabelsAppendRemoveMemory)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(1203);
    Fixture f(32, 16, 8, 4000, 40, Metric::L2, s);
    GpuIvfPqOptions opt;
    // Append in two batches: the same index as one batch.
    GpuIvfPqIndex idx(ctx(), f.d, f.lists, f.m, f.metric, f.model->centroids().data(),
                      f.model->pq().codebooks().data(), opt);
    const size_t half_n = f.n / 2;
    idx.add_encoded(half_n, f.cpu.all_lists.data(), f.cpu.all_codes.data(), f.ids.data());
    idx.add_encoded(f.n - half_n, f.cpu.all_lists.data() + half_n, f.cpu.all_codes.data() + half_n * f.m,
                    f.ids.data() + half_n);
    ASSERT_EQ(idx.ntotal(), f.n);
    size_t sum = 0;
    for (size_t l = 0; l < f.lists; ++l) {
        EXPECT_EQ(idx.list_size(l), f.cpu.ids[l].size());
        sum += idx.list_size(l);
    }
    EXPECT_EQ(sum, f.n);
    auto mem = idx.memory_use();
    EXPECT_GE(mem.codes, f.n * f.m);
    EXPECT_GE(mem.ids, f.n * sizeof(int64_t));
    EXPECT_EQ(mem.centroids, f.lists * f.d * 4 + f.lists * 4);
    EXPECT_EQ(mem.term1, 0u);  // default: term 1 folded per vector
    EXPECT_GE(mem.vector_terms, f.n * sizeof(float));
    EXPECT_LE(mem.total(), ctx().bytes_in_use());
    compare_search(f, idx, 10, 4, 2e-4, shape("two batches", {}, s));

    // (list, offset) labels point at the stored vectors.
    const size_t k = 10, nprobe = 4;
    std::vector<float> d1(f.nq * k), d2(f.nq * k);
    std::vector<int64_t> l1(f.nq * k), l2(f.nq * k);
    idx.search(f.q.data(), f.nq, k, nprobe, d1.data(), l1.data(), LabelKind::Ids);
    idx.search(f.q.data(), f.nq, k, nprobe, d2.data(), l2.data(), LabelKind::ListOffset);
    for (size_t e = 0; e < f.nq * k; ++e) {
        ASSERT_EQ(d1[e], d2[e]);
        if (l2[e] < 0)
            continue;
        const int64_t list = l2[e] >> 32, off = l2[e] & 0xffffffff;
        ASSERT_LT(size_t(off), f.cpu.ids[list].size());
        EXPECT_EQ(f.cpu.ids[list][off], l1[e]);
    }

    // Remove every third id: gone from results, the rest as the CPU over the rest.
    std::vector<int64_t> gone;
    for (size_t i = 0; i < f.n; i += 3)
        gone.push_back(f.ids[i]);
    EXPECT_EQ(idx.remove_ids(gone.data(), gone.size()), gone.size());
    EXPECT_EQ(idx.ntotal(), f.n - gone.size());
    std::set<int64_t> goneset(gone.begin(), gone.end());
    Fixture& g = f;
    for (size_t l = 0; l < g.lists; ++l) {
        std::vector<uint8_t> keep_codes;
        std::vector<int64_t> keep_ids;
        for (size_t i = 0; i < g.cpu.ids[l].size(); ++i)
            if (!goneset.count(g.cpu.ids[l][i])) {
                keep_ids.push_back(g.cpu.ids[l][i]);
                keep_codes.insert(keep_codes.end(), g.cpu.codes[l].begin() + i * g.m,
                                  g.cpu.codes[l].begin() + (i + 1) * g.m);
            }
        g.cpu.ids[l] = keep_ids;
        g.cpu.codes[l] = keep_codes;
    }
    std::vector<int64_t> labels;
    compare_search(g, idx, 10, 4, 2e-4, shape("after remove", {}, s), &labels);
    for (int64_t l : labels)
        EXPECT_FALSE(goneset.count(l)) << "removed id " << l << " returned";
}

TEST(IvfPqIndex, RemoveIdsOnDevice)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(1254);
    Fixture f(32, 16, 8, 3000, 30, Metric::L2, s);
    const CpuIvf all = f.cpu;
    for (bool per_vector : {true, false}) {
        const std::string what = shape("remove", {{"per_vector", double(per_vector)}}, s);
        SCOPED_TRACE(what);
        f.cpu = all;
        GpuIvfPqOptions opt;
        opt.term1_per_vector = per_vector;
        auto idx = f.gpu(opt);
        EXPECT_EQ(idx->remove_ids(nullptr, 0), 0u);
        // All of list 0 (a list emptied), every 5th id, duplicates, ids never stored.
        std::vector<int64_t> gone(all.ids[0].begin(), all.ids[0].end());
        for (size_t i = 0; i < f.n; i += 5)
            gone.push_back(f.ids[i]);
        gone.push_back(f.ids[1]);
        gone.push_back(f.ids[1]);
        gone.push_back(-5);
        gone.push_back(int64_t(1) << 40);
        const std::set<int64_t> goneset(gone.begin(), gone.end());
        size_t expect = 0;
        for (int64_t id : f.ids)
            expect += goneset.count(id);
        ASSERT_GT(all.ids[0].size(), 0u);
        EXPECT_EQ(idx->remove_ids(gone.data(), gone.size()), expect);
        EXPECT_EQ(idx->ntotal(), f.n - expect);
        EXPECT_EQ(idx->remove_ids(gone.data(), gone.size()), 0u);  // nothing left to remove
        // The CPU lists without the removed ids, in their order.
        for (size_t l = 0; l < f.lists; ++l) {
            std::vector<uint8_t> keep_codes;
            std::vector<int64_t> keep_ids;
            for (size_t i = 0; i < all.ids[l].size(); ++i)
                if (!goneset.count(all.ids[l][i])) {
                    keep_ids.push_back(all.ids[l][i]);
                    keep_codes.insert(keep_codes.end(), all.codes[l].begin() + i * f.m,
                                      all.codes[l].begin() + (i + 1) * f.m);
                }
            f.cpu.ids[l] = keep_ids;
            f.cpu.codes[l] = keep_codes;
            EXPECT_EQ(idx->list_size(l), keep_ids.size()) << "list " << l;
        }
        EXPECT_EQ(idx->list_size(0), 0u);
        // Order kept: (list, offset) labels name the CPU's entry at that offset.
        const size_t k = 20, nprobe = 6;
        std::vector<float> d1(f.nq * k), d2(f.nq * k);
        std::vector<int64_t> l1(f.nq * k), l2(f.nq * k);
        idx->search(f.q.data(), f.nq, k, nprobe, d1.data(), l1.data(), LabelKind::Ids);
        idx->search(f.q.data(), f.nq, k, nprobe, d2.data(), l2.data(), LabelKind::ListOffset);
        for (size_t e = 0; e < f.nq * k; ++e) {
            ASSERT_EQ(d1[e], d2[e]);
            if (l2[e] < 0)
                continue;
            const int64_t list = l2[e] >> 32, off = l2[e] & 0xffffffff;
            ASSERT_LT(size_t(off), f.cpu.ids[list].size());
            EXPECT_EQ(f.cpu.ids[list][off], l1[e]);
            EXPECT_FALSE(goneset.count(l1[e])) << "removed id " << l1[e] << " returned";
        }
        // Codes (and per-vector term 1) moved with their ids: same search as the CPU.
        compare_search(f, *idx, 10, nprobe, 2e-4, what + " after remove");
        // Appending after a removal: the removed vectors back, the full set again.
        std::vector<int32_t> add_lists;
        std::vector<uint8_t> add_codes;
        std::vector<int64_t> add_ids;
        for (size_t i = 0; i < f.n; ++i)
            if (goneset.count(f.ids[i])) {
                add_lists.push_back(all.all_lists[i]);
                add_codes.insert(add_codes.end(), all.all_codes.begin() + i * f.m,
                                 all.all_codes.begin() + (i + 1) * f.m);
                add_ids.push_back(f.ids[i]);
            }
        idx->add_encoded(add_ids.size(), add_lists.data(), add_codes.data(), add_ids.data());
        EXPECT_EQ(idx->ntotal(), f.n);
        f.cpu = all;
        compare_search(f, *idx, 10, nprobe, 2e-4, what + " after re-adding");
    }
}

TEST(IvfPqIndex, GpuTrainedAndGpuEncoded)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(1304);
    const size_t d = 32, lists = 32, m = 8, n = 10000, nq = 200;
    auto x = clustered(n, d, 40, 4.0f, s);
    auto q = clustered(nq, d, 40, 4.0f, s + 1);
    std::vector<float> cents(lists * d), cbs(m * 256 * (d / m));
    gpuivfpq::KMeansParams kp;
    kp.iterations = 8;
    kp.seed = s;
    gpuivfpq::gpu::train_ivfpq_gpu(ctx(), x.data(), n, d, lists, m, Metric::L2, kp, kp, 65536,
                                   cents.data(), cbs.data());
    for (float v : cents)
        ASSERT_TRUE(std::isfinite(v));
    // The same model on both sides: CPU engine with GPU-trained parameters.
    IvfPqModel model(d, lists, m, Metric::L2);
    model.set_centroids(cents.data());
    model.set_codebooks(cbs.data());
    model.precompute_tables(size_t(1) << 30);
    std::vector<int64_t> ids(n);
    for (size_t i = 0; i < n; ++i)
        ids[i] = int64_t(i);
    CpuIvf cpu;
    cpu.build(model, x.data(), n, ids.data());
    GpuIvfPqIndex idx(ctx(), d, lists, m, Metric::L2, cents.data(), cbs.data());
    idx.add(n, x.data(), ids.data());  // GPU encoding
    std::vector<float> ed(nq);
    std::vector<int64_t> gt(nq);
    gpuivfpq::brute_force_knn(q.data(), nq, x.data(), n, d, Metric::L2, 1, ed.data(), gt.data());
    const size_t k = 10;
    std::vector<float> gd(nq * k);
    std::vector<int64_t> gl(nq * k), cl(nq * k);
    idx.search(q.data(), nq, k, 8, gd.data(), gl.data());
    for (size_t i = 0; i < nq; ++i) {
        auto r = cpu.search(q.data() + i * d, k, 8);
        for (size_t j = 0; j < k; ++j)
            cl[i * k + j] = j < r.size() ? r[j].label : -1;
    }
    const double rg = recall_at(gl, k, gt, 10), rc = recall_at(cl, k, gt, 10);
    EXPECT_NEAR(rg, rc, 0.02) << shape("gpu trained", {}, s);
    EXPECT_GT(rg, 0.5) << shape("gpu trained", {}, s);
}
