// The direct path's segment (gpu_process/query_queue.h) and the GPU
// process's server of it (query_server.h), over the CPU emulation: the
// slots' state machine, the answers a dead GPU process leaves, the checks
// backends apply to what they read, and searches served through the queue
// as the mirror itself answers them, held until the change log is applied.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <shared_mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "engine/error.h"
#include "engine/metric/lc_index.h"
#include "gpu_process/device_set.h"
#include "gpu_process/gpu_process_server.h"
#include "gpu_process/mirror_store.h"
#include "gpu_process/query_queue.h"
#include "gpu_process/query_server.h"
#include "gpu_process/reply_checks.h"
#include "metric_spec.h"
#include "metric_words.h"
#include "mirror_fixture.h"

using namespace gpuivfpq;
using gpuivfpq::queue::Queue;
using Fixture = testutil::EncodedSet;

namespace {

// A segment in process memory (the real one is a shared memory object).
struct Segment {
    std::vector<uint64_t> mem;
    Queue q;
    explicit Segment(uint32_t nslots) : mem(Queue::bytes_for(nslots) / 8 + 1)
    {
        q = Queue::create(mem.data(), Queue::bytes_for(nslots), nslots, 7);
    }
};

void fill(const Queue& q, uint32_t i, const MirrorKey& key, const float* query, uint32_t d, uint32_t k,
          uint32_t nprobe, uint64_t log_pos = 0)
{
    queue::Slot& s = q.slot(i);
    s.req = queue::SearchRequest();
    s.req.d = d;
    s.req.k = k;
    s.req.nprobe = nprobe;
    s.req.key = key;
    s.req.log_pos = log_pos;
    std::memcpy(s.payload, query, d * sizeof(float));
}

// The fixture's entries (with their vectors) as the mirror of key; hidden:
// loaded hidden, as the service loads one it still has to catch up.
Mirror* load_fixture(MirrorStore& store, const Fixture& f, const MirrorKey& key, bool hidden = false)
{
    return store.load(key, f.spec(true), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), f.x.data(),
                      nullptr, Placement::Auto, hidden);
}

}  // namespace

TEST(QueryQueue, AttachChecksTheLayout)
{
    Segment seg(4);
    ASSERT_TRUE(seg.q.ok());
    EXPECT_TRUE(Queue::attach(seg.mem.data(), Queue::bytes_for(4)).ok());
    // Another size than the creator's, or another version: refused.
    EXPECT_FALSE(Queue::attach(seg.mem.data(), Queue::bytes_for(4) + 64).ok());
    seg.q.header().version = queue::kVersion + 1;
    EXPECT_FALSE(Queue::attach(seg.mem.data(), Queue::bytes_for(4)).ok());
    EXPECT_FALSE(Queue::attach(nullptr, 100).ok());
}

TEST(QueryQueue, SlotStates)
{
    Segment seg(3);
    const Queue& q = seg.q;
    q.submit(1);
    EXPECT_EQ(q.state(1).load(), uint32_t(queue::Pending));
    EXPECT_FALSE(q.wait_done(1, 1));

    std::vector<uint32_t> taken;
    EXPECT_EQ(q.take(taken, 8), 1u);
    ASSERT_EQ(taken, std::vector<uint32_t>{1});
    EXPECT_EQ(q.state(1).load(), uint32_t(queue::Running));
    EXPECT_EQ(q.take(taken, 8), 0u);  // taken once only

    q.complete(1);
    EXPECT_TRUE(q.wait_done(1, 1));
    q.release(1);
    EXPECT_EQ(q.state(1).load(), uint32_t(queue::Free));
}

// A cancel: a search not yet taken is the owner's again at once; a taken one
// stays the GPU process's until it completes it (it may still write there).
TEST(QueryQueue, AbandonedSlotsAreFreedByWhoeverHoldsThem)
{
    Segment seg(2);
    const Queue& q = seg.q;
    q.submit(0);
    EXPECT_TRUE(q.abandon(0));
    EXPECT_EQ(q.state(0).load(), uint32_t(queue::Free));

    q.submit(1);
    std::vector<uint32_t> taken;
    ASSERT_EQ(q.take(taken, 8), 1u);
    EXPECT_TRUE(q.abandon(1));
    EXPECT_EQ(q.state(1).load(), uint32_t(queue::Abandoned));
    taken.clear();
    EXPECT_EQ(q.take(taken, 8), 0u);  // not taken, not freed by a take
    EXPECT_EQ(q.state(1).load(), uint32_t(queue::Abandoned));
    q.complete(1);
    EXPECT_EQ(q.state(1).load(), uint32_t(queue::Free));

    // Answered before the cancel: the owner releases it.
    q.submit(0);
    taken.clear();
    ASSERT_EQ(q.take(taken, 8), 1u);
    q.complete(0);
    EXPECT_FALSE(q.abandon(0));
    q.release(0);
    EXPECT_EQ(q.state(0).load(), uint32_t(queue::Free));
}

// The GPU process died: whatever was queued or taken is answered Gone, an
// abandoned slot is freed, and the stall clock says who owes progress.
TEST(QueryQueue, FailAllAnswersWhatADeadProcessLeft)
{
    Segment seg(4);
    const Queue& q = seg.q;
    EXPECT_EQ(q.stalled_since_ns(), 0u);
    q.submit(0);
    q.submit(1);
    q.submit(2);
    EXPECT_NE(q.stalled_since_ns(), 0u);  // pending, not taken
    std::vector<uint32_t> taken;
    ASSERT_EQ(q.take(taken, 2), 2u);  // 0 and 1 taken, 2 still pending
    ASSERT_TRUE(q.abandon(1));
    // A process killed mid-batch leaves its clock running, and one that
    // misbehaved wrote over the header: the slot count is never read from
    // it again, and fail_all writes the identity back.
    q.header().busy_since_ns[1].store(queue::now_ns() - 10000000000ull);
    q.header().nslots = 0xFFFFFFFFu;
    q.header().magic = 0;
    q.header().gpu_waiting.store(3);
    EXPECT_EQ(q.slots(), 4u);
    EXPECT_NE(q.stalled_since_ns(), 0u);
    EXPECT_EQ(q.fail_all("gone"), 2u);
    EXPECT_EQ(q.header().nslots, 4u);
    EXPECT_EQ(q.header().magic, queue::kMagic);
    EXPECT_EQ(q.header().gpu_waiting.load(), 0u);
    for (uint32_t i : {0u, 2u}) {
        EXPECT_TRUE(q.wait_done(i, 1));
        EXPECT_EQ(q.slot(i).ans.result, int32_t(queue::Result::Gone));
        EXPECT_STREQ(q.slot(i).ans.error, "gone");
    }
    EXPECT_EQ(q.state(1).load(), uint32_t(queue::Free));
    EXPECT_EQ(q.state(3).load(), uint32_t(queue::Free));
    EXPECT_EQ(q.stalled_since_ns(), 0u);  // taken searches held for the log do not count
}

// What a backend accepts from the segment: a GPU process writing garbage
// there gets its answer refused, never used to index anything.
TEST(QueryQueue, MalformedAnswersAreRefused)
{
    queue::SearchRequest req;
    req.k = 4;
    req.d = 8;
    int64_t labels[4] = {1, 2, -1, -1};
    double dists[4] = {0.5, 0.5, 0.0, 0.0};
    int64_t scratch[4];
    queue::SearchAnswer ok;
    ok.n = 2;
    ok.batch = 3;
    EXPECT_TRUE(queue::answer_sound(req, ok, labels, nullptr, scratch, 16));

    auto refused = [&](auto change, const int64_t* l = nullptr, const double* d = nullptr) {
        queue::SearchAnswer a = ok;
        change(a);
        return !queue::answer_sound(req, a, l != nullptr ? l : labels, d != nullptr ? d : dists, scratch, 16);
    };
    EXPECT_TRUE(refused([](queue::SearchAnswer& a) { a.result = 17; }));
    EXPECT_TRUE(refused([](queue::SearchAnswer& a) { a.result = -1; }));
    EXPECT_TRUE(refused([](queue::SearchAnswer& a) { a.n = 5; }));
    EXPECT_TRUE(refused([](queue::SearchAnswer& a) { a.exact = 3; }));  // no kind of distances
    EXPECT_FALSE(refused([](queue::SearchAnswer& a) { a.exact = GPU_IVFPQ_DISTS_LOWER; }));
    EXPECT_TRUE(refused([](queue::SearchAnswer& a) { a.batch = 0; }));
    EXPECT_TRUE(refused([](queue::SearchAnswer& a) { a.batch = 17; }));
    EXPECT_TRUE(refused([](queue::SearchAnswer& a) { a.matched = 3; }));  // not a filtered search
    EXPECT_TRUE(refused([](queue::SearchAnswer& a) { std::memset(a.error, 'x', sizeof(a.error)); }));
    const int64_t not_tids[4] = {1, 65536, -1, -1};  // offset 0 is no heap TID
    EXPECT_TRUE(refused([](queue::SearchAnswer&) {}, not_tids));
    const int64_t negative[4] = {1, -7, -1, -1};
    EXPECT_TRUE(refused([](queue::SearchAnswer&) {}, negative));
    // A -1 among the n rows (it would read as block 0xFFFFFFFF), a row twice.
    const int64_t padding_inside[4] = {-1, 2, -1, -1};
    EXPECT_TRUE(refused([](queue::SearchAnswer&) {}, padding_inside));
    const int64_t twice[4] = {2, 2, -1, -1};
    EXPECT_TRUE(refused([](queue::SearchAnswer&) {}, twice));
    // Distances: ascending, NaN only after every number (a cosine distance
    // to a zero vector ranks last), where the answer has them.
    const double descending[4] = {0.7, 0.5, 0.0, 0.0};
    const double nan_first[4] = {std::nan(""), 0.5, 0.0, 0.0};
    const double nan_last[4] = {0.5, std::nan(""), 0.0, 0.0};
    EXPECT_FALSE(refused([](queue::SearchAnswer& a) { a.exact = GPU_IVFPQ_DISTS_EXACT; }, labels, nan_last));
    for (uint32_t kind : {uint32_t(GPU_IVFPQ_DISTS_EXACT), uint32_t(GPU_IVFPQ_DISTS_LOWER)}) {
        EXPECT_TRUE(refused([kind](queue::SearchAnswer& a) { a.exact = kind; }, labels, descending));
        EXPECT_TRUE(refused([kind](queue::SearchAnswer& a) { a.exact = kind; }, labels, nan_first));
        EXPECT_FALSE(refused([kind](queue::SearchAnswer& a) { a.exact = kind; }));
    }
    EXPECT_FALSE(refused([](queue::SearchAnswer&) {}, labels, descending));  // labels only: not read
    // Distances announced but not given.
    queue::SearchAnswer lower = ok;
    lower.exact = GPU_IVFPQ_DISTS_EXACT;
    EXPECT_FALSE(queue::answer_sound(req, lower, labels, nullptr, scratch, 16));
    // Errors pass (their text is shown, terminated), whatever the rest says.
    EXPECT_FALSE(refused([](queue::SearchAnswer& a) {
        a.result = int32_t(queue::Result::Error);
        a.n = 99;
    }));
}

// A row twice anywhere among an answer's rows is refused, both below the
// small set's limit (one pass through a set on the stack) and above it
// (sorted), also when every label lands on the same slots of the set.
TEST(QueryQueue, RepeatedRowsAreRefusedAtEverySize)
{
    namespace rc = gpuivfpq::replycheck;
    std::vector<int64_t> scratch(1000);
    auto tid = [](int64_t block, int64_t off) { return (block << 16) | off; };
    const size_t half = rc::kSmallRowSet / 2;
    for (size_t n : {size_t(1), size_t(2), size_t(100), half, half + 1, size_t(1000)}) {
        std::vector<int64_t> rows(n);
        for (size_t i = 0; i < n; i++)
            rows[i] = tid(int64_t(i * 7919 % 100003), int64_t(1 + i % 5));
        EXPECT_TRUE(rc::tid_rows_sound(rows.data(), n, scratch.data())) << n;
        if (n < 2)
            continue;
        for (size_t at : {size_t(1), n / 2, n - 1}) {
            std::vector<int64_t> bad = rows;
            bad[at] = bad[at - 1 - (at - 1) / 2];
            EXPECT_FALSE(rc::tid_rows_sound(bad.data(), n, scratch.data())) << n << " " << at;
        }
    }
    // As many distinct labels as the set takes, all with the same first
    // slot (the longest probe sequences), then one of them twice.
    std::vector<int64_t> same;
    for (int64_t b = 0; same.size() < rc::kSmallRowSet / 2; b++)
        if (rc::small_row_slot(tid(b, 1)) == 0)
            same.push_back(tid(b, 1));
    EXPECT_TRUE(rc::tid_rows_sound(same.data(), same.size(), scratch.data()));
    same.back() = same.front();
    EXPECT_FALSE(rc::tid_rows_sound(same.data(), same.size(), scratch.data()));
}

// A gpu_metric request in slot i: words, k-NN with k > 0 or a range search
// with radii (one, or one a word).
void fill_metric(const Queue& q, uint32_t i, const MirrorKey& key, const std::vector<metricwords::Word>& words,
                 uint32_t k, const std::vector<uint32_t>& radii)
{
    queue::Slot& s = q.slot(i);
    s.req = queue::SearchRequest();
    s.req.kind = uint32_t(queue::Kind::Metric);
    s.req.k = k;
    s.req.key = key;
    s.req.nq = uint32_t(words.size());
    s.req.nradii = uint32_t(radii.size());
    std::vector<uint32_t> cps;
    std::vector<uint64_t> offsets(1, 0);
    for (const auto& w : words) {
        cps.insert(cps.end(), w.begin(), w.end());
        offsets.push_back(cps.size());
    }
    s.req.ncps = cps.size();
    const MetricSearchLayout l = metric_search_layout(words.size(), cps.size(), radii.size());
    ASSERT_LE(l.hits, queue::kPayload);
    std::memcpy(s.payload + l.cps, cps.data(), cps.size() * sizeof(uint32_t));
    std::memcpy(s.payload + l.offsets, offsets.data(), offsets.size() * sizeof(uint64_t));
    std::memcpy(s.payload + l.radii, radii.data(), radii.size() * sizeof(uint32_t));
}

// The hits of a metric answer in slot i equal the engine's for its queries alone.
void expect_metric_answer(const Queue& q, uint32_t i, const MetricBatchResult& want, const std::string& what)
{
    const queue::Slot& s = q.slot(i);
    ASSERT_TRUE(queue::metric_answer_sound(s.ans, q.slots())) << what;
    ASSERT_EQ(s.ans.result, int32_t(queue::Result::Ok)) << what << ": " << s.ans.error;
    ASSERT_EQ(s.ans.needed, 0u) << what;
    const MetricSearchLayout l = metric_search_layout(s.req.nq, s.req.ncps, s.req.nradii);
    const uint64_t* offsets = reinterpret_cast<const uint64_t*>(s.payload + l.hit_offsets);
    const uint32_t* hits = reinterpret_cast<const uint32_t*>(s.payload + l.hits);
    ASSERT_EQ(std::vector<uint64_t>(offsets, offsets + s.req.nq + 1), want.offsets) << what;
    for (size_t h = 0; h < want.hits.size(); h++) {
        ASSERT_EQ(hits[2 * h], want.hits[h].id) << what << " hit " << h;
        ASSERT_EQ(hits[2 * h + 1], want.hits[h].dist) << what << " hit " << h;
    }
}

// Whether slot i is answered within ms (wait_done may return early: its
// futex also wakes at the slot's other changes).
static bool answered_within(const Queue& q, uint32_t i, int ms)
{
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (!q.wait_done(i, 100))
        if (std::chrono::steady_clock::now() > end)
            return false;
    return true;
}

// The QueryServer tests' setting: an encoded set and a mirror store over
// the CPU emulation (each test loads what it serves).
class QueryServer : public ::testing::Test {
protected:
    Fixture f;
    std::unique_ptr<ComputeDevice> dev = make_cpu_emulation_device();
    DeviceSet devices{*dev};
    MirrorStore store{devices};
};

// Searches through the queue get what the mirror itself answers; a search
// carrying a change-log position beyond what the service applied waits.
TEST_F(QueryServer, ServesAsTheMirrorAnswersAndWaitsForTheLog)
{
    const MirrorKey key{1, 10, 100, 1};
    ASSERT_NE(load_fixture(store, f, key), nullptr);
    Segment seg(8);
    gpuproc::DeviceLock lock;
    gpuproc::QueryServer server(seg.q, store, devices, lock, nullptr, 0);

    const uint32_t k = 10, nprobe = 4;
    for (uint32_t i = 0; i < 5; i++) {
        fill(seg.q, i, key, f.x.data() + i * 31 * f.d, uint32_t(f.d), k, nprobe, i == 4 ? 5 : 0);
        seg.q.submit(i);
    }
    EXPECT_TRUE(server.serve_once(0));
    for (uint32_t i = 0; i < 4; i++) {
        ASSERT_TRUE(seg.q.wait_done(i, 1)) << i;
        const queue::SearchAnswer& a = seg.q.slot(i).ans;
        ASSERT_EQ(a.result, int32_t(queue::Result::Ok)) << a.error;
        EXPECT_EQ(a.batch, 4u);
        EXPECT_EQ(a.exact, 1u);
        ASSERT_EQ(a.n, k);
        std::vector<int64_t> labels(k);
        std::vector<double> dist(k);
        Mirror* mirror = store.find(key);
        gpuproc::run_search(*mirror, f.x.data() + i * 31 * f.d, 1, f.d, k, nprobe, nullptr, nullptr, nullptr,
                            labels.data(), dist.data());
        const int64_t* got = reinterpret_cast<const int64_t*>(seg.q.slot(i).payload);
        const double* got_dist = reinterpret_cast<const double*>(seg.q.slot(i).payload + k * sizeof(int64_t));
        for (uint32_t j = 0; j < k; j++) {
            EXPECT_EQ(got[j], labels[j]);
            EXPECT_EQ(got_dist[j], dist[j]);
        }
        std::vector<int64_t> scratch(k);
        EXPECT_TRUE(queue::answer_sound(seg.q.slot(i).req, a, got, a.exact ? got_dist : nullptr, scratch.data(), 8));
        seg.q.release(i);
    }
    // The fifth waits for position 5 of the change log.
    EXPECT_EQ(seg.q.state(4).load(), uint32_t(queue::Running));
    EXPECT_FALSE(server.serve_once(0));
    EXPECT_FALSE(seg.q.wait_done(4, 1));
    seg.q.header().applied.store(5);
    EXPECT_TRUE(server.serve_once(0));
    ASSERT_TRUE(seg.q.wait_done(4, 1));
    EXPECT_EQ(seg.q.slot(4).ans.result, int32_t(queue::Result::Ok));
    EXPECT_EQ(seg.q.header().stats.queries.load(), 5u);
    EXPECT_EQ(seg.q.header().stats.batches.load(), 2u);
}

// No mirror: the first asker loads it, the others use the CPU meanwhile;
// malformed requests are answered with an error, never served.
TEST_F(QueryServer, NotLoadedOnceThenLoadingAndBadRequestsRefused)
{
    Segment seg(8);
    gpuproc::DeviceLock lock;
    gpuproc::QueryServer server(seg.q, store, devices, lock, nullptr, 0);
    const MirrorKey key{1, 11, 100, 1};
    for (uint32_t i = 0; i < 3; i++) {
        fill(seg.q, i, key, f.x.data(), uint32_t(f.d), 5, 2);
        seg.q.submit(i);
    }
    fill(seg.q, 3, key, f.x.data(), uint32_t(f.d), 0, 2);  // k 0
    seg.q.submit(3);
    fill(seg.q, 4, key, f.x.data(), uint32_t(f.d), 5, 2);
    seg.q.slot(4).req.d = 1u << 20;  // a dimension past the payload
    seg.q.submit(4);
    ASSERT_TRUE(server.serve_once(0));
    std::vector<int32_t> results;
    for (uint32_t i = 0; i < 5; i++) {
        ASSERT_TRUE(seg.q.wait_done(i, 1));
        results.push_back(seg.q.slot(i).ans.result);
    }
    EXPECT_EQ(results[0], int32_t(queue::Result::NotLoaded));
    EXPECT_EQ(results[1], int32_t(queue::Result::Loading));
    EXPECT_EQ(results[2], int32_t(queue::Result::Loading));
    EXPECT_EQ(results[3], int32_t(queue::Result::Error));
    EXPECT_EQ(results[4], int32_t(queue::Result::Error));
}

// A dropped mirror releases its load claim: after an invalidation (or a
// load the service discarded) the next search loads it again at once
// rather than every search using the CPU until the claim expires.
TEST_F(QueryServer, DroppedMirrorReleasesTheLoadClaim)
{
    Segment seg(4);
    gpuproc::DeviceLock lock;
    gpuproc::QueryServer server(seg.q, store, devices, lock, nullptr, 0);
    server.set_retry_after_drop(std::chrono::milliseconds(0));
    const MirrorKey key{1, 12, 100, 1};
    const MirrorKey other{1, 14, 100, 1};
    auto ask = [&](uint32_t slot, const MirrorKey& k) {
        fill(seg.q, slot, k, f.x.data(), uint32_t(f.d), 5, 2);
        seg.q.submit(slot);
        EXPECT_TRUE(server.serve_once(0));
        EXPECT_TRUE(seg.q.wait_done(slot, 1));
        int32_t r = seg.q.slot(slot).ans.result;
        seg.q.release(slot);
        return r;
    };
    EXPECT_EQ(ask(0, key), int32_t(queue::Result::NotLoaded));
    EXPECT_EQ(ask(1, other), int32_t(queue::Result::NotLoaded));
    EXPECT_EQ(ask(0, key), int32_t(queue::Result::Loading));
    server.release_claims(key.db, key.index);
    EXPECT_EQ(ask(0, key), int32_t(queue::Result::NotLoaded));
    EXPECT_EQ(ask(1, other), int32_t(queue::Result::Loading));
    server.release_claims(0, 0);
    EXPECT_EQ(ask(1, other), int32_t(queue::Result::NotLoaded));
    // The claimer gives the load up (a cancel while it read the index): the
    // next asker claims it at once, and its claim stands for the others.
    EXPECT_EQ(ask(2, other), int32_t(queue::Result::Loading));
    seg.q.give_up_load(1);
    EXPECT_EQ(ask(2, other), int32_t(queue::Result::NotLoaded));
    EXPECT_EQ(ask(1, other), int32_t(queue::Result::Loading));
    seg.q.give_up_load(1);
    EXPECT_EQ(ask(3, other), int32_t(queue::Result::Loading));
    // After a drop the load may be claimed again only once the retry delay passed.
    server.set_retry_after_drop(std::chrono::milliseconds(200));
    server.release_claims(0, 0);
    EXPECT_EQ(ask(3, other), int32_t(queue::Result::Loading));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(ask(3, other), int32_t(queue::Result::NotLoaded));
}

// A mirror loaded hidden (the service catches it up with the changes
// logged while it loaded) is not searched until revealed.
TEST_F(QueryServer, HiddenMirrorAnswersLoadingUntilRevealed)
{
    const MirrorKey key{1, 13, 100, 1};
    ASSERT_NE(load_fixture(store, f, key, true), nullptr);
    EXPECT_FALSE(store.servable(key));
    Segment seg(2);
    gpuproc::DeviceLock lock;
    gpuproc::QueryServer server(seg.q, store, devices, lock, nullptr, 0);
    for (int round = 0; round < 2; round++) {
        fill(seg.q, 0, key, f.x.data(), uint32_t(f.d), 5, 2);
        seg.q.submit(0);
        ASSERT_TRUE(server.serve_once(0));
        ASSERT_TRUE(seg.q.wait_done(0, 1));
        EXPECT_EQ(seg.q.slot(0).ans.result, int32_t(round == 0 ? queue::Result::Loading : queue::Result::Ok));
        seg.q.release(0);
        store.reveal(key);
    }
}

// Serving threads and many clients at once: every search answered, each
// with its own query's answer, whether the serving threads sleep at once or
// poll (gpu_ivfpq.gpu_poll); batches above kDeliveryShare are delivered in
// shares by the delivery threads.
// (gpu_poll microseconds, serving threads at work): two threads pace their
// batches one behind the other (BatchPacer).
class ThreadsServe : public QueryServer,
                     public ::testing::WithParamInterface<std::tuple<uint32_t, uint32_t>> {};

TEST_P(ThreadsServe, ConcurrentClients)
{
    const MirrorKey key{1, 12, 100, 1};
    ASSERT_NE(load_fixture(store, f, key), nullptr);
    const uint32_t clients = 24, rounds = 30, k = 5, nprobe = 3;
    Segment seg(clients);
    seg.q.header().poll_us.store(std::get<0>(GetParam()));
    seg.q.header().servers.store(std::get<1>(GetParam()));
    gpuproc::DeviceLock lock;
    // Reference answers first (the store is not shared with the server yet).
    std::vector<int64_t> want(clients * rounds * k);
    std::vector<double> dist(k);
    for (uint32_t c = 0; c < clients; c++)
        for (uint32_t r = 0; r < rounds; r++)
            gpuproc::run_search(*store.find(key), f.x.data() + ((c * rounds + r) % f.n) * f.d, 1, f.d, k, nprobe,
                                nullptr, nullptr, nullptr, want.data() + (c * rounds + r) * k, dist.data());
    {
        gpuproc::QueryServer server(seg.q, store, devices, lock, [] { std::abort(); }, 3);
        std::vector<std::thread> threads;
        std::vector<int> wrong(clients, 0);
        for (uint32_t c = 0; c < clients; c++)
            threads.emplace_back([&, c] {
                for (uint32_t r = 0; r < rounds; r++) {
                    fill(seg.q, c, key, f.x.data() + ((c * rounds + r) % f.n) * f.d, uint32_t(f.d), k, nprobe);
                    seg.q.submit(c);
                    while (!seg.q.wait_done(c, 1000)) {
                    }
                    const int64_t* got = reinterpret_cast<const int64_t*>(seg.q.slot(c).payload);
                    if (seg.q.slot(c).ans.result != 0 ||
                        std::memcmp(got, want.data() + (c * rounds + r) * k, k * sizeof(int64_t)) != 0)
                        wrong[c]++;
                    seg.q.release(c);
                }
            });
        for (auto& t : threads)
            t.join();
        for (uint32_t c = 0; c < clients; c++)
            EXPECT_EQ(wrong[c], 0) << "client " << c;
    }
    EXPECT_EQ(seg.q.header().stats.queries.load(), uint64_t(clients) * rounds);
    // Batches larger than one share formed (the delivery threads took part).
    uint64_t shared = 0;
    for (int b = 3; b < queue::kHistBuckets; b++)  // buckets 8-15 and up
        shared += seg.q.header().stats.hist[b].load();
    EXPECT_GT(shared, 0u);
}

INSTANTIATE_TEST_SUITE_P(QueryServer, ThreadsServe,
                         ::testing::Values(std::make_tuple(0u, 1u), std::make_tuple(200u, 1u),
                                           std::make_tuple(0u, 2u)));

// The pacing of serving threads' batches: a thread waits until the batch in
// flight is within the lead of its expected end (never longer than the
// cap); a batch queued behind another is expected to end one batch time
// after it, and the time it teaches is counted from that end, not from
// when it was queued.
TEST(BatchPacer, BatchesQueueOneBehindTheOther)
{
    const uint64_t us = 1000, lead = 30 * us;
    gpuproc::BatchPacer p(lead, 500 * us);
    EXPECT_EQ(p.wait_ns(1, 0), 0u);  // nothing in flight
    p.begins(0, 1000 * us);          // no batch time learnt yet: ends at once
    EXPECT_EQ(p.wait_ns(1, 1000 * us), 0u);
    p.ends(0, 1000 * us, 1100 * us);
    EXPECT_EQ(p.batch_ns(), 100 * us);
    EXPECT_EQ(p.wait_ns(1, 1100 * us), 0u);  // ended: cleared

    p.begins(0, 2000 * us);  // expected end 2100
    EXPECT_EQ(p.expected_end(0), 2100 * us);
    EXPECT_EQ(p.wait_ns(0, 2000 * us), 0u);  // a thread never waits for itself
    EXPECT_EQ(p.wait_ns(1, 2000 * us), 70 * us);
    EXPECT_EQ(p.wait_ns(1, 2060 * us), 10 * us);
    EXPECT_EQ(p.wait_ns(1, 2070 * us), 0u);
    p.begins(1, 2070 * us);  // queued behind thread 0's: starts at 2100
    EXPECT_EQ(p.expected_end(1), 2200 * us);
    EXPECT_EQ(p.wait_ns(2, 2070 * us), 100 * us);  // a third waits for the later one
    p.ends(0, 2000 * us, 2100 * us);
    p.ends(1, 2070 * us, 2200 * us);  // kept the device from 2100: 100 us, not 130
    EXPECT_EQ(p.batch_ns(), 100 * us);
    p.ends(2, 0, 0);  // a failed call teaches nothing
    EXPECT_EQ(p.batch_ns(), 100 * us);

    // Two devices: a thread waits only while both are taken, until one of
    // them frees (the second latest end), and a batch then queues there.
    p.begins(0, 3000 * us, 2);  // ends 3100
    EXPECT_EQ(p.wait_ns(1, 3000 * us, 2), 0u);  // the other device is free
    p.begins(1, 3000 * us, 2);  // on the other device: ends 3100 too
    p.ends(0, 3000 * us, 3100 * us);
    p.begins(0, 3100 * us, 2);  // ends 3200
    EXPECT_EQ(p.wait_ns(2, 3010 * us, 2), 60 * us);  // 3100 - 30 - 3010
    p.begins(2, 3070 * us, 2);  // behind the one that frees at 3100
    EXPECT_EQ(p.expected_end(2), 3200 * us);
    for (int u : {0, 1, 2})
        p.ends(u, 0, 0);

    // An estimate gone wrong costs no more than the cap.
    p.ends(0, 4000 * us, 4000 * us + 100000 * us);
    p.begins(0, 200000 * us);
    EXPECT_EQ(p.wait_ns(1, 200000 * us), 500 * us);
}

// run_between_batches (the change log's appends): with no serving thread
// the caller is told to run the job itself; with serving threads busy
// serving clients, each job runs once, on a serving thread, holding the
// device lock exclusively (no search can take it meanwhile), and is done
// when the call returns: a row appended by a job is in the next search's
// answer. What a job throws reaches the caller.
TEST_F(QueryServer, JobsRunOnAServingThreadBetweenBatches)
{
    const MirrorKey key{1, 13, 100, 1};
    ASSERT_NE(load_fixture(store, f, key), nullptr);
    const uint32_t clients = 6, k = 10, nprobe = 8;
    Segment seg(clients + 1);
    gpuproc::DeviceLock lock;
    {
        gpuproc::QueryServer none(seg.q, store, devices, lock, nullptr, 0);
        bool ran = false;
        EXPECT_FALSE(none.run_between_batches([&] { ran = true; }));
        EXPECT_FALSE(ran);
    }
    gpuproc::QueryServer server(seg.q, store, devices, lock, [] { std::abort(); }, 2);
    // With nothing else to serve, a job wakes a sleeping serving thread
    // at once (its wait is 100 ms without a wake-up).
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (int j = 0; j < 5; j++) {
        const auto t0 = std::chrono::steady_clock::now();
        EXPECT_TRUE(server.run_between_batches([] {}));
        EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(50)) << "job " << j;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::atomic<bool> stop{false};
    std::atomic<int> wrong{0};
    std::vector<std::thread> threads;
    for (uint32_t c = 0; c < clients; c++)
        threads.emplace_back([&, c] {
            for (uint32_t r = 0; !stop.load(); r++) {
                fill(seg.q, c, key, f.x.data() + ((c * 97 + r) % f.n) * f.d, uint32_t(f.d), k, nprobe);
                seg.q.submit(c);
                if (!answered_within(seg.q, c, 30000) || seg.q.slot(c).ans.result != int32_t(queue::Result::Ok)) {
                    wrong++;
                    return;
                }
                seg.q.release(c);
            }
        });
    const std::thread::id caller = std::this_thread::get_id();
    int runs = 0, elsewhere = 0, exclusive = 0;
    std::deque<std::atomic<bool>> took(40);
    std::vector<std::thread> readers;
    for (int j = 0; j < 40; j++) {
        EXPECT_TRUE(server.run_between_batches([&] {
            runs++;
            elsewhere += std::this_thread::get_id() != caller;
            // A reader of the lock waits until the job is over.
            std::atomic<bool>& mine = took[j];
            readers.emplace_back([&lock, &mine] {
                std::shared_lock<gpuproc::DeviceLock> g(lock);
                mine = true;
            });
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
            exclusive += !mine.load();
        }));
    }
    for (auto& t : readers)
        t.join();
    EXPECT_EQ(runs, 40);
    EXPECT_EQ(elsewhere, 40);
    EXPECT_EQ(exclusive, 40);
    // Appended by a job: row 5 again under a new label, found by its own vector.
    const int64_t label = 999999;
    const size_t r = 5;
    EXPECT_TRUE(server.run_between_batches([&] {
        store.find(key)->add(1, f.list_ids.data() + r, f.codes.data() + r * f.m, &label, f.x.data() + r * f.d,
                             nullptr);
    }));
    fill(seg.q, clients, key, f.x.data() + r * f.d, uint32_t(f.d), k, nprobe);
    seg.q.submit(clients);
    const bool answered = answered_within(seg.q, clients, 30000);
    EXPECT_TRUE(answered);
    EXPECT_EQ(seg.q.slot(clients).ans.result, int32_t(queue::Result::Ok)) << seg.q.slot(clients).ans.error;
    if (answered && seg.q.slot(clients).ans.result == int32_t(queue::Result::Ok)) {
        const int64_t* got = reinterpret_cast<const int64_t*>(seg.q.slot(clients).payload);
        EXPECT_NE(std::find(got, got + k, label), got + k);
        EXPECT_NE(std::find(got, got + k, f.labels[r]), got + k);
        seg.q.release(clients);
    }
    EXPECT_THROW(server.run_between_batches([] { throw Error(ErrorKind::Internal, "a failed job"); }), Error);
    stop = true;
    for (auto& t : threads)
        t.join();
    EXPECT_EQ(wrong.load(), 0);
}

// gpu_metric searches through the queue: those of one mirror and kind are
// one call (range searches of different radii together, k-NN per k), and
// each gets the answer it would have got alone; scan rounds in the same
// pass are served beside them; an answer larger than the payload says how
// many bytes it needs; another change count is not loaded; malformed
// requests are refused.
TEST_F(QueryServer, MetricSearchesBatchedPerMirrorAndKind)
{
    using metricwords::Word;
    const uint64_t seed = testutil::test_seed(4242);
    const auto words = metricwords::make_words(500, seed, metricwords::spanish_alphabet());
    const auto queries = metricwords::make_queries(words, 12, seed + 1, metricwords::spanish_alphabet());
    ListOfClusters lc(metricwords::to_list(words), 8);
    for (uint32_t id = 0; id < lc.size(); id += 9)
        lc.remove(id);
    const metricspec::SpecStore state(lc);

    MirrorKey key{1, 20, 120, 2};
    key.change = 17;
    ASSERT_NE(store.load_metric(key, state.spec), nullptr);
    const MirrorKey ivf_key{1, 21, 121, 1};
    ASSERT_NE(load_fixture(store, f, ivf_key), nullptr);
    Segment seg(13);
    gpuproc::DeviceLock lock;
    gpuproc::QueryServer server(seg.q, store, devices, lock, nullptr, 0);

    auto part = [&](size_t from, size_t n) { return std::vector<Word>(queries.begin() + from, queries.begin() + from + n); };
    // Range: three requests (one radius; one a query; one radius), k-NN 3 twice and k-NN 5 once.
    fill_metric(seg.q, 0, key, part(0, 2), 0, {2});
    fill_metric(seg.q, 1, key, part(2, 3), 0, {0, 1, 3});
    fill_metric(seg.q, 2, key, part(5, 1), 0, {1});
    fill_metric(seg.q, 3, key, part(6, 2), 3, {});
    fill_metric(seg.q, 4, key, part(8, 2), 3, {});
    fill_metric(seg.q, 5, key, part(10, 2), 5, {});
    // Every object for twelve queries: more hits than a payload holds.
    fill_metric(seg.q, 6, key, part(0, 12), 0, {1000});
    // Another change count: not loaded.
    MirrorKey other = key;
    other.change = 18;
    fill_metric(seg.q, 7, other, part(0, 1), 0, {1});
    // Decreasing offsets; two radii for one query; a k-NN with a radius.
    fill_metric(seg.q, 8, key, part(0, 2), 0, {1});
    {
        const MetricSearchLayout l = metric_search_layout(2, seg.q.slot(8).req.ncps, 1);
        reinterpret_cast<uint64_t*>(seg.q.slot(8).payload + l.offsets)[1] = seg.q.slot(8).req.ncps + 1;
    }
    fill_metric(seg.q, 9, key, part(0, 1), 0, {1, 2});
    fill_metric(seg.q, 10, key, part(0, 1), 2, {1});
    // A k-NN with more neighbours than a slot could hold.
    fill_metric(seg.q, 12, key, part(0, 1), 1u << 30, {});
    // A scan round of the IVFPQ mirror in the same pass.
    fill(seg.q, 11, ivf_key, f.x.data(), uint32_t(f.d), 5, 2);
    for (uint32_t i = 0; i < 13; i++)
        seg.q.submit(i);
    ASSERT_TRUE(server.serve_once(0));
    for (uint32_t i = 0; i < 13; i++)
        ASSERT_TRUE(seg.q.wait_done(i, 1)) << i;

    const std::string what = "seed=" + std::to_string(seed);
    expect_metric_answer(seg.q, 0, range_search_batch(lc, metricwords::to_list(part(0, 2)), {2}, 1), what + " 0");
    expect_metric_answer(seg.q, 1, range_search_batch(lc, metricwords::to_list(part(2, 3)), {0, 1, 3}, 1), what + " 1");
    expect_metric_answer(seg.q, 2, range_search_batch(lc, metricwords::to_list(part(5, 1)), {1}, 1), what + " 2");
    expect_metric_answer(seg.q, 3, knn_search_batch(lc, metricwords::to_list(part(6, 2)), 3, 1), what + " 3");
    expect_metric_answer(seg.q, 4, knn_search_batch(lc, metricwords::to_list(part(8, 2)), 3, 1), what + " 4");
    expect_metric_answer(seg.q, 5, knn_search_batch(lc, metricwords::to_list(part(10, 2)), 5, 1), what + " 5");
    // One call per mirror and kind: the range searches (with the large one), k-NN 3, k-NN 5.
    for (uint32_t i : {0u, 1u, 2u, 6u})
        EXPECT_EQ(seg.q.slot(i).ans.batch, 4u) << i;
    EXPECT_EQ(seg.q.slot(3).ans.batch, 2u);
    EXPECT_EQ(seg.q.slot(5).ans.batch, 1u);
    EXPECT_EQ(seg.q.slot(0).ans.live, lc.live());
    const queue::SearchAnswer& big = seg.q.slot(6).ans;
    ASSERT_TRUE(queue::metric_answer_sound(big, seg.q.slots()));
    EXPECT_EQ(big.result, int32_t(queue::Result::Ok));
    EXPECT_EQ(big.needed, metric_search_layout(12, seg.q.slot(6).req.ncps, 1).hits + 12 * lc.live() * 8);
    EXPECT_EQ(seg.q.slot(7).ans.result, int32_t(queue::Result::NotLoaded));
    for (uint32_t i : {8u, 9u, 10u, 12u})
        EXPECT_EQ(seg.q.slot(i).ans.result, int32_t(queue::Result::Error)) << i;
    EXPECT_EQ(seg.q.slot(11).ans.result, int32_t(queue::Result::Ok));
    EXPECT_EQ(seg.q.slot(11).ans.batch, 1u);
    // Batches: the scan round, the range searches, k-NN 3, k-NN 5.
    EXPECT_EQ(seg.q.header().stats.batches.load(), 4u);
}

// What a backend accepts of a metric answer before it reads its hits.
TEST(QueryQueue, MalformedMetricAnswersAreRefused)
{
    queue::SearchAnswer ok;
    ok.batch = 2;
    EXPECT_TRUE(queue::metric_answer_sound(ok, 8));
    auto refused = [&](auto change) {
        queue::SearchAnswer a = ok;
        change(a);
        return !queue::metric_answer_sound(a, 8);
    };
    EXPECT_TRUE(refused([](queue::SearchAnswer& a) { a.result = 9; }));
    EXPECT_TRUE(refused([](queue::SearchAnswer& a) { a.batch = 0; }));
    EXPECT_TRUE(refused([](queue::SearchAnswer& a) { a.batch = 9; }));
    EXPECT_TRUE(refused([](queue::SearchAnswer& a) { a.n = 1; }));
    EXPECT_TRUE(refused([](queue::SearchAnswer& a) { a.exact = 1; }));
    EXPECT_TRUE(refused([](queue::SearchAnswer& a) { a.needed = queue::kPayload; }));  // it would have fit
    EXPECT_TRUE(refused([](queue::SearchAnswer& a) { std::memset(a.error, 'x', sizeof(a.error)); }));
    EXPECT_FALSE(refused([](queue::SearchAnswer& a) { a.needed = queue::kPayload + 1; }));
}

// The device lock lets a waiting writer (a change-log append) in before
// new readers (searches), so that overlapping searches cannot starve it.
TEST(DeviceLock, AWaitingWriterGoesBeforeNewReaders)
{
    gpuproc::DeviceLock lock;
    std::atomic<int> order{0};
    int writer_at = -1, reader_at = -1;
    lock.lock_shared();  // a search runs
    std::thread writer([&] {
        lock.lock();
        writer_at = order++;
        lock.unlock();
    });
    // Once the writer waits, a second search arrives.
    while (lock.writers_waiting() == 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::thread reader([&] {
        lock.lock_shared();
        reader_at = order++;
        lock.unlock_shared();
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(order.load(), 0);  // neither while the first search holds it
    lock.unlock_shared();
    writer.join();
    reader.join();
    EXPECT_EQ(writer_at, 0);
    EXPECT_EQ(reader_at, 1);
}
