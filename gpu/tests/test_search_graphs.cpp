// CUDA graphs of small search calls (search_graphs.h): the same answers as
// the ordinary calls, bit for bit (distances, ids, in-range counts), and
// through the changes that move or refill what a graph reads: appends that
// grow the lists, removals that compact them, host buffers freed and
// allocated again between calls (page-locked, as the GPU process's
// exchange, and pageable), other batch sizes. The graph path must really
// serve (launch counter).
#include <cuda_runtime.h>

#include <cstring>
#include <set>

#include "exact_fixture.h"
#include "gpu_ivfpq/ivfpq_index.h"
#include "gpu_test_util.h"

using namespace gputest;
using gpuivfpq::Metric;
using gpuivfpq::gpu::GpuIvfPqIndex;
using gpuivfpq::gpu::GpuIvfPqOptions;
using gpuivfpq::gpu::KeyRange;
using gpuivfpq::gpu::LabelKind;

namespace {

// Page-locked host memory for one call's inputs and outputs.
template <typename T>
struct Pinned {
    T* p = nullptr;
    size_t n = 0;
    explicit Pinned(size_t count) : n(count)
    {
        EXPECT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&p), std::max<size_t>(count, 1) * sizeof(T), 0),
                  cudaSuccess);
    }
    ~Pinned() { cudaFreeHost(p); }
    Pinned(const Pinned&) = delete;
    Pinned& operator=(const Pinned&) = delete;
};

struct Answer {
    std::vector<double> exact;
    std::vector<float> adc;
    std::vector<int64_t> labels, ids, matched;
};

// search_exact and search (ids) of queries [q0, q0 + nq) of f, from pinned
// buffers, with key ranges when keyed; called twice more so that a graph is
// captured and replayed when graphs are on. The last call's answers.
Answer run(const ExactFixture& f, GpuIvfPqIndex& idx, size_t q0, size_t nq, size_t k, size_t nprobe, bool keyed)
{
    Pinned<float> q(nq * f.d);
    Pinned<double> ed(nq * k);
    Pinned<float> ad(nq * k);
    Pinned<int64_t> el(nq * k), al(nq * k), lo(nq), hi(nq), matched(nq);
    std::memcpy(q.p, f.q.data() + q0 * f.d, nq * f.d * sizeof(float));
    for (size_t i = 0; i < nq; ++i) {
        // Half the key space, shifted per query.
        lo.p[i] = (int64_t(i % 5) - 16) * (int64_t(1) << 32);
        hi.p[i] = lo.p[i] + (int64_t(32) << 32);
    }
    KeyRange r{lo.p, hi.p, matched.p};
    for (int rep = 0; rep < 3; ++rep) {
        std::memset(ed.p, 0, nq * k * sizeof(double));
        std::memset(el.p, 0, nq * k * sizeof(int64_t));
        std::memset(matched.p, 0, nq * sizeof(int64_t));
        idx.search_exact(q.p, nq, k, nprobe, ed.p, el.p, keyed ? &r : nullptr);
        idx.search(q.p, nq, k, nprobe, ad.p, al.p, LabelKind::Ids, keyed ? &r : nullptr);
    }
    Answer a;
    a.exact.assign(ed.p, ed.p + nq * k);
    a.labels.assign(el.p, el.p + nq * k);
    a.adc.assign(ad.p, ad.p + nq * k);
    a.ids.assign(al.p, al.p + nq * k);
    if (keyed)
        a.matched.assign(matched.p, matched.p + nq);
    return a;
}

void expect_same(const Answer& want, const Answer& got, const std::string& what)
{
    SCOPED_TRACE(what);
    ASSERT_EQ(want.labels.size(), got.labels.size());
    EXPECT_EQ(want.labels, got.labels);
    EXPECT_EQ(want.ids, got.ids);
    EXPECT_EQ(want.matched, got.matched);
    size_t bad = 0;
    for (size_t i = 0; i < want.exact.size(); ++i)
        bad += bits_of(want.exact[i]) != bits_of(got.exact[i]) || std::memcmp(&want.adc[i], &got.adc[i], 4) != 0;
    EXPECT_EQ(bad, 0u) << "distances differ";
}

}  // namespace

TEST(SearchGraphs, SameAnswersThroughAppendsRemovalsAndShapes)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(5150);
    for (bool keyed : {false, true}) {
        const std::string what = shape("graphs", {{"keyed", double(keyed)}}, s);
        SCOPED_TRACE(what);
        ExactFixture f(64, 16, 16, 4000, 40, Metric::L2, s);
        GpuIvfPqOptions opt;
        opt.filter_keys = keyed;
        auto plain = f.empty(opt);   // graphs off: the reference
        auto graphed = f.empty(opt);  // graphs on (the default)
        plain->set_search_graphs(false);
        auto both = [&](auto&& change) {
            change(*plain);
            change(*graphed);
        };
        both([&](GpuIvfPqIndex& i) { f.add_rows(i, 0, f.n / 4, true, keyed); });
        auto check = [&](const std::string& stage) {
            for (size_t nq : {size_t(1), size_t(7), size_t(32)})
                for (size_t q0 : {size_t(0), size_t(5)}) {
                    const std::string w = stage + " nq " + std::to_string(nq) + " from " + std::to_string(q0);
                    expect_same(run(f, *plain, q0, nq, 20, 4, keyed), run(f, *graphed, q0, nq, 20, 4, keyed), w);
                }
        };
        check("first quarter");
        EXPECT_GT(graphed->search_graph_launches(), 0u) << "no call was served by a graph";
        EXPECT_EQ(plain->search_graph_launches(), 0u);
        // Appends grow every list (new buffers behind the same pointer arrays).
        both([&](GpuIvfPqIndex& i) { f.add_rows(i, f.n / 4, f.n, true, keyed); });
        const size_t before = graphed->search_graph_launches();
        check("after appends");
        EXPECT_GT(graphed->search_graph_launches(), before);
        // Removals compact the lists in place.
        std::vector<int64_t> gone(f.cpu.ids[0].begin(), f.cpu.ids[0].end());
        for (size_t i = 1; i < f.n; i += 4)
            gone.push_back(f.ids[i]);
        both([&](GpuIvfPqIndex& i) { i.remove_ids(gone.data(), gone.size()); });
        check("after removals");
        const std::set<int64_t> goneset(gone.begin(), gone.end());
        const Answer a = run(f, *graphed, 0, 7, 20, 4, keyed);
        for (int64_t l : a.labels)
            EXPECT_FALSE(goneset.count(l)) << "removed id " << l << " returned by a graph";
        // The graphs' answers are also right on their own, not only equal.
        check_exact(f, *graphed, std::vector<float>(f.q.begin(), f.q.begin() + 7 * f.d), 20, 4,
                    what + " exact after removals");
    }
}

TEST(SearchGraphs, PageableMemoryAndSwitchingOff)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(5151);
    ExactFixture f(32, 8, 8, 1500, 8, Metric::InnerProduct, s);
    auto idx = f.empty(GpuIvfPqOptions{});
    f.add_rows(*idx, 0, f.n);
    // Pageable memory: the copies stay outside the graph.
    std::vector<double> d(8 * 10);
    std::vector<int64_t> l(8 * 10);
    for (int rep = 0; rep < 4; ++rep)
        idx->search_exact(f.q.data(), 8, 10, 3, d.data(), l.data());
    EXPECT_GT(idx->search_graph_launches(), 0u);
    const Answer on = run(f, *idx, 0, 8, 10, 3, false);
    EXPECT_EQ(on.labels, l);
    idx->set_search_graphs(false);
    const size_t n = idx->search_graph_launches();
    const Answer off = run(f, *idx, 0, 8, 10, 3, false);
    EXPECT_EQ(idx->search_graph_launches(), n);
    expect_same(off, on, "inner product, graphs switched off");
}
