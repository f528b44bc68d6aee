// The service's mirror store and the CPU emulation of the GPU device: the
// emulated mirror ranks exactly like the engine's IVFADC; the store evicts
// least recently used mirrors to stay within its budget, refuses what cannot
// fit, and replaces older versions of an index.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "engine/error.h"
#include "engine/ivfpq.h"
#include "engine/search_limits.h"
#include "engine/topk.h"
#include "gpu_process/mirror_store.h"
#include "mirror_fixture.h"

namespace gpuivfpq {
namespace {

using Fixture = testutil::EncodedSet;

TEST(Mirror, EmulationRanksLikeTheEngine)
{
    Fixture f;
    auto dev = make_cpu_emulation_device();
    auto mirror = dev->create_mirror(f.spec());
    mirror->add(f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr, nullptr);
    EXPECT_EQ(mirror->entries(), f.n);

    const size_t k = 20, nprobe = 3;
    std::vector<float> dist(k);
    std::vector<int64_t> got(k);
    mirror->search(f.x.data() + 5 * f.d, 1, k, nprobe, dist.data(), got.data(), nullptr);

    // Direct: ADC over the probed lists with the engine's tables.
    IvfPqQuery q;
    f.model.prepare_query(f.x.data() + 5 * f.d, nprobe, q);
    TopK topk(k);
    std::vector<float> table(f.m * 256);
    for (size_t p = 0; p < q.lists.size(); p++) {
        float base = 0;
        f.model.list_table(q, p, table.data(), &base);
        for (size_t i = 0; i < f.n; i++)
            if (f.list_ids[i] == q.lists[p])
                topk.push(base + adc_lookup(&f.codes[i * f.m], table.data(), f.m), f.labels[i]);
    }
    auto want = topk.take_sorted();
    ASSERT_EQ(want.size(), k);
    for (size_t i = 0; i < k; i++) {
        EXPECT_EQ(got[i], want[i].label);
        EXPECT_FLOAT_EQ(dist[i], want[i].dist);
    }
    EXPECT_EQ(got[0], f.labels[5]);  // the query is row 5 itself
}

TEST(Mirror, PadsWhenFewerThanK)
{
    Fixture f;
    auto dev = make_cpu_emulation_device();
    auto mirror = dev->create_mirror(f.spec());
    mirror->add(3, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr, nullptr);
    std::vector<float> dist(10);
    std::vector<int64_t> got(10);
    mirror->search(f.x.data(), 1, 10, f.lists, dist.data(), got.data(), nullptr);
    EXPECT_NE(got[2], -1);
    EXPECT_EQ(got[3], -1);
    EXPECT_TRUE(std::isinf(dist[3]));
}

TEST(MirrorStore, BudgetEvictsLeastRecentlyUsed)
{
    Fixture f;
    auto dev = make_cpu_emulation_device();
    MirrorStore store(*dev);
    size_t one = dev->mirror_bytes(f.spec(), f.n);
    store.set_budget(one * 2 + one / 2);
    MirrorKey a{1, 10, 100, 1}, b{1, 11, 101, 1}, c{1, 12, 102, 1};
    store.load(a, f.spec(), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr, nullptr);
    store.load(b, f.spec(), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr, nullptr);
    ASSERT_NE(store.find(a), nullptr);  // a is now the most recently used
    store.load(c, f.spec(), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr, nullptr);
    EXPECT_NE(store.find(a), nullptr);
    EXPECT_EQ(store.find(b), nullptr);
    EXPECT_NE(store.find(c), nullptr);
    EXPECT_EQ(store.evictions(), 1u);
    EXPECT_LE(store.bytes(), store.budget());

    // Lowering the budget evicts down to it.
    store.set_budget(one);
    store.enforce_budget();
    EXPECT_EQ(store.list().size(), 1u);
}

TEST(MirrorStore, RefusesWhatCannotFitAndReplacesVersions)
{
    Fixture f;
    auto dev = make_cpu_emulation_device();
    MirrorStore store(*dev);
    size_t one = dev->mirror_bytes(f.spec(), f.n);
    store.set_budget(one / 2);
    MirrorKey a{1, 10, 100, 1};
    try {
        store.load(a, f.spec(), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr, nullptr);
        FAIL() << "a mirror larger than the budget was loaded";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::OutOfMemory);
    }
    EXPECT_EQ(store.find(a), nullptr);

    store.set_budget(one * 4);
    store.load(a, f.spec(), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr, nullptr);
    MirrorKey a2{1, 10, 200, 2};  // the same index after REINDEX
    store.load(a2, f.spec(), 10, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr, nullptr);
    EXPECT_EQ(store.find(a), nullptr);
    ASSERT_NE(store.find(a2), nullptr);
    EXPECT_EQ(store.find(a2)->entries(), 10u);
    EXPECT_EQ(store.drop_index(1, 10), 1u);
    EXPECT_TRUE(store.list().empty());
}

// The emulation refuses what the GPU refuses (src/engine/limits.h).
TEST(Mirror, EmulationKeepsTheGpuLimits)
{
    Fixture f;
    auto dev = make_cpu_emulation_device();
    auto mirror = dev->create_mirror(f.spec());
    mirror->add(f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr, nullptr);
    auto kind_of = [](auto&& fn) { return testutil::error_kind(fn); };
    const size_t big = kMaxSelectK + 1;
    std::vector<float> dist(big);
    std::vector<int64_t> labels(big);
    EXPECT_EQ(kind_of([&] { mirror->search(f.x.data(), 1, big, 2, dist.data(), labels.data(), nullptr); }),
              ErrorKind::InvalidArgument);
    EXPECT_EQ(kind_of([&] { mirror->search(f.x.data(), 1, 0, 2, dist.data(), labels.data(), nullptr); }),
              ErrorKind::InvalidArgument);
    EXPECT_EQ(kind_of([&] {
                  dev->exact_knn(f.x.data(), 1, f.x.data(), f.n, f.d, Metric::L2, big, dist.data(),
                                 labels.data());
              }),
              ErrorKind::InvalidArgument);
    // k at the limit is served (padded past the n entries there are not).
    mirror->search(f.x.data(), 1, kMaxSelectK, 2, dist.data(), labels.data(), nullptr);
    EXPECT_EQ(labels[0], f.labels[0]);
    // nprobe 0 is taken as 1, as on the GPU.
    mirror->search(f.x.data(), 1, 5, 0, dist.data(), labels.data(), nullptr);
    EXPECT_EQ(labels[0], f.labels[0]);
    // Wider codes than the GPU's shared-memory tables hold.
    const size_t m = kMaxGpuSubQuantizers * 2, d = m;
    std::vector<float> cents(f.lists * d, 0.0f), cbs(256 * d, 0.0f);
    MirrorSpec wide;
    wide.d = d;
    wide.lists = f.lists;
    wide.m = m;
    wide.centroids = cents.data();
    wide.codebooks = cbs.data();
    EXPECT_EQ(kind_of([&] { dev->create_mirror(wide); }), ErrorKind::Unsupported);
}

}  // namespace
}  // namespace gpuivfpq
