// A metric mirror brought up to a later state of its index in place
// (MetricMirror::catch_up, MirrorStore::load_metric over a mirror of an
// earlier change): after the engine's inserts and removals the caught-up
// mirror answers as the engine does, on one emulated device and spread
// over several; states that do not extend the mirror's are refused without
// a change; the store files the mirror under the new key, or loads afresh.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/metric/lc_index.h"
#include "engine/metric/metric_index.h"
#include "engine/metric/sss_index.h"
#include "metric_spec.h"
#include "metric_words.h"
#include "gpu_process/compute_device.h"
#include "gpu_process/device_set.h"
#include "gpu_process/metric_mirror.h"
#include "gpu_process/mirror_store.h"
#include "gpu_process/placed_metric_mirror.h"
#include "test_util.h"

using namespace gpuivfpq;
using metricspec::label_of;
using metricspec::SpecStore;
using metricwords::to_list;
using metricwords::view;
using metricwords::Word;
using testutil::test_seed;

namespace {

MetricWords words_of(const WordList& list)
{
    return MetricWords{list.size(), list.code_points(), list.offsets()};
}

// Range (radii 0..3) and k-NN answers of the mirror equal the engine's, as labels.
void expect_answers(MetricMirror& mirror, const MetricIndex& engine, const std::vector<Word>& queries,
                    const std::string& what)
{
    const WordList q = to_list(queries);
    MetricHits got;
    auto same = [&](const MetricBatchResult& want, const std::string& w) {
        ASSERT_EQ(got.offsets, want.offsets) << w;
        ASSERT_EQ(got.labels.size(), want.hits.size()) << w;
        for (size_t i = 0; i < want.hits.size(); i++) {
            ASSERT_EQ(got.labels[i], label_of(want.hits[i].id)) << w << " hit " << i;
            ASSERT_EQ(got.distances[i], want.hits[i].dist) << w << " hit " << i;
        }
    };
    for (uint32_t r = 0; r <= 3; r++) {
        mirror.range_batch(words_of(q), &r, 1, got);
        same(range_search_batch(engine, q, {r}, 2), what + " r=" + std::to_string(r));
    }
    mirror.knn_batch(words_of(q), 7, got);
    same(knn_search_batch(engine, q, 7, 2), what + " k=7");
    EXPECT_EQ(mirror.entries(), engine.live()) << what;
    EXPECT_EQ(mirror.objects(), engine.size()) << what;
}

// Inserts (the engine's rule) and removals of objects held before them
// (centres and pivots among them). An object both appended and removed
// between two states makes the mirror load afresh (RefusesStates...).
void change(MetricIndex& engine, const std::vector<Word>& extra, uint64_t seed)
{
    std::mt19937_64 gen(seed);
    const size_t held = engine.size();
    for (size_t i = 0; i < extra.size(); i++) {
        engine.insert(view(extra[i]));
        if (i % 7 == 3)
            engine.remove(uint32_t(gen() % held));
    }
    for (uint32_t id = 0; id < 12 && id < held; id += 5)
        engine.remove(id);
}

struct Devices {
    std::unique_ptr<DeviceSet> set;
    explicit Devices(size_t n)
    {
        std::vector<std::unique_ptr<ComputeDevice>> devs;
        std::vector<uint32_t> ordinals;
        for (size_t i = 0; i < n; i++) {
            devs.push_back(make_cpu_emulation_device());
            ordinals.push_back(uint32_t(i));
        }
        set = std::make_unique<DeviceSet>(std::move(devs), ordinals);
    }
};

// Words to index, queries near them and words to insert later.
struct Data {
    std::vector<Word> words, queries, extra;
    Data(uint64_t seed, const std::vector<uint32_t>& alphabet, size_t n, size_t nq, size_t nextra)
        : words(metricwords::make_words(n, seed, alphabet)),
          queries(metricwords::make_queries(words, nq, seed + 1, alphabet)),
          extra(metricwords::make_words(nextra, seed + 2, alphabet))
    {
    }
};

template <class Index>
void catch_up_rounds(Index& engine, DeviceSet& set, size_t parts, const std::vector<Word>& queries,
                     const std::vector<Word>& extra, uint64_t seed, const std::string& what)
{
    std::vector<size_t> on(parts);
    for (size_t j = 0; j < parts; j++)
        on[j] = j;
    PlacedMetricMirror mirror(set, on, SpecStore(engine).spec);
    expect_answers(mirror, engine, queries, what + " loaded");
    // Three rounds of changes, each caught up from the last.
    for (int round = 0; round < 3; round++) {
        const size_t per = extra.size() / 3;
        const std::vector<Word> some(extra.begin() + long(per * size_t(round)),
                                     extra.begin() + long(per * size_t(round + 1)));
        change(engine, some, seed + uint64_t(round));
        const SpecStore newer(engine);
        ASSERT_TRUE(mirror.catch_up(newer.spec)) << what << " round " << round;
        expect_answers(mirror, engine, queries, what + " round " + std::to_string(round));
    }
    // Nothing changed: caught up at once.
    EXPECT_TRUE(mirror.catch_up(SpecStore(engine).spec)) << what;
}

}  // namespace

TEST(MetricCatchUp, ListOfClustersAndSssEqualTheEngineOverDevices)
{
    const uint64_t seed = test_seed(981);
    const Data d(seed, metricwords::spanish_alphabet(), 700, 40, 240);
    const auto& words = d.words;
    const auto& queries = d.queries;
    const auto& extra = d.extra;
    Devices devices(3);
    for (size_t parts : {1, 2, 3}) {
        for (size_t bucket : {4, 32}) {
            const std::string what = "seed=" + std::to_string(seed) + " parts=" + std::to_string(parts) +
                                     " lc bucket=" + std::to_string(bucket);
            SCOPED_TRACE(what);
            ListOfClusters lc(to_list(words), bucket);
            catch_up_rounds(lc, *devices.set, parts, queries, extra, seed + 3, what);
            // Inserts past every cluster open new ones, each by its centre.
            ListOfClusters small(to_list(std::vector<Word>(words.begin(), words.begin() + 10)), bucket);
            catch_up_rounds(small, *devices.set, parts, queries, extra, seed + 4, what + " from 10 words");
        }
        const std::string what = "seed=" + std::to_string(seed) + " parts=" + std::to_string(parts) + " sss";
        SCOPED_TRACE(what);
        SparseSpatialSelection sss(to_list(words), 0.5);
        catch_up_rounds(sss, *devices.set, parts, queries, extra, seed + 5, what);
    }
}

TEST(MetricCatchUp, RefusesStatesThatDoNotExtendTheMirror)
{
    const Data d(test_seed(982), metricwords::ascii_alphabet(), 300, 20, 60);
    const auto& words = d.words;
    const auto& queries = d.queries;
    const auto& extra = d.extra;
    const auto device = make_cpu_emulation_device();

    ListOfClusters lc(to_list(words), 8);
    lc.remove(3);
    const SpecStore before(lc);
    auto mirror = device->create_metric_mirror(before.spec);
    for (const Word& w : extra)
        lc.insert(view(w));
    lc.remove(20);
    // Each refusal leaves the mirror as it was (its answers: the state before).
    ListOfClusters as_before(to_list(words), 8);
    as_before.remove(3);
    auto refused = [&](const MetricSpec& spec, const std::string& what) {
        EXPECT_FALSE(mirror->catch_up(spec)) << what;
        expect_answers(*mirror, as_before, queries, what);
    };
    {
        SpecStore s(lc);
        s.labels[5] = -1;  // another object at position 5
        refused(s.spec, "other labels");
    }
    {
        SpecStore s(lc);
        s.removed[3] = 0;  // a removed object back
        refused(s.spec, "an object no longer removed");
    }
    {
        SpecStore s(lc);
        s.removed[words.size() + 2] = 1;  // appended and removed in between
        refused(s.spec, "an appended object removed");
    }
    {
        SpecStore s(as_before);
        s.spec.words.n = words.size() - 1;
        refused(s.spec, "fewer objects");
    }
    {
        SpecStore s(lc);
        s.radii[0] += 1;  // an early cluster's radius grown
        refused(s.spec, "a radius no insert makes");
    }
    {
        SpecStore s(lc);
        s.spec.method = MetricMethod::SparseSpatialSelection;
        refused(s.spec, "another method");
    }
    // And the state that does extend it.
    EXPECT_TRUE(mirror->catch_up(SpecStore(lc).spec));
    expect_answers(*mirror, lc, queries, "caught up");

    SparseSpatialSelection sss(to_list(words), 0.5);
    auto sm = device->create_metric_mirror(SpecStore(sss).spec);
    SparseSpatialSelection other(to_list(words), 0.3);
    ASSERT_NE(other.pivots(), sss.pivots());
    EXPECT_FALSE(sm->catch_up(SpecStore(other).spec)) << "other pivots";
}

TEST(MetricCatchUp, StoreBringsAnEarlierChangeUpToDate)
{
    const uint64_t seed = test_seed(983);
    const Data d(seed, metricwords::spanish_alphabet(), 400, 20, 90);
    const auto& words = d.words;
    const auto& queries = d.queries;
    const auto& extra = d.extra;
    Devices devices(2);
    MirrorStore store(*devices.set);
    ListOfClusters lc(to_list(words), 16);
    MirrorKey k1;
    k1.db = 5;
    k1.index = 77;
    k1.relnode = 78;
    k1.build = 1;
    k1.change = 10;
    bool updated = true;
    PlacedMetricMirror* first = store.load_metric(k1, SpecStore(lc).spec, &updated);
    EXPECT_FALSE(updated);

    change(lc, extra, seed + 3);
    MirrorKey k2 = k1;
    k2.change = 14;
    PlacedMetricMirror* second = store.load_metric(k2, SpecStore(lc).spec, &updated);
    EXPECT_TRUE(updated);
    EXPECT_EQ(second, first) << "the same mirror, brought up to date";
    EXPECT_EQ(store.find_metric(k1), nullptr);
    ASSERT_EQ(store.find_metric(k2), second);
    expect_answers(*second, lc, queries, "after the store's catch-up");

    // Another build of the index (REINDEX) is loaded afresh, the old one dropped.
    ListOfClusters rebuilt(to_list(words), 16);
    MirrorKey k3 = k2;
    k3.build = 2;
    k3.change = 15;
    PlacedMetricMirror* third = store.load_metric(k3, SpecStore(rebuilt).spec, &updated);
    EXPECT_FALSE(updated);
    EXPECT_EQ(store.find_metric(k2), nullptr);
    expect_answers(*third, rebuilt, queries, "a new build");

    // A state that does not extend the mirror (an object un-removed): afresh.
    SpecStore odd(rebuilt);
    MirrorKey k4 = k3;
    k4.change = 16;
    rebuilt.remove(2);
    PlacedMetricMirror* fourth = store.load_metric(k4, SpecStore(rebuilt).spec, &updated);
    EXPECT_TRUE(updated);
    MirrorKey k5 = k4;
    k5.change = 17;
    store.load_metric(k5, odd.spec, &updated);
    EXPECT_FALSE(updated);
    EXPECT_EQ(store.find_metric(k4), nullptr);
    (void)fourth;
}
