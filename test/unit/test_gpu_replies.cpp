// Replies from a GPU process that misbehaves: the emulated process runs
// behind a proxy that changes one kind of reply on its way to the service's
// client (gpuproc::GpuProcess) as a broken process could: a status that is
// no status, a truncated message, counts beyond the room the request gave,
// hit offsets past the hits, object ids past the mirror's objects, labels
// that are no mirror's, row numbers past the rows given, negative counts.
//
// Why: the GPU process is outside the fault boundary, and every number in
// a reply that indexes an array is used by the service (the worker copies
// answers by them) and by the backends (hit ids index the index's objects,
// labels become heap TIDs, exact search's labels index the base rows, an
// encode's list ids index the build's lists). The client must take such a
// reply for a failure of the process (Error(Internal), the process given up
// as when it dies, so the service answers on the CPU and restarts it),
// never return it. The same replies untouched must pass, so that each case
// fails only by what it changes. The checks the backends repeat on what the
// service passes on (reply_checks.h) are tested at the end.
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "engine/error.h"
#include "engine/metric/lc_index.h"
#include "engine/metric/metric_index.h"
#include "gpu_process_channel.h"
#include "metric_spec.h"
#include "metric_words.h"
#include "mirror_fixture.h"
#include "gpu_process/gpu_process_client.h"
#include "gpu_process/gpu_process_protocol.h"
#include "gpu_process/reply_checks.h"
#include "test_util.h"

namespace gpuivfpq {
namespace gpuproc {
namespace {

// How a misbehaving process changes a reply: rep, the arrays in the
// exchange (x, mapped at the size the request states; null when none) and
// the bytes sent (sizeof(Reply), or fewer: a truncated message). The
// announcement comes with a request of no operation.
using Tamper = std::function<void(const Request& q, Reply& rep, char* x, size_t& bytes)>;

// The emulated GPU process behind a proxy that passes each reply through
// tamper. The proxy ends when the client closes its end, and ends the
// process behind it.
Channel::Server tampering(Tamper tamper)
{
    return [tamper](ServerEnd& end) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
            return 1;
        ServerEnd inner;
        inner.sock = sv[1];
        inner.exchange = end.exchange;
        std::thread real([&inner] {
            (void)emulated_server(inner);
            ::close(inner.sock);
        });
        auto pass_reply = [&](const Request& q) {
            Reply rep;
            if (::recv(sv[0], &rep, sizeof(rep), 0) != ssize_t(sizeof(rep)))
                return false;
            size_t bytes = sizeof(rep);
            char* x = nullptr;
            if (q.exchange_bytes > 0) {
                void* p = mmap(nullptr, q.exchange_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                               end.exchange, 0);
                if (p != MAP_FAILED)
                    x = static_cast<char*>(p);
            }
            tamper(q, rep, x, bytes);
            if (x != nullptr)
                munmap(x, q.exchange_bytes);
            return ::send(end.sock, &rep, bytes, MSG_NOSIGNAL) == ssize_t(bytes);
        };
        bool open = pass_reply(Request());
        Request q;
        while (open && ::recv(end.sock, &q, sizeof(q), 0) == ssize_t(sizeof(q)))
            open =
                ::send(sv[0], &q, sizeof(q), MSG_NOSIGNAL) == ssize_t(sizeof(q)) && pass_reply(q);
        ::close(sv[0]);  // the process behind sees the channel close
        real.join();
        return 0;
    };
}

// Changes the replies to op only (every one of them).
Tamper on(Op op, std::function<void(const Request&, Reply&, char*)> change)
{
    return [op, change](const Request& q, Reply& rep, char* x, size_t&) {
        if (q.op == op)
            change(q, rep, x);
    };
}

const Tamper untouched = [](const Request&, Reply&, char*, size_t&) {};

template <typename T>
T* at(char* x, const Request& q, int region)
{
    return reinterpret_cast<T*>(x + q.region[region].offset);
}

// fn must meet a malformed reply: Error(Internal), and the process given
// up (alive() false) with the reply as the cause.
void expect_malformed(GpuProcess& gp, const std::function<void()>& fn, const std::string& what)
{
    try {
        fn();
        ADD_FAILURE() << what << ": the reply was accepted";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::Internal) << what << ": " << e.what();
        EXPECT_NE(std::string(e.what()).find("malformed reply"), std::string::npos)
            << what << ": " << e.what();
    }
    EXPECT_FALSE(gp.alive()) << what;
    EXPECT_NE(gp.cause().find("malformed reply"), std::string::npos) << what << ": " << gp.cause();
    // Given up: later calls fail at once, as after a death.
    try {
        gp.set_budget(1 << 20);
        ADD_FAILURE() << what << ": a call after the malformed reply was sent";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::Internal) << what;
    }
}

struct Case {
    std::string what;
    Tamper tamper;
};

using Data = testutil::EncodedSet;
const MirrorKey kKey{1, 10, 100, 1};

// ---------------------------------------------------------------- any reply

TEST(GpuProcessReplies, AStatusThatIsNoneOrATruncatedReplyIsAFailure)
{
    const std::vector<Case> cases = {
        {"an unknown status",
         on(Op::SetBudget, [](const Request&, Reply& rep, char*) { rep.status = Status(42); })},
        {"a negative status",
         on(Op::SetBudget, [](const Request&, Reply& rep, char*) { rep.status = Status(-3); })},
        {"a truncated reply",
         [](const Request& q, Reply&, char*, size_t& bytes) {
             if (q.op == Op::SetBudget)
                 bytes = offsetof(Reply, message);
         }},
    };
    for (const Case& c : cases) {
        Channel ch(tampering(c.tamper));
        auto gp = ch.connect();
        expect_malformed(
            *gp, [&] { gp->set_budget(1 << 20); }, c.what);
    }
    Channel ch(tampering(untouched));
    auto gp = ch.connect();
    gp->set_budget(1 << 20);
    EXPECT_TRUE(gp->alive());
}

TEST(GpuProcessReplies, AnAnnouncementOfAnUnknownKindIsAFailedStart)
{
    Channel ch(tampering([](const Request& q, Reply& rep, char*, size_t&) {
        if (q.seq == 0)
            rep.value[1] = 7;
    }));
    try {
        ch.connect();
        FAIL() << "an announcement of an unknown device kind was accepted";
    } catch (const StartError& e) {
        EXPECT_FALSE(e.no_device());  // a failure: retried later
        EXPECT_NE(std::string(e.what()).find("malformed"), std::string::npos) << e.what();
    }
}

// ---------------------------------------------------------------- Status, Devices

TEST(GpuProcessReplies, StatusListsNoMoreThanTheRoomAndKnownValues)
{
    Data f;
    auto first = [](char* x, const Request& q) { return at<char>(x, q, 0); };
    const std::vector<Case> cases = {
        {"more mirrors than the room",
         on(Op::Status,
            [](const Request&, Reply& rep, char*) { rep.value[0] = kMaxStatusMirrors + 1; })},
        {"a flag that is no bool",
         on(Op::Status, [&](const Request& q, Reply&,
                            char* x) { first(x, q)[offsetof(MirrorInfo, vectors)] = 5; })},
        {"an unknown placement", on(Op::Status,
                                    [&](const Request& q, Reply&, char* x) {
                                        uint32_t nine = 9;
                                        std::memcpy(first(x, q) + offsetof(MirrorInfo, placement),
                                                    &nine, sizeof(nine));
                                    })},
        {"an unknown kind", on(Op::Status,
                               [&](const Request& q, Reply&, char* x) {
                                   uint32_t seven = 7;
                                   std::memcpy(first(x, q) + offsetof(MirrorInfo, kind), &seven,
                                               sizeof(seven));
                               })},
    };
    for (const Case& c : cases) {
        Channel ch(tampering(c.tamper));
        auto gp = ch.connect();
        gp->load(kKey, f.spec(), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr,
                 nullptr);
        expect_malformed(
            *gp, [&] { (void)gp->status(); }, c.what);
    }
    Channel ch(tampering(untouched));
    auto gp = ch.connect();
    gp->load(kKey, f.spec(), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr,
             nullptr);
    StoreStatus st = gp->status();
    ASSERT_EQ(st.mirrors.size(), 1u);
    EXPECT_EQ(st.mirrors[0].key, kKey);
}

TEST(GpuProcessReplies, DevicesListsOneToTheRoomWithTerminatedDescriptions)
{
    const std::vector<Case> cases = {
        {"no device", on(Op::Devices, [](const Request&, Reply& rep, char*) { rep.value[0] = 0; })},
        {"more devices than the room",
         on(Op::Devices,
            [](const Request&, Reply& rep, char*) { rep.value[0] = kMaxDevices + 1; })},
        {"an unterminated description", on(Op::Devices,
                                           [](const Request& q, Reply&, char* x) {
                                               DeviceInfo* d = at<DeviceInfo>(x, q, 0);
                                               std::memset(d->description, 'x',
                                                           sizeof(d->description));
                                           })},
        {"an unknown state", on(Op::Devices, [](const Request& q, Reply&,
                                                char* x) { at<DeviceInfo>(x, q, 0)->alive = 2; })},
    };
    for (const Case& c : cases) {
        Channel ch(tampering(c.tamper));
        auto gp = ch.connect();
        expect_malformed(
            *gp, [&] { (void)gp->devices(); }, c.what);
    }
    Channel ch(tampering(untouched));
    auto gp = ch.connect();
    EXPECT_EQ(gp->devices().size(), 1u);
}

// ---------------------------------------------------------------- gpu_ivfpq mirrors

// A mirror with filter keys (each row's key its row number) over the set.
struct KeyedMirror {
    Data f;
    std::vector<int64_t> keys;
    KeyedMirror()
    {
        for (size_t i = 0; i < f.n; i++)
            keys.push_back(int64_t(i));
    }
    void load(GpuProcess& gp) const
    {
        MirrorSpec s = f.spec();
        s.filter_keys = true;
        gp.load(kKey, s, f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr,
                keys.data());
        // The fixture's labels (7 i + 1) are TIDs of block 0: the service's check passes them.
        gp.set_label_check(replycheck::tid_label);
    }
};

TEST(GpuProcessReplies, SearchAnswersLabelsOfTheMirrorAndNoNegativeCounts)
{
    KeyedMirror km;
    const Data& f = km.f;
    const size_t nq = 4, k = 5;
    const std::vector<int64_t> lo(nq, std::numeric_limits<int64_t>::min()),
        hi(nq, std::numeric_limits<int64_t>::max());
    const std::vector<Case> cases = {
        {"a distance kind that is none of 0, 1 and 2",
         on(Op::Search, [](const Request&, Reply& rep, char*) { rep.value[0] = 3; })},
        {"a label below -1",
         on(Op::Search, [](const Request& q, Reply&, char* x) { at<int64_t>(x, q, 1)[3] = -5; })},
        {"a label that is no heap TID (offset 0)",
         on(Op::Search,
            [](const Request& q, Reply&, char* x) { at<int64_t>(x, q, 1)[0] = int64_t(1) << 16; })},
        {"a label past any block", on(Op::Search,
                                      [](const Request& q, Reply&, char* x) {
                                          at<int64_t>(x, q, 1)[nq * k - 1] =
                                              std::numeric_limits<int64_t>::max();
                                      })},
        {"a negative count of matched entries",
         on(Op::Search, [](const Request& q, Reply&, char* x) { at<int64_t>(x, q, 5)[1] = -1; })},
        {"a truncated reply",
         [](const Request& q, Reply&, char*, size_t& bytes) {
             if (q.op == Op::Search)
                 bytes = sizeof(Reply) - 1;
         }},
    };
    std::vector<int64_t> labels(nq * k), matched(nq);
    std::vector<double> exact(nq * k);
    GpuIvfpqAnswerDists is_exact = GPU_IVFPQ_DISTS_NONE;
    for (const Case& c : cases) {
        Channel ch(tampering(c.tamper));
        auto gp = ch.connect();
        km.load(*gp);
        expect_malformed(
            *gp,
            [&] {
                (void)gp->search(kKey, f.d, f.x.data(), nq, k, 2, lo.data(), hi.data(),
                                 matched.data(), labels.data(), exact.data(), &is_exact);
            },
            c.what);
    }
    Channel ch(tampering(untouched));
    auto gp = ch.connect();
    km.load(*gp);
    ASSERT_TRUE(gp->search(kKey, f.d, f.x.data(), nq, k, 2, lo.data(), hi.data(), matched.data(),
                           labels.data(), exact.data(), &is_exact));
    EXPECT_EQ(labels[0], f.labels[0]);  // query 0 is row 0
    EXPECT_GT(matched[0], 0);
}

// A search in flight is checked as one called at once: the one before it
// is answered, it fails, and so does any after it (the process is gone).
TEST(GpuProcessReplies, SearchesInFlightAreCheckedToo)
{
    KeyedMirror km;
    const Data& f = km.f;
    const size_t k = 5;
    int searches = 0;
    Channel ch(tampering(on(Op::Search, [&searches](const Request& q, Reply&, char* x) {
        if (++searches == 2)
            at<int64_t>(x, q, 1)[2] = 3 << 16;  // offset 0
    })));
    auto gp = ch.connect();
    km.load(*gp);
    GpuProcess::SearchCall calls[3];
    for (int i = 0; i < 3; i++)
        ASSERT_TRUE(
            gp->send_search(calls[i], kKey, f.d, f.x.data() + i * f.d, 1, k, 2, nullptr, nullptr));
    std::vector<int64_t> labels(k);
    std::vector<double> exact(k);
    GpuIvfpqAnswerDists is_exact = GPU_IVFPQ_DISTS_NONE;
    ASSERT_TRUE(gp->receive_search(calls[0], nullptr, labels.data(), exact.data(), &is_exact));
    EXPECT_EQ(labels[0], f.labels[0]);
    expect_malformed(
        *gp,
        [&] {
            (void)gp->receive_search(calls[1], nullptr, labels.data(), exact.data(), &is_exact);
        },
        "a search in flight answering a label that is no heap TID");
    EXPECT_EQ(testutil::error_kind([&] {
                  (void)gp->receive_search(calls[2], nullptr, labels.data(), exact.data(),
                                           &is_exact);
              }),
              ErrorKind::Internal);
    EXPECT_EQ(gp->searches_in_flight(), 0);
}

TEST(GpuProcessReplies, RemoveCountsNoMoreThanTheLabelsGiven)
{
    Data f;
    Channel ch(tampering(
        on(Op::Remove, [](const Request& q, Reply& rep, char*) { rep.value[0] = q.n + 1; })));
    auto gp = ch.connect();
    gp->load(kKey, f.spec(), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr,
             nullptr);
    size_t removed = 0;
    expect_malformed(
        *gp, [&] { (void)gp->remove(kKey, 2, f.labels.data(), &removed); },
        "more removed than given");
}

// ---------------------------------------------------------------- builds and exact search

TEST(GpuProcessReplies, EncodeAssignsRowsToListsOfTheModel)
{
    Data f;
    const std::vector<Case> cases = {
        {"a list past the model's",
         on(Op::Encode, [&f](const Request& q, Reply&,
                             char* x) { at<int32_t>(x, q, 3)[7] = int32_t(f.lists); })},
        {"a negative list",
         on(Op::Encode, [](const Request& q, Reply&, char* x) { at<int32_t>(x, q, 3)[0] = -1; })},
    };
    std::vector<int32_t> ids(f.n);
    std::vector<uint8_t> codes(f.n * f.m);
    for (const Case& c : cases) {
        Channel ch(tampering(c.tamper));
        auto gp = ch.connect();
        expect_malformed(
            *gp, [&] { gp->encode(f.spec(), f.x.data(), f.n, ids.data(), codes.data()); }, c.what);
    }
    Channel ch(tampering(untouched));
    auto gp = ch.connect();
    gp->encode(f.spec(), f.x.data(), f.n, ids.data(), codes.data());
    EXPECT_EQ(ids, f.list_ids);
}

TEST(GpuProcessReplies, ExactAnswersRowsAmongTheRowsGiven)
{
    Data f;
    const size_t nq = 3, n = 100, k = 4;
    const std::vector<Case> cases = {
        {"a row past the rows given",
         on(Op::Exact,
            [](const Request& q, Reply&, char* x) { at<int64_t>(x, q, 3)[5] = int64_t(q.n); })},
        {"a row below -1",
         on(Op::Exact, [](const Request& q, Reply&, char* x) { at<int64_t>(x, q, 3)[0] = -2; })},
    };
    std::vector<float> dist(nq * k);
    std::vector<int64_t> labels(nq * k);
    for (const Case& c : cases) {
        Channel ch(tampering(c.tamper));
        auto gp = ch.connect();
        expect_malformed(
            *gp,
            [&] {
                gp->exact_knn(f.x.data(), nq, f.x.data(), n, f.d, Metric::L2, k, dist.data(),
                              labels.data());
            },
            c.what);
    }
    Channel ch(tampering(untouched));
    auto gp = ch.connect();
    gp->exact_knn(f.x.data(), nq, f.x.data(), n, f.d, Metric::L2, k, dist.data(), labels.data());
    EXPECT_EQ(labels[0], 0);  // query 0 is row 0
}

// ---------------------------------------------------------------- gpu_metric mirrors

using metricwords::to_list;
using metricwords::Word;

// A List of Clusters over 300 words, its state, and 20 queries.
struct MetricSet {
    std::vector<Word> words = metricwords::make_words(300, 5, metricwords::ascii_alphabet());
    std::vector<Word> queries =
        metricwords::make_queries(words, 20, 6, metricwords::ascii_alphabet());
    ListOfClusters lc{to_list(words), 8};
    metricspec::SpecStore state{lc};
    WordList q = to_list(queries);
    MirrorKey key{1, 70, 170, 3, 41};

    MetricWords query_words() const { return MetricWords{q.size(), q.code_points(), q.offsets()}; }
};

// The first attempt's room for a range search of MetricSet's queries (the client's guess).
constexpr uint64_t kRangeRoom = 4096;

TEST(GpuProcessReplies, MetricLoadCountsNoMoreLiveObjectsThanLoaded)
{
    MetricSet ms;
    Channel ch(tampering(
        on(Op::MetricLoad, [](const Request& q, Reply& rep, char*) { rep.value[0] = q.n + 1; })));
    auto gp = ch.connect();
    expect_malformed(
        *gp, [&] { (void)gp->metric_load(ms.key, ms.state.spec); }, "more live than loaded");
}

TEST(GpuProcessReplies, MetricSearchAnswersFitTheRoomTheQueriesAndTheMirror)
{
    MetricSet ms;
    const size_t objects = ms.lc.size();
    auto range = [](std::function<void(const Request&, Reply&, char*)> change) {
        return on(Op::MetricSearch, [change](const Request& q, Reply& rep, char* x) {
            if (q.k == 0)
                change(q, rep, x);
        });
    };
    const std::vector<Case> range_cases = {
        {"more hits than the room", range([](const Request& q, Reply& rep, char*) {
             ASSERT_EQ(q.n, kRangeRoom);
             rep.value[0] = q.n + 1;
         })},
        {"far more hits than the room",
         range([](const Request&, Reply& rep, char*) { rep.value[0] = uint64_t(1) << 40; })},
        {"more hits than its queries can have (asking for room)",
         range([](const Request& q, Reply& rep, char*) {
             rep.value[1] = 1;
             rep.value[0] = q.nq * rep.value[2] + 1;
         })},
        {"a request for absurd room", range([](const Request&, Reply& rep, char*) {
             rep.value[1] = 1;
             rep.value[0] = uint64_t(1) << 62;
         })},
        {"a request for room it was given", range([](const Request& q, Reply& rep, char*) {
             rep.value[1] = 1;
             rep.value[0] = q.n;
         })},
        {"a request for more room every time", range([](const Request& q, Reply& rep, char*) {
             rep.value[1] = 1;
             rep.value[0] = q.n + 1;
         })},
        {"a room flag of 2", range([](const Request&, Reply& rep, char*) { rep.value[1] = 2; })},
        {"more live objects than loaded",
         range([objects](const Request&, Reply& rep, char*) { rep.value[2] = objects + 1; })},
        {"hit offsets ending past the hits",
         range([](const Request& q, Reply&, char* x) { at<uint64_t>(x, q, 3)[q.nq] += 1; })},
        {"hit offsets ending before the hits", range([](const Request& q, Reply& rep, char* x) {
             ASSERT_GT(rep.value[0], 0u);
             at<uint64_t>(x, q, 3)[q.nq] -= 1;
         })},
        {"hit offsets not from 0",
         range([](const Request& q, Reply&, char* x) { at<uint64_t>(x, q, 3)[0] = 1; })},
        {"decreasing hit offsets", range([](const Request& q, Reply& rep, char* x) {
             ASSERT_GT(rep.value[0], 0u);
             at<uint64_t>(x, q, 3)[1] = rep.value[0] + 1;
         })},
        {"an object id past the mirror's", range([objects](const Request& q, Reply& rep, char* x) {
             ASSERT_GT(rep.value[0], 0u);
             at<uint32_t>(x, q, 4)[rep.value[0] - 1] = uint32_t(objects);
         })},
        {"a query with more hits than live objects",
         range([](const Request& q, Reply& rep, char* x) {
             // Few live objects, as many as the queries' hits need, and every hit to query 0.
             ASSERT_GT(rep.value[0], 1u);
             rep.value[2] = (rep.value[0] + q.nq - 1) / q.nq;
             uint64_t* offsets = at<uint64_t>(x, q, 3);
             for (uint64_t i = 1; i <= q.nq; i++)
                 offsets[i] = rep.value[0];
         })},
    };
    const uint32_t radius = 3;
    MetricHits got;
    for (const Case& c : range_cases) {
        Channel ch(tampering(c.tamper));
        auto gp = ch.connect();
        gp->metric_load(ms.key, ms.state.spec);
        expect_malformed(
            *gp, [&] { (void)gp->metric_search(ms.key, ms.query_words(), 0, &radius, 1, got); },
            c.what);
    }

    const size_t k = 1;
    const std::vector<Case> knn_cases = {
        {"a k-NN search asking for room", on(Op::MetricSearch,
                                             [](const Request& q, Reply& rep, char*) {
                                                 rep.value[1] = 1;
                                                 rep.value[0] = q.n + 1;
                                             })},
        {"a k-NN query with more than k hits", on(Op::MetricSearch,
                                                  [](const Request& q, Reply& rep, char* x) {
                                                      ASSERT_EQ(rep.value[0], q.nq);  // one each
                                                      at<uint64_t>(x, q, 3)[1] =
                                                          2;  // two to query 0, none to query 1
                                                  })},
    };
    for (const Case& c : knn_cases) {
        Channel ch(tampering(c.tamper));
        auto gp = ch.connect();
        gp->metric_load(ms.key, ms.state.spec);
        expect_malformed(
            *gp, [&] { (void)gp->metric_search(ms.key, ms.query_words(), k, nullptr, 0, got); },
            c.what);
    }

    // Untouched, the same searches pass; every object (past the first
    // room guessed) takes the second attempt.
    Channel ch(tampering(untouched));
    auto gp = ch.connect();
    gp->metric_load(ms.key, ms.state.spec);
    ASSERT_TRUE(gp->metric_search(ms.key, ms.query_words(), 0, &radius, 1, got));
    ASSERT_TRUE(gp->metric_search(ms.key, ms.query_words(), k, nullptr, 0, got));
    EXPECT_EQ(got.ids.size(), ms.queries.size());
    const uint32_t all = 1000;
    size_t live = 0;
    ASSERT_TRUE(gp->metric_search(ms.key, ms.query_words(), 0, &all, 1, got, &live));
    EXPECT_GT(got.ids.size(), kRangeRoom);
    EXPECT_EQ(got.ids.size(), ms.queries.size() * live);
}

// An answer for a mirror the client never loaded (or dropped, or replaced
// with another version) cannot be one: the process holds no such mirror.
TEST(GpuProcessReplies, MetricSearchOfAMirrorNeverLoadedIsNotAnswered)
{
    MetricSet ms;
    const Tamper found_anyway = on(Op::MetricSearch, [](const Request&, Reply& rep, char*) {
        if (rep.status == Status::NotFound)
            rep.status = Status::Ok;  // value[0]: no hits
    });
    const uint32_t radius = 1;
    MetricHits got;
    {
        Channel ch(tampering(found_anyway));
        auto gp = ch.connect();
        expect_malformed(
            *gp, [&] { (void)gp->metric_search(ms.key, ms.query_words(), 0, &radius, 1, got); },
            "never loaded");
    }
    {
        Channel ch(tampering(found_anyway));
        auto gp = ch.connect();
        gp->metric_load(ms.key, ms.state.spec);
        EXPECT_EQ(gp->drop_index(ms.key.db, ms.key.index), 1u);
        expect_malformed(
            *gp, [&] { (void)gp->metric_search(ms.key, ms.query_words(), 0, &radius, 1, got); },
            "dropped");
    }
    {
        Channel ch(tampering(found_anyway));
        auto gp = ch.connect();
        gp->metric_load(ms.key, ms.state.spec);
        MirrorKey newer = ms.key;
        newer.change++;
        gp->metric_load(newer, ms.state.spec);
        ASSERT_TRUE(gp->metric_search(newer, ms.query_words(), 0, &radius, 1, got));
        expect_malformed(
            *gp, [&] { (void)gp->metric_search(ms.key, ms.query_words(), 0, &radius, 1, got); },
            "replaced by a newer version");
    }
    // Untouched, a mirror not loaded is simply not found.
    Channel ch(tampering(untouched));
    auto gp = ch.connect();
    EXPECT_FALSE(gp->metric_search(ms.key, ms.query_words(), 0, &radius, 1, got));
    EXPECT_TRUE(gp->alive());
}

// ---------------------------------------------------------------- the backends' checks

// What the backends check before they index with what the service passes
// on: gpu_metric hits as (id, distance) pairs (metric_client.cpp), exact
// search's row labels and an encode's list ids (build_client.cpp), search
// labels as heap TIDs (search_client.cpp).
TEST(ReplyChecks, RefuseWhatWouldIndexPastAnArray)
{
    using namespace replycheck;
    const uint64_t sound[] = {0, 2, 2, 5};
    EXPECT_TRUE(hit_offsets_sound(sound, 3, 5));
    EXPECT_FALSE(hit_offsets_sound(sound, 3, 4));  // past the room
    const uint64_t late[] = {1, 2, 2, 5};
    EXPECT_FALSE(hit_offsets_sound(late, 3, 5));
    const uint64_t decreasing[] = {0, 3, 2, 5};
    EXPECT_FALSE(hit_offsets_sound(decreasing, 3, 5));
    const uint64_t none[] = {0};
    EXPECT_TRUE(hit_offsets_sound(none, 0, 0));

    const MetricHit hits[] = {{4, 9}, {0, 100}, {7, 1}};
    EXPECT_TRUE(ids_below(&hits[0].id, 3, 2, 8));
    EXPECT_FALSE(ids_below(&hits[0].id, 3, 2, 7));  // id 7 of 7 objects
    EXPECT_TRUE(ids_below(&hits[0].id, 2, 2, 5));   // the distances are not ids

    const int64_t rows[] = {0, 3, -1, 9};
    EXPECT_TRUE(all_within<int64_t>(rows, 4, -1, 10));
    EXPECT_FALSE(all_within<int64_t>(rows, 4, -1, 9));
    EXPECT_FALSE(all_within<int64_t>(rows, 4, 0, 10));
    const int32_t lists[] = {0, 7};
    EXPECT_TRUE(all_within<int32_t>(lists, 2, 0, 8));
    EXPECT_FALSE(all_within<int32_t>(lists, 2, 0, 7));

    EXPECT_TRUE(tid_label(1));                                     // (0, 1)
    EXPECT_TRUE(tid_label((int64_t(0xFFFFFFFE) << 16) | 0xFFFF));  // the last block, offset 65535
    EXPECT_FALSE(tid_label(0));                                    // offset 0
    EXPECT_FALSE(tid_label(int64_t(5) << 16));                     // offset 0
    EXPECT_FALSE(tid_label(int64_t(0xFFFFFFFF) << 16 | 1));        // InvalidBlockNumber
    EXPECT_FALSE(tid_label(-1));
    EXPECT_FALSE(tid_label(std::numeric_limits<int64_t>::max()));
    const int64_t candidates[] = {(3 << 16) | 2, 1, -1, -1};
    EXPECT_TRUE(tid_labels_sound(candidates, 4));
    const int64_t below[] = {1, -2};
    EXPECT_FALSE(tid_labels_sound(below, 2));
    const int64_t offset0[] = {1, 2 << 16};
    EXPECT_FALSE(tid_labels_sound(offset0, 2));

    // RaBitQ rows of d = 20 at 1 bit (one word, then 3 factors): infinities
    // pass, NaN, a negative rescale or error, a negative add (but for inner
    // product) and a padding bit do not.
    uint8_t rabitq[2 * 16] = {};
    const float inf = std::numeric_limits<float>::infinity();
    const float good[3] = {1.5f, inf, 0.0f};
    std::memcpy(rabitq + 4, good, sizeof good);
    std::memcpy(rabitq + 16 + 4, good, sizeof good);
    rabitq[0] = 0xff;
    rabitq[2] = 0x0f;  // bits 16..19: dimensions
    EXPECT_TRUE(rabitq_rows_sound(rabitq, 2, 20, 1, false));
    EXPECT_FALSE(rabitq_rows_sound(rabitq, 2, 20, 2, false));  // a row of 2 planes would be longer
    auto bad = [&](size_t at, float v, bool ip) {
        uint8_t copy[sizeof rabitq];
        std::memcpy(copy, rabitq, sizeof copy);
        std::memcpy(copy + 16 + at, &v, sizeof v);
        return rabitq_rows_sound(copy, 2, 20, 1, ip);
    };
    EXPECT_FALSE(bad(4 + 8, std::numeric_limits<float>::quiet_NaN(), false));  // the second row's error
    EXPECT_FALSE(bad(4 + 4, -1.0f, false));                                    // a negative rescale
    EXPECT_FALSE(bad(4, -2.0f, false));                                        // a negative ||r||^2
    EXPECT_TRUE(bad(4, -2.0f, true));                                          // <c, r> may be negative
    EXPECT_FALSE(bad(4, std::numeric_limits<float>::quiet_NaN(), true));
    rabitq[16 + 2] = 0x1f;  // bit 20: padding
    EXPECT_FALSE(rabitq_rows_sound(rabitq, 2, 20, 1, false));
    EXPECT_TRUE(rabitq_rows_sound(rabitq, 1, 20, 1, false));
    EXPECT_FALSE(rabitq_rows_sound(rabitq, 1, 20, 9, false));
}

}  // namespace
}  // namespace gpuproc
}  // namespace gpuivfpq
