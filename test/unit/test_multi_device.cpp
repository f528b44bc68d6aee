// Several devices in one GPU process (device_set.h, placed_mirror.h,
// shard_merge.h, MirrorStore's placement), on CPU emulation devices.
//
// Why: a replicated or sharded mirror must answer exactly what one device
// holding the whole index answers (the paper's shard merge; replicas are
// copies), through appends, removals and filters; the placement must
// follow the budgets (replicas while a copy fits one device, else shards);
// and a device that fails must take its replicas with it while the others
// answer, or make a sharded mirror reload over the devices left.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "engine/error.h"
#include "gpu_process/compute_device.h"
#include "gpu_process/device_set.h"
#include "gpu_process/mirror_store.h"
#include "gpu_process/placed_mirror.h"
#include "gpu_process/shard_merge.h"
#include "mirror_fixture.h"
#include "test_util.h"

namespace gpuivfpq {
namespace {

using testutil::EncodedSet;

// A CPU emulation device that can be made to fail like a GPU whose context
// is lost: every later call throws Error(Internal) and healthy() is false.
class FailingDevice final : public ComputeDevice {
public:
    FailingDevice() : inner_(make_cpu_emulation_device()) {}
    void fail() { broken_->store(true); }

    std::string description() const override { return "failing emulation"; }
    size_t memory_capacity() const override { return inner_->memory_capacity(); }
    size_t mirror_bytes(const MirrorSpec& s, size_t n) const override { return inner_->mirror_bytes(s, n); }
    std::unique_ptr<Mirror> create_mirror(const MirrorSpec& spec) override
    {
        check();
        return std::make_unique<FailingMirror>(inner_->create_mirror(spec), broken_);
    }
    void train(const float* x, size_t n, size_t d, size_t lists, size_t m, Metric metric,
               const IvfPqTrainParams& p, float* c, float* cb) override
    {
        check();
        inner_->train(x, n, d, lists, m, metric, p, c, cb);
    }
    void exact_knn(const float* q, size_t nq, const float* b, size_t n, size_t d, Metric metric, size_t k,
                   float* dist, int64_t* labels) override
    {
        check();
        inner_->exact_knn(q, nq, b, n, d, metric, k, dist, labels);
    }
    void encode(const MirrorSpec& s, const float* x, size_t n, int32_t* l, uint8_t* c) override
    {
        check();
        inner_->encode(s, x, n, l, c);
    }
    bool healthy() override { return !broken_->load(); }

private:
    class FailingMirror final : public Mirror {
    public:
        FailingMirror(std::unique_ptr<Mirror> m, std::shared_ptr<std::atomic<bool>> broken)
            : m_(std::move(m)), broken_(std::move(broken))
        {
        }
        void add(size_t n, const int32_t* l, const uint8_t* c, const int64_t* lab, const float* v,
                 const int64_t* k) override
        {
            check();
            m_->add(n, l, c, lab, v, k);
        }
        bool has_vectors() const override { return m_->has_vectors(); }
        bool has_keys() const override { return m_->has_keys(); }
        void search(const float* q, size_t nq, size_t k, size_t np, float* d, int64_t* l,
                    const KeyRanges* r) override
        {
            check();
            m_->search(q, nq, k, np, d, l, r);
        }
        void search_exact(const float* q, size_t nq, size_t k, size_t np, double* d, int64_t* l,
                          const KeyRanges* r) override
        {
            check();
            m_->search_exact(q, nq, k, np, d, l, r);
        }
        void brute_force(const float* q, size_t nq, size_t k, double* d, int64_t* l) override
        {
            check();
            m_->brute_force(q, nq, k, d, l);
        }
        size_t remove(size_t n, const int64_t* l) override
        {
            check();
            return m_->remove(n, l);
        }
        size_t entries() const override { return m_->entries(); }
        size_t bytes() const override { return m_->bytes(); }

    private:
        void check() const
        {
            if (broken_->load())
                throw Error(ErrorKind::Internal, "the device's context is lost");
        }
        std::unique_ptr<Mirror> m_;
        std::shared_ptr<std::atomic<bool>> broken_;
    };
    void check() const
    {
        if (broken_->load())
            throw Error(ErrorKind::Internal, "the device's context is lost");
    }
    std::unique_ptr<ComputeDevice> inner_;
    std::shared_ptr<std::atomic<bool>> broken_ = std::make_shared<std::atomic<bool>>(false);
};

// n failing emulation devices (they work until fail()), and pointers to them.
struct Devices {
    std::vector<FailingDevice*> raw;
    std::unique_ptr<DeviceSet> set;
    explicit Devices(size_t n)
    {
        std::vector<std::unique_ptr<ComputeDevice>> devs;
        for (size_t i = 0; i < n; i++) {
            auto d = std::make_unique<FailingDevice>();
            raw.push_back(d.get());
            devs.push_back(std::move(d));
        }
        set = std::make_unique<DeviceSet>(std::move(devs), std::vector<uint32_t>{});
    }
};

// Everything one search call answers, to compare a placed mirror with one device.
struct Answers {
    std::vector<float> adc;
    std::vector<int64_t> adc_labels, exact_labels, brute_labels, matched;
    std::vector<double> exact, brute;
};

Answers ask(Mirror& m, const std::vector<float>& queries, size_t nq, size_t k, size_t nprobe, bool filtered)
{
    Answers a;
    a.adc.resize(nq * k);
    a.adc_labels.resize(nq * k);
    a.exact.resize(nq * k);
    a.exact_labels.resize(nq * k);
    a.brute.resize(nq * k);
    a.brute_labels.resize(nq * k);
    a.matched.assign(nq, -1);
    std::vector<int64_t> lo(nq), hi(nq);
    for (size_t q = 0; q < nq; q++) {
        lo[q] = int64_t(q % 5);
        hi[q] = lo[q] + 2;
    }
    KeyRanges r{lo.data(), hi.data(), a.matched.data()};
    m.search(queries.data(), nq, k, nprobe, a.adc.data(), a.adc_labels.data(), filtered ? &r : nullptr);
    m.search_exact(queries.data(), nq, k, nprobe, a.exact.data(), a.exact_labels.data(), filtered ? &r : nullptr);
    m.brute_force(queries.data(), nq, k, a.brute.data(), a.brute_labels.data());
    return a;
}

void expect_same(const Answers& a, const Answers& b)
{
    EXPECT_EQ(a.adc_labels, b.adc_labels);
    EXPECT_EQ(a.adc, b.adc);
    EXPECT_EQ(a.exact_labels, b.exact_labels);
    EXPECT_EQ(a.exact, b.exact);
    EXPECT_EQ(a.brute_labels, b.brute_labels);
    EXPECT_EQ(a.brute, b.brute);
    EXPECT_EQ(a.matched, b.matched);
}

std::vector<int64_t> filter_keys(const EncodedSet& s)
{
    std::vector<int64_t> keys;
    for (size_t i = 0; i < s.n; i++)
        keys.push_back(int64_t(i % 7));
    return keys;
}

TEST(ShardMerge, AssignListsBalancesEntries)
{
    std::vector<size_t> sizes = {100, 1, 50, 50, 0, 30, 20, 70, 5, 0};
    std::vector<int32_t> shard = assign_lists(sizes, 3);
    ASSERT_EQ(shard.size(), sizes.size());
    std::vector<size_t> load(3, 0);
    for (size_t l = 0; l < sizes.size(); l++) {
        ASSERT_GE(shard[l], 0);
        ASSERT_LT(shard[l], 3);
        load[size_t(shard[l])] += sizes[l];
    }
    // 326 entries: greedy largest-first keeps every share within the largest list of the mean.
    for (size_t s = 0; s < 3; s++)
        EXPECT_LE(load[s], 326 / 3 + 100) << s;
    EXPECT_EQ(shard, assign_lists(sizes, 3));  // deterministic
    EXPECT_EQ(testutil::error_kind([&] { assign_lists(sizes, 0); }), ErrorKind::InvalidArgument);
}

TEST(ShardMerge, MergesLikeOneSortedList)
{
    std::mt19937_64 rng(5);
    const size_t nq = 20, k = 7, shards = 3;
    std::vector<std::vector<float>> d(shards, std::vector<float>(nq * k));
    std::vector<std::vector<int64_t>> l(shards, std::vector<int64_t>(nq * k));
    for (size_t s = 0; s < shards; s++)
        for (size_t q = 0; q < nq; q++) {
            // Each shard's row: sorted, some padded, ties across shards.
            size_t found = rng() % (k + 1);
            std::vector<float> row;
            for (size_t j = 0; j < found; j++)
                row.push_back(float(rng() % 10));
            std::sort(row.begin(), row.end());
            for (size_t j = 0; j < k; j++) {
                d[s][q * k + j] = j < found ? row[j] : std::numeric_limits<float>::infinity();
                l[s][q * k + j] = j < found ? int64_t(s * 1000 + q * 10 + j) : -1;
            }
        }
    std::vector<ShardRows<float>> rows;
    for (size_t s = 0; s < shards; s++)
        rows.push_back({d[s].data(), l[s].data()});
    std::vector<float> out(nq * k);
    std::vector<int64_t> lab(nq * k);
    merge_adc(nq, k, rows, out.data(), lab.data());
    for (size_t q = 0; q < nq; q++) {
        std::vector<std::pair<float, int64_t>> all;
        for (size_t s = 0; s < shards; s++)
            for (size_t j = 0; j < k; j++)
                if (l[s][q * k + j] >= 0)
                    all.emplace_back(d[s][q * k + j], l[s][q * k + j]);
        std::sort(all.begin(), all.end());
        for (size_t j = 0; j < k; j++) {
            if (j < all.size()) {
                EXPECT_EQ(lab[q * k + j], all[j].second);
                EXPECT_EQ(out[q * k + j], all[j].first);
            } else {
                EXPECT_EQ(lab[q * k + j], -1);
            }
        }
    }
}

// A store over three devices and one over a single device, loaded alike.
struct Pair {
    EncodedSet s;
    std::vector<int64_t> keys = filter_keys(s);
    std::unique_ptr<ComputeDevice> one_dev = make_cpu_emulation_device();
    MirrorStore one{*one_dev};
    Devices many{3};
    MirrorStore placed{*many.set};
    MirrorKey key{1, 2, 3, 4};

    Mirror* load_one()
    {
        MirrorSpec spec = s.spec(true);
        spec.filter_keys = true;
        return one.load(key, spec, s.n, s.list_ids.data(), s.codes.data(), s.labels.data(), s.x.data(),
                        keys.data());
    }
    Mirror* load_placed(Placement p)
    {
        MirrorSpec spec = s.spec(true);
        spec.filter_keys = true;
        return placed.load(key, spec, s.n, s.list_ids.data(), s.codes.data(), s.labels.data(), s.x.data(),
                           keys.data(), p);
    }
};

TEST(MultiDevice, ReplicasAndShardsAnswerAsOneDevice)
{
    for (Placement p : {Placement::Replicate, Placement::Shard}) {
        SCOPED_TRACE(p == Placement::Shard ? "shards" : "replicas");
        Pair t;
        Mirror* one = t.load_one();
        Mirror* placed = t.load_placed(p);
        ASSERT_NE(placed, nullptr);
        MirrorInfo info = t.placed.list().at(0);
        EXPECT_EQ(info.placement, uint32_t(p));
        EXPECT_EQ(info.device_mask, 7u);
        EXPECT_EQ(info.entries, t.s.n);
        if (p == Placement::Shard) {
            // Each device holds a share, not a copy.
            for (size_t i = 0; i < 3; i++) {
                EXPECT_GT(t.placed.bytes_on(i), 0u);
                EXPECT_LT(t.placed.bytes_on(i), t.one.bytes());
            }
        } else {
            for (size_t i = 0; i < 3; i++)
                EXPECT_EQ(t.placed.bytes_on(i), t.one.bytes());
        }
        std::vector<float> queries = testutil::gaussian_vectors(300, t.s.d, 11);
        for (bool filtered : {false, true})
            for (size_t nprobe : {1, 3, 8}) {
                SCOPED_TRACE(testing::Message() << "filtered " << filtered << " nprobe " << nprobe);
                expect_same(ask(*one, queries, 300, 10, nprobe, filtered),
                            ask(*placed, queries, 300, 10, nprobe, filtered));
            }
        // Appends reach the part holding their list; removals every part.
        auto rows = t.s.new_rows(150, 99, 100000);
        std::vector<int64_t> k2(150, 3);
        one->add(150, rows.list_ids.data(), rows.codes.data(), rows.labels.data(), rows.x.data(), k2.data());
        placed->add(150, rows.list_ids.data(), rows.codes.data(), rows.labels.data(), rows.x.data(), k2.data());
        std::vector<int64_t> gone;
        for (size_t i = 0; i < t.s.n; i += 3)
            gone.push_back(t.s.labels[i]);
        gone.push_back(100003);
        EXPECT_EQ(one->remove(gone.size(), gone.data()), placed->remove(gone.size(), gone.data()));
        EXPECT_EQ(one->entries(), placed->entries());
        expect_same(ask(*one, queries, 300, 20, 4, true), ask(*placed, queries, 300, 20, 4, true));
    }
}

TEST(MultiDevice, AutoReplicatesWhileACopyFitsElseShards)
{
    Pair t;
    MirrorSpec spec = t.s.spec(true);
    spec.filter_keys = true;
    size_t copy = t.many.set->device(0).mirror_bytes(spec, t.s.n);
    t.placed.set_budget(copy);
    t.load_placed(Placement::Auto);
    EXPECT_EQ(t.placed.list().at(0).placement, uint32_t(Placement::Replicate));
    // A budget a copy cannot fit but a third of it can: shards, still with vectors.
    t.placed.set_budget(copy / 2);
    Mirror* m = t.load_placed(Placement::Auto);
    MirrorInfo info = t.placed.list().at(0);
    EXPECT_EQ(info.placement, uint32_t(Placement::Shard));
    EXPECT_TRUE(info.vectors);
    for (size_t i = 0; i < 3; i++)
        EXPECT_LE(t.placed.bytes_on(i), copy / 2);
    Mirror* one = t.load_one();
    std::vector<float> queries = testutil::gaussian_vectors(50, t.s.d, 12);
    expect_same(ask(*one, queries, 50, 10, 3, false), ask(*m, queries, 50, 10, 3, false));
    // Asked to replicate within that budget: the copies drop their vectors.
    t.load_placed(Placement::Replicate);
    info = t.placed.list().at(0);
    EXPECT_EQ(info.placement, uint32_t(Placement::Replicate));
    EXPECT_FALSE(info.vectors);
    // Nothing fits: out of memory, with the figures.
    t.placed.set_budget(1000);
    EXPECT_EQ(testutil::error_kind([&] { t.load_placed(Placement::Auto); }), ErrorKind::OutOfMemory);
}

// A device opened twice (its number listed twice: two contexts on one GPU)
// shares its budget between the two; the others keep theirs.
TEST(MultiDevice, ADeviceOpenedTwiceSharesItsBudget)
{
    std::vector<std::unique_ptr<ComputeDevice>> devs;
    for (int i = 0; i < 3; i++)
        devs.push_back(make_cpu_emulation_device());
    DeviceSet set(std::move(devs), {0, 0, 1});
    const size_t cap = set.device(0).memory_capacity();
    EXPECT_EQ(set.budget(0), cap / 4 * 3 / 2);
    EXPECT_EQ(set.budget(1), cap / 4 * 3 / 2);
    EXPECT_EQ(set.budget(2), set.device(2).memory_capacity() / 4 * 3);
    set.set_budget(1000);
    EXPECT_EQ(set.budget(0), 500u);
    EXPECT_EQ(set.budget(1), 500u);
    EXPECT_EQ(set.budget(2), 1000u);
}

TEST(MultiDevice, EvictsPerDevice)
{
    Pair t;
    MirrorSpec spec = t.s.spec(false);
    size_t copy = t.many.set->device(0).mirror_bytes(spec, t.s.n);
    // Room for one copy per device: a second index evicts the first.
    t.placed.set_budget(copy + copy / 2);
    auto load = [&](uint32_t index) {
        MirrorKey k{1, index, 3, 4};
        t.placed.load(k, spec, t.s.n, t.s.list_ids.data(), t.s.codes.data(), t.s.labels.data(), nullptr, nullptr,
                      Placement::Replicate);
    };
    load(10);
    load(11);
    EXPECT_EQ(t.placed.list().size(), 1u);
    EXPECT_EQ(t.placed.evictions(), 1u);
    for (size_t i = 0; i < 3; i++)
        EXPECT_LE(t.placed.bytes_on(i), copy + copy / 2);
}

TEST(MultiDevice, AFailedDeviceLeavesReplicasAndReloadsShards)
{
    Pair t;
    Mirror* one = t.load_one();
    Mirror* placed = t.load_placed(Placement::Replicate);
    std::vector<float> queries = testutil::gaussian_vectors(400, t.s.d, 13);
    Answers before = ask(*one, queries, 400, 10, 4, false);
    t.many.raw[1]->fail();
    // Large batches split over all replicas: the failed one's share is redone by the others.
    expect_same(before, ask(*placed, queries, 400, 10, 4, false));
    EXPECT_FALSE(t.many.set->alive(1));
    EXPECT_EQ(t.many.set->alive_devices(), (std::vector<size_t>{0, 2}));
    t.placed.drop_failed();
    EXPECT_EQ(t.placed.list().at(0).device_mask, 5u);
    EXPECT_EQ(t.placed.device_info().at(1).alive, 0u);

    // Shards: the mirror is gone once a shard's device fails; it reloads over the rest.
    Pair u;
    one = u.load_one();
    placed = u.load_placed(Placement::Shard);
    u.many.raw[2]->fail();
    std::vector<double> d(10);
    std::vector<int64_t> l(10);
    EXPECT_EQ(testutil::error_kind([&] { placed->search_exact(queries.data(), 1, 10, 4, d.data(), l.data(), nullptr); }),
              ErrorKind::Internal);
    (void)u.many.set->check_health(2);
    EXPECT_EQ(u.placed.find(u.key), nullptr);
    u.placed.drop_failed();
    EXPECT_TRUE(u.placed.list().empty());
    placed = u.load_placed(Placement::Shard);
    EXPECT_EQ(u.placed.list().at(0).device_mask, 3u);
    expect_same(ask(*one, queries, 400, 10, 4, true), ask(*placed, queries, 400, 10, 4, true));
}

TEST(MultiDevice, ReplicasServeConcurrentBatches)
{
    Pair t;
    Mirror* one = t.load_one();
    Mirror* placed = t.load_placed(Placement::Replicate);
    std::vector<float> queries = testutil::gaussian_vectors(64, t.s.d, 14);
    Answers want = ask(*one, queries, 64, 10, 4, true);
    // Small batches from several threads at once (as the GPU process's pool runs them).
    std::vector<std::thread> threads;
    std::vector<Answers> got(6);
    for (size_t i = 0; i < got.size(); i++)
        threads.emplace_back([&, i] { got[i] = ask(*placed, queries, 64, 10, 4, true); });
    for (auto& th : threads)
        th.join();
    for (const Answers& a : got)
        expect_same(want, a);
    uint64_t used = 0;
    for (const DeviceInfo& d : t.placed.device_info()) {
        EXPECT_EQ(d.alive, 1u);
        used += d.batches > 0 ? 1 : 0;
    }
    EXPECT_GE(used, 2u);  // more than one replica answered
}

// A device that only records what a lease asks of it: the wait handover
// its search calls would use (set_wait_handover).
class HandoverDevice final : public ComputeDevice {
public:
    HandoverDevice() : inner_(make_cpu_emulation_device()) {}
    std::string description() const override { return "handover emulation"; }
    size_t memory_capacity() const override { return inner_->memory_capacity(); }
    size_t mirror_bytes(const MirrorSpec& s, size_t n) const override { return inner_->mirror_bytes(s, n); }
    std::unique_ptr<Mirror> create_mirror(const MirrorSpec& spec) override { return inner_->create_mirror(spec); }
    void train(const float* x, size_t n, size_t d, size_t lists, size_t m, Metric metric,
               const IvfPqTrainParams& p, float* c, float* cb) override
    {
        inner_->train(x, n, d, lists, m, metric, p, c, cb);
    }
    void exact_knn(const float* q, size_t nq, const float* b, size_t n, size_t d, Metric metric, size_t k,
                   float* dist, int64_t* labels) override
    {
        inner_->exact_knn(q, nq, b, n, d, metric, k, dist, labels);
    }
    void encode(const MirrorSpec& s, const float* x, size_t n, int32_t* l, uint8_t* c) override
    {
        inner_->encode(s, x, n, l, c);
    }
    void set_wait_handover(void (*yield)(void*), void (*reclaim)(void*), void* arg) override
    {
        yield_ = yield;
        reclaim_ = reclaim;
        arg_ = arg;
    }
    // What a search call reads under its lease, before it waits.
    struct Handover {
        void (*yield)(void*);
        void (*reclaim)(void*);
        void* arg;
    };
    Handover handover() const { return {yield_, reclaim_, arg_}; }

private:
    std::unique_ptr<ComputeDevice> inner_;
    void (*yield_)(void*) = nullptr;
    void (*reclaim_)(void*) = nullptr;
    void* arg_ = nullptr;
};

// A lease that opts in (hand_over_at_wait, as a replica's search share
// does) lets go of its device for good when its call yields (as the CUDA
// device's search calls do once their work is queued): another thread's
// lease is granted at once, so that its batch is queued behind; a lease
// that does not opt in installs no handover; and the device's busy time
// is the union of the overlapping leases, from the first one's start to
// the last one's end. Without the handover the second lease would wait
// for the first, which waits for the second: the waits time out and fail.
TEST(MultiDevice, ALeaseHandsTheDeviceOverWhileItsCallWaits)
{
    HandoverDevice dev;
    DeviceSet set(dev);
    std::mutex m;
    std::condition_variable cv;
    bool yielded = false, second_done = false, second_ran = false;
    bool held_after = true, took_turn = false;
    void* first_arg = nullptr;
    void* second_sees = &dev;
    const auto t0 = std::chrono::steady_clock::now();
    std::thread first([&] {
        DeviceSet::Lease lease(set, 0);
        EXPECT_EQ(dev.handover().arg, nullptr);  // none until asked for
        lease.hand_over_at_wait();
        const HandoverDevice::Handover h = dev.handover();
        first_arg = h.arg;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));  // staging and queuing
        if (h.yield != nullptr && h.reclaim != nullptr) {
            h.yield(h.arg);  // the call's work is queued: it waits
            held_after = lease.held();
        }
        {
            std::unique_lock<std::mutex> g(m);
            yielded = true;
            cv.notify_all();
            took_turn = cv.wait_for(g, std::chrono::seconds(10), [&] { return second_done; });
        }
        if (h.reclaim != nullptr)
            h.reclaim(h.arg);  // the answers are read: the device stays with the other
        EXPECT_FALSE(lease.held());
    });
    std::thread second([&] {
        {
            std::unique_lock<std::mutex> g(m);
            if (!cv.wait_for(g, std::chrono::seconds(10), [&] { return yielded; }))
                return;
        }
        {
            DeviceSet::Lease lease(set, 0);  // granted while the first waits
            second_sees = dev.handover().arg;
            second_ran = true;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        std::lock_guard<std::mutex> g(m);
        second_done = true;
        cv.notify_all();
    });
    first.join();
    second.join();
    const uint64_t wall = uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                       std::chrono::steady_clock::now() - t0)
                                       .count());
    EXPECT_NE(first_arg, nullptr);
    EXPECT_FALSE(held_after);
    EXPECT_TRUE(second_ran);
    EXPECT_TRUE(took_turn);
    EXPECT_EQ(second_sees, nullptr);  // the first's handover went with it
    EXPECT_EQ(dev.handover().arg, nullptr);
    const std::vector<DeviceInfo> info = set.info({0});
    ASSERT_EQ(info.size(), 1u);
    EXPECT_GE(info[0].busy_ns, uint64_t(30000000));  // 10 ms alone, then 20 overlapped
    EXPECT_LE(info[0].busy_ns, wall);                // the union, not the sum
}

}  // namespace
}  // namespace gpuivfpq
