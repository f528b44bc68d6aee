// GpuRabitqIndex (the GPU mirror of an index with RaBitQ codes) against the
// CPU engine: for every metric, code widths 1 to 8 and a dimension with
// plane padding, each query's k best estimates over its probed lists are
// RabitqModel::scan's bit for bit (L2 and inner product; Cosine within
// rounding, the GPU normalising the query itself), with key ranges and their
// counts, after appends in several batches and after removals; a
// sentence-embedding size; every list probed returns every entry; the
// argument checks.
#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <numeric>
#include <random>
#include <tuple>
#include <utility>

#include "engine/distances.h"
#include "engine/rabitq.h"
#include "gpu_ivfpq/exact_search.h"
#include "gpu_ivfpq/rabitq_index.h"
#include "gpu_test_util.h"

using namespace gputest;
using gpuivfpq::ErrorKind;
using gpuivfpq::Metric;
using gpuivfpq::RabitqFactors;
using gpuivfpq::RabitqListQuery;
using gpuivfpq::RabitqModel;
using gpuivfpq::RabitqQuery;
using gpuivfpq::RabitqRotation;
using gpuivfpq::gpu::GpuRabitqIndex;
using gpuivfpq::gpu::KeyRange;

namespace {

// An index's rows as the pages hold them (code, then factors), and the
// model, on the host.
struct Fixture {
    size_t d, lists, n;
    int bits;
    Metric metric;
    std::unique_ptr<RabitqModel> model;
    std::vector<float> x, cent;
    std::vector<uint8_t> blob, rows;
    std::vector<int32_t> list_ids;
    std::vector<int64_t> ids, keys;

    Fixture(size_t d_, size_t lists_, size_t n_, int bits_, Metric metric_, uint64_t s)
        : d(d_), lists(lists_), n(n_), bits(bits_), metric(metric_)
    {
        x = clustered(n, d, 8, 3.0f, s);
        model = std::make_unique<RabitqModel>(d, lists, bits, metric, RabitqRotation::generate(d, s, 4));
        cent.assign(x.begin(), x.begin() + lists * d);
        if (metric == Metric::Cosine)
            gpuivfpq::normalize_rows(cent.data(), lists, d);
        model->set_centroids(cent.data(), 4);
        list_ids.resize(n);
        model->assign(x.data(), n, list_ids.data(), 4);
        const size_t cb = model->code_bytes(), rb = gpuivfpq::rabitq_row_bytes(d, bits);
        std::vector<uint8_t> codes(n * cb);
        std::vector<RabitqFactors> f(n);
        model->encode(x.data(), n, list_ids.data(), codes.data(), f.data(), 4);
        rows.resize(n * rb);
        for (size_t i = 0; i < n; i++) {
            std::memcpy(rows.data() + i * rb, codes.data() + i * cb, cb);
            std::memcpy(rows.data() + i * rb + cb, &f[i], sizeof(RabitqFactors));
            ids.push_back(int64_t(i) * 7 + 3);
            keys.push_back(int64_t(i % 10));
        }
        blob.assign(gpuivfpq::rabitq_model_bytes(d, lists), 0);
        std::memcpy(blob.data(), model->rotation().matrix().data(), d * d * sizeof(float));
        std::memcpy(blob.data() + gpuivfpq::rabitq_rotated_offset(d), model->rotated_centroids().data(),
                    lists * d * sizeof(double));
    }
    size_t rb() const { return gpuivfpq::rabitq_row_bytes(d, bits); }
};

// The rows `which` of fx (their codes, lists, ids and keys) added to index.
void add_rows(GpuRabitqIndex& index, const Fixture& fx, const std::vector<size_t>& which)
{
    std::vector<uint8_t> rows(which.size() * fx.rb());
    std::vector<int32_t> ls;
    std::vector<int64_t> ids, keys;
    for (size_t j = 0; j < which.size(); j++) {
        const size_t i = which[j];
        std::memcpy(rows.data() + j * fx.rb(), fx.rows.data() + i * fx.rb(), fx.rb());
        ls.push_back(fx.list_ids[i]);
        ids.push_back(fx.ids[i]);
        keys.push_back(fx.keys[i]);
    }
    index.add(which.size(), ls.data(), rows.data(), ids.data(), keys.data());
}

struct Hit {
    float est;
    int64_t label;
};

// The CPU engine's k best (rank key, label) of a query over the given
// lists, the entries in `live` and within [lo, hi] only; *matched counts
// those in range; key_of (if set) gets every such entry's key by label.
// The keys are scan_keys's at eps0: the estimates (0) or their lower bounds.
std::vector<Hit> cpu_best(const Fixture& fx, const float* q, const int32_t* probed, size_t nprobe, size_t k,
                          const std::vector<bool>& live, int64_t lo, int64_t hi, int64_t* matched, float eps0,
                          std::map<int64_t, float>* key_of = nullptr)
{
    RabitqQuery query;
    fx.model->prepare_query(q, query);
    std::vector<Hit> all;
    *matched = 0;
    const size_t cb = fx.model->code_bytes();
    for (size_t p = 0; p < nprobe; p++) {
        RabitqListQuery lq;
        fx.model->prepare_list(query, probed[p], lq);
        for (size_t i = 0; i < fx.n; i++) {
            if (fx.list_ids[i] != probed[p] || !live[i] || fx.keys[i] < lo || fx.keys[i] > hi)
                continue;
            (*matched)++;
            RabitqFactors f;
            std::memcpy(&f, fx.rows.data() + i * fx.rb() + cb, sizeof(f));
            float e = 0;
            fx.model->scan_keys(lq, fx.rows.data() + i * fx.rb(), fx.rb(), &f, 1, eps0, &e);
            all.push_back({e, fx.ids[i]});
            if (key_of)
                (*key_of)[fx.ids[i]] = e;
        }
    }
    std::sort(all.begin(), all.end(), [](const Hit& a, const Hit& b) {
        return std::tie(a.est, a.label) < std::tie(b.est, b.label);
    });
    if (all.size() > k)
        all.resize(k);
    return all;
}

// The GPU's answers against cpu_best for nq queries: the same estimates in
// the same order (bit for bit, or within rounding for Cosine), each label a
// distinct entry of the probed lists whose own estimate that is, padding
// where the CPU found fewer.
void compare(GpuRabitqIndex& index, const Fixture& fx, const std::vector<float>& q, size_t nq, size_t k,
             size_t nprobe, const std::vector<bool>& live, bool ranged, float eps0 = 0.0f)
{
    const size_t d = fx.d;
    std::vector<int64_t> lo(nq), hi(nq), matched(nq, -1);
    for (size_t i = 0; i < nq; i++) {
        lo[i] = ranged ? int64_t(i % 4) : INT64_MIN;
        hi[i] = ranged ? int64_t(i % 4) + 5 : INT64_MAX;
    }
    KeyRange r;
    r.lo = lo.data();
    r.hi = hi.data();
    r.matched = matched.data();
    std::vector<float> dist(nq * k);
    std::vector<int64_t> labels(nq * k);
    index.search(q.data(), nq, k, nprobe, dist.data(), labels.data(), ranged ? &r : nullptr, eps0);
    std::vector<int32_t> probed(nq * std::min(nprobe, fx.lists));
    const size_t np = std::min(nprobe, fx.lists);
    index.probe_lists(q.data(), nq, np, probed.data());
    std::map<int64_t, size_t> row_of;
    for (size_t i = 0; i < fx.n; i++)
        row_of[fx.ids[i]] = i;
    for (size_t i = 0; i < nq; i++) {
        int64_t want_matched = 0;
        std::map<int64_t, float> key_of;
        const std::vector<Hit> want = cpu_best(fx, q.data() + i * d, probed.data() + i * np, np, k, live, lo[i],
                                               hi[i], &want_matched, eps0, &key_of);
        std::set<int64_t> seen;
        if (ranged)
            ASSERT_EQ(matched[i], want_matched) << "query " << i << ": entries in range";
        for (size_t j = 0; j < k; j++) {
            const float got = dist[i * k + j];
            const int64_t label = labels[i * k + j];
            if (j >= want.size()) {
                ASSERT_EQ(label, -1) << "query " << i << " rank " << j << ": padding";
                ASSERT_TRUE(std::isinf(got));
                continue;
            }
            ASSERT_NE(label, -1) << "query " << i << " rank " << j;
            ASSERT_TRUE(row_of.count(label)) << "unknown label " << label;
            const size_t row = row_of[label];
            ASSERT_TRUE(live[row]) << "a removed entry came back: " << label;
            if (ranged)
                ASSERT_TRUE(fx.keys[row] >= lo[i] && fx.keys[row] <= hi[i]) << "entry out of range";
            ASSERT_TRUE(seen.insert(label).second) << "query " << i << ": label " << label << " twice";
            ASSERT_TRUE(key_of.count(label)) << "query " << i << ": label " << label << " not in a probed list";
            const float own = key_of[label];
            if (fx.metric == Metric::Cosine) {
                ASSERT_NEAR(got, want[j].est, 1e-5f * (1.0f + std::fabs(want[j].est)))
                    << "query " << i << " rank " << j;
                ASSERT_NEAR(got, own, 1e-5f * (1.0f + std::fabs(own))) << "query " << i << " rank " << j << ": label's key";
            } else {
                ASSERT_EQ(bits_of(got), bits_of(want[j].est))
                    << "query " << i << " rank " << j << ": " << got << " vs " << want[j].est;
                ASSERT_EQ(bits_of(got), bits_of(own)) << "query " << i << " rank " << j << ": label's key";
            }
        }
    }
}

// n rows of d dimensions in `lists` lists (4 bits, L2), all added to an
// index with filter keys, and three queries.
struct Loaded {
    Fixture fx;
    std::vector<float> q;
    GpuRabitqIndex index;
    std::vector<bool> live;
    Loaded(size_t d, size_t lists, size_t n, uint64_t s)
        : fx(d, lists, n, 4, Metric::L2, s),
          q(clustered(3, d, 8, 3.0f, s + 1)),
          index(ctx(), d, lists, 4, Metric::L2, fx.cent.data(), fx.blob.data(), true),
          live(n, true)
    {
        index.add(n, fx.list_ids.data(), fx.rows.data(), fx.ids.data(), fx.keys.data());
    }
};

void check_index(size_t d, int bits, Metric metric, uint64_t s)
{
    const size_t n = d >= 512 ? 600 : 2000, lists = 12, nq = 6;
    Fixture fx(d, lists, n, bits, metric, s);
    std::vector<float> q = clustered(nq, d, 8, 3.0f, s + 1);
    GpuRabitqIndex index(ctx(), d, lists, bits, metric, fx.cent.data(), fx.blob.data(), true);
    ASSERT_EQ(index.row_bytes(), fx.rb());
    // Appends in three batches of different sizes.
    const size_t cuts[] = {0, 1, n / 3, n};
    for (int c = 0; c < 3; c++) {
        const size_t a = cuts[c], b = cuts[c + 1];
        index.add(b - a, fx.list_ids.data() + a, fx.rows.data() + a * fx.rb(), fx.ids.data() + a,
                  fx.keys.data() + a);
    }
    ASSERT_EQ(index.ntotal(), n);
    std::vector<bool> live(n, true);
    for (bool radix : {false, true})
        for (size_t k : {size_t(1), size_t(10), size_t(100)}) {
            SCOPED_TRACE("radix " + std::to_string(radix) + " k " + std::to_string(k));
            gpuivfpq::gpu::set_radix_select(ctx(), radix);
            compare(index, fx, q, nq, k, 4, live, false);
            compare(index, fx, q, nq, k, 4, live, true);
            // Ranked by lower bounds, as the GPU service's mirrors rank them.
            compare(index, fx, q, nq, k, 4, live, false, gpuivfpq::kRabitqLowerEps0);
            compare(index, fx, q, nq, k, 4, live, true, gpuivfpq::kRabitqLowerEps0);
        }
    gpuivfpq::gpu::set_radix_select(ctx(), true);  // the default
    // A tile of 64 queries or more rotates four queries a block (70: the
    // last block holds two).
    {
        const size_t many = 70;
        const std::vector<float> qm = clustered(many, d, 8, 3.0f, s + 2);
        compare(index, fx, qm, many, 10, 4, live, false, gpuivfpq::kRabitqLowerEps0);
    }
    // Every list probed, k = n: every entry, in estimate order.
    compare(index, fx, q, 2, n, lists, live, false);
    // Removals (unknown ids and duplicates among them).
    std::vector<int64_t> gone;
    for (size_t i = 0; i < n; i += 3) {
        gone.push_back(fx.ids[i]);
        live[i] = false;
    }
    gone.push_back(-5);
    gone.push_back(gone.front());
    ASSERT_EQ(index.remove_ids(gone.data(), gone.size()), (n + 2) / 3);
    ASSERT_EQ(index.ntotal(), n - (n + 2) / 3);
    compare(index, fx, q, nq, 50, 6, live, false);
    compare(index, fx, q, nq, 50, 6, live, true);
    compare(index, fx, q, nq, 50, 6, live, true, gpuivfpq::kRabitqLowerEps0);
}


// Two settings of one index (set(false), then set(true) before the second
// search) against each other: the same keys (bit for bit), labels and
// in-range counts for nq queries, with key ranges when ranged (empty
// ones, single keys and windows), at eps0.
void same_answers(GpuRabitqIndex& index, const std::vector<float>& q, size_t nq, size_t k, size_t nprobe,
                  bool ranged, float eps0, const std::function<void(bool)>& set)
{
    std::vector<int64_t> lo(nq), hi(nq);
    for (size_t i = 0; i < nq; i++) {
        if (i % 5 == 0) {  // empty
            lo[i] = 5;
            hi[i] = 4;
        } else if (i % 5 == 1) {  // a single key
            lo[i] = hi[i] = 3;
        } else {
            lo[i] = int64_t(i % 4);
            hi[i] = int64_t(i % 4) + 5;
        }
    }
    auto run = [&](bool second, std::vector<float>& dist, std::vector<int64_t>& labels,
                   std::vector<int64_t>& matched) {
        dist.assign(nq * k, 0.0f);
        labels.assign(nq * k, -2);
        matched.assign(nq, -1);
        KeyRange r;
        r.lo = lo.data();
        r.hi = hi.data();
        r.matched = matched.data();
        set(second);
        index.search(q.data(), nq, k, nprobe, dist.data(), labels.data(), ranged ? &r : nullptr, eps0);
    };
    // The staged kernels break equal keys by position with the radix
    // selections only (the default; another test may have left it off).
    gpuivfpq::gpu::set_radix_select(ctx(), true);
    std::vector<float> d0, d1;
    std::vector<int64_t> l0, l1, m0, m1;
    run(false, d0, l0, m0);
    run(true, d1, l1, m1);
    for (size_t i = 0; i < nq; i++) {
        if (ranged)
            ASSERT_EQ(m1[i], m0[i]) << "query " << i << ": entries in range";
        for (size_t j = 0; j < k; j++) {
            const size_t e = i * k + j;
            ASSERT_EQ(l1[e], l0[e]) << "query " << i << " rank " << j << ": label";
            ASSERT_EQ(bits_of(d1[e]), bits_of(d0[e])) << "query " << i << " rank " << j << ": " << d1[e] << " vs "
                                                      << d0[e];
        }
    }
}

// The one-launch search (set_small_batch_max) against the staged kernels
// on the same index (same_answers; Cosine included: both normalise the
// queries the same way); cluster forces the blocks per query (0 chooses).
// one_launch: whether the shape must take the one-launch path.
void same_as_staged(GpuRabitqIndex& index, const std::vector<float>& q, size_t nq, size_t k, size_t nprobe,
                    bool ranged, float eps0, int cluster, bool one_launch = true)
{
    size_t before = 0;
    same_answers(index, q, nq, k, nprobe, ranged, eps0, [&](bool second) {
        if (second)
            before = index.small_search_launches();
        index.set_small_batch_max(second ? 256 : 0);
        index.set_small_cluster(cluster);
    });
    index.set_small_batch_max(0);
    index.set_small_cluster(0);
    ASSERT_EQ(index.small_search_launches(), before + (one_launch ? 1 : 0)) << "the path taken";
}
// InterleavedRowsAcrossBlocks for n rows of d dimensions at bits in lists.
void interleaved_rows_across_blocks(size_t d, int bits, size_t n, size_t lists, uint64_t s)
{
    SCOPED_TRACE(shape("rabitq rows across blocks", {{"d", double(d)}, {"bits", double(bits)}, {"n", double(n)}}, s));
    Fixture fx(d, lists, n, bits, Metric::L2, s);
    GpuRabitqIndex index(ctx(), d, lists, bits, Metric::L2, fx.cent.data(), fx.blob.data(), true);
    const std::vector<float> q = clustered(5, d, 8, 3.0f, s + 1);
    std::vector<bool> live(n, false);
    auto check = [&] {
        for (size_t small : {size_t(0), size_t(256)}) {
            index.set_small_batch_max(small);
            compare(index, fx, q, 5, 100, lists, live, false, gpuivfpq::kRabitqLowerEps0);
            compare(index, fx, q, 5, 10, 2, live, true);
        }
        index.set_small_batch_max(0);
    };
    size_t at = 0;
    for (size_t count : {size_t(1), size_t(31), size_t(2), size_t(70)}) {
        std::vector<size_t> rows(count);
        std::iota(rows.begin(), rows.end(), at);
        add_rows(index, fx, rows);
        for (size_t i : rows)
            live[i] = true;
        at += count;
        SCOPED_TRACE("after appending up to row " + std::to_string(at));
        check();
    }
    // Each list's rows in order of addition: remove its 0th, 31st, 32nd,
    // 63rd, 255th, 256th, 511th, 512th (the compaction's chunks are 256
    // rows), every seventh past that and its last.
    auto remove_edges = [&](size_t upto) {
        std::vector<int64_t> gone;
        for (size_t l = 0; l < lists; l++) {
            std::vector<size_t> of;
            for (size_t i = 0; i < upto; i++)
                if (size_t(fx.list_ids[i]) == l && live[i])
                    of.push_back(i);
            std::vector<size_t> at_j = {0, 31, 32, 63, 255, 256, 511, 512, of.size() - 1};
            for (size_t j = 600; j < of.size(); j += 7)
                at_j.push_back(j);
            for (size_t j : at_j)
                if (j < of.size() && live[of[j]]) {
                    gone.push_back(fx.ids[of[j]]);
                    live[of[j]] = false;
                }
        }
        ASSERT_EQ(index.remove_ids(gone.data(), gone.size()), gone.size());
    };
    remove_edges(at);
    {
        SCOPED_TRACE("after removals");
        check();
    }
    std::vector<size_t> rest(n - at);
    std::iota(rest.begin(), rest.end(), at);
    add_rows(index, fx, rest);
    for (size_t i : rest)
        live[i] = true;
    {
        SCOPED_TRACE("after the rest");
        check();
    }
    remove_edges(n);
    SCOPED_TRACE("after removals from long lists");
    check();
}

}  // namespace

TEST(RabitqIndex, SameEstimatesAsCpu)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(4501);
    for_each_rabitq_shape("rabitq index", s, {1, 4, 8},
                          [s](size_t d, int bits, Metric metric) { check_index(d, bits, metric, s); });
}

TEST(RabitqIndex, SentenceEmbeddingSize)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(4502);
    SCOPED_TRACE(shape("rabitq index 768", {{"bits", 4.0}}, s));
    check_index(768, 4, Metric::L2, s);
}

// Long lists and few queries: each query's candidates (tens of thousands)
// are selected in many chunks and merged, and lists of very different
// lengths sit side by side in a query's row of candidates.
TEST(RabitqIndex, LongListsSelectedInChunks)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(4504);
    const size_t lists = 3, n = 60000;
    SCOPED_TRACE(shape("rabitq index long lists", {{"n", double(n)}}, s));
    Loaded L(32, lists, n, s);
    // Both selections: the radix one (k up to 256) and WarpSelect.
    for (bool radix : {true, false})
        for (size_t nq : {size_t(1), size_t(3)})
            for (size_t k : {size_t(10), size_t(100), size_t(256), size_t(1000)}) {
                SCOPED_TRACE("radix " + std::to_string(radix) + " nq " + std::to_string(nq) + " k " +
                             std::to_string(k));
                gpuivfpq::gpu::set_radix_select(ctx(), radix);
                compare(L.index, L.fx, L.q, nq, k, lists, L.live, false, gpuivfpq::kRabitqLowerEps0);
                compare(L.index, L.fx, L.q, nq, k, 2, L.live, true);
            }
}

// More probes than a warp's 32 (the prefix's second group), and chunks
// with fewer rows in range than k (padding out of every chunk).
TEST(RabitqIndex, ManyProbesAndSparseRanges)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(4505);
    const size_t lists = 70, n = 30000;
    SCOPED_TRACE(shape("rabitq index many probes", {{"n", double(n)}}, s));
    Loaded L(24, lists, n, s);
    for (bool radix : {true, false})
        for (size_t nprobe : {size_t(33), size_t(64), lists}) {
            SCOPED_TRACE("radix " + std::to_string(radix) + " nprobe " + std::to_string(nprobe));
            gpuivfpq::gpu::set_radix_select(ctx(), radix);
            compare(L.index, L.fx, L.q, 3, 100, nprobe, L.live, false, gpuivfpq::kRabitqLowerEps0);
            compare(L.index, L.fx, L.q, 3, 200, nprobe, L.live, true);
            compare(L.index, L.fx, L.q, 3, 1000, nprobe, L.live, true);
        }
    gpuivfpq::gpu::set_radix_select(ctx(), true);  // the default
    // Three probes (about three chunks at k 1000), a key range: fewer rows
    // in range than k.
    compare(L.index, L.fx, L.q, 3, 1000, 3, L.live, true);
}

// The one-launch search of small batches against the staged kernels, bit
// for bit, and against the CPU engine: every metric, 1 to 8 bits, plane
// padding (d 100); one query and batches below and above the shared coarse
// keys (16); both queue sizes (k and nprobe up to 32, and up to 128); the
// blocks per query chosen and forced (one block; odd and large clusters);
// key ranges (empty, single keys); lower bounds; after removals. Shapes
// past the one launch (k above 128) take the staged kernels.
TEST(RabitqIndex, OneLaunchAsStaged)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(4510);
    for_each_rabitq_shape("rabitq one launch", s, {1, 4, 8}, [s](size_t d, int bits, Metric metric) {
        const size_t n = 3000, lists = 24;
        Fixture fx(d, lists, n, bits, metric, s);
        GpuRabitqIndex index(ctx(), d, lists, bits, metric, fx.cent.data(), fx.blob.data(), true);
        index.add(n, fx.list_ids.data(), fx.rows.data(), fx.ids.data(), fx.keys.data());
        const std::vector<float> q = clustered(20, d, 8, 3.0f, s + 1);
        for (int cluster : {0, 1, 3, 16})
            for (size_t nq : {size_t(1), size_t(5), size_t(20)})
                for (auto [k, nprobe] : {std::pair<size_t, size_t>{10, 4}, {32, 32}, {100, 24}, {128, 24}})
                    for (bool ranged : {false, true})
                        for (float eps0 : {0.0f, gpuivfpq::kRabitqLowerEps0}) {
                            SCOPED_TRACE("cluster " + std::to_string(cluster) + " nq " + std::to_string(nq) +
                                         " k " + std::to_string(k) + " nprobe " + std::to_string(nprobe) +
                                         " ranged " + std::to_string(ranged) + " eps0 " + std::to_string(eps0));
                            same_as_staged(index, q, nq, k, nprobe, ranged, eps0, cluster);
                        }
        // Against the CPU engine too (each compare one search).
        std::vector<bool> live(n, true);
        index.set_small_batch_max(256);
        size_t launches = index.small_search_launches();
        compare(index, fx, q, 6, 10, 4, live, false);
        compare(index, fx, q, 6, 100, 24, live, true, gpuivfpq::kRabitqLowerEps0);
        ASSERT_EQ(index.small_search_launches(), launches + 2);
        // After removals.
        std::vector<int64_t> gone;
        for (size_t i = 0; i < n; i += 3) {
            gone.push_back(fx.ids[i]);
            live[i] = false;
        }
        ASSERT_EQ(index.remove_ids(gone.data(), gone.size()), gone.size());
        launches = index.small_search_launches();
        compare(index, fx, q, 6, 100, 24, live, true, gpuivfpq::kRabitqLowerEps0);
        ASSERT_EQ(index.small_search_launches(), launches + 1);
        index.set_small_batch_max(0);
        same_as_staged(index, q, 20, 100, 24, true, gpuivfpq::kRabitqLowerEps0, 0);
        same_as_staged(index, q, 3, 10, lists, false, 0.0f, 2);
        // k above 128: the staged kernels.
        same_as_staged(index, q, 3, 200, 4, false, 0.0f, 0, false);
        // Empty lists among the probed ones: only the rows of two lists in
        // three added.
        GpuRabitqIndex sparse(ctx(), d, lists, bits, metric, fx.cent.data(), fx.blob.data(), true);
        std::vector<size_t> kept;
        for (size_t i = 0; i < n; i++)
            if (fx.list_ids[i] % 3 != 0)
                kept.push_back(i);
        add_rows(sparse, fx, kept);
        for (int cluster : {0, 1, 5})
            for (bool ranged : {false, true}) {
                SCOPED_TRACE("empty lists: cluster " + std::to_string(cluster) + " ranged " + std::to_string(ranged));
                same_as_staged(sparse, q, 7, 100, lists, ranged, gpuivfpq::kRabitqLowerEps0, cluster);
                same_as_staged(sparse, q, 7, 10, 6, ranged, 0.0f, cluster);
            }
    });
}

// Blocks whose share of the probed rows passes their key buffer (4096
// rows): the running bar (FilterSink) keeps the candidates; lists of very
// different lengths; a 768-dimension shape (its tables rebuilt per list);
// a dimension that is not a multiple of 4.
TEST(RabitqIndex, OneLaunchLongListsAndWideRows)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(4511);
    {
        const size_t lists = 3, n = 60000;
        SCOPED_TRACE(shape("rabitq one launch long lists", {{"n", double(n)}}, s));
        Loaded L(32, lists, n, s);
        const std::vector<float> q = clustered(6, 32, 8, 3.0f, s + 3);
        for (int cluster : {1, 2, 0})
            for (size_t k : {size_t(10), size_t(100), size_t(128)})
                for (size_t nprobe : {size_t(2), lists})
                    for (bool ranged : {false, true}) {
                        SCOPED_TRACE("cluster " + std::to_string(cluster) + " k " + std::to_string(k) + " nprobe " +
                                     std::to_string(nprobe) + " ranged " + std::to_string(ranged));
                        same_as_staged(L.index, q, 6, k, nprobe, ranged, gpuivfpq::kRabitqLowerEps0, cluster);
                    }
        L.index.set_small_batch_max(256);
        L.index.set_small_cluster(1);
        const size_t launches = L.index.small_search_launches();
        compare(L.index, L.fx, L.q, 3, 100, lists, L.live, true, gpuivfpq::kRabitqLowerEps0);
        compare(L.index, L.fx, L.q, 3, 10, 2, L.live, false);
        ASSERT_EQ(L.index.small_search_launches(), launches + 2);
    }
    {
        const size_t d = 768, lists = 12, n = 600;
        SCOPED_TRACE(shape("rabitq one launch 768", {{"bits", 4.0}}, s));
        Fixture fx(d, lists, n, 4, Metric::L2, s);
        GpuRabitqIndex index(ctx(), d, lists, 4, Metric::L2, fx.cent.data(), fx.blob.data(), true);
        index.add(n, fx.list_ids.data(), fx.rows.data(), fx.ids.data(), fx.keys.data());
        const std::vector<float> q = clustered(17, d, 8, 3.0f, s + 1);
        for (int cluster : {0, 1, 8})
            for (size_t nq : {size_t(1), size_t(17)})
                for (bool ranged : {false, true})
                    same_as_staged(index, q, nq, 100, 6, ranged, gpuivfpq::kRabitqLowerEps0, cluster);
        std::vector<bool> live(n, true);
        index.set_small_batch_max(256);
        const size_t launches = index.small_search_launches();
        compare(index, fx, q, 4, 100, 6, live, true, gpuivfpq::kRabitqLowerEps0);
        ASSERT_EQ(index.small_search_launches(), launches + 1);
    }
    // A dimension that is not a multiple of 4: the rotation's tail terms
    // (the split rotation below 64 queries, the tiled one from 64).
    for (Metric metric : {Metric::L2, Metric::InnerProduct, Metric::Cosine}) {
        const size_t d = 101, lists = 12, n = 1500;
        SCOPED_TRACE(shape("rabitq one launch d 101", {{"metric", double(int(metric))}}, s));
        Fixture fx(d, lists, n, 3, metric, s);
        GpuRabitqIndex index(ctx(), d, lists, 3, metric, fx.cent.data(), fx.blob.data(), true);
        index.add(n, fx.list_ids.data(), fx.rows.data(), fx.ids.data(), fx.keys.data());
        const std::vector<float> q = clustered(70, d, 8, 3.0f, s + 5);
        for (size_t nq : {size_t(1), size_t(9), size_t(70)})
            same_as_staged(index, q, nq, 50, 5, true, gpuivfpq::kRabitqLowerEps0, 0);
    }
}

// The mirror's rows, row-major (d 100, 3 bits: 60-byte rows) and
// interleaved 32 at a time (list_layout.cuh; d 768 at 3 bits: 300 bytes,
// 1500-row lists at 4 bits; d 800 at 3 bits: 75 code words, not a
// multiple of the eight loaded at a time; d 2000 at 8 bits: 507 words, more
// than the append's and the compaction's threads): appends of 1, 31, 2 and
// 70 rows (blocks filled across calls, lists grown past their capacity
// while a block is part full), then the rest; removals at block and chunk
// edges; the answers the CPU engine's after each step, by the staged
// kernels and in one launch.
TEST(RabitqIndex, InterleavedRowsAcrossBlocks)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(4513);
    interleaved_rows_across_blocks(100, 3, 300, 3, s);
    interleaved_rows_across_blocks(768, 3, 300, 3, s);
    interleaved_rows_across_blocks(768, 4, 3000, 2, s);
    interleaved_rows_across_blocks(800, 3, 300, 3, s);
    interleaved_rows_across_blocks(2000, 8, 400, 2, s);
}

// Small batches replay CUDA graphs of their device work from the second
// call of a shape on: the answers stay the CPU engine's after appends (the
// longest list grows: a new plan, so a new graph), after removals (shorter
// lists: a new plan too), after a few rows appended to the shortest list
// (the same plan: the same graphs, reading the new lengths, replay at once),
// with key ranges and their counts, and with Cosine queries normalised
// inside the graph; graphs off, none runs.
TEST(RabitqIndex, GraphsReplayAfterChanges)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(4506);
    for (Metric metric : {Metric::L2, Metric::Cosine}) {
        const size_t d = 48, lists = 10, n = 4000, nq = 4;
        SCOPED_TRACE(shape("rabitq index graphs", {{"metric", double(int(metric))}}, s));
        Fixture fx(d, lists, n, 4, metric, s);
        std::vector<float> q = clustered(nq, d, 8, 3.0f, s + 1);
        GpuRabitqIndex index(ctx(), d, lists, 4, metric, fx.cent.data(), fx.blob.data(), true);
        std::vector<bool> live(n, false);
        // Ten rows of the shortest list are held back for the last round
        // (none of them among the rows removed: every third).
        std::vector<size_t> size(lists, 0);
        for (size_t i = 0; i < n; i++)
            size[size_t(fx.list_ids[i])]++;
        const int32_t shortest = int32_t(std::min_element(size.begin(), size.end()) - size.begin());
        std::vector<size_t> first, second, held;
        for (size_t i = 0; i < n; i++) {
            if (fx.list_ids[i] == shortest && i % 3 != 0 && held.size() < 10)
                held.push_back(i);
            else
                (i < n / 2 ? first : second).push_back(i);
        }
        ASSERT_EQ(held.size(), 10u);
        auto add = [&](const std::vector<size_t>& which) {
            for (size_t i : which)
                live[i] = true;
            add_rows(index, fx, which);
        };
        auto rounds = [&](const char* what, size_t replays) {
            SCOPED_TRACE(what);
            const size_t before = index.search_graph_launches();
            for (int rep = 0; rep < 3; rep++) {
                compare(index, fx, q, nq, 10, 3, live, false);
                compare(index, fx, q, nq, 20, 3, live, true, gpuivfpq::kRabitqLowerEps0);
            }
            EXPECT_GE(index.search_graph_launches(), before + replays) << "too few calls replayed a graph";
        };
        add(first);
        rounds("half the rows", 2);
        add(second);
        rounds("every row", 2);
        std::vector<int64_t> gone;
        for (size_t i = 0; i < n; i += 3) {
            gone.push_back(fx.ids[i]);
            live[i] = false;
        }
        ASSERT_EQ(index.remove_ids(gone.data(), gone.size()), gone.size());
        rounds("after removals", 2);
        add(held);
        rounds("rows appended to the shortest list", 6);
        index.set_search_graphs(false);
        const size_t before = index.search_graph_launches();
        for (int rep = 0; rep < 3; rep++)
            compare(index, fx, q, nq, 10, 3, live, false);
        EXPECT_EQ(index.search_graph_launches(), before);
    }
}

// A build's assignment on the GPU (GpuRabitqIndex::assign) against the
// CPU engine's (RabitqModel::assign): every metric (Cosine rows normalised,
// L2-nearest for all), more rows than one tile of the device's pass; a row
// may go to another list only where the two are equally near within float
// rounding.
TEST(RabitqIndex, AssignAsCpu)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(4504);
    for (Metric metric : {Metric::L2, Metric::InnerProduct, Metric::Cosine}) {
        const size_t d = 48, lists = 64, n = 70000;
        SCOPED_TRACE(shape("rabitq assign", {{"metric", double(int(metric))}}, s));
        Fixture fx(d, lists, 300, 2, metric, s);
        std::vector<float> x = clustered(n, d, 16, 3.0f, s + 1);
        GpuRabitqIndex index(ctx(), d, lists, 2, metric, fx.cent.data(), fx.blob.data());
        std::vector<int32_t> gpu_l(n, -1), cpu_l(n, -1);
        index.assign(x.data(), n, gpu_l.data());
        fx.model->assign(x.data(), n, cpu_l.data(), 4);
        std::vector<float> row(d);
        size_t differ = 0;
        for (size_t i = 0; i < n; i++) {
            ASSERT_GE(gpu_l[i], 0);
            ASSERT_LT(gpu_l[i], int32_t(lists));
            if (gpu_l[i] == cpu_l[i])
                continue;
            ++differ;
            std::memcpy(row.data(), x.data() + i * d, d * sizeof(float));
            if (metric == Metric::Cosine)
                gpuivfpq::normalize_rows(row.data(), 1, d);
            const float dg = gpuivfpq::l2_sqr(row.data(), fx.cent.data() + size_t(gpu_l[i]) * d, d);
            const float dc = gpuivfpq::l2_sqr(row.data(), fx.cent.data() + size_t(cpu_l[i]) * d, d);
            EXPECT_NEAR(dg, dc, 1e-4f * std::max(1.0f, dc)) << "row " << i;
        }
        EXPECT_LE(differ, n / 1000) << "rows assigned to another list than the CPU's";
    }
    Fixture fx(16, 4, 50, 1, Metric::L2, s);
    GpuRabitqIndex index(ctx(), 16, 4, 1, Metric::L2, fx.cent.data(), fx.blob.data());
    index.assign(nullptr, 0, nullptr);  // nothing to do
    EXPECT_EQ(kind_of([&] { index.assign(nullptr, 3, nullptr); }), ErrorKind::InvalidArgument);
}

// A build's codes on the GPU (GpuRabitqIndex::encode) against the CPU
// engine's (RabitqModel::encode) for the same lists: every byte of every
// row (bit planes and factors), for every metric, code widths 1 to 8,
// dimensions with and without plane padding, rows on their centroid (the
// fixture's centroids are rows of it), more rows than one of the device's
// tiles at a sentence-embedding size, and a width past 1536.
TEST(RabitqIndex, EncodeAsCpuBitForBit)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(4505);
    struct Shape {
        size_t d, lists, n;
        int bits;
    };
    const Shape shapes[] = {{5, 4, 300, 1}, {37, 8, 700, 2}, {64, 16, 900, 3}, {128, 32, 2000, 4},
                            {100, 8, 500, 5}, {33, 4, 400, 7}, {128, 16, 600, 8}, {768, 8, 12000, 4},
                            {1600, 4, 300, 3}};  // past 1536: the rotation's two rows a block
    for (Metric metric : {Metric::L2, Metric::InnerProduct, Metric::Cosine})
        for (const Shape& sh : shapes) {
            if (sh.d >= 768 && metric != Metric::L2)
                continue;
            SCOPED_TRACE(shape("rabitq encode", {{"metric", double(int(metric))}, {"d", double(sh.d)},
                                                 {"bits", double(sh.bits)}}, s));
            Fixture fx(sh.d, sh.lists, sh.n, sh.bits, metric, s);
            GpuRabitqIndex index(ctx(), sh.d, sh.lists, sh.bits, metric, fx.cent.data(), fx.blob.data());
            std::vector<uint8_t> rows(fx.rows.size(), 0xee);
            index.encode(fx.x.data(), sh.n, fx.list_ids.data(), rows.data());
            size_t differ = 0;
            for (size_t i = 0; i < sh.n; i++)
                differ += std::memcmp(rows.data() + i * fx.rb(), fx.rows.data() + i * fx.rb(), fx.rb()) != 0;
            EXPECT_EQ(differ, 0u) << "rows whose code or factors differ from the CPU engine's";
        }
    // Directions that probe the sweep's special cases (ties in u and in t,
    // short binary fractions, zeros, a dominant coordinate), by the GPU's
    // sweep against the engine's grid search.
    std::mt19937_64 gen(s);
    std::normal_distribution<double> g(0.0, 1.0);
    for (int bits = 1; bits <= 8; bits++)
        for (size_t d : {1, 3, 31, 128, 300}) {
            const size_t n = 48;
            std::vector<double> o(n * d);
            for (size_t v = 0; v < n; v++) {
                const int kind = int(v % 6);
                double nrm = 0;
                for (size_t t = 0; t < d; t++) {
                    double e = g(gen);
                    if (kind == 1 && gen() % 3 != 0)
                        e = 0;
                    if (kind == 2)
                        e = double(1 + gen() % 4) * (gen() % 2 ? 1.0 : -1.0);
                    if (kind == 3)
                        e = std::ldexp(double(int64_t(gen() % 64) - 32), -5);
                    if (kind == 4 && t == 0)
                        e = 50.0;
                    if (kind == 5)
                        e = e * e * e;
                    o[v * d + t] = e;
                    nrm += e * e;
                }
                if (nrm > 0)
                    for (size_t t = 0; t < d; t++)
                        o[v * d + t] /= std::sqrt(nrm);
            }
            std::vector<uint8_t> gx(n * d), cx(d);
            std::vector<gpuivfpq::RabitqGridPoint> gp(n);
            gpuivfpq::gpu::rabitq_grid_points_gpu(ctx(), o.data(), n, d, bits, gx.data(), gp.data());
            for (size_t v = 0; v < n; v++) {
                const gpuivfpq::RabitqGridPoint c = gpuivfpq::rabitq_best_grid_point(o.data() + v * d, d, bits, cx.data());
                ASSERT_TRUE(std::memcmp(gx.data() + v * d, cx.data(), d) == 0 &&
                            std::memcmp(&gp[v].ip, &c.ip, sizeof c.ip) == 0 &&
                            std::memcmp(&gp[v].norm_sqr, &c.norm_sqr, sizeof c.norm_sqr) == 0)
                    << "bits " << bits << " d " << d << " vector " << v;
            }
        }
    Fixture fx(16, 4, 50, 1, Metric::L2, s);
    GpuRabitqIndex index(ctx(), 16, 4, 1, Metric::L2, fx.cent.data(), fx.blob.data());
    index.encode(nullptr, 0, nullptr, nullptr);  // nothing to do
    std::vector<int32_t> bad(fx.list_ids);
    bad[7] = 4;
    std::vector<uint8_t> out(fx.rows.size());
    EXPECT_EQ(kind_of([&] { index.encode(fx.x.data(), fx.n, bad.data(), out.data()); }), ErrorKind::InvalidArgument);
}

TEST(RabitqIndex, EmptyAndArgumentChecks)
{
    GPU_REQUIRE_DEVICE();
    const size_t d = 64, lists = 4;
    Fixture fx(d, lists, 200, 4, Metric::L2, seed(4503));
    GpuRabitqIndex plain(ctx(), d, lists, 4, Metric::L2, fx.cent.data(), fx.blob.data(), false);
    std::vector<float> q(d, 0.5f), dist(3);
    std::vector<int64_t> labels(3, 7);
    // Empty: padding only.
    plain.search(q.data(), 1, 3, 2, dist.data(), labels.data());
    for (size_t j = 0; j < 3; j++) {
        EXPECT_EQ(labels[j], -1);
        EXPECT_TRUE(std::isinf(dist[j]));
    }
    int64_t lo = 0, hi = 1;
    KeyRange r;
    r.lo = &lo;
    r.hi = &hi;
    EXPECT_EQ(kind_of([&] { plain.search(q.data(), 1, 3, 2, dist.data(), labels.data(), nullptr, -1.0f); }),
              ErrorKind::InvalidArgument);
    EXPECT_EQ(kind_of([&] { plain.search(q.data(), 1, 0, 2, dist.data(), labels.data()); }),
              ErrorKind::InvalidArgument);
    EXPECT_EQ(kind_of([&] {
                  plain.search(q.data(), 1, gpuivfpq::kMaxSelectK + 1, 2, dist.data(), labels.data());
              }),
              ErrorKind::InvalidArgument);
    EXPECT_EQ(kind_of([&] { plain.search(q.data(), 1, 3, 2, dist.data(), labels.data(), &r); }),
              ErrorKind::InvalidArgument);
    EXPECT_EQ(kind_of([&] {
                  plain.add(1, fx.list_ids.data(), fx.rows.data(), fx.ids.data(), fx.keys.data());
              }),
              ErrorKind::InvalidArgument);
    int32_t bad = int32_t(lists);
    EXPECT_EQ(kind_of([&] { plain.add(1, &bad, fx.rows.data(), fx.ids.data()); }), ErrorKind::InvalidArgument);
    EXPECT_EQ(plain.ntotal(), 0u);
    EXPECT_EQ(kind_of([&] {
                  GpuRabitqIndex x(ctx(), d, lists, 9, Metric::L2, fx.cent.data(), fx.blob.data());
              }),
              ErrorKind::InvalidArgument);
    std::vector<uint8_t> nan_blob = fx.blob;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(nan_blob.data(), &nan, sizeof(nan));
    EXPECT_EQ(kind_of([&] {
                  GpuRabitqIndex x(ctx(), d, lists, 4, Metric::L2, fx.cent.data(), nan_blob.data());
              }),
              ErrorKind::InvalidArgument);
}
