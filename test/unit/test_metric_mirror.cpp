// Metric mirrors (gpu_process/metric_mirror.h) on the CPU emulation
// against the engine's indexes built directly: the same answers as labels,
// through inserts at the engine's placements and removals by label, on one
// device and spread over several (placed_metric_mirror.h); the refusals of
// broken states and bad changes. And what the mirrors rely on
// in the engine: an insert at the placement the engine's rule chose
// (ListOfClusters::placement / insert_at, SparseSpatialSelection::table_row
// / insert_at) leaves a copy of an index exactly as insert() leaves the
// original, and a placement no insert makes is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/error.h"
#include "engine/metric/lc_index.h"
#include "engine/metric/metric_index.h"
#include "engine/metric/sss_index.h"
#include "metric_spec.h"
#include "metric_words.h"
#include "gpu_process/compute_device.h"
#include "gpu_process/device_set.h"
#include "gpu_process/metric_mirror.h"
#include "gpu_process/placed_metric_mirror.h"
#include "test_util.h"

using namespace gpuivfpq;
using metricwords::to_list;
using metricwords::view;
using metricwords::Word;
using metricspec::label_of;
using metricspec::removed_flags;
using metricspec::SpecStore;
using testutil::test_seed;

namespace {

std::unique_ptr<ListOfClusters> copy_of(const ListOfClusters& lc)
{
    std::vector<uint32_t> centres, radii;
    for (size_t c = 0; c < lc.clusters(); c++) {
        centres.push_back(lc.centre(c));
        radii.push_back(lc.radius(c));
    }
    return ListOfClusters::restore(lc.words(), removed_flags(lc), lc.bucket_size(), centres, radii,
                                   lc.cluster_assignment());
}

std::unique_ptr<SparseSpatialSelection> copy_of(const SparseSpatialSelection& sss)
{
    std::vector<uint32_t> pivots;
    for (size_t p = 0; p < sss.pivots(); p++)
        pivots.push_back(sss.pivot(p));
    return SparseSpatialSelection::restore(
        sss.words(), removed_flags(sss), sss.alpha(), sss.max_distance(), pivots,
        std::vector<uint8_t>(sss.table(), sss.table() + sss.size() * sss.pivots()));
}

void expect_same_lc(const ListOfClusters& a, const ListOfClusters& b)
{
    ASSERT_EQ(a.size(), b.size());
    ASSERT_EQ(a.clusters(), b.clusters());
    for (size_t c = 0; c < a.clusters(); c++) {
        ASSERT_EQ(a.centre(c), b.centre(c)) << "cluster " << c;
        ASSERT_EQ(a.radius(c), b.radius(c)) << "cluster " << c;
        ASSERT_EQ(a.members(c), b.members(c)) << "cluster " << c;
    }
}

template <class Fn>
void expect_invalid(Fn&& fn)
{
    try {
        fn();
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument) << e.what();
    }
}

}  // namespace

// The copy takes every insert at the original's placement, found on the
// copy itself; both stay identical (clusters, radii, buckets).
TEST(MetricPlacement, ListOfClustersInsertAtFollowsInsert)
{
    const uint64_t seed = test_seed(951);
    const auto& alphabet = metricwords::spanish_alphabet();
    const auto words = metricwords::make_words(600, seed, alphabet);
    const auto extra = metricwords::make_words(500, seed + 1, alphabet);
    // Every kind of placement occurs somewhere (new clusters at small
    // buckets, a grown last radius, first fits).
    size_t new_clusters = 0, grown = 0;
    for (size_t bucket : {1, 8, 32}) {
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " bucket=" << bucket);
        ListOfClusters lc(to_list(words), bucket);
        auto copy = copy_of(lc);
        for (const Word& w : extra) {
            const LcPlacement p = copy->placement(view(w));
            const size_t before = lc.clusters();
            new_clusters += p.cluster == before;
            grown += p.cluster + 1 == before && p.radius > lc.radius(p.cluster);
            EXPECT_EQ(copy->insert_at(view(w), p), lc.insert(view(w)));
        }
        expect_same_lc(lc, *copy);
    }
    EXPECT_GT(new_clusters, 0u);
    EXPECT_GT(grown, 0u);
}

TEST(MetricPlacement, ListOfClustersRefusesPlacementsNoInsertMakes)
{
    const auto words = metricwords::make_words(200, test_seed(952), metricwords::ascii_alphabet());
    ListOfClusters lc(to_list(words), 6);
    ASSERT_GE(lc.clusters(), 3u);
    const size_t nc = lc.clusters();
    const Word w = {'x', 'y'};
    uint32_t mid = 0;
    while (mid + 1 < nc && lc.radius(mid) == 0)
        mid++;
    ASSERT_LT(mid + 1, nc);
    expect_invalid([&] { lc.insert_at(view(w), LcPlacement{uint32_t(nc + 1), 0}); });
    expect_invalid([&] { lc.insert_at(view(w), LcPlacement{uint32_t(nc), 1}); });
    expect_invalid([&] { lc.insert_at(view(w), LcPlacement{mid, lc.radius(mid) - 1}); });
    expect_invalid([&] { lc.insert_at(view(w), LcPlacement{mid, lc.radius(mid) + 1}); });
    EXPECT_EQ(lc.size(), words.size());
    EXPECT_EQ(lc.clusters(), nc);
    // What the rule does make: a first fit as it is, the last radius grown,
    // a new cluster.
    EXPECT_EQ(lc.insert_at(view(w), LcPlacement{mid, lc.radius(mid)}), words.size());
    const uint32_t last = uint32_t(lc.clusters() - 1);
    lc.insert_at(view(w), LcPlacement{last, lc.radius(last) + 5});
    EXPECT_EQ(lc.members(last).back(), words.size() + 1);
    lc.insert_at(view(w), LcPlacement{uint32_t(lc.clusters()), 0});
    EXPECT_EQ(lc.clusters(), nc + 1);
    EXPECT_EQ(lc.centre(nc), words.size() + 2);
}

TEST(MetricPlacement, SssInsertAtFollowsInsert)
{
    const uint64_t seed = test_seed(953);
    const auto& alphabet = metricwords::ascii_alphabet();
    const auto words = metricwords::make_words(500, seed, alphabet);
    const auto extra = metricwords::make_words(300, seed + 1, alphabet);
    for (double alpha : {0.3, 0.5, 0.7}) {
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " alpha=" << alpha);
        SparseSpatialSelection sss(to_list(words), alpha);
        auto copy = copy_of(sss);
        for (const Word& w : extra) {
            const std::vector<uint8_t> row = copy->table_row(view(w));
            ASSERT_EQ(row.size(), sss.pivots());
            EXPECT_EQ(copy->insert_at(view(w), row.data()), sss.insert(view(w)));
        }
        ASSERT_EQ(copy->size(), sss.size());
        EXPECT_TRUE(std::equal(sss.table(), sss.table() + sss.size() * sss.pivots(), copy->table()));
        EXPECT_FALSE(copy->is_pivot(uint32_t(copy->size() - 1)));
    }
    SparseSpatialSelection sss(to_list(words), 0.5);
    const Word w = {'a'};
    expect_invalid([&] { sss.insert_at(view(w), nullptr); });
    EXPECT_EQ(sss.size(), words.size());
}

namespace {

// Words as MetricWords over a WordList that outlives the call.
MetricWords words_of(const WordList& list)
{
    return MetricWords{list.size(), list.code_points(), list.offsets()};
}

// The mirror's answers equal the engine's, ids and labels mapped.
void expect_same_hits(const MetricHits& got, const MetricBatchResult& want, const std::string& what)
{
    ASSERT_EQ(got.offsets, want.offsets) << what;
    ASSERT_EQ(got.ids.size(), want.hits.size()) << what;
    for (size_t i = 0; i < want.hits.size(); i++) {
        ASSERT_EQ(got.ids[i], want.hits[i].id) << what << " hit " << i;
        ASSERT_EQ(got.labels[i], label_of(want.hits[i].id)) << what << " hit " << i;
        ASSERT_EQ(got.distances[i], want.hits[i].dist) << what << " hit " << i;
    }
}

// The distance evaluations a mirror reports, one per query: the engine's
// own where one engine index answers (exact), else some.
void expect_evaluations(const MetricHits& got, const MetricBatchResult& want, bool exact,
                        const std::string& what)
{
    ASSERT_EQ(got.evaluations.size(), want.stats.size()) << what;
    uint64_t total = 0;
    for (size_t q = 0; q < want.stats.size(); q++) {
        if (exact)
            ASSERT_EQ(got.evaluations[q], want.stats[q].distance_evaluations) << what << " query " << q;
        total += got.evaluations[q];
    }
    EXPECT_GT(total, 0u) << what;
}

// exact_evaluations: the mirror is one engine index (its counts the engine's).
size_t expect_mirror_matches(MetricMirror& mirror, const MetricIndex& engine,
                             const std::vector<Word>& queries, const std::string& what,
                             bool exact_evaluations = true)
{
    const WordList q = to_list(queries);
    size_t hits = 0;
    MetricHits got;
    for (uint32_t r = 0; r <= 3; r++) {
        const MetricBatchResult want = range_search_batch(engine, q, {r}, 2);
        mirror.range_batch(words_of(q), &r, 1, got);
        expect_same_hits(got, want, what + " r=" + std::to_string(r));
        expect_evaluations(got, want, exact_evaluations, what + " evaluations r=" + std::to_string(r));
        hits += want.hits.size();
    }
    std::vector<uint32_t> radii(queries.size());
    for (size_t i = 0; i < radii.size(); i++)
        radii[i] = uint32_t(i % 5);
    mirror.range_batch(words_of(q), radii.data(), radii.size(), got);
    expect_same_hits(got, range_search_batch(engine, q, radii, 2), what + " radii 0..4");
    for (size_t k : {1, 5, 20}) {
        const MetricBatchResult want = knn_search_batch(engine, q, k, 2);
        mirror.knn_batch(words_of(q), k, got);
        expect_same_hits(got, want, what + " k=" + std::to_string(k));
        expect_evaluations(got, want, exact_evaluations, what + " evaluations k=" + std::to_string(k));
    }
    EXPECT_EQ(mirror.entries(), engine.live());
    EXPECT_EQ(mirror.objects(), engine.size());
    return hits;
}

// Inserts into the engine by its rule and into the mirror at the same
// placements, in batches of 40; then removals by label (low ids: centres
// and pivots).
template <class Index, class Placement>
void change_both(MetricMirror& mirror, Index& engine, const std::vector<Word>& extra, uint64_t seed,
                 const Placement& placement)
{
    for (size_t first = 0; first < extra.size(); first += 40) {
        WordList batch;
        std::vector<int64_t> labels;
        using P = decltype(placement(view(extra[0])));
        std::vector<P> where;
        for (size_t i = first; i < std::min(extra.size(), first + 40); i++) {
            where.push_back(placement(view(extra[i])));
            labels.push_back(label_of(uint32_t(engine.size())));
            engine.insert(view(extra[i]));
            batch.push_back(view(extra[i]));
        }
        MetricPlacements placements;
        std::vector<uint8_t> rows;
        if constexpr (std::is_same_v<P, LcPlacement>) {
            placements.clusters = where.data();
        } else {
            for (const auto& row : where)
                rows.insert(rows.end(), row.begin(), row.end());
            placements.table_rows = rows.data();
        }
        mirror.add(words_of(batch), labels.data(), placements);
    }
    std::mt19937_64 gen(seed);
    std::vector<int64_t> gone;
    size_t newly = 0;
    for (int i = 0; i < 80; i++) {
        const uint32_t id = uint32_t(i % 3 == 0 ? gen() % 20 : gen() % engine.size());
        newly += engine.remove(id);
        gone.push_back(label_of(id));
    }
    gone.push_back(-5);  // unknown: ignored
    EXPECT_EQ(mirror.remove(gone.size(), gone.data()), newly);
    EXPECT_EQ(mirror.remove(gone.size(), gone.data()), 0u);
}

}  // namespace

TEST(MetricMirror, EmulationEqualsEngine)
{
    const uint64_t seed = test_seed(961);
    const auto device = make_cpu_emulation_device();
    for (const auto* alphabet : {&metricwords::ascii_alphabet(), &metricwords::spanish_alphabet()}) {
        const auto words = metricwords::make_words(800, seed, *alphabet);
        const auto queries = metricwords::make_queries(words, 50, seed + 1, *alphabet);
        const auto extra = metricwords::make_words(200, seed + 2, *alphabet);
        for (size_t bucket : {1, 8, 32}) {
            const std::string what = "seed=" + std::to_string(seed) + " lc bucket=" +
                                     std::to_string(bucket);
            SCOPED_TRACE(what);
            ListOfClusters lc(to_list(words), bucket);
            for (uint32_t id = 0; id < lc.size(); id += 9)
                lc.remove(id);
            const SpecStore store(lc);
            auto mirror = device->create_metric_mirror(store.spec);
            EXPECT_EQ(mirror->method(), MetricMethod::ListOfClusters);
            EXPECT_EQ(mirror->clusters(), lc.clusters());
            EXPECT_GT(expect_mirror_matches(*mirror, lc, queries, what), 50u);
            change_both(*mirror, lc, extra, seed + 3,
                        [&](WordView w) { return lc.placement(w); });
            expect_mirror_matches(*mirror, lc, queries, what + " after changes");
            EXPECT_GT(mirror->bytes(), 0u);
        }
        for (double alpha : {0.3, 0.5, 0.7}) {
            const std::string what = "seed=" + std::to_string(seed) + " sss alpha=" +
                                     std::to_string(alpha);
            SCOPED_TRACE(what);
            SparseSpatialSelection sss(to_list(words), alpha);
            const SpecStore store(sss);
            auto mirror = device->create_metric_mirror(store.spec);
            EXPECT_EQ(mirror->pivots(), sss.pivots());
            EXPECT_GT(expect_mirror_matches(*mirror, sss, queries, what), 50u);
            change_both(*mirror, sss, extra, seed + 3,
                        [&](WordView w) { return sss.table_row(w); });
            expect_mirror_matches(*mirror, sss, queries, what + " after changes");
        }
    }
}

TEST(MetricMirror, RefusesBrokenStatesAndChanges)
{
    const auto words = metricwords::make_words(100, test_seed(962), metricwords::ascii_alphabet());
    const auto device = make_cpu_emulation_device();
    const ListOfClusters lc(to_list(words), 5);
    const SparseSpatialSelection sss(to_list(words), 0.5);
    auto expect_refused = [&](const MetricSpec& spec) {
        expect_invalid([&] { device->create_metric_mirror(spec); });
    };
    {
        SpecStore s(lc);
        s.spec.bucket = 0;
        expect_refused(s.spec);
    }
    {
        SpecStore s(lc);
        s.cluster_of.back() = uint32_t(s.centres.size());
        expect_refused(s.spec);
    }
    {
        SpecStore s(lc);
        s.spec.cluster_of = nullptr;
        expect_refused(s.spec);
    }
    {
        SpecStore s(lc);
        s.spec.labels = nullptr;
        expect_refused(s.spec);
    }
    {
        SpecStore s(lc);
        const std::vector<uint32_t> ids(words.size(), 4);  // not increasing
        s.spec.ids = ids.data();
        expect_refused(s.spec);
    }
    {
        SpecStore s(sss);
        s.spec.alpha = 0;
        expect_refused(s.spec);
    }
    {
        SpecStore s(sss);
        s.pivots[1] = s.pivots[0];
        expect_refused(s.spec);
    }
    {
        SpecStore s(sss);
        s.spec.table = nullptr;
        expect_refused(s.spec);
    }
    {
        SpecStore s(lc);
        s.spec.method = MetricMethod(7);
        expect_refused(s.spec);
    }
    {
        SpecStore s(lc);
        s.offsets[3] = s.offsets[4] + 1;  // offsets that decrease
        expect_refused(s.spec);
    }

    // Changes: a bad placement, a missing row, ids out of order, bad radii.
    const SpecStore store(lc);
    auto mirror = device->create_metric_mirror(store.spec);
    const WordList two = to_list({words[0], words[1]});
    const int64_t labels[2] = {1, 2};
    const LcPlacement bad[2] = {{0, lc.radius(0)}, {uint32_t(lc.clusters() + 3), 0}};
    expect_invalid([&] { mirror->add(words_of(two), labels, MetricPlacements{bad, nullptr}); });
    expect_invalid([&] { mirror->add(words_of(two), labels, MetricPlacements{}); });
    const LcPlacement good[2] = {{0, lc.radius(0)}, {0, lc.radius(0)}};
    const uint32_t backwards[2] = {500, 400};
    expect_invalid(
        [&] { mirror->add(words_of(two), labels, MetricPlacements{good, nullptr}, backwards); });
    EXPECT_EQ(mirror->objects(), words.size());
    const uint32_t radii[3] = {1, 2, 3};
    MetricHits out;
    expect_invalid([&] { mirror->range_batch(words_of(two), radii, 3, out); });
    // The real placements, found on a copy of the engine index.
    ListOfClusters copy(to_list(words), 5);
    LcPlacement real[2];
    real[0] = copy.placement(view(words[0]));
    copy.insert_at(view(words[0]), real[0]);
    real[1] = copy.placement(view(words[1]));
    const uint32_t forwards[2] = {500, 600};
    mirror->add(words_of(two), labels, MetricPlacements{real, nullptr}, forwards);
    EXPECT_EQ(mirror->next_id(), 601u);
    const uint32_t zero = 0;
    mirror->range_batch(words_of(two), &zero, 1, out);
    ASSERT_EQ(out.offsets.size(), 3u);
    // Each query finds itself: its first copy (id 0 or 1) before the one
    // added as 500 or 600.
    EXPECT_EQ(out.ids[out.offsets[1] - 1], 500u);
    EXPECT_EQ(out.ids[out.offsets[2] - 1], 600u);
    EXPECT_EQ(out.labels[out.offsets[2] - 1], 2);

    SpecStore sss_store(sss);
    auto sss_mirror = device->create_metric_mirror(sss_store.spec);
    expect_invalid([&] { sss_mirror->add(words_of(two), labels, MetricPlacements{}); });
    EXPECT_EQ(sss_mirror->entries(), words.size());
}

// A device that keeps no metric mirrors says so.
TEST(MetricMirror, UnsupportedWithoutMirrors)
{
    class Plain final : public ComputeDevice {
    public:
        std::string description() const override { return "plain"; }
        size_t memory_capacity() const override { return 0; }
        size_t mirror_bytes(const MirrorSpec&, size_t) const override { return 0; }
        std::unique_ptr<Mirror> create_mirror(const MirrorSpec&) override { return nullptr; }
        void train(const float*, size_t, size_t, size_t, size_t, Metric, const IvfPqTrainParams&,
                   float*, float*) override
        {
        }
        void exact_knn(const float*, size_t, const float*, size_t, size_t, Metric, size_t, float*,
                       int64_t*) override
        {
        }
        void encode(const MirrorSpec&, const float*, size_t, int32_t*, uint8_t*) override {}
    } plain;
    const auto words = metricwords::make_words(20, 5, metricwords::ascii_alphabet());
    const SpecStore store(ListOfClusters(to_list(words), 3));
    try {
        plain.create_metric_mirror(store.spec);
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::Unsupported) << e.what();
    }
    EXPECT_GT(metric_mirror_bytes(store.spec), store.cps.size() * sizeof(uint32_t));
}

// Spread over 1, 2 and 3 emulated devices (LC clusters or SSS objects,
// every part searching every query), the merged answers are one index's,
// through inserts (new clusters landing on parts that had none) and
// removals; a failed device makes the mirror refuse to answer.
TEST(MetricMirror, PlacedOverDevicesEqualsEngine)
{
    const uint64_t seed = test_seed(963);
    const auto& alphabet = metricwords::spanish_alphabet();
    std::vector<std::unique_ptr<ComputeDevice>> devices;
    for (int i = 0; i < 3; i++)
        devices.push_back(make_cpu_emulation_device());
    DeviceSet set(std::move(devices), {0, 1, 2});
    const auto words = metricwords::make_words(600, seed, alphabet);
    const auto queries = metricwords::make_queries(words, 40, seed + 1, alphabet);
    const auto extra = metricwords::make_words(160, seed + 2, alphabet);
    for (size_t parts : {1, 2, 3}) {
        std::vector<size_t> on(parts);
        std::iota(on.begin(), on.end(), size_t(0));
        for (size_t n : {size_t(2), words.size()}) {
            const std::vector<Word> some(words.begin(), words.begin() + long(n));
            const std::string what = "seed=" + std::to_string(seed) + " parts=" +
                                     std::to_string(parts) + " n=" + std::to_string(n);
            SCOPED_TRACE(what);
            ListOfClusters lc(to_list(some), 6);
            lc.remove(1);
            PlacedMetricMirror lcm(set, on, SpecStore(lc).spec);
            EXPECT_EQ(lcm.clusters(), lc.clusters());
            // One part: the engine's counts; several: each part's added up.
            const bool exact = parts == 1;
            expect_mirror_matches(lcm, lc, queries, what + " lc", exact);
            change_both(lcm, lc, extra, seed + 3, [&](WordView w) { return lc.placement(w); });
            expect_mirror_matches(lcm, lc, queries, what + " lc after changes", exact);

            SparseSpatialSelection sss(to_list(some), 0.5);
            PlacedMetricMirror sm(set, on, SpecStore(sss).spec);
            expect_mirror_matches(sm, sss, queries, what + " sss", exact);
            change_both(sm, sss, extra, seed + 3, [&](WordView w) { return sss.table_row(w); });
            expect_mirror_matches(sm, sss, queries, what + " sss after changes", exact);
            size_t spread = 0;
            for (size_t d = 0; d < 3; d++)
                spread += sm.bytes_on(d);
            EXPECT_EQ(spread, sm.bytes());
            EXPECT_EQ(sm.bytes_on(2) > 0, parts == 3);
        }
    }
    ListOfClusters lc(to_list(words), 6);
    PlacedMetricMirror lcm(set, {0, 2}, SpecStore(lc).spec);
    {
        // An answer large enough for the merge to split its queries over
        // threads (every word for each of 160 queries: 96,000 hits).
        std::vector<Word> many;
        while (many.size() < 160)
            many.insert(many.end(), queries.begin(), queries.end());
        many.resize(160);
        const WordList mq = to_list(many);
        const uint32_t all = 1000;
        MetricHits got;
        lcm.range_batch(words_of(mq), &all, 1, got);
        expect_same_hits(got, range_search_batch(lc, mq, {all}, 2), "every word, 160 queries");
        EXPECT_EQ(got.ids.size(), 160 * words.size());
    }
    EXPECT_TRUE(lcm.whole());
    set.mark_failed(2);
    EXPECT_FALSE(lcm.whole());
    const WordList q = to_list(queries);
    MetricHits out;
    const uint32_t r = 1;
    try {
        lcm.range_batch(words_of(q), &r, 1, out);
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::Internal) << e.what();
    }
}
