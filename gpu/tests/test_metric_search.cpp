// Metric-space search on the GPU against the CPU engine (src/engine), value
// for value: the bit-parallel edit distance (one block and blocked, exact
// and bounded), SSS and List of Clusters range and k-NN search on ASCII and
// Spanish words of 0..200 code points, through inserts at the engine's
// placements and removals, across tiles of queries and buffer regrowth;
// and the refusals (bad states, bad placements, bad arguments).
#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/metric/edit_distance.h"
#include "engine/metric/lc_index.h"
#include "engine/metric/metric_index.h"
#include "engine/metric/sss_index.h"
#include "../../test/unit/metric_words.h"
#include "gpu_ivfpq/metric_index.h"
#include "gpu_ivfpq/metric_search.h"
#include "gpu_test_util.h"

using namespace gputest;
using gpuivfpq::EditPattern;
using gpuivfpq::ErrorKind;
using gpuivfpq::LcPlacement;
using gpuivfpq::ListOfClusters;
using gpuivfpq::MetricBatchResult;
using gpuivfpq::MetricIndex;
using gpuivfpq::SparseSpatialSelection;
using gpuivfpq::WordList;
using gpuivfpq::gpu::GpuMetricIndex;
using metricwords::to_list;
using metricwords::view;
using metricwords::Word;

namespace {

using gputest::kind_of;

struct Alphabet {
    const char* name;
    const std::vector<uint32_t>& letters;
};

std::vector<Alphabet> alphabets()
{
    return {{"ascii", metricwords::ascii_alphabet()}, {"spanish", metricwords::spanish_alphabet()}};
}

std::vector<uint8_t> removed_flags(const MetricIndex& index)
{
    std::vector<uint8_t> removed(index.size());
    for (uint32_t id = 0; id < index.size(); id++)
        removed[id] = index.is_removed(id);
    return removed;
}

// The GPU copy of an engine index, from the state the engine exposes.
std::unique_ptr<GpuMetricIndex> gpu_copy(const ListOfClusters& lc)
{
    std::vector<uint32_t> centres, radii;
    for (size_t c = 0; c < lc.clusters(); c++) {
        centres.push_back(lc.centre(c));
        radii.push_back(lc.radius(c));
    }
    const auto removed = removed_flags(lc);
    return GpuMetricIndex::list_of_clusters(ctx(), lc.words(), removed.data(), centres, radii,
                                            lc.cluster_assignment());
}

std::unique_ptr<GpuMetricIndex> gpu_copy(const SparseSpatialSelection& sss)
{
    std::vector<uint32_t> pivots;
    for (size_t p = 0; p < sss.pivots(); p++)
        pivots.push_back(sss.pivot(p));
    const auto removed = removed_flags(sss);
    return GpuMetricIndex::sparse_spatial_selection(ctx(), sss.words(), removed.data(), pivots,
                                                    sss.table());
}

// The same answers, query by query, hit by hit.
void expect_same(const MetricBatchResult& got, const MetricBatchResult& want,
                 const std::string& what)
{
    ASSERT_EQ(got.offsets.size(), want.offsets.size()) << what;
    for (size_t q = 0; q + 1 < want.offsets.size(); q++) {
        const size_t gb = size_t(got.offsets[q]), ge = size_t(got.offsets[q + 1]);
        const size_t wb = size_t(want.offsets[q]), we = size_t(want.offsets[q + 1]);
        ASSERT_EQ(ge - gb, we - wb)
            << what << " query " << q << "\ngot  " << metricwords::describe(&got.hits[gb], ge - gb)
            << "\nwant " << metricwords::describe(&want.hits[wb], we - wb);
        for (size_t i = 0; i < we - wb; i++) {
            ASSERT_EQ(got.hits[gb + i].id, want.hits[wb + i].id) << what << " query " << q << " rank " << i;
            ASSERT_EQ(got.hits[gb + i].dist, want.hits[wb + i].dist) << what << " query " << q << " rank " << i;
        }
    }
    EXPECT_EQ(got.hits.size(), want.hits.size()) << what;
}

// The device's distance evaluations per query of a range search: with SSS
// the engine's (every pivot, then the candidates the table leaves); a List
// of Clusters computes every centre where the engine stops at its stop
// cluster, so between the engine's count and that plus the clusters.
void expect_evaluations(const GpuMetricIndex& gpu, const MetricBatchResult& got,
                        const MetricBatchResult& want, const std::string& what)
{
    ASSERT_EQ(got.stats.size(), want.stats.size()) << what;
    const bool lc = gpu.is_list_of_clusters();
    for (size_t q = 0; q < want.stats.size(); q++) {
        const uint64_t g = got.stats[q].distance_evaluations, w = want.stats[q].distance_evaluations;
        if (lc) {
            ASSERT_GE(g, w) << what << " query " << q;
            ASSERT_LE(g, w + gpu.clusters()) << what << " query " << q;
        } else {
            ASSERT_EQ(g, w) << what << " query " << q;
        }
    }
}

// Range (radii 0..3, one for all and one per query) and k-NN of the GPU
// copy equal the engine's; returns the range hits (so that a test can see
// it checked something).
size_t expect_matches_engine(GpuMetricIndex& gpu, const MetricIndex& engine,
                             const std::vector<Word>& queries, const std::string& what)
{
    const WordList q = to_list(queries);
    size_t hits = 0;
    for (uint32_t r = 0; r <= 3; r++) {
        const MetricBatchResult want = range_search_batch(engine, q, {r}, 2);
        const MetricBatchResult got = gpu.range(q, {r});
        expect_same(got, want, what + " r=" + std::to_string(r));
        expect_evaluations(gpu, got, want, what + " evaluations r=" + std::to_string(r));
        hits += want.hits.size();
    }
    std::vector<uint32_t> radii(queries.size());
    for (size_t i = 0; i < radii.size(); i++)
        radii[i] = uint32_t(i % 5);
    expect_same(gpu.range(q, radii), range_search_batch(engine, q, radii, 2), what + " radii 0..4");
    for (size_t k : {1, 5, 20}) {
        const MetricBatchResult got = gpu.knn(q, k);
        expect_same(got, knn_search_batch(engine, q, k, 2), what + " k=" + std::to_string(k));
        // Every pivot or centre, then each round's candidates.
        const size_t targets = gpu.is_list_of_clusters() ? gpu.clusters() : gpu.pivots();
        EXPECT_EQ(got.stats.size(), queries.size()) << what;
        for (const gpuivfpq::MetricStats& st : got.stats)
            EXPECT_GE(st.distance_evaluations, targets) << what << " k=" << k;
    }
    return hits;
}

// Inserts at the engine's placements on both (place(w) inserts w into the
// engine and hands it to the GPU, flush() sends what it holds back), then
// removals, centres and pivots among them (low ids).
template <class Place, class Flush>
void grow_and_shrink(MetricIndex& engine, GpuMetricIndex& gpu, const std::vector<Word>& extra,
                     uint64_t s, const Place& place, const Flush& flush)
{
    std::mt19937_64 gen(s);
    for (const Word& w : extra)
        place(w);
    flush();
    ASSERT_EQ(gpu.size(), engine.size());
    std::vector<uint32_t> gone;
    for (int i = 0; i < 60; i++) {
        const uint32_t id = uint32_t(i % 3 == 0 ? gen() % 20 : gen() % engine.size());
        if (engine.remove(id))
            gone.push_back(id);
    }
    gpu.remove(gone);
    ASSERT_EQ(gpu.size(), engine.size());
}

}  // namespace

// Distances of every query x target pair, bounded and exact, equal the
// engine's EditPattern (within(k) = min(d, k + 1)) across 64 and 128.
TEST(MetricSearch, EditDistanceMatrixEqualsEngine)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(3101);
    for (const Alphabet& a : alphabets()) {
        const auto targets = metricwords::make_words(300, s, a.letters);
        auto queries = metricwords::make_queries(targets, 60, s + 1, a.letters);
        queries.push_back({});
        const WordList q = to_list(queries), t = to_list(targets);
        for (uint32_t bound : {0u, 1u, 2u, 3u, 70u, 130u, UINT32_MAX}) {
            SCOPED_TRACE(shape("matrix", {{"bound", double(bound)}}, s) + " " + a.name);
            const auto got = gpuivfpq::gpu::edit_distance_matrix(ctx(), q, t, {bound});
            ASSERT_EQ(got.size(), queries.size() * targets.size());
            for (size_t i = 0; i < queries.size(); i++) {
                const EditPattern p(view(queries[i]));
                for (size_t j = 0; j < targets.size(); j++)
                    ASSERT_EQ(got[i * targets.size() + j], p.within(view(targets[j]), bound))
                        << "query " << i << " (" << queries[i].size() << " code points), target " << j
                        << " (" << targets[j].size() << ")";
            }
        }
    }
}

// Patterns past the blocks a thread keeps in its own arrays (600 and 1500
// code points: 10 and 24 blocks) take the grid's scratch: same values.
TEST(MetricSearch, LongPatternsEqualEngine)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(3102);
    std::mt19937_64 gen(s);
    const auto& letters = metricwords::spanish_alphabet();
    std::vector<Word> queries, targets;
    for (size_t len : {600, 1500, 70, 0}) {
        Word w(len);
        for (uint32_t& c : w)
            c = letters[gen() % 6];
        queries.push_back(w);
    }
    for (int i = 0; i < 40; i++) {
        Word w = metricwords::mutate(gen, queries[size_t(i) % 2], size_t(gen() % 40), letters);
        targets.push_back(i % 7 == 0 ? Word(size_t(gen() % 100), letters[0]) : w);
    }
    const WordList q = to_list(queries), t = to_list(targets);
    for (uint32_t bound : {5u, 40u, 900u, UINT32_MAX}) {
        SCOPED_TRACE(shape("long", {{"bound", double(bound)}}, s));
        const auto got = gpuivfpq::gpu::edit_distance_matrix(ctx(), q, t, {bound});
        for (size_t i = 0; i < queries.size(); i++) {
            const EditPattern p(view(queries[i]));
            for (size_t j = 0; j < targets.size(); j++)
                ASSERT_EQ(got[i * targets.size() + j], p.within(view(targets[j]), bound))
                    << "query " << i << ", target " << j;
        }
    }
}

TEST(MetricSearch, SssEqualsEngine)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(3103);
    for (const Alphabet& a : alphabets())
        for (double alpha : {0.3, 0.5, 0.7}) {
            const std::string what =
                shape("sss", {{"alpha", alpha}}, s) + " " + a.name;
            SCOPED_TRACE(what);
            const auto words = metricwords::make_words(1500, s, a.letters);
            const auto queries = metricwords::make_queries(words, 80, s + 1, a.letters);
            SparseSpatialSelection sss(to_list(words), alpha, 2);
            auto gpu = gpu_copy(sss);
            EXPECT_EQ(gpu->pivots(), sss.pivots());
            EXPECT_GT(expect_matches_engine(*gpu, sss, queries, what), 80u);
            const auto extra = metricwords::make_words(300, s + 2, a.letters);
            grow_and_shrink(
                sss, *gpu, extra, s + 3,
                [&](const Word& w) {
                    const auto row = sss.table_row(view(w));
                    WordList one;
                    one.push_back(view(w));
                    gpu->add(one, row.data());
                    sss.insert_at(view(w), row.data());
                },
                [] {});
            expect_matches_engine(*gpu, sss, queries, what + " after changes");
            EXPECT_LE(gpu->bytes(), ctx().bytes_in_use());
        }
}

TEST(MetricSearch, ListOfClustersEqualsEngine)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(3104);
    for (const Alphabet& a : alphabets())
        for (size_t bucket : {1, 8, 32}) {
            const std::string what =
                shape("lc", {{"bucket", double(bucket)}}, s) + " " + a.name;
            SCOPED_TRACE(what);
            const auto words = metricwords::make_words(1200, s, a.letters);
            const auto queries = metricwords::make_queries(words, 80, s + 1, a.letters);
            ListOfClusters lc(to_list(words), bucket, 2);
            auto gpu = gpu_copy(lc);
            EXPECT_EQ(gpu->clusters(), lc.clusters());
            EXPECT_GT(expect_matches_engine(*gpu, lc, queries, what), 80u);
            // Inserts in batches: each batch's placements found on the
            // engine one after the other, as a caller does.
            const auto extra = metricwords::make_words(300, s + 2, a.letters);
            std::vector<LcPlacement> batch;
            WordList pending;
            auto flush = [&] {
                gpu->add(pending, batch.data());
                batch.clear();
                pending = WordList();
            };
            grow_and_shrink(
                lc, *gpu, extra, s + 3,
                [&](const Word& w) {
                    const LcPlacement p = lc.placement(view(w));
                    lc.insert_at(view(w), p);
                    batch.push_back(p);
                    pending.push_back(view(w));
                    if (batch.size() == 37)
                        flush();
                },
                flush);
            EXPECT_EQ(gpu->clusters(), lc.clusters());
            expect_matches_engine(*gpu, lc, queries, what + " after changes");
        }
}

// Empty indexes, an index with every object removed, k = 0 and k past the
// live objects, radii past the table's clamp and the largest radius.
TEST(MetricSearch, EdgeCases)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(3105);
    const auto& letters = metricwords::ascii_alphabet();
    const auto words = metricwords::make_words(300, s, letters);
    const auto queries = metricwords::make_queries(words, 30, s + 1, letters);
    const WordList q = to_list(queries);

    ListOfClusters empty_lc(WordList(), 4);
    SparseSpatialSelection empty_sss(WordList(), 0.5);
    for (auto* gpu : {gpu_copy(empty_lc).release(), gpu_copy(empty_sss).release()}) {
        std::unique_ptr<GpuMetricIndex> own(gpu);
        const auto r = own->range(q, {5});
        EXPECT_EQ(r.offsets, std::vector<uint64_t>(queries.size() + 1, 0));
        EXPECT_TRUE(own->knn(q, 3).hits.empty());
        EXPECT_EQ(own->range(WordList(), {5}).offsets, std::vector<uint64_t>(1, 0));
    }

    SparseSpatialSelection sss(to_list(words), 0.4);
    ListOfClusters lc(to_list(words), 8);
    auto gs = gpu_copy(sss);
    auto gl = gpu_copy(lc);
    for (uint32_t r : {254u, 255u, 256u, 1000u, UINT32_MAX}) {
        expect_same(gs->range(q, {r}), range_search_batch(sss, q, {r}, 2), "sss r=" + std::to_string(r));
        expect_same(gl->range(q, {r}), range_search_batch(lc, q, {r}, 2), "lc r=" + std::to_string(r));
    }
    for (size_t k : {0, 299, 300, 301, 5000}) {
        expect_same(gs->knn(q, k), knn_search_batch(sss, q, k, 2), "sss k=" + std::to_string(k));
        expect_same(gl->knn(q, k), knn_search_batch(lc, q, k, 2), "lc k=" + std::to_string(k));
    }
    std::vector<uint32_t> all(words.size());
    for (uint32_t id = 0; id < all.size(); id++) {
        all[id] = id;
        sss.remove(id);
        lc.remove(id);
    }
    gs->remove(all);
    gl->remove(all);
    EXPECT_TRUE(gs->range(q, {UINT32_MAX}).hits.empty());
    EXPECT_TRUE(gl->knn(q, 10).hits.empty());
}

// More hits and candidates than the buffers' first capacity (2^16), and
// batches in many tiles of queries: grown and run again, nothing lost.
TEST(MetricSearch, ManyHitsAndTiles)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(3106);
    const auto& letters = metricwords::spanish_alphabet();
    const auto words = metricwords::make_words(2000, s, letters);
    const auto queries = metricwords::make_queries(words, 90, s + 1, letters);
    const WordList q = to_list(queries);
    SparseSpatialSelection sss(to_list(words), 0.5);
    ListOfClusters lc(to_list(words), 16);
    auto gs = gpu_copy(sss);
    auto gl = gpu_copy(lc);
    // About half the words within 12 of each query: ~90000 hits.
    const MetricBatchResult want = range_search_batch(sss, q, {12}, 2);
    ASSERT_GT(want.hits.size(), size_t(1) << 16);
    expect_same(gs->range(q, {12}), want, "sss many hits");
    expect_same(gl->range(q, {12}), want, "lc many hits");
    for (size_t tile : {1, 7, 32}) {
        gpuivfpq::gpu::set_metric_tile_queries(tile);
        const std::string what = " tile=" + std::to_string(tile);
        expect_same(gs->range(q, {2}), range_search_batch(sss, q, {2}, 2), "sss" + what);
        expect_same(gl->range(q, {3}), range_search_batch(lc, q, {3}, 2), "lc" + what);
        expect_same(gs->knn(q, 9), knn_search_batch(sss, q, 9, 2), "sss knn" + what);
        expect_same(gl->knn(q, 9), knn_search_batch(lc, q, 9, 2), "lc knn" + what);
    }
    gpuivfpq::gpu::set_metric_tile_queries(0);
}

TEST(MetricSearch, Refusals)
{
    GPU_REQUIRE_DEVICE();
    const auto words = metricwords::make_words(120, seed(3107), metricwords::ascii_alphabet());
    const WordList list = to_list(words);
    ListOfClusters lc(list, 5);
    std::vector<uint32_t> centres, radii;
    for (size_t c = 0; c < lc.clusters(); c++) {
        centres.push_back(lc.centre(c));
        radii.push_back(lc.radius(c));
    }
    const auto cluster_of = lc.cluster_assignment();
    auto bad_lc = [&](std::vector<uint32_t> c, std::vector<uint32_t> r, std::vector<uint32_t> a) {
        return kind_of([&] { GpuMetricIndex::list_of_clusters(ctx(), list, nullptr, c, r, a); });
    };
    auto short_radii = radii;
    short_radii.pop_back();
    EXPECT_EQ(bad_lc(centres, short_radii, cluster_of), ErrorKind::InvalidArgument);
    auto far_centre = centres;
    far_centre[1] = uint32_t(words.size());
    EXPECT_EQ(bad_lc(far_centre, radii, cluster_of), ErrorKind::InvalidArgument);
    auto twice = centres;
    twice[1] = twice[0];
    EXPECT_EQ(bad_lc(twice, radii, cluster_of), ErrorKind::InvalidArgument);
    auto lost = cluster_of;
    lost.back() = uint32_t(centres.size());
    EXPECT_EQ(bad_lc(centres, radii, lost), ErrorKind::InvalidArgument);

    SparseSpatialSelection sss(list, 0.5);
    std::vector<uint32_t> pivots;
    for (size_t p = 0; p < sss.pivots(); p++)
        pivots.push_back(sss.pivot(p));
    ASSERT_GE(pivots.size(), 2u);
    auto dup = pivots;
    dup[1] = dup[0];
    EXPECT_EQ(kind_of([&] {
                  GpuMetricIndex::sparse_spatial_selection(ctx(), list, nullptr, dup, sss.table());
              }),
              ErrorKind::InvalidArgument);

    // A placement no insert makes changes nothing.
    auto gpu = gpu_copy(lc);
    WordList two;
    two.push_back(view(words[0]));
    two.push_back(view(words[1]));
    const LcPlacement fine{0, lc.radius(0)};
    const LcPlacement bad{uint32_t(lc.clusters() + 1), 0};
    const LcPlacement batch[2] = {fine, bad};
    EXPECT_EQ(kind_of([&] { gpu->add(two, batch); }), ErrorKind::InvalidArgument);
    EXPECT_EQ(gpu->size(), words.size());
    EXPECT_EQ(kind_of([&] { gpu->add(two, sss.table()); }), ErrorKind::InvalidArgument);
    EXPECT_EQ(kind_of([&] { gpu->remove({uint32_t(words.size())}); }), ErrorKind::InvalidArgument);
    EXPECT_EQ(kind_of([&] { gpu->range(list, {1, 2}); }), ErrorKind::InvalidArgument);
    const WordList q = to_list({words[3]});
    expect_same(gpu->range(q, {2}), range_search_batch(lc, q, {2}, 1), "after refusals");
}
