// The channel between the GPU service and its GPU process
// (gpu_process_protocol.h): the server loop (gpuproc::announce, serve) runs
// on a thread with the CPU emulation device, and the service's client
// (gpuproc::GpuProcess, built over an existing channel: no child process)
// calls it through a SOCK_SEQPACKET socket pair and a memfd exchange, as the
// service does in production.
//
// Why: every array a call names crosses the exchange at offsets the client
// lays out and the server checks, the exchange grows and shrinks between
// calls, device errors must come back as the same Error kinds without ending
// the process, and a process that dies, hangs or must be stopped must turn
// into alive() == false with a cause, never into a hang of the service. So
// each answer that crosses the channel is compared with the same work done
// directly in-process (a second emulation device, MirrorStore, or a
// brute-force loop), and the failure paths are driven by servers that close,
// stall or never answer.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/error.h"
#include "engine/exact_distance.h"
#include "engine/ivfpq.h"
#include "engine/search_limits.h"
#include "gpu_process/compute_device.h"
#include "gpu_process/device_set.h"
#include "gpu_process/gpu_process_client.h"
#include "gpu_process/gpu_process_protocol.h"
#include "gpu_process/gpu_process_server.h"
#include "gpu_process/mirror_store.h"
#include "gpu_process_channel.h"
#include "mirror_fixture.h"
#include "test_util.h"

namespace gpuivfpq {
namespace gpuproc {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0)
{
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Blocks until the client closes its end (recv returns 0), with a bound so
// that a broken test cannot hang the suite.
void wait_for_close(int sock)
{
    struct timeval tv = {10, 0};
    setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    Request q;
    while (::recv(sock, &q, sizeof(q), 0) > 0) {
    }
}

// A process that announces itself, takes one request and never answers it
// (stuck in the driver); on_request runs once the request is in.
Channel::Server stalling_server(std::function<void()> on_request = nullptr)
{
    return [on_request](ServerEnd& end) {
        auto dev = make_cpu_emulation_device();
        announce(end.sock, dev.get(), Kind::Emulated, Status::Ok, dev->description());
        Request q;
        if (::recv(end.sock, &q, sizeof(q), 0) <= 0)
            return 1;
        if (on_request)
            on_request();
        wait_for_close(end.sock);
        return 0;
    };
}

// A small trained model and its encoded entries (as test_mirror.cpp).
using Data = testutil::EncodedSet;

using testutil::error_kind;

// GpuProcess::search for a mirror without vectors (codes only): labels in
// ADC order, never re-ranked, so the exact distances are not written.
bool search_adc(GpuProcess& gp, const MirrorKey& key, size_t d, const float* queries, size_t nq,
                size_t k, size_t nprobe, int64_t* labels)
{
    std::vector<double> exact(nq * k, -7.0);
    GpuIvfpqAnswerDists is_exact = GPU_IVFPQ_DISTS_EXACT;
    const bool found = gp.search(key, d, queries, nq, k, nprobe, nullptr, nullptr, nullptr, labels, exact.data(), &is_exact);
    if (found) {
        EXPECT_EQ(is_exact, GPU_IVFPQ_DISTS_NONE) << "a codes-only mirror claimed an exact re-rank";
        EXPECT_EQ(std::count(exact.begin(), exact.end(), -7.0), std::ptrdiff_t(exact.size()))
            << "the exact distances of an ADC search were written";
    }
    return found;
}

// Brute-force k nearest rows of base (n x d) to q under L2, by float64
// distance (ties by row), and those distances.
void reference_knn(const float* q, const float* base, size_t n, size_t d, size_t k,
                   std::vector<int64_t>& labels, std::vector<double>& dist)
{
    std::vector<std::pair<double, int64_t>> best;
    for (size_t i = 0; i < n; i++) {
        double s = testutil::l2_ref(q, base + i * d, d);
        if (best.size() < k || s < best.back().first) {
            best.emplace_back(s, int64_t(i));
            std::sort(best.begin(), best.end());
            if (best.size() > k)
                best.pop_back();
        }
    }
    labels.clear();
    dist.clear();
    for (auto& b : best) {
        dist.push_back(b.first);
        labels.push_back(b.second);
    }
}

// n x d floats uniform in [-1, 1), from splitmix64: testutil's
// <random>-based generator is several times slower for the large payload.
std::vector<float> fast_uniform(size_t n, size_t d, uint64_t seed)
{
    std::vector<float> v(n * d);
    uint64_t s = seed;
    for (float& x : v) {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        x = float(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
    }
    return v;
}

// ---------------------------------------------------------------- tests

TEST(GpuProcess, AnnouncementReportsTheDevice)
{
    auto reference = make_cpu_emulation_device();
    {
        Channel ch(emulated_server);
        auto gp = ch.connect();
        EXPECT_TRUE(gp->alive());
        EXPECT_TRUE(gp->cause().empty());
        EXPECT_EQ(gp->pid(), 0);
        EXPECT_EQ(gp->description(), reference->description());
        EXPECT_EQ(gp->capacity(), reference->memory_capacity());
        EXPECT_EQ(gp->kind(), Kind::Emulated);
        gp.reset();
        EXPECT_EQ(ch.server_rc(), 0);  // the service closed the channel: a clean exit
    }
    // Kind::Emulated is also the client's default: a real GPU's kind must cross too.
    {
        Channel ch([](ServerEnd& end) {
            auto dev = make_cpu_emulation_device();
            announce(end.sock, dev.get(), Kind::Gpu, Status::Ok, "a device description");
            return serve(end.sock, end.exchange, *dev);
        });
        auto gp = ch.connect();
        EXPECT_EQ(gp->kind(), Kind::Gpu);
        EXPECT_EQ(gp->description(), "a device description");
    }
}

// A process without a device announces so, and the service must not retry.
TEST(GpuProcess, AnnouncedFailureThrowsStartError)
{
    {
        Channel ch([](ServerEnd& end) {
            announce(end.sock, nullptr, Kind::Gpu, Status::Unsupported, "none (no CUDA device found)");
            return 0;
        });
        try {
            ch.connect();
            FAIL() << "a process without a device was accepted";
        } catch (const StartError& e) {
            EXPECT_TRUE(e.no_device());
            EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
        }
    }
    {
        Channel ch([](ServerEnd& end) {
            announce(end.sock, nullptr, Kind::Gpu, Status::Internal, "the device failed to open: boom");
            return 0;
        });
        try {
            ch.connect();
            FAIL() << "a process whose device failed was accepted";
        } catch (const StartError& e) {
            EXPECT_FALSE(e.no_device());  // a failure: retry later
        }
    }
    // A program from another build (installed while the server ran the old
    // library): refused for good, since retrying starts the same program.
    {
        Channel ch([](ServerEnd& end) {
            Reply rep;
            rep.status = Status::Ok;
            rep.value[1] = static_cast<uint64_t>(Kind::Gpu);
            rep.value[2] = kVersion + 1;
            rep.value[3] = sizeof(Request);
            (void)::send(end.sock, &rep, sizeof(rep), MSG_NOSIGNAL);
            wait_for_close(end.sock);
            return 0;
        });
        try {
            ch.connect();
            FAIL() << "a program of another protocol version was accepted";
        } catch (const StartError& e) {
            EXPECT_TRUE(e.no_device());
            EXPECT_NE(std::string(e.what()).find("another build"), std::string::npos) << e.what();
        }
    }
    // Dying before the announcement is a failure too, not a hang.
    {
        Channel ch([](ServerEnd& end) {
            end.close_sock();
            return 0;
        });
        ch.join();
        try {
            ch.connect();
            FAIL() << "a process that never announced itself was accepted";
        } catch (const StartError& e) {
            EXPECT_FALSE(e.no_device());
        }
    }
}

TEST(GpuProcess, LoadAndSearchMatchTheMirrorInProcess)
{
    Data f;
    const MirrorKey key{1, 10, 100, 1};
    // More queries than the server's 4096-query tile, so a batch spans tiles.
    const size_t nq = 4100, k = 10, nprobe = 3;
    std::vector<float> queries = testutil::gaussian_vectors(nq, f.d, 11);
    std::copy(f.x.begin() + 5 * f.d, f.x.begin() + 6 * f.d, queries.begin());  // query 0 is row 5

    auto dev = make_cpu_emulation_device();
    MirrorStore store(*dev);
    store.load(key, f.spec(), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr, nullptr);
    std::vector<float> want_dist(nq * k);
    std::vector<int64_t> want(nq * k);
    store.find(key)->search(queries.data(), nq, k, nprobe, want_dist.data(), want.data(), nullptr);

    Channel ch(emulated_server);
    auto gp = ch.connect();
    gp->load(key, f.spec(), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr, nullptr);
    std::vector<int64_t> got(nq * k, -7);
    ASSERT_TRUE(search_adc(*gp, key, f.d, queries.data(), nq, k, nprobe, got.data()));
    EXPECT_EQ(got, want);
    EXPECT_EQ(got[0], f.labels[5]);
    EXPECT_EQ(std::count(got.begin(), got.end(), -1), 0);  // 2000 entries fill every k
}

TEST(GpuProcess, AddSearchAndDropByKey)
{
    Data f;
    const MirrorKey a{1, 10, 100, 1}, b{1, 11, 101, 1}, unknown{1, 99, 999, 1};
    const size_t k = 8, nprobe = 8;

    Channel ch(emulated_server);
    auto gp = ch.connect();
    std::vector<int64_t> got(k);
    EXPECT_FALSE(search_adc(*gp, a, f.d, f.x.data(), 1, k, nprobe, got.data()));
    EXPECT_FALSE(gp->add(a, f.m, 1, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr, 0, nullptr));

    gp->load(a, f.spec(), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr, nullptr);
    gp->load(b, f.spec(), 100, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr, nullptr);
    EXPECT_FALSE(search_adc(*gp, unknown, f.d, f.x.data(), 1, k, nprobe, got.data()));

    // New vectors added under labels of their own must be found.
    const size_t na = 300;
    auto rows = f.new_rows(na, 21, 1000000);
    std::vector<float>& y = rows.x;
    std::vector<int32_t>& ylist = rows.list_ids;
    std::vector<uint8_t>& ycodes = rows.codes;
    std::vector<int64_t>& ylabels = rows.labels;
    EXPECT_TRUE(gp->add(a, f.m, na, ylist.data(), ycodes.data(), ylabels.data(), nullptr, 0, nullptr));

    auto dev = make_cpu_emulation_device();
    MirrorStore store(*dev);
    store.load(a, f.spec(), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr, nullptr);
    store.find(a)->add(na, ylist.data(), ycodes.data(), ylabels.data(), nullptr, nullptr);
    const size_t nq = 20;
    std::vector<float> wdist(nq * k);
    std::vector<int64_t> want(nq * k), all(nq * k);
    store.find(a)->search(y.data(), nq, k, nprobe, wdist.data(), want.data(), nullptr);
    ASSERT_TRUE(search_adc(*gp, a, f.d, y.data(), nq, k, nprobe, all.data()));
    EXPECT_EQ(all, want);
    size_t added_first = 0;
    for (size_t q = 0; q < nq; q++)
        added_first += all[q * k] >= 1000000;
    EXPECT_GE(added_first, nq / 2) << "the added entries are not found first for their own vectors";

    // b kept its own entries through a's add.
    StoreStatus st = gp->status();
    ASSERT_EQ(st.mirrors.size(), 2u);
    EXPECT_EQ(st.mirrors[0].entries, f.n + na);
    EXPECT_EQ(st.mirrors[1].entries, 100u);

    EXPECT_EQ(gp->drop_index(a.db, a.index), 1u);
    EXPECT_EQ(gp->drop_index(a.db, a.index), 0u);
    EXPECT_FALSE(search_adc(*gp, a, f.d, y.data(), 1, k, nprobe, got.data()));
    EXPECT_TRUE(search_adc(*gp, b, f.d, y.data(), 1, k, nprobe, got.data()));

    gp->load(a, f.spec(), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr, nullptr);
    gp->drop_all();
    EXPECT_FALSE(search_adc(*gp, a, f.d, y.data(), 1, k, nprobe, got.data()));
    EXPECT_FALSE(search_adc(*gp, b, f.d, y.data(), 1, k, nprobe, got.data()));
    EXPECT_TRUE(gp->status().mirrors.empty());
    EXPECT_TRUE(gp->alive());
}

// VACUUM's in-place removal: the labels go (unknown ones and duplicates
// ignored), the count says how many, searches never return them again, and
// the mirror answers as one loaded without them.
TEST(GpuProcess, RemoveDropsLabelsInPlace)
{
    Data f;
    const MirrorKey key{1, 10, 100, 1}, other{1, 11, 110, 1};
    Channel ch(emulated_server);
    auto gp = ch.connect();
    gp->load(key, f.spec(), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr, nullptr);

    std::vector<int64_t> gone;
    for (size_t i = 0; i < f.n; i += 3)
        gone.push_back(f.labels[i]);
    std::vector<int64_t> asked = gone;
    asked.push_back(-5);            // unknown
    asked.push_back(gone.front());  // duplicate
    size_t removed = 0;
    ASSERT_TRUE(gp->remove(key, asked.size(), asked.data(), &removed));
    EXPECT_EQ(removed, gone.size());
    EXPECT_EQ(gp->status().mirrors.at(0).entries, f.n - gone.size());
    EXPECT_FALSE(gp->remove(other, asked.size(), asked.data(), &removed));

    // The same mirror loaded without the removed entries.
    std::vector<int32_t> lists;
    std::vector<uint8_t> codes;
    std::vector<int64_t> labels;
    for (size_t i = 0; i < f.n; i++) {
        if (i % 3 == 0)
            continue;
        lists.push_back(f.list_ids[i]);
        codes.insert(codes.end(), &f.codes[i * f.m], &f.codes[(i + 1) * f.m]);
        labels.push_back(f.labels[i]);
    }
    gp->load(other, f.spec(), labels.size(), lists.data(), codes.data(), labels.data(), nullptr, nullptr);
    const size_t nq = 50, k = 20;
    std::vector<int64_t> a(nq * k), b(nq * k);
    ASSERT_TRUE(search_adc(*gp, key, f.d, f.x.data(), nq, k, f.lists, a.data()));
    ASSERT_TRUE(search_adc(*gp, other, f.d, f.x.data(), nq, k, f.lists, b.data()));
    EXPECT_EQ(a, b);
    std::sort(gone.begin(), gone.end());
    for (int64_t label : a)
        EXPECT_FALSE(std::binary_search(gone.begin(), gone.end(), label)) << label;
}

// ---------------------------------------------------------------- exact vectors

// A mirror loaded with its vectors re-ranks in the process and says so
// (is_exact); what crosses equals search_exact on an equal mirror in
// process, and each distance is the exact distance of its own row.
TEST(GpuProcess, LoadWithVectorsSearchesExact)
{
    auto dev = make_cpu_emulation_device();
    Channel ch(emulated_server);
    auto gp = ch.connect();
    uint32_t index = 10;
    for (Metric metric : {Metric::L2, Metric::InnerProduct, Metric::Cosine}) {
        SCOPED_TRACE(testutil::metric_name(metric));
        Data f(metric);
        const MirrorKey key{1, index, 100 + index, 1};
        index++;
        // L2: more queries than the server's 4096-query tile.
        const size_t nq = metric == Metric::L2 ? 4100 : 64, k = 10, nprobe = 3;
        std::vector<float> queries = testutil::gaussian_vectors(nq, f.d, 13);
        std::copy(f.x.begin() + 5 * f.d, f.x.begin() + 6 * f.d, queries.begin());

        gp->load(key, f.spec(true), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(),
                 f.x.data(), nullptr);
        StoreStatus st = gp->status();
        ASSERT_FALSE(st.mirrors.empty());
        EXPECT_EQ(st.mirrors.back().key, key);
        EXPECT_TRUE(st.mirrors.back().vectors);
        EXPECT_EQ(st.mirrors.back().bytes, dev->mirror_bytes(f.spec(true), f.n));

        auto direct = dev->create_mirror(f.spec(true));
        direct->add(f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), f.x.data(), nullptr);
        std::vector<double> want_dist(nq * k);
        std::vector<int64_t> want(nq * k);
        direct->search_exact(queries.data(), nq, k, nprobe, want_dist.data(), want.data(), nullptr);

        std::vector<int64_t> got(nq * k, -7);
        std::vector<double> exact(nq * k, -7.0);
        GpuIvfpqAnswerDists is_exact = GPU_IVFPQ_DISTS_NONE;
        ASSERT_TRUE(gp->search(key, f.d, queries.data(), nq, k, nprobe, nullptr, nullptr, nullptr, got.data(), exact.data(),
                               &is_exact));
        EXPECT_EQ(is_exact, GPU_IVFPQ_DISTS_EXACT);
        EXPECT_EQ(got, want);
        EXPECT_EQ(exact, want_dist);
        for (size_t q = 0; q < std::min<size_t>(nq, 64); q++)
            for (size_t i = 0; i < k; i++) {
                ASSERT_GE(f.row_of(got[q * k + i]), 0) << "query " << q << ", rank " << i;
                EXPECT_EQ(exact[q * k + i], exact_distance(metric, &queries[q * f.d],
                                                           f.vector_of(got[q * k + i]), f.d))
                    << "query " << q << ", rank " << i;
            }
        if (metric == Metric::L2) {
            EXPECT_EQ(got[0], f.labels[5]);
            EXPECT_EQ(exact[0], 0.0);
        }
    }
    EXPECT_TRUE(gp->alive());
}

// Searches in flight (send_search, receive_search), as many as the
// exchange has parts: each answered as the same search sent alone, in the
// order sent, each from its own part of the exchange, also when one is
// larger than another and with key ranges; one more, or any other call,
// while they are in flight is refused; a search too large to go beside one
// in flight is not sent (false), and goes once that one is received (the
// exchange then grows).
TEST(GpuProcess, SearchesInFlightAnswerInOrder)
{
    Channel ch(emulated_server);
    auto gp = ch.connect();
    Data f(Metric::L2);
    const MirrorKey key{1, 40, 140, 1};
    gp->load(key, f.spec(true), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), f.x.data(), nullptr);
    const size_t k = 10, nprobe = 3;
    auto alone = [&](const std::vector<float>& q, std::vector<int64_t>& labels, std::vector<double>& exact) {
        const size_t nq = q.size() / f.d;
        labels.assign(nq * k, -7);
        exact.assign(nq * k, -7.0);
        GpuIvfpqAnswerDists is_exact = GPU_IVFPQ_DISTS_NONE;
        ASSERT_TRUE(gp->search(key, f.d, q.data(), nq, k, nprobe, nullptr, nullptr, nullptr, labels.data(),
                               exact.data(), &is_exact));
        ASSERT_EQ(is_exact, GPU_IVFPQ_DISTS_EXACT);
    };
    const std::vector<float> qa = testutil::gaussian_vectors(3, f.d, 21), qb = testutil::gaussian_vectors(40, f.d, 22);
    std::vector<int64_t> la, lb;
    std::vector<double> ea, eb;
    alone(qa, la, ea);
    alone(qb, lb, eb);

    for (int round = 0; round < 3; round++) {
        // As many in flight as the exchange has parts; one more is refused.
        const int parts = GpuProcess::kMaxSearchesInFlight;
        std::vector<GpuProcess::SearchCall> calls(parts);
        for (int i = 0; i < parts; i++) {
            const bool small = i % 2 == 0;
            ASSERT_TRUE(gp->send_search(calls[i], key, f.d, (small ? qa : qb).data(), small ? 3 : 40, k, nprobe,
                                        nullptr, nullptr));
        }
        EXPECT_EQ(gp->searches_in_flight(), parts);
        GpuProcess::SearchCall extra;
        EXPECT_THROW(gp->send_search(extra, key, f.d, qa.data(), 3, k, nprobe, nullptr, nullptr), Error);
        EXPECT_THROW(gp->status(), Error);
        auto check = [&](GpuProcess::SearchCall& c, bool small) {
            const size_t nq = small ? 3 : 40;
            std::vector<int64_t> g(nq * k);
            std::vector<double> x(nq * k);
            GpuIvfpqAnswerDists is_exact = GPU_IVFPQ_DISTS_NONE;
            ASSERT_TRUE(gp->receive_search(c, nullptr, g.data(), x.data(), &is_exact));
            EXPECT_EQ(is_exact, GPU_IVFPQ_DISTS_EXACT);
            EXPECT_EQ(g, small ? la : lb);
            EXPECT_EQ(x, small ? ea : eb);
        };
        check(calls[0], true);
        // The next search goes into the part the first one left.
        GpuProcess::SearchCall d;
        ASSERT_TRUE(gp->send_search(d, key, f.d, qa.data(), 3, k, nprobe, nullptr, nullptr));
        for (int i = 1; i < parts; i++)
            check(calls[i], i % 2 == 0);
        check(d, true);
        EXPECT_EQ(gp->searches_in_flight(), 0);
    }
    // Larger than a part of the exchange beside one in flight: not sent;
    // sent once that one is received (the exchange then grows).
    const size_t big = 6000;  // 6000 x (d floats + 10 answers): more than a 1 MiB part
    const std::vector<float> qbig = testutil::gaussian_vectors(big, f.d, 23);
    {
        GpuProcess::SearchCall a, b;
        ASSERT_TRUE(gp->send_search(a, key, f.d, qa.data(), 3, k, nprobe, nullptr, nullptr));
        EXPECT_FALSE(gp->send_search(b, key, f.d, qbig.data(), big, k, nprobe, nullptr, nullptr));
        EXPECT_EQ(gp->searches_in_flight(), 1);
        std::vector<int64_t> ga(3 * k), gb(big * k);
        std::vector<double> xa(3 * k), xb(big * k);
        GpuIvfpqAnswerDists ex = GPU_IVFPQ_DISTS_NONE;
        ASSERT_TRUE(gp->receive_search(a, nullptr, ga.data(), xa.data(), &ex));
        EXPECT_EQ(ga, la);
        ASSERT_TRUE(gp->send_search(b, key, f.d, qbig.data(), big, k, nprobe, nullptr, nullptr));
        ASSERT_TRUE(gp->receive_search(b, nullptr, gb.data(), xb.data(), &ex));
        std::vector<int64_t> lbig;
        std::vector<double> ebig;
        alone(qbig, lbig, ebig);
        EXPECT_EQ(gb, lbig);
        EXPECT_EQ(xb, ebig);
    }
    // With key ranges and counts, against the same search sent alone.
    {
        std::vector<int64_t> lo(3, 0), hi(3, INT64_MAX), matched(3, -1), m2(3, -1);
        GpuProcess::SearchCall a, b;
        EXPECT_THROW(gp->send_search(a, key, f.d, qa.data(), 3, k, nprobe, lo.data(), nullptr), Error);
        EXPECT_EQ(gp->searches_in_flight(), 0);
        ASSERT_TRUE(gp->send_search(a, key, f.d, qb.data(), 40, k, nprobe, nullptr, nullptr));
        // A mirror without filter keys refuses ranges: the error comes with its reply, in order.
        ASSERT_TRUE(gp->send_search(b, key, f.d, qa.data(), 3, k, nprobe, lo.data(), hi.data()));
        std::vector<int64_t> gb(40 * k), g(3 * k);
        std::vector<double> xb(40 * k), x(3 * k);
        GpuIvfpqAnswerDists ex = GPU_IVFPQ_DISTS_NONE;
        ASSERT_TRUE(gp->receive_search(a, nullptr, gb.data(), xb.data(), &ex));
        EXPECT_EQ(gb, lb);
        EXPECT_THROW(gp->receive_search(b, matched.data(), g.data(), x.data(), &ex), Error);
        EXPECT_EQ(gp->searches_in_flight(), 0);
    }
    EXPECT_TRUE(gp->alive());
    // Other calls work again once nothing is in flight.
    EXPECT_FALSE(gp->status().mirrors.empty());
}

// Adds carry vectors of the mirror's dimension: the new rows are found at
// their exact distances; a wrong dimension, or no vectors for a mirror that
// keeps them, is the caller's error and changes nothing.
TEST(GpuProcess, AddWithVectorsFindsNewRowsExactly)
{
    Data f;
    const MirrorKey key{1, 10, 100, 1};
    Channel ch(emulated_server);
    auto gp = ch.connect();
    gp->load(key, f.spec(true), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(),
             f.x.data(), nullptr);

    const size_t na = 300;
    auto rows = f.new_rows(na, 21, 1000000);
    std::vector<float>& y = rows.x;
    std::vector<int32_t>& ylist = rows.list_ids;
    std::vector<uint8_t>& ycodes = rows.codes;
    std::vector<int64_t>& ylabels = rows.labels;
    EXPECT_TRUE(gp->add(key, f.m, na, ylist.data(), ycodes.data(), ylabels.data(), y.data(), f.d, nullptr));
    EXPECT_EQ(gp->status().mirrors.at(0).entries, f.n + na);

    auto dev = make_cpu_emulation_device();
    auto direct = dev->create_mirror(f.spec(true));
    direct->add(f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), f.x.data(), nullptr);
    direct->add(na, ylist.data(), ycodes.data(), ylabels.data(), y.data(), nullptr);

    const size_t nq = 40, k = 10, nprobe = 3;
    std::vector<double> want_dist(nq * k), exact(nq * k);
    std::vector<int64_t> want(nq * k), got(nq * k);
    direct->search_exact(y.data(), nq, k, nprobe, want_dist.data(), want.data(), nullptr);
    GpuIvfpqAnswerDists is_exact = GPU_IVFPQ_DISTS_NONE;
    ASSERT_TRUE(gp->search(key, f.d, y.data(), nq, k, nprobe, nullptr, nullptr, nullptr, got.data(), exact.data(), &is_exact));
    EXPECT_EQ(is_exact, GPU_IVFPQ_DISTS_EXACT);
    EXPECT_EQ(got, want);
    EXPECT_EQ(exact, want_dist);
    size_t own_first = 0;
    for (size_t q = 0; q < nq; q++) {
        const float* query = &y[q * f.d];
        for (size_t i = 0; i < k; i++) {
            const int64_t label = got[q * k + i];
            ASSERT_TRUE(label >= 1000000 || f.row_of(label) >= 0) << label;
            const float* v =
                label >= 1000000 ? &y[size_t(label - 1000000) * f.d] : f.vector_of(label);
            EXPECT_EQ(exact[q * k + i], exact_distance(Metric::L2, query, v, f.d))
                << "query " << q << ", rank " << i;
            // Its own row, when a candidate, comes first at distance 0.
            if (label == ylabels[q]) {
                EXPECT_EQ(i, 0u) << "query " << q;
                EXPECT_EQ(exact[q * k + i], 0.0) << "query " << q;
                own_first++;
            }
        }
    }
    EXPECT_GE(own_first, nq / 2) << "the added entries are not found for their own vectors";

    // Vectors of another dimension.
    EXPECT_EQ(error_kind([&] {
                  gp->add(key, f.m, na, ylist.data(), ycodes.data(), ylabels.data(), y.data(),
                          f.d / 2, nullptr);
              }),
              ErrorKind::InvalidArgument);
    // No vectors for a mirror that keeps them.
    EXPECT_EQ(error_kind([&] {
                  gp->add(key, f.m, na, ylist.data(), ycodes.data(), ylabels.data(), nullptr, 0, nullptr);
              }),
              ErrorKind::InvalidArgument);
    EXPECT_EQ(gp->status().mirrors.at(0).entries, f.n + na);
    EXPECT_TRUE(gp->alive());
    ASSERT_TRUE(gp->search(key, f.d, y.data(), nq, k, nprobe, nullptr, nullptr, nullptr, got.data(), exact.data(), &is_exact));
    EXPECT_EQ(got, want);
    EXPECT_EQ(exact, want_dist);
}

// A mirror without vectors (codes only, or made so by the budget) answers
// in ADC order with is_exact false and leaves the exact distances alone;
// vectors sent to it are ignored.
TEST(GpuProcess, CodesOnlyMirrorIsNotExact)
{
    Data f;
    const MirrorKey key{1, 10, 100, 1};
    auto dev = make_cpu_emulation_device();
    Channel ch(emulated_server);
    auto gp = ch.connect();
    gp->load(key, f.spec(false), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr, nullptr);
    EXPECT_FALSE(gp->status().mirrors.at(0).vectors);

    const size_t nq = 20, k = 10, nprobe = 3;
    auto direct = dev->create_mirror(f.spec(false));
    direct->add(f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr, nullptr);
    std::vector<float> adc(nq * k);
    std::vector<int64_t> want(nq * k), got(nq * k);
    std::vector<double> exact(nq * k, -7.0);
    direct->search(f.x.data(), nq, k, nprobe, adc.data(), want.data(), nullptr);
    GpuIvfpqAnswerDists is_exact = GPU_IVFPQ_DISTS_EXACT;
    ASSERT_TRUE(gp->search(key, f.d, f.x.data(), nq, k, nprobe, nullptr, nullptr, nullptr, got.data(), exact.data(), &is_exact));
    EXPECT_EQ(is_exact, GPU_IVFPQ_DISTS_NONE);
    EXPECT_EQ(got, want);
    EXPECT_EQ(std::count(exact.begin(), exact.end(), -7.0), std::ptrdiff_t(exact.size()));

    // Vectors sent along with an add: ignored, the entries go in.
    std::vector<int32_t> lists(f.list_ids.begin(), f.list_ids.begin() + 50);
    std::vector<uint8_t> codes(f.codes.begin(), f.codes.begin() + 50 * f.m);
    std::vector<int64_t> labels(50);
    std::iota(labels.begin(), labels.end(), int64_t(5000000));
    EXPECT_TRUE(gp->add(key, f.m, 50, lists.data(), codes.data(), labels.data(), f.x.data(), f.d, nullptr));
    EXPECT_EQ(gp->status().mirrors.at(0).entries, f.n + 50);
    is_exact = GPU_IVFPQ_DISTS_EXACT;
    ASSERT_TRUE(gp->search(key, f.d, f.x.data(), nq, k, nprobe, nullptr, nullptr, nullptr, got.data(), exact.data(), &is_exact));
    EXPECT_EQ(is_exact, GPU_IVFPQ_DISTS_NONE);

    // A budget that holds the codes but not the vectors: loaded without them.
    const size_t codes_bytes = dev->mirror_bytes(f.spec(false), f.n);
    gp->drop_all();
    gp->set_budget(codes_bytes);
    gp->load(key, f.spec(true), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(),
             f.x.data(), nullptr);
    StoreStatus st = gp->status();
    ASSERT_EQ(st.mirrors.size(), 1u);
    EXPECT_FALSE(st.mirrors[0].vectors);
    EXPECT_EQ(st.mirrors[0].bytes, codes_bytes);
    is_exact = GPU_IVFPQ_DISTS_EXACT;
    ASSERT_TRUE(gp->search(key, f.d, f.x.data(), nq, k, nprobe, nullptr, nullptr, nullptr, got.data(), exact.data(), &is_exact));
    EXPECT_EQ(is_exact, GPU_IVFPQ_DISTS_NONE);
    EXPECT_EQ(got, want);
    // With room, the same load keeps them.
    gp->set_budget(SIZE_MAX);
    gp->load(key, f.spec(true), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(),
             f.x.data(), nullptr);
    st = gp->status();
    ASSERT_EQ(st.mirrors.size(), 1u);
    EXPECT_TRUE(st.mirrors[0].vectors);
    EXPECT_EQ(st.mirrors[0].bytes, dev->mirror_bytes(f.spec(true), f.n));
    ASSERT_TRUE(gp->search(key, f.d, f.x.data(), nq, k, nprobe, nullptr, nullptr, nullptr, got.data(), exact.data(), &is_exact));
    EXPECT_EQ(is_exact, GPU_IVFPQ_DISTS_EXACT);
    EXPECT_EQ(got[0], f.labels[0]);
    EXPECT_EQ(exact[0], 0.0);
}

// A brute-force search through the process equals the mirror's own, and a
// mirror without vectors says it did not search (nothing written).
TEST(GpuProcess, BruteForceThroughTheProcess)
{
    Data f;
    const MirrorKey key{1, 10, 100, 1};
    auto dev = make_cpu_emulation_device();
    Channel ch(emulated_server);
    auto gp = ch.connect();
    gp->load(key, f.spec(true), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), f.x.data(), nullptr);
    auto direct = dev->create_mirror(f.spec(true));
    direct->add(f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), f.x.data(), nullptr);
    const size_t nq = 20, k = 12;
    std::vector<double> want_dist(nq * k), exact(nq * k);
    std::vector<int64_t> want(nq * k), got(nq * k);
    direct->brute_force(f.x.data(), nq, k, want_dist.data(), want.data());
    GpuIvfpqAnswerDists is_exact = GPU_IVFPQ_DISTS_NONE;
    ASSERT_TRUE(gp->search(key, f.d, f.x.data(), nq, k, 1, nullptr, nullptr, nullptr, got.data(), exact.data(),
                           &is_exact, true));
    EXPECT_EQ(is_exact, GPU_IVFPQ_DISTS_EXACT);
    EXPECT_EQ(got, want);
    EXPECT_EQ(exact, want_dist);
    // Not the probed search's answer: 1 list probed finds less than every entry.
    std::vector<double> probed(nq * k);
    std::vector<int64_t> probed_labels(nq * k);
    direct->search_exact(f.x.data(), nq, k, 1, probed.data(), probed_labels.data(), nullptr);
    EXPECT_NE(probed_labels, want);

    gp->load(key, f.spec(false), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr, nullptr);
    std::fill(got.begin(), got.end(), -7);
    is_exact = GPU_IVFPQ_DISTS_EXACT;
    ASSERT_TRUE(gp->search(key, f.d, f.x.data(), nq, k, 1, nullptr, nullptr, nullptr, got.data(), exact.data(),
                           &is_exact, true));
    EXPECT_EQ(is_exact, GPU_IVFPQ_DISTS_NONE);
    EXPECT_EQ(std::count(got.begin(), got.end(), -7), std::ptrdiff_t(got.size()));
}

TEST(GpuProcess, StatusBudgetAndOutOfMemory)
{
    Data f;
    auto dev = make_cpu_emulation_device();
    const size_t small = 500;
    const size_t big_bytes = dev->mirror_bytes(f.spec(), f.n);
    const size_t small_bytes = dev->mirror_bytes(f.spec(), small);
    const MirrorKey a{1, 10, 100, 1}, b{1, 11, 101, 1}, c{2, 12, 102, 1};

    Channel ch(emulated_server);
    auto gp = ch.connect();
    StoreStatus st = gp->status();
    EXPECT_TRUE(st.mirrors.empty());
    EXPECT_EQ(st.bytes, 0u);
    // Until the service sets one: three quarters of the device.
    EXPECT_EQ(st.budget, dev->memory_capacity() / 4 * 3);

    gp->load(a, f.spec(), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr, nullptr);
    gp->load(b, f.spec(), small, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr, nullptr);
    const size_t budget = big_bytes + small_bytes + 1000;
    gp->set_budget(budget);
    std::vector<int64_t> got(3 * 5);
    ASSERT_TRUE(search_adc(*gp, b, f.d, f.x.data(), 3, 5, 2, got.data()));

    st = gp->status();
    ASSERT_EQ(st.mirrors.size(), 2u);
    EXPECT_EQ(st.mirrors[0].key, a);
    EXPECT_EQ(st.mirrors[0].entries, f.n);
    EXPECT_EQ(st.mirrors[0].bytes, big_bytes);
    EXPECT_EQ(st.mirrors[0].queries, 0u);
    EXPECT_EQ(st.mirrors[1].key, b);
    EXPECT_EQ(st.mirrors[1].entries, small);
    EXPECT_EQ(st.mirrors[1].queries, 3u);
    EXPECT_EQ(st.bytes, big_bytes + small_bytes);
    EXPECT_EQ(st.budget, budget);
    EXPECT_EQ(st.evictions, 0u);

    // Below one mirror's size: a load that cannot fit is refused, and the
    // refusal is a device error, not the end of the process.
    gp->set_budget(big_bytes - 1);
    EXPECT_EQ(error_kind([&] {
                  gp->load(c, f.spec(), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(),
                           nullptr, nullptr);
              }),
              ErrorKind::OutOfMemory);
    EXPECT_TRUE(gp->alive());
    EXPECT_TRUE(gp->cause().empty());
    st = gp->status();
    EXPECT_EQ(st.mirrors.size(), 2u);  // c absent; nothing evicted for it
    EXPECT_EQ(st.budget, big_bytes - 1);

    // a (least recently used) goes; b fits.
    gp->enforce_budget();
    st = gp->status();
    ASSERT_EQ(st.mirrors.size(), 1u);
    EXPECT_EQ(st.mirrors[0].key, b);
    EXPECT_EQ(st.evictions, 1u);
    EXPECT_LE(st.bytes, st.budget);
}

// Inserts grow a mirror past the budget: the least recently used mirror
// goes, as when the budget shrinks, so the store stays within it.
TEST(GpuProcess, AppendsStayWithinTheBudget)
{
    Data f;
    auto dev = make_cpu_emulation_device();
    const size_t small = 500;
    const size_t small_bytes = dev->mirror_bytes(f.spec(), small);
    const size_t big_bytes = dev->mirror_bytes(f.spec(), f.n);
    const MirrorKey a{1, 10, 100, 1}, b{1, 11, 101, 1};

    Channel ch(emulated_server);
    auto gp = ch.connect();
    gp->load(a, f.spec(), small, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr, nullptr);
    gp->load(b, f.spec(), small, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr, nullptr);
    // Both fit, and b grown to every row fits alone, not beside a.
    const size_t budget = big_bytes + small_bytes / 2;
    gp->set_budget(budget);
    // b grows by every other row of the data (labels past the loaded ones).
    const size_t na = f.n - small;
    std::vector<int64_t> labels(f.labels.begin() + small, f.labels.end());
    ASSERT_TRUE(gp->add(b, f.m, na, f.list_ids.data() + small, f.codes.data() + small * f.m, labels.data(),
                        nullptr, 0, nullptr));
    StoreStatus st = gp->status();
    EXPECT_LE(st.bytes, st.budget);
    EXPECT_GE(st.evictions, 1u);
    // a, used least recently, went; b holds every row.
    ASSERT_EQ(st.mirrors.size(), 1u);
    EXPECT_EQ(st.mirrors[0].key, b);
    EXPECT_EQ(st.mirrors[0].entries, f.n);
}

TEST(GpuProcess, DeviceErrorsCrossWithTheirKind)
{
    Data f;
    const MirrorKey key{1, 10, 100, 1};
    Channel ch(emulated_server);
    auto gp = ch.connect();
    gp->load(key, f.spec(), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr, nullptr);

    const size_t big = kMaxSelectK + 1;
    std::vector<int64_t> labels(big);
    std::vector<float> dist(big);
    EXPECT_EQ(error_kind([&] { search_adc(*gp, key, f.d, f.x.data(), 1, 0, 2, labels.data()); }),
              ErrorKind::InvalidArgument);
    EXPECT_EQ(error_kind([&] { search_adc(*gp, key, f.d, f.x.data(), 1, big, 2, labels.data()); }),
              ErrorKind::InvalidArgument);
    EXPECT_EQ(error_kind([&] {
                  gp->exact_knn(f.x.data(), 1, f.x.data(), f.n, f.d, Metric::L2, big, dist.data(),
                                labels.data());
              }),
              ErrorKind::InvalidArgument);
    // m must divide d: a model the GPU cannot hold.
    MirrorSpec odd = f.spec();
    odd.m = 3;
    EXPECT_EQ(error_kind([&] {
                  gp->load(MirrorKey{1, 20, 200, 1}, odd, 1, f.list_ids.data(), f.codes.data(),
                           f.labels.data(), nullptr, nullptr);
              }),
              ErrorKind::Unsupported);
    // A list id out of range is the caller's error.
    std::vector<int32_t> bad_list = {int32_t(f.lists)};
    EXPECT_EQ(error_kind([&] {
                  gp->add(key, f.m, 1, bad_list.data(), f.codes.data(), f.labels.data(), nullptr, 0, nullptr);
              }),
              ErrorKind::InvalidArgument);

    // A request whose dimension or code size is not the mirror's would make
    // the mirror read past the request's arrays: refused.
    EXPECT_EQ(error_kind([&] { search_adc(*gp, key, f.d / 2, f.x.data(), 1, 5, 2, labels.data()); }),
              ErrorKind::InvalidArgument);
    EXPECT_EQ(error_kind([&] {
                  gp->add(key, f.m / 2, 1, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr, 0, nullptr);
              }),
              ErrorKind::InvalidArgument);
    EXPECT_EQ(gp->status().mirrors.at(0).entries, f.n);

    // The message crosses too.
    try {
        search_adc(*gp, key, f.d, f.x.data(), 1, big, 2, labels.data());
        ADD_FAILURE() << "k above the limit was served";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(std::to_string(kMaxSelectK)), std::string::npos) << e.what();
    }

    // The process lives on and still serves, k at the limit included.
    EXPECT_TRUE(gp->alive());
    EXPECT_TRUE(gp->cause().empty());
    ASSERT_TRUE(search_adc(*gp, key, f.d, f.x.data(), 1, kMaxSelectK, 2, labels.data()));
    EXPECT_EQ(labels[0], f.labels[0]);
}

TEST(GpuProcess, TrainEncodeExactMatchDirectCalls)
{
    Data f;
    auto dev = make_cpu_emulation_device();
    Channel ch(emulated_server);
    auto gp = ch.connect();

    // Not the defaults: each parameter must cross the channel to matter.
    IvfPqTrainParams p;
    p.iterations = 4;
    p.seed = 77;
    p.max_points_per_centroid = 32;
    std::vector<float> cents(f.lists * f.d), cbs(kPqCentroids * f.d);
    std::vector<float> want_cents(cents.size()), want_cbs(cbs.size());
    gp->train(f.x.data(), f.n, f.d, f.lists, f.m, Metric::L2, p, cents.data(), cbs.data());
    dev->train(f.x.data(), f.n, f.d, f.lists, f.m, Metric::L2, p, want_cents.data(), want_cbs.data());
    EXPECT_EQ(cents, want_cents);
    EXPECT_EQ(cbs, want_cbs);
    std::vector<float> default_cents(cents.size()), default_cbs(cbs.size());
    dev->train(f.x.data(), f.n, f.d, f.lists, f.m, Metric::L2, IvfPqTrainParams(), default_cents.data(),
               default_cbs.data());
    EXPECT_NE(cents, default_cents) << "the parameters do not change training: the test proves nothing";

    MirrorSpec s;
    s.d = f.d;
    s.lists = f.lists;
    s.m = f.m;
    s.metric = Metric::L2;
    s.centroids = cents.data();
    s.codebooks = cbs.data();
    std::vector<int32_t> ids(f.n, -5), want_ids(f.n);
    std::vector<uint8_t> codes(f.n * f.m), want_codes(f.n * f.m);
    gp->encode(s, f.x.data(), f.n, ids.data(), codes.data());
    dev->encode(s, f.x.data(), f.n, want_ids.data(), want_codes.data());
    EXPECT_EQ(ids, want_ids);
    EXPECT_EQ(codes, want_codes);

    const size_t nq = 7, k = 9;
    std::vector<float> queries = testutil::gaussian_vectors(nq, f.d, 5);
    for (Metric metric : {Metric::L2, Metric::InnerProduct, Metric::Cosine}) {
        SCOPED_TRACE(testutil::metric_name(metric));
        std::vector<float> dist(nq * k), want_dist(nq * k);
        std::vector<int64_t> labels(nq * k), want_labels(nq * k);
        gp->exact_knn(queries.data(), nq, f.x.data(), f.n, f.d, metric, k, dist.data(), labels.data());
        dev->exact_knn(queries.data(), nq, f.x.data(), f.n, f.d, metric, k, want_dist.data(),
                       want_labels.data());
        EXPECT_EQ(labels, want_labels);
        EXPECT_EQ(dist, want_dist);
    }
}

// Arrays above the exchange's 64 MiB keep: the exchange grows for the call
// and gives the memory back at the next, smaller one; both must be right
// (the server remaps at the size each request states).
TEST(GpuProcess, LargePayloadGrowsThenShrinksTheExchange)
{
    const size_t d = 32, n = 600000, nq = 2, k = 5;  // 77 MB of base rows
    std::vector<float> base = fast_uniform(n, d, 31);
    std::vector<float> queries = fast_uniform(nq, d, 32);

    Channel ch(emulated_server);
    auto gp = ch.connect();
    std::vector<float> dist(nq * k);
    std::vector<int64_t> labels(nq * k);
    gp->exact_knn(queries.data(), nq, base.data(), 1000, d, Metric::L2, k, dist.data(), labels.data());
    const uint64_t small_size = ch.exchange_size();
    EXPECT_LT(small_size, 64ull << 20);

    gp->exact_knn(queries.data(), nq, base.data(), n, d, Metric::L2, k, dist.data(), labels.data());
    const uint64_t big_size = ch.exchange_size();
    EXPECT_GE(big_size, n * d * sizeof(float));
    std::vector<int64_t> want;
    std::vector<double> want_dist;
    for (size_t q = 0; q < nq; q++) {
        SCOPED_TRACE("large, query " + std::to_string(q));
        reference_knn(queries.data() + q * d, base.data(), n, d, k, want, want_dist);
        for (size_t i = 0; i < k; i++) {
            EXPECT_EQ(labels[q * k + i], want[i]) << "rank " << i;
            EXPECT_NEAR(dist[q * k + i], want_dist[i], 1e-3 * (1 + want_dist[i])) << "rank " << i;
        }
    }

    // A small call over the rows at the end of the base: what the large call
    // left in the exchange must not leak into it.
    const size_t tail = 3000;
    const float* tail_base = base.data() + (n - tail) * d;
    gp->exact_knn(queries.data(), nq, tail_base, tail, d, Metric::L2, k, dist.data(), labels.data());
    const uint64_t shrunk = ch.exchange_size();
    EXPECT_LT(shrunk, big_size);
    EXPECT_LE(shrunk, 64ull << 20);
    for (size_t q = 0; q < nq; q++) {
        SCOPED_TRACE("small, query " + std::to_string(q));
        reference_knn(queries.data() + q * d, tail_base, tail, d, k, want, want_dist);
        for (size_t i = 0; i < k; i++) {
            EXPECT_EQ(labels[q * k + i], want[i]) << "rank " << i;
            EXPECT_NEAR(dist[q * k + i], want_dist[i], 1e-3 * (1 + want_dist[i])) << "rank " << i;
        }
    }
    EXPECT_TRUE(gp->alive());
}

TEST(GpuProcess, PeerGoneEndsTheProcess)
{
    // Exits after its announcement (between calls).
    {
        Channel ch([](ServerEnd& end) {
            auto dev = make_cpu_emulation_device();
            announce(end.sock, dev.get(), Kind::Emulated, Status::Ok, dev->description());
            end.close_sock();
            return 0;
        });
        auto gp = ch.connect();
        ch.join();
        EXPECT_TRUE(gp->alive());  // nothing has noticed yet
        EXPECT_EQ(error_kind([&] { gp->drop_all(); }), ErrorKind::Internal);
        EXPECT_FALSE(gp->alive());
        EXPECT_FALSE(gp->cause().empty());

        auto t0 = Clock::now();
        try {
            gp->status();
            ADD_FAILURE() << "a call to a dead process returned";
        } catch (const Error& e) {
            EXPECT_EQ(e.kind(), ErrorKind::Internal);
            EXPECT_NE(std::string(e.what()).find(gp->cause()), std::string::npos) << e.what();
        }
        EXPECT_LT(seconds_since(t0), 0.5);  // no wait for an answer
        EXPECT_FALSE(gp->alive());
    }
    // Dies while a call waits for it.
    {
        Channel ch([](ServerEnd& end) {
            auto dev = make_cpu_emulation_device();
            announce(end.sock, dev.get(), Kind::Emulated, Status::Ok, dev->description());
            Request q;
            (void)::recv(end.sock, &q, sizeof(q), 0);
            end.close_sock();
            return 0;
        });
        auto gp = ch.connect();
        Data f;
        std::vector<int64_t> labels(5);
        EXPECT_EQ(error_kind([&] {
                      search_adc(*gp, MirrorKey{1, 2, 3, 4}, f.d, f.x.data(), 1, 5, 1, labels.data());
                  }),
                  ErrorKind::Internal);
        EXPECT_FALSE(gp->alive());
        EXPECT_FALSE(gp->cause().empty());
        EXPECT_EQ(error_kind([&] { gp->drop_all(); }), ErrorKind::Internal);
    }
}

// A device whose context broke (a sticky CUDA error): its calls fail with
// an internal error and it reports itself unhealthy afterwards.
class BrokenDevice final : public ComputeDevice {
public:
    std::string description() const override { return "a device that breaks"; }
    size_t memory_capacity() const override { return 1 << 30; }
    size_t mirror_bytes(const MirrorSpec&, size_t) const override { return 0; }
    std::unique_ptr<Mirror> create_mirror(const MirrorSpec&) override { fail(); }
    void train(const float*, size_t, size_t, size_t, size_t, Metric, const IvfPqTrainParams&, float*,
               float*) override
    {
        fail();
    }
    void exact_knn(const float*, size_t, const float*, size_t, size_t, Metric, size_t, float*,
                   int64_t*) override
    {
        fail();
    }
    void encode(const MirrorSpec&, const float*, size_t, int32_t*, uint8_t*) override { fail(); }
    bool healthy() override { return false; }

private:
    [[noreturn]] static void fail() { throw Error(ErrorKind::Internal, "an illegal memory access"); }
};

// A sticky device error ends the process after the reply that says so: the
// service sees it gone with that cause (and starts another), instead of a
// process whose every later call would fail.
TEST(GpuProcess, StickyDeviceErrorEndsTheProcess)
{
    Channel ch([](ServerEnd& end) {
        BrokenDevice dev;
        announce(end.sock, &dev, Kind::Gpu, Status::Ok, dev.description());
        return serve(end.sock, end.exchange, dev);
    });
    auto gp = ch.connect();
    Data f;
    std::vector<float> dist(5);
    std::vector<int64_t> labels(5);
    EXPECT_EQ(error_kind([&] {
                  gp->exact_knn(f.x.data(), 1, f.x.data(), 10, f.d, Metric::L2, 5, dist.data(), labels.data());
              }),
              ErrorKind::Internal);
    EXPECT_FALSE(gp->alive());
    EXPECT_NE(gp->cause().find("reported that its device failed"), std::string::npos) << gp->cause();
    EXPECT_NE(gp->cause().find("illegal memory access"), std::string::npos) << gp->cause();
    EXPECT_EQ(ch.server_rc(), kExitDeviceFailed);
}

TEST(GpuProcess, TimeoutAbandonsAStuckCall)
{
    Channel ch(stalling_server());
    auto gp = ch.connect();
    gp->set_timeout(0.3);
    auto t0 = Clock::now();
    EXPECT_EQ(error_kind([&] { gp->drop_all(); }), ErrorKind::Internal);
    const double waited = seconds_since(t0);
    // Not before the timeout; and well before the server would close (10 s),
    // with slack for a loaded machine.
    EXPECT_GE(waited, 0.3);
    EXPECT_LT(waited, 2.0);
    EXPECT_FALSE(gp->alive());
    EXPECT_NE(gp->cause().find("did not answer"), std::string::npos) << gp->cause();
    // A late answer must never be taken for a later call's.
    EXPECT_EQ(error_kind([&] { gp->drop_all(); }), ErrorKind::Internal);
}

// The StopCheck is a plain function pointer: its state must be global.
std::atomic<bool> g_stop{false};
bool stop_requested() { return g_stop.load(); }

TEST(GpuProcess, StopCheckAbandonsAWait)
{
    g_stop = false;
    {
        // The service is told to stop while the process is busy with a call.
        Channel ch(stalling_server([] { g_stop = true; }));
        auto gp = ch.connect(stop_requested);
        ASSERT_TRUE(gp->alive());
        auto t0 = Clock::now();
        EXPECT_EQ(error_kind([&] { gp->drop_all(); }), ErrorKind::Internal);  // no timeout set
        EXPECT_LT(seconds_since(t0), 2.0);
        EXPECT_FALSE(gp->alive());
        EXPECT_NE(gp->cause().find("stopped"), std::string::npos) << gp->cause();
    }
    g_stop = false;
}

// The server's own checks, which the client never trips: requests are
// taken only whole and with the magic, and every region must lie inside
// the exchange as the request states it, which must exist at that size.
TEST(GpuProcessServer, RejectsMalformedRequestsAndRegions)
{
    Channel ch(emulated_server);
    const int sock = ch.raw_sock();
    Reply rep;
    ASSERT_EQ(::recv(sock, &rep, sizeof(rep), 0), ssize_t(sizeof(rep)));
    EXPECT_EQ(rep.seq, 0u);
    EXPECT_EQ(rep.status, Status::Ok);
    EXPECT_EQ(rep.value[1], uint64_t(Kind::Emulated));

    auto exchange = [&](Request q) {
        Reply r;
        EXPECT_EQ(::send(sock, &q, sizeof(q), MSG_NOSIGNAL), ssize_t(sizeof(q)));
        EXPECT_EQ(::recv(sock, &r, sizeof(r), 0), ssize_t(sizeof(r)));
        EXPECT_EQ(r.seq, q.seq);
        return r;
    };
    const uint64_t mib = 1 << 20;
    ASSERT_EQ(ftruncate(ch.exchange_fd(), off_t(mib)), 0);

    Request bad;
    bad.magic = 0x12345678;
    bad.seq = 1;
    rep = exchange(bad);
    EXPECT_EQ(rep.status, Status::Internal);
    EXPECT_NE(std::string(rep.message).find("malformed"), std::string::npos) << rep.message;

    Request q;
    q.op = Op::Exact;
    q.seq = 2;
    q.exchange_bytes = mib;
    q.d = 4;
    q.nq = 1;
    q.n = 100;
    q.k = 1;
    q.region[0] = {0, 16};
    q.region[1] = {64, 1600};
    q.region[2] = {1728, 4};
    q.region[3] = {mib - 4, 8};  // past the end
    rep = exchange(q);
    EXPECT_EQ(rep.status, Status::InvalidArgument);
    EXPECT_NE(std::string(rep.message).find("outside the exchange"), std::string::npos) << rep.message;

    q.seq = 3;
    q.region[3] = {1792, 8};
    q.region[1] = {64, 1596};  // smaller than n x d floats
    rep = exchange(q);
    EXPECT_EQ(rep.status, Status::InvalidArgument);

    q.seq = 4;
    q.region[1] = {64, 1600};
    rep = exchange(q);
    EXPECT_EQ(rep.status, Status::Ok) << rep.message;

    q.seq = 5;
    q.exchange_bytes = 2 * mib;  // more than the segment holds
    rep = exchange(q);
    EXPECT_EQ(rep.status, Status::Internal);
    EXPECT_NE(std::string(rep.message).find("smaller than stated"), std::string::npos) << rep.message;

    Request unknown;
    unknown.op = static_cast<Op>(999);
    unknown.seq = 6;
    rep = exchange(unknown);
    EXPECT_EQ(rep.status, Status::InvalidArgument);

    // Half a request: the magic and op, nothing else.
    Request half;
    half.op = Op::DropAll;
    half.seq = 7;
    ASSERT_EQ(::send(sock, &half, 8, MSG_NOSIGNAL), 8);
    ASSERT_EQ(::recv(sock, &rep, sizeof(rep), 0), ssize_t(sizeof(rep)));
    EXPECT_EQ(rep.status, Status::Internal);

    // Still serving after all of it.
    Request drop;
    drop.op = Op::DropAll;
    drop.seq = 8;
    rep = exchange(drop);
    EXPECT_EQ(rep.status, Status::Ok);
}

// A process with several devices: mirrors placed over them answer through
// the channel as one device does, searches in flight run at once on
// different devices and come back in order, and Devices lists each device.
TEST(GpuProcess, SeveralDevicesAnswerAsOne)
{
    Channel ch([](ServerEnd& end) {
        std::vector<std::unique_ptr<ComputeDevice>> devs;
        for (int i = 0; i < 3; i++)
            devs.push_back(make_cpu_emulation_device());
        DeviceSet set(std::move(devs), {0, 1, 2});
        announce(end.sock, set, Kind::Emulated);
        return serve(end.sock, end.exchange, set);
    });
    auto gp = ch.connect();
    EXPECT_NE(gp->description().find("3 x "), std::string::npos) << gp->description();
    Channel single(emulated_server);
    auto one = single.connect();
    Data f(Metric::L2);
    const size_t k = 10, nprobe = 3;
    const std::vector<float> qa = testutil::gaussian_vectors(5, f.d, 31), qb = testutil::gaussian_vectors(300, f.d, 32);
    for (Placement p : {Placement::Replicate, Placement::Shard}) {
        const MirrorKey key{1, 50, 150, uint32_t(p)};
        gp->load(key, f.spec(true), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), f.x.data(), nullptr, p);
        one->load(key, f.spec(true), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), f.x.data(), nullptr);
        StoreStatus st = gp->status();
        ASSERT_EQ(st.mirrors.size(), 1u);
        EXPECT_EQ(st.mirrors[0].placement, uint32_t(p));
        EXPECT_EQ(st.mirrors[0].device_mask, 7u);
        for (const std::vector<float>* q : {&qa, &qb}) {
            const size_t nq = q->size() / f.d;
            std::vector<int64_t> want(nq * k), got1(nq * k), got2(nq * k);
            std::vector<double> wx(nq * k), gx1(nq * k), gx2(nq * k);
            GpuIvfpqAnswerDists e0 = GPU_IVFPQ_DISTS_NONE, e1 = GPU_IVFPQ_DISTS_NONE, e2 = GPU_IVFPQ_DISTS_NONE;
            ASSERT_TRUE(one->search(key, f.d, q->data(), nq, k, nprobe, nullptr, nullptr, nullptr, want.data(),
                                    wx.data(), &e0));
            // Two in flight: both run, answered in the order sent.
            GpuProcess::SearchCall a, b;
            ASSERT_TRUE(gp->send_search(a, key, f.d, q->data(), nq, k, nprobe, nullptr, nullptr));
            ASSERT_TRUE(gp->send_search(b, key, f.d, q->data(), nq, k, nprobe, nullptr, nullptr));
            ASSERT_TRUE(gp->receive_search(a, nullptr, got1.data(), gx1.data(), &e1));
            ASSERT_TRUE(gp->receive_search(b, nullptr, got2.data(), gx2.data(), &e2));
            EXPECT_TRUE(e0 == GPU_IVFPQ_DISTS_EXACT && e1 == e0 && e2 == e0);
            EXPECT_EQ(got1, want);
            EXPECT_EQ(gx1, wx);
            EXPECT_EQ(got2, want);
            EXPECT_EQ(gx2, wx);
        }
        // Another call after searches: they were answered first.
        EXPECT_EQ(gp->drop_index(key.db, key.index), 1u);
    }
    std::vector<DeviceInfo> devs = gp->devices();
    ASSERT_EQ(devs.size(), 3u);
    uint64_t queries = 0;
    for (size_t i = 0; i < devs.size(); i++) {
        EXPECT_EQ(devs[i].ordinal, i);
        EXPECT_EQ(devs[i].alive, 1u);
        EXPECT_GT(devs[i].budget, 0u);
        queries += devs[i].queries;
    }
    EXPECT_GT(queries, 0u);
    EXPECT_TRUE(gp->alive());
}

}  // namespace
}  // namespace gpuproc
}  // namespace gpuivfpq
