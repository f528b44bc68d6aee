// gpu_metric mirrors served by the GPU process (Op::MetricLoad and
// Op::MetricSearch over the channel, the CPU emulation behind it): the
// answers equal the engine's for List of Clusters and SSS, range and k-NN,
// on one device and spread over several; a range answer larger than the
// room the client guessed comes back whole; a mirror is of one change count
// (another is not found, a newer one replaces it) and the status lists it
// with its kind; bad requests are refused and the process serves on.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/error.h"
#include "engine/metric/lc_index.h"
#include "engine/metric/metric_index.h"
#include "engine/metric/sss_index.h"
#include "gpu_process_channel.h"
#include "metric_spec.h"
#include "metric_words.h"
#include "gpu_process/device_set.h"
#include "test_util.h"

namespace gpuivfpq {
namespace gpuproc {
namespace {

using metricspec::label_of;
using metricspec::SpecStore;
using metricwords::to_list;
using metricwords::Word;

MetricWords words_of(const WordList& list) { return MetricWords{list.size(), list.code_points(), list.offsets()}; }

// A process serving `devices` emulated devices.
Channel::Server emulated_devices(int devices)
{
    return [devices](ServerEnd& end) {
        std::vector<std::unique_ptr<ComputeDevice>> devs;
        std::vector<uint32_t> ordinals;
        for (int i = 0; i < devices; i++) {
            devs.push_back(make_cpu_emulation_device());
            ordinals.push_back(uint32_t(i));
        }
        DeviceSet set(std::move(devs), ordinals);
        announce(end.sock, set, Kind::Emulated);
        return serve(end.sock, end.exchange, set);
    };
}

void expect_same(const MetricHits& got, const MetricBatchResult& want, const std::string& what)
{
    ASSERT_EQ(got.offsets, want.offsets) << what;
    ASSERT_EQ(got.ids.size(), want.hits.size()) << what;
    for (size_t i = 0; i < want.hits.size(); i++) {
        ASSERT_EQ(got.ids[i], want.hits[i].id) << what << " hit " << i;
        ASSERT_EQ(got.distances[i], want.hits[i].dist) << what << " hit " << i;
        ASSERT_EQ(got.labels[i], label_of(want.hits[i].id)) << what << " hit " << i;
    }
    // The distance evaluations come back through the channel, one a query
    // (the parts' counts added up: the engine's own on one device).
    ASSERT_EQ(got.evaluations.size(), want.stats.size()) << what;
    for (size_t q = 0; q < want.stats.size(); q++)
        if (want.stats[q].distance_evaluations > 0)
            EXPECT_GT(got.evaluations[q], 0u) << what << " query " << q;
}

// Range searches at radii 0..3, per-query radii, everything (larger than the
// client's first guess) and k-NN through the channel, against the engine.
void expect_served(GpuProcess& gp, const MirrorKey& key, const MetricIndex& engine, const std::vector<Word>& queries,
                   const std::string& what)
{
    const WordList q = to_list(queries);
    MetricHits got;
    size_t live = 0;
    for (uint32_t r = 0; r <= 3; r++) {
        ASSERT_TRUE(gp.metric_search(key, words_of(q), 0, &r, 1, got, &live)) << what;
        expect_same(got, range_search_batch(engine, q, {r}, 2), what + " r=" + std::to_string(r));
        EXPECT_EQ(live, engine.live());
    }
    std::vector<uint32_t> radii(queries.size());
    for (size_t i = 0; i < radii.size(); i++)
        radii[i] = uint32_t(i % 5);
    ASSERT_TRUE(gp.metric_search(key, words_of(q), 0, radii.data(), radii.size(), got));
    expect_same(got, range_search_batch(engine, q, radii, 2), what + " radii 0..4");
    const uint32_t all = 1000;
    ASSERT_TRUE(gp.metric_search(key, words_of(q), 0, &all, 1, got));
    EXPECT_EQ(got.ids.size(), engine.live() * queries.size()) << what;
    expect_same(got, range_search_batch(engine, q, {all}, 2), what + " every object");
    for (size_t k : {1, 5, 20}) {
        ASSERT_TRUE(gp.metric_search(key, words_of(q), k, nullptr, 0, got)) << what;
        expect_same(got, knn_search_batch(engine, q, k, 2), what + " k=" + std::to_string(k));
    }
}

void serve_both_methods(GpuProcess& gp, const std::string& name)
{
    const uint64_t seed = testutil::test_seed(977);
    const auto words = metricwords::make_words(600, seed, metricwords::spanish_alphabet());
    const auto queries = metricwords::make_queries(words, 40, seed + 1, metricwords::spanish_alphabet());
    const std::string what = name + " seed=" + std::to_string(seed);

    ListOfClusters lc(to_list(words), 8);
    for (uint32_t id = 0; id < lc.size(); id += 7)
        lc.remove(id);
    const SpecStore lc_state(lc);
    MirrorKey lc_key{1, 70, 170, 3};
    lc_key.change = 41;
    EXPECT_EQ(gp.metric_load(lc_key, lc_state.spec), lc.live());
    expect_served(gp, lc_key, lc, queries, what + " lc");

    SparseSpatialSelection sss(to_list(words), 0.5);
    for (uint32_t id = 3; id < sss.size(); id += 11)
        sss.remove(id);
    const SpecStore sss_state(sss);
    MirrorKey sss_key{1, 71, 171, 4};
    sss_key.change = 9;
    EXPECT_EQ(gp.metric_load(sss_key, sss_state.spec), sss.live());
    expect_served(gp, sss_key, sss, queries, what + " sss");

    // Another change count of the index is another version: not found; a
    // newer one loaded replaces the older.
    MetricHits got;
    const WordList q = to_list(queries);
    const uint32_t r = 2;
    MirrorKey newer = lc_key;
    newer.change = 42;
    EXPECT_FALSE(gp.metric_search(newer, words_of(q), 0, &r, 1, got));
    lc.remove(1);
    lc.remove(2);
    const SpecStore newer_state(lc);
    EXPECT_EQ(gp.metric_load(newer, newer_state.spec), lc.live());
    EXPECT_FALSE(gp.metric_search(lc_key, words_of(q), 0, &r, 1, got));
    expect_served(gp, newer, lc, queries, what + " lc newer");

    StoreStatus st = gp.status();
    ASSERT_EQ(st.mirrors.size(), 2u);
    for (const MirrorInfo& info : st.mirrors) {
        EXPECT_EQ(info.kind, uint32_t(MirrorKind::Metric));
        EXPECT_GT(info.bytes, 0u);
        EXPECT_NE(info.device_mask, 0u);
        if (info.key == newer)
            EXPECT_EQ(info.entries, lc.live());
        else
            EXPECT_TRUE(info.key == sss_key);
    }
    EXPECT_GT(st.bytes, 0u);
    EXPECT_EQ(gp.drop_index(1, 71), 1u);
    EXPECT_FALSE(gp.metric_search(sss_key, words_of(q), 0, &r, 1, got));
}

TEST(MetricService, OneDeviceAnswersAsTheEngine)
{
    Channel ch(emulated_server);
    auto gp = ch.connect();
    serve_both_methods(*gp, "one device");
}

TEST(MetricService, SeveralDevicesAnswerAsTheEngine)
{
    Channel ch(emulated_devices(3));
    auto gp = ch.connect();
    serve_both_methods(*gp, "three devices");
    std::vector<DeviceInfo> devs = gp->devices();
    ASSERT_EQ(devs.size(), 3u);
}

// A state that is no index, and queries whose offsets leave their code
// points, are refused with InvalidArgument; the process serves on.
TEST(MetricService, RefusesBadRequests)
{
    Channel ch(emulated_server);
    auto gp = ch.connect();
    const auto words = metricwords::make_words(100, 5, metricwords::ascii_alphabet());
    ListOfClusters lc(to_list(words), 4);
    SpecStore state(lc);
    const MirrorKey key{2, 80, 180, 1};

    state.cluster_of[0] = uint32_t(lc.clusters() + 5);  // no such cluster
    try {
        gp->metric_load(key, state.spec);
        FAIL() << "a broken state was loaded";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument) << e.what();
    }
    EXPECT_TRUE(gp->alive());
    const SpecStore good(lc);
    gp->metric_load(key, good.spec);

    const std::vector<uint32_t> cps = {'a', 'b'};
    const std::vector<uint64_t> offsets = {0, 2, 1};  // decreasing
    MetricHits got;
    const uint32_t r = 1;
    try {
        (void)gp->metric_search(key, MetricWords{2, cps.data(), offsets.data()}, 0, &r, 1, got);
        FAIL() << "decreasing offsets were searched";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument) << e.what();
    }
    const uint32_t two[2] = {1, 2};
    try {
        // Two radii for one query: range_batch refuses them.
        const std::vector<uint64_t> one = {0, 2};
        (void)gp->metric_search(key, MetricWords{1, cps.data(), one.data()}, 0, two, 2, got);
        FAIL() << "two radii for one query were accepted";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument) << e.what();
    }
    const std::vector<uint64_t> one = {0, 2};
    EXPECT_TRUE(gp->metric_search(key, MetricWords{1, cps.data(), one.data()}, 3, nullptr, 0, got));
    EXPECT_EQ(got.ids.size(), 3u);
}

}  // namespace
}  // namespace gpuproc
}  // namespace gpuivfpq
