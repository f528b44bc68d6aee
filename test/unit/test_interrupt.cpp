// The host's interrupt poll (interrupt.h) stops the engine's loops:
// List of Clusters and SSS builds on several threads, their searches and
// inserts, brute force and batches throw Interrupted soon after the poll
// says so, on every thread, and leave an index as it was.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/error.h"
#include "engine/interrupt.h"
#include "engine/ivfpq.h"
#include "engine/topk.h"
#include "engine/metric/lc_index.h"
#include "engine/metric/metric_index.h"
#include "engine/metric/sss_index.h"
#include "metric_words.h"

using namespace gpuivfpq;
using metricwords::Word;

namespace {

// The test's poll: says stop from the poll numbered g_stop_at on (counting
// from 1), and counts every call, whatever the thread.
std::atomic<uint64_t> g_polls{0};
std::atomic<uint64_t> g_stop_at{0};

bool test_poll() { return g_polls.fetch_add(1) + 1 >= g_stop_at.load(); }

// Installs test_poll while alive, stopping from poll stop_at on (0: never);
// restores the previous poll after.
class PollScope {
public:
    explicit PollScope(uint64_t stop_at)
    {
        g_polls = 0;
        g_stop_at = stop_at == 0 ? UINT64_MAX : stop_at;
        previous_ = set_interrupt_poll(test_poll);
    }
    ~PollScope() { set_interrupt_poll(previous_); }
    PollScope(const PollScope&) = delete;
    PollScope& operator=(const PollScope&) = delete;

private:
    InterruptPoll previous_;
};

// Words enough for builds and searches that poll many times.
const std::vector<Word>& words()
{
    static const std::vector<Word> w = metricwords::make_words(2000, 77, metricwords::spanish_alphabet());
    return w;
}

// Runs fn with a poll that says stop at its stop_at-th call: fn must throw
// Interrupted, and the threads, each stopping at its next poll, must make
// at most `threads` polls beyond it (none keeps on working).
void expect_interrupted(const std::function<void()>& fn, uint64_t stop_at, int threads)
{
    PollScope scope(stop_at);
    EXPECT_THROW(fn(), Interrupted);
    EXPECT_GE(g_polls.load(), stop_at);
    EXPECT_LE(g_polls.load(), stop_at + uint64_t(threads)) << "a thread kept on working after the stop";
}

}  // namespace

TEST(Interrupt, NoPollNeverStops)
{
    EXPECT_EQ(set_interrupt_poll(nullptr), nullptr);
    EXPECT_NO_THROW(check_interrupt());
    const ListOfClusters lc(metricwords::to_list(words()), 8, 2);
    EXPECT_EQ(lc.size(), words().size());
}

TEST(Interrupt, PollThatNeverStopsChangesNothing)
{
    const WordList list = metricwords::to_list(words());
    const ListOfClusters plain(list, 8, 2);
    const SparseSpatialSelection plain_sss(list, 0.5, 2);
    PollScope scope(0);
    const ListOfClusters polled(list, 8, 2);
    const SparseSpatialSelection polled_sss(list, 0.5, 2);
    EXPECT_GT(g_polls.load(), 100u);
    EXPECT_EQ(polled.cluster_assignment(), plain.cluster_assignment());
    ASSERT_EQ(polled_sss.pivots(), plain_sss.pivots());
    const size_t bytes = plain_sss.size() * plain_sss.pivots();
    EXPECT_EQ(std::vector<uint8_t>(polled_sss.table(), polled_sss.table() + bytes),
              std::vector<uint8_t>(plain_sss.table(), plain_sss.table() + bytes));
    const Word& q = words()[17];
    const auto a = plain.knn(metricwords::view(q), 10), b = polled.knn(metricwords::view(q), 10);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); i++)
        EXPECT_EQ(a[i].id, b[i].id);
}

// The builds stop in their parallel passes, on every thread: the poll stops
// early (the 100th poll) and late (the 2000th, well into the build).
TEST(Interrupt, BuildsStopOnEveryThread)
{
    const WordList list = metricwords::to_list(words());
    for (int threads : {1, 3}) {
        for (uint64_t stop_at : {uint64_t(100), uint64_t(2000)}) {
            SCOPED_TRACE(testing::Message() << "threads=" << threads << " stop_at=" << stop_at);
            expect_interrupted([&] { ListOfClusters lc(list, 4, threads); }, stop_at, threads);
            expect_interrupted([&] { SparseSpatialSelection sss(list, 0.5, threads); }, stop_at, threads);
        }
    }
}

TEST(Interrupt, SearchesStop)
{
    const WordList list = metricwords::to_list(words());
    const ListOfClusters lc(list, 16, 2);
    const SparseSpatialSelection sss(list, 0.5, 2);
    const BruteForceIndex brute(list);
    const Word& q = words()[5];
    const std::vector<const MetricIndex*> indexes = {&lc, &sss, &brute};
    for (const MetricIndex* index : indexes) {
        // A radius that holds every word: every object's distance is computed.
        expect_interrupted([&] { index->range(metricwords::view(q), 1000); }, 50, 1);
        expect_interrupted([&] { index->knn(metricwords::view(q), 5000); }, 50, 1);
        WordList queries;
        for (size_t i = 0; i < 8; i++)
            queries.push_back(metricwords::view(words()[i * 31]));
        expect_interrupted([&] { range_search_batch(*index, queries, {1000}, 4); }, 100, 4);
        expect_interrupted([&] { knn_search_batch(*index, queries, 5000, 4); }, 100, 4);
    }
}

// An insert stopped while it computes its distances adds nothing.
TEST(Interrupt, InsertsStopAndAddNothing)
{
    const WordList list = metricwords::to_list(words());
    ListOfClusters lc(list, 2, 2);  // many clusters: the placement polls
    SparseSpatialSelection sss(list, 0.3, 2);
    ASSERT_GT(sss.pivots(), kInterruptStride);  // the pivot distances poll
    const Word w(40, 'x');  // a symbol no word has
    const size_t clusters = lc.clusters();
    expect_interrupted([&] { lc.insert(metricwords::view(w)); }, 2, 1);
    EXPECT_EQ(lc.size(), list.size());
    EXPECT_EQ(lc.clusters(), clusters);
    expect_interrupted([&] { sss.insert(metricwords::view(w)); }, 2, 1);
    EXPECT_EQ(sss.size(), list.size());
    // Without the stop, the same inserts go in.
    EXPECT_EQ(lc.insert(metricwords::view(w)), list.size());
    EXPECT_EQ(sss.insert(metricwords::view(w)), list.size());
}

// The IVF-PQ engine's long loops poll too: training (k-means of the coarse
// quantizer and of each sub-quantizer, on several threads), encoding and
// brute force stop soon after the poll says so.
namespace {

std::vector<float> ivf_points(size_t n, size_t d)
{
    std::vector<float> x(n * d);
    uint64_t s = 12345;
    for (float& v : x) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        v = float((s >> 40) % 1000) / 1000.0f;
    }
    return x;
}

}  // namespace

TEST(Interrupt, IvfPqTrainingEncodingAndBruteForceStop)
{
    const size_t n = 4000, d = 32, lists = 16, m = 8;
    const std::vector<float> x = ivf_points(n, d);
    IvfPqTrainParams params;
    params.threads = 2;
    for (uint64_t stop_at : {1, 5}) {
        SCOPED_TRACE(stop_at);
        expect_interrupted(
            [&] {
                IvfPqModel model(d, lists, m, Metric::L2);
                model.train(x.data(), n, params);
            },
            stop_at, params.threads);
    }

    IvfPqModel model(d, lists, m, Metric::L2);
    {
        PollScope never(0);
        model.train(x.data(), n, params);
    }
    std::vector<int32_t> ids(n);
    std::vector<uint8_t> codes(n * m);
    expect_interrupted([&] { model.encode(x.data(), n, ids.data(), codes.data(), nullptr, 2); }, 1, 2);

    std::vector<float> dist(10);
    std::vector<int64_t> labels(10);
    expect_interrupted(
        [&] { brute_force_knn(x.data(), 1, x.data(), n, d, Metric::L2, 10, dist.data(), labels.data()); }, 1,
        1);
}
