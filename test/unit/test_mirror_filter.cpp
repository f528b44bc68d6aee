// Mirrors that keep a filter key per entry (MirrorSpec::filter_keys) and
// searches restricted to a per-query key range (KeyRanges), on the CPU
// emulation and through the GPU process's channel (the server on a thread,
// as test_gpu_process.cpp runs it).
//
// Why: a filtered index scan served by the device must return what the
// same search returns over only the rows that pass the filter. So each
// filtered search is compared, row for row and bit for bit, with the
// unfiltered search of a mirror built from only the in-range entries (same
// model, same per-list order, same queries); every query of a batch gets a
// range of its own (a range read at the wrong query, or at the wrong tile of
// a large batch, changes the answer); matched is checked against counts made
// here from the probed lists; and add/remove must keep each key with its
// entry (a removal that compacts labels but not keys pairs survivors with
// other entries' keys).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/error.h"
#include "engine/ivfpq.h"
#include "gpu_process/compute_device.h"
#include "gpu_process/gpu_process_client.h"
#include "gpu_process/gpu_process_protocol.h"
#include "gpu_process/gpu_process_server.h"
#include "gpu_process/mirror_store.h"
#include "mirror_fixture.h"
#include "test_util.h"

namespace gpuivfpq {
namespace {

using Fixture = testutil::EncodedSet;
using testutil::error_kind;

constexpr int64_t kMinKey = std::numeric_limits<int64_t>::min();
constexpr int64_t kMaxKey = std::numeric_limits<int64_t>::max();
constexpr float kInfF = std::numeric_limits<float>::infinity();
constexpr double kInf = std::numeric_limits<double>::infinity();

// n filter keys, seeded: even values in -40..40 (duplicates, negatives; an
// odd key matches nothing).
std::vector<int64_t> make_keys(size_t n, uint64_t seed)
{
    std::mt19937_64 gen(seed);
    std::uniform_int_distribution<int> u(-20, 20);
    std::vector<int64_t> keys(n);
    for (int64_t& k : keys)
        k = 2 * int64_t(u(gen));
    return keys;
}

MirrorSpec keyed_spec(const Fixture& f, bool vectors)
{
    MirrorSpec s = f.spec(vectors);
    s.filter_keys = true;
    return s;
}

// Entries as the arrays Mirror::add takes, in the order they were added.
struct Entries {
    size_t d = 0, m = 0;
    std::vector<int32_t> lists;
    std::vector<uint8_t> codes;
    std::vector<int64_t> labels;
    std::vector<float> x;
    std::vector<int64_t> keys;

    size_t size() const { return labels.size(); }
    void push(int32_t list, const uint8_t* code, int64_t label, const float* v, int64_t key)
    {
        lists.push_back(list);
        codes.insert(codes.end(), code, code + m);
        labels.push_back(label);
        x.insert(x.end(), v, v + d);
        keys.push_back(key);
    }
    void append(size_t n, const int32_t* l, const uint8_t* c, const int64_t* lab, const float* v,
                const int64_t* k)
    {
        for (size_t i = 0; i < n; i++)
            push(l[i], c + i * m, lab[i], v + i * d, k[i]);
    }
    // The entries with lo <= key <= hi, order kept.
    Entries in_range(int64_t lo, int64_t hi) const
    {
        Entries out;
        out.d = d;
        out.m = m;
        for (size_t i = 0; i < size(); i++)
            if (keys[i] >= lo && keys[i] <= hi)
                out.push(lists[i], &codes[i * m], labels[i], &x[i * d], keys[i]);
        return out;
    }
    // Without the entries whose label is in gone, order kept.
    Entries without(const std::vector<int64_t>& gone) const
    {
        Entries out;
        out.d = d;
        out.m = m;
        for (size_t i = 0; i < size(); i++)
            if (std::find(gone.begin(), gone.end(), labels[i]) == gone.end())
                out.push(lists[i], &codes[i * m], labels[i], &x[i * d], keys[i]);
        return out;
    }
    int64_t key_of(int64_t label) const
    {
        auto it = std::find(labels.begin(), labels.end(), label);
        return it == labels.end() ? kMinKey : keys[size_t(it - labels.begin())];
    }
};

Entries entries_of(const Fixture& f, const std::vector<int64_t>& keys)
{
    Entries e;
    e.d = f.d;
    e.m = f.m;
    e.append(f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), f.x.data(), keys.data());
    return e;
}

// A mirror of e made with spec (keys and vectors passed as spec says).
std::unique_ptr<Mirror> mirror_of(ComputeDevice& dev, const MirrorSpec& spec, const Entries& e)
{
    auto mirror = dev.create_mirror(spec);
    if (e.size() > 0)
        mirror->add(e.size(), e.lists.data(), e.codes.data(), e.labels.data(),
                    spec.vectors ? e.x.data() : nullptr, spec.filter_keys ? e.keys.data() : nullptr);
    return mirror;
}

// The ranges a batch cycles through: query q gets kRanges[q % size].
struct Range {
    int64_t lo, hi;
    const char* what;
};
const std::vector<Range> kRanges = {
    {-10, 14, "band"},
    {5, 4, "empty (lo > hi)"},
    {kMinKey, kMaxKey, "all keys"},
    {6, 6, "single key"},
    {kMaxKey, kMinKey, "empty (extremes)"},
    {3, 3, "single absent key"},
    {kMinKey, -32, "low band (few)"},
    {-40, 40, "all keys, bounds inclusive"},
    {24, 38, "high band"},
    {-6, -6, "another single key"},
};

struct Batch {
    std::vector<float> queries;
    std::vector<int64_t> lo, hi;
    size_t nq = 0;
    const Range& range(size_t q) const { return kRanges[q % kRanges.size()]; }
};

// nq queries (every third a row of x, its own entry a candidate), each with
// the range of its position.
Batch make_batch(const Fixture& f, size_t nq, uint64_t seed)
{
    Batch b;
    b.nq = nq;
    b.queries = testutil::gaussian_vectors(nq, f.d, seed);
    for (size_t q = 0; q < nq; q += 3) {
        const size_t row = (q * 131 + 17) % f.n;
        std::copy(f.x.begin() + row * f.d, f.x.begin() + (row + 1) * f.d, b.queries.begin() + q * f.d);
    }
    for (size_t q = 0; q < nq; q++) {
        b.lo.push_back(b.range(q).lo);
        b.hi.push_back(b.range(q).hi);
    }
    return b;
}

// Lists probed for query under the model (nprobe clamped to 1..lists).
std::vector<int32_t> probed_lists(const Fixture& f, const float* query, size_t nprobe)
{
    IvfPqQuery prepared;
    f.model.prepare_query(query, std::min(std::max<size_t>(nprobe, 1), f.lists), prepared);
    return prepared.lists;
}

// In-range entries of e in the given lists.
int64_t count_in(const Entries& e, const std::vector<int32_t>& lists, int64_t lo, int64_t hi)
{
    int64_t n = 0;
    for (size_t i = 0; i < e.size(); i++)
        n += e.keys[i] >= lo && e.keys[i] <= hi &&
             std::find(lists.begin(), lists.end(), e.lists[i]) != lists.end();
    return n;
}

// Compares one filtered search (search, and search_exact when the mirror
// has vectors) of the batch with the unfiltered search of a mirror of only
// the in-range entries of all, per range; checks matched against the count
// of in-range entries of the probed lists, padding, and the keys of the
// labels returned. Returns how many rows were padded yet not empty.
size_t expect_filtered_equals_subset(ComputeDevice& dev, const Fixture& f, Mirror& filtered,
                                     const Entries& all, const Batch& b, size_t k, size_t nprobe)
{
    const size_t nq = b.nq;
    const bool exact = filtered.has_vectors();
    std::vector<float> dist(nq * k, -7.0f);
    std::vector<int64_t> labels(nq * k, -7), matched(nq, -7);
    std::vector<double> xdist(nq * k, -7.0);
    std::vector<int64_t> xlabels(nq * k, -7), xmatched(nq, -7);
    KeyRanges r{b.lo.data(), b.hi.data(), matched.data()};
    filtered.search(b.queries.data(), nq, k, nprobe, dist.data(), labels.data(), &r);
    if (exact) {
        KeyRanges xr{b.lo.data(), b.hi.data(), xmatched.data()};
        filtered.search_exact(b.queries.data(), nq, k, nprobe, xdist.data(), xlabels.data(), &xr);
        EXPECT_EQ(xmatched, matched) << "search_exact counts other entries than search";
    }

    size_t padded = 0;
    for (size_t ri = 0; ri < kRanges.size(); ri++) {
        const Range& range = kRanges[ri];
        SCOPED_TRACE(std::string("range ") + range.what);
        // The same model over only the in-range entries, searched unfiltered.
        Entries sub = all.in_range(range.lo, range.hi);
        MirrorSpec spec = f.spec(exact);
        auto subset = mirror_of(dev, spec, sub);
        std::vector<float> want_dist(nq * k);
        std::vector<int64_t> want(nq * k), xwant(nq * k);
        std::vector<double> xwant_dist(nq * k);
        subset->search(b.queries.data(), nq, k, nprobe, want_dist.data(), want.data(), nullptr);
        if (exact)
            subset->search_exact(b.queries.data(), nq, k, nprobe, xwant_dist.data(), xwant.data(), nullptr);

        for (size_t q = ri; q < nq; q += kRanges.size()) {
            SCOPED_TRACE("query " + std::to_string(q));
            const size_t at = q * k;
            EXPECT_TRUE(std::equal(&labels[at], &labels[at + k], &want[at])) << "ADC labels";
            EXPECT_TRUE(std::equal(&dist[at], &dist[at + k], &want_dist[at])) << "ADC distances";
            if (exact) {
                EXPECT_TRUE(std::equal(&xlabels[at], &xlabels[at + k], &xwant[at])) << "exact labels";
                EXPECT_TRUE(std::equal(&xdist[at], &xdist[at + k], &xwant_dist[at])) << "exact distances";
            }
            // matched: the in-range entries of the probed lists, counted here.
            const int64_t want_matched =
                count_in(all, probed_lists(f, &b.queries[q * f.d], nprobe), range.lo, range.hi);
            EXPECT_EQ(matched[q], want_matched);
            // As many candidates as the probed lists hold in range (at most
            // k), then (+inf, -1); each label's key in the range.
            const size_t found = size_t(std::min<int64_t>(int64_t(k), want_matched));
            for (size_t i = 0; i < k; i++) {
                if (i < found) {
                    const int64_t key = all.key_of(labels[at + i]);
                    EXPECT_TRUE(key >= range.lo && key <= range.hi)
                        << "rank " << i << ": label " << labels[at + i] << " has key " << key;
                    EXPECT_LT(dist[at + i], kInfF) << "rank " << i;
                    if (exact) {
                        const int64_t xkey = all.key_of(xlabels[at + i]);
                        EXPECT_TRUE(xkey >= range.lo && xkey <= range.hi)
                            << "exact rank " << i << ": label " << xlabels[at + i] << " has key " << xkey;
                    }
                } else {
                    EXPECT_EQ(labels[at + i], -1) << "rank " << i;
                    EXPECT_EQ(dist[at + i], kInfF) << "rank " << i;
                    if (exact) {
                        EXPECT_EQ(xlabels[at + i], -1) << "exact rank " << i;
                        EXPECT_EQ(xdist[at + i], kInf) << "exact rank " << i;
                    }
                }
            }
            padded += found > 0 && found < k;
        }
    }
    return padded;
}

// ---------------------------------------------------------------- the mirror

// Several ranges in one batch, ADC and exact, with k above what some ranges
// hold: each row is the unfiltered search of a mirror of only its in-range
// entries.
TEST(MirrorFilter, FilteredSearchEqualsSearchOfTheInRangeEntries)
{
    auto dev = make_cpu_emulation_device();
    for (Metric metric : {Metric::L2, Metric::InnerProduct}) {
        SCOPED_TRACE(testutil::metric_name(metric));
        Fixture f(metric);
        const std::vector<int64_t> keys = make_keys(f.n, 5);
        const Entries all = entries_of(f, keys);
        for (bool vectors : {false, true}) {
            SCOPED_TRACE(vectors ? "with vectors" : "codes only");
            auto mirror = mirror_of(*dev, keyed_spec(f, vectors), all);
            EXPECT_TRUE(mirror->has_keys());
            EXPECT_EQ(mirror->has_vectors(), vectors);
            EXPECT_EQ(mirror->entries(), f.n);
            const size_t k = 30, nprobe = 3;
            const Batch b = make_batch(f, 3 * kRanges.size(), 17);
            const size_t padded = expect_filtered_equals_subset(*dev, f, *mirror, all, b, k, nprobe);
            // Some rows hold fewer than k candidates (and more than none):
            // padding after real candidates is exercised.
            EXPECT_GT(padded, 0u);

            // The filter matters: the band's answers are not the unfiltered ones.
            std::vector<float> dist(b.nq * k), plain_dist(b.nq * k);
            std::vector<int64_t> labels(b.nq * k), plain(b.nq * k), matched(b.nq);
            KeyRanges r{b.lo.data(), b.hi.data(), matched.data()};
            mirror->search(b.queries.data(), b.nq, k, nprobe, dist.data(), labels.data(), &r);
            mirror->search(b.queries.data(), b.nq, k, nprobe, plain_dist.data(), plain.data(), nullptr);
            EXPECT_FALSE(std::equal(labels.begin(), labels.begin() + k, plain.begin()));
            // A range of all keys is no filter at all (query 2 has one).
            ASSERT_EQ(b.range(2).lo, kMinKey);
            EXPECT_TRUE(std::equal(&labels[2 * k], &labels[3 * k], &plain[2 * k]));
        }
    }
}

// A filtered search without a matched array filters as one with it (which
// the other tests hold to the in-range subset), ADC and exact.
TEST(MirrorFilter, MatchedIsOptional)
{
    auto dev = make_cpu_emulation_device();
    Fixture f;
    const std::vector<int64_t> keys = make_keys(f.n, 5);
    const Entries all = entries_of(f, keys);
    auto mirror = mirror_of(*dev, keyed_spec(f, true), all);
    const Batch b = make_batch(f, 2 * kRanges.size(), 23);
    const size_t k = 12, nprobe = 2;
    KeyRanges without{b.lo.data(), b.hi.data(), nullptr};
    std::vector<int64_t> matched(b.nq, -7);
    KeyRanges with{b.lo.data(), b.hi.data(), matched.data()};

    std::vector<float> fa(b.nq * k), fc(b.nq * k);
    std::vector<int64_t> la(b.nq * k), lc(b.nq * k), plain(b.nq * k);
    mirror->search(b.queries.data(), b.nq, k, nprobe, fa.data(), la.data(), &without);
    mirror->search(b.queries.data(), b.nq, k, nprobe, fc.data(), lc.data(), &with);
    EXPECT_EQ(la, lc);
    EXPECT_EQ(fa, fc);
    mirror->search(b.queries.data(), b.nq, k, nprobe, fc.data(), plain.data(), nullptr);
    EXPECT_NE(la, plain);  // the ranges filter

    std::vector<double> xa(b.nq * k), xc(b.nq * k);
    std::fill(matched.begin(), matched.end(), -7);
    mirror->search_exact(b.queries.data(), b.nq, k, nprobe, xa.data(), la.data(), &without);
    mirror->search_exact(b.queries.data(), b.nq, k, nprobe, xc.data(), lc.data(), &with);
    EXPECT_EQ(la, lc);
    EXPECT_EQ(xa, xc);
    EXPECT_EQ(std::count(matched.begin(), matched.end(), -7), 0);
    mirror->search_exact(b.queries.data(), b.nq, k, nprobe, xc.data(), plain.data(), nullptr);
    EXPECT_NE(la, plain);
}

// matched counts the in-range entries of the probed lists: with every list
// probed (nprobe = lists, or above it: clamped), of the whole mirror.
TEST(MirrorFilter, MatchedCountsTheInRangeEntriesOfTheProbedLists)
{
    auto dev = make_cpu_emulation_device();
    Fixture f;
    const std::vector<int64_t> keys = make_keys(f.n, 7);
    const Entries all = entries_of(f, keys);
    auto mirror = mirror_of(*dev, keyed_spec(f, false), all);
    const Batch b = make_batch(f, 2 * kRanges.size(), 29);
    const size_t k = 5;
    std::vector<float> dist(b.nq * k);
    std::vector<int64_t> labels(b.nq * k);

    for (size_t nprobe : {f.lists, f.lists + 5}) {
        SCOPED_TRACE("nprobe " + std::to_string(nprobe));
        std::vector<int64_t> matched(b.nq, -7);
        KeyRanges r{b.lo.data(), b.hi.data(), matched.data()};
        mirror->search(b.queries.data(), b.nq, k, nprobe, dist.data(), labels.data(), &r);
        for (size_t q = 0; q < b.nq; q++) {
            const Range& range = b.range(q);
            const int64_t want =
                std::count_if(keys.begin(), keys.end(), [&](int64_t key) { return key >= range.lo && key <= range.hi; });
            EXPECT_EQ(matched[q], want) << "query " << q << ", range " << range.what;
        }
        EXPECT_EQ(matched[2], int64_t(f.n));  // all keys
        EXPECT_EQ(matched[1], 0);            // lo > hi
        EXPECT_EQ(matched[5], 0);            // a key no entry has
    }

    // Fewer lists: fewer entries, exactly those of the lists probed
    // (nprobe 0 probes one).
    for (size_t nprobe : {size_t(0), size_t(1), size_t(3)}) {
        SCOPED_TRACE("nprobe " + std::to_string(nprobe));
        std::vector<int64_t> matched(b.nq, -7), all_lists(b.nq, -7);
        KeyRanges r{b.lo.data(), b.hi.data(), matched.data()};
        mirror->search(b.queries.data(), b.nq, k, nprobe, dist.data(), labels.data(), &r);
        for (size_t q = 0; q < b.nq; q++) {
            const Range& range = b.range(q);
            const std::vector<int32_t> lists = probed_lists(f, &b.queries[q * f.d], nprobe);
            ASSERT_EQ(lists.size(), std::max<size_t>(nprobe, 1));
            EXPECT_EQ(matched[q], count_in(all, lists, range.lo, range.hi))
                << "query " << q << ", range " << range.what;
        }
        EXPECT_LT(matched[2], int64_t(f.n));
        EXPECT_GT(matched[2], 0);
    }
}

// Adds and removals keep each key with its entry: after two keyed batches
// and removals from the middle of lists (old and new entries alike), the
// filtered searches equal those of a mirror rebuilt from the surviving
// in-range entries.
TEST(MirrorFilter, AddAndRemoveKeepKeysWithTheirLabels)
{
    auto dev = make_cpu_emulation_device();
    Fixture f;
    const std::vector<int64_t> keys = make_keys(f.n, 11);
    Entries all = entries_of(f, keys);
    auto mirror = mirror_of(*dev, keyed_spec(f, true), all);

    auto b1 = f.new_rows(300, 31, 1000000);
    auto b2 = f.new_rows(200, 32, 2000000);
    const std::vector<int64_t> k1 = make_keys(300, 33), k2 = make_keys(200, 34);
    mirror->add(300, b1.list_ids.data(), b1.codes.data(), b1.labels.data(), b1.x.data(), k1.data());
    mirror->add(200, b2.list_ids.data(), b2.codes.data(), b2.labels.data(), b2.x.data(), k2.data());
    all.append(300, b1.list_ids.data(), b1.codes.data(), b1.labels.data(), b1.x.data(), k1.data());
    all.append(200, b2.list_ids.data(), b2.codes.data(), b2.labels.data(), b2.x.data(), k2.data());
    EXPECT_EQ(mirror->entries(), f.n + 500);

    const size_t k = 25, nprobe = 3;
    // Queries near the added rows too, so that they are candidates.
    Batch b = make_batch(f, 3 * kRanges.size(), 37);
    for (size_t q = 1; q < b.nq; q += 3)
        std::copy(&b1.x[q * f.d], &b1.x[(q + 1) * f.d], &b.queries[q * f.d]);
    {
        SCOPED_TRACE("after the adds");
        expect_filtered_equals_subset(*dev, f, *mirror, all, b, k, nprobe);
    }

    std::vector<int64_t> gone;
    for (size_t i = 0; i < f.n; i += 3)
        gone.push_back(f.labels[i]);
    for (size_t i = 1; i < 300; i += 4)
        gone.push_back(b1.labels[i]);
    for (size_t i = 0; i < 50; i++)
        gone.push_back(b2.labels[i]);
    const size_t real = gone.size();
    gone.push_back(-5);          // unknown
    gone.push_back(gone.front());  // duplicate
    EXPECT_EQ(mirror->remove(gone.size(), gone.data()), real);
    const Entries kept = all.without(gone);
    ASSERT_EQ(kept.size(), f.n + 500 - real);
    EXPECT_EQ(mirror->entries(), kept.size());
    {
        SCOPED_TRACE("after the removal");
        expect_filtered_equals_subset(*dev, f, *mirror, kept, b, k, nprobe);
    }

    // And a keyed add after the removal lands with its keys.
    auto b3 = f.new_rows(100, 35, 3000000);
    const std::vector<int64_t> k3 = make_keys(100, 36);
    mirror->add(100, b3.list_ids.data(), b3.codes.data(), b3.labels.data(), b3.x.data(), k3.data());
    Entries after = kept;
    after.append(100, b3.list_ids.data(), b3.codes.data(), b3.labels.data(), b3.x.data(), k3.data());
    for (size_t q = 2; q < b.nq; q += 3)
        std::copy(&b3.x[q * f.d], &b3.x[(q + 1) * f.d], &b.queries[q * f.d]);
    {
        SCOPED_TRACE("after an add that follows the removal");
        expect_filtered_equals_subset(*dev, f, *mirror, after, b, k, nprobe);
    }
}

// Keys must come exactly with a keyed mirror, and ranges only to one.
TEST(MirrorFilter, KeysAndRangesAgainstTheMirrorsKindAreRefused)
{
    auto dev = make_cpu_emulation_device();
    Fixture f;
    const std::vector<int64_t> keys = make_keys(f.n, 5);
    const size_t n = 100, k = 5;
    std::vector<float> dist(k);
    std::vector<double> xdist(k);
    std::vector<int64_t> labels(k), lo{kMinKey}, hi{kMaxKey}, matched{-7};
    KeyRanges r{lo.data(), hi.data(), matched.data()};

    for (bool vectors : {false, true}) {
        SCOPED_TRACE(vectors ? "with vectors" : "codes only");
        const float* x = vectors ? f.x.data() : nullptr;
        matched[0] = -7;
        auto keyed = dev->create_mirror(keyed_spec(f, vectors));
        EXPECT_EQ(error_kind([&] {
                      keyed->add(n, f.list_ids.data(), f.codes.data(), f.labels.data(), x, nullptr);
                  }),
                  ErrorKind::InvalidArgument);
        EXPECT_EQ(keyed->entries(), 0u);
        // Nothing to add takes no keys.
        keyed->add(0, nullptr, nullptr, nullptr, nullptr, nullptr);
        keyed->add(n, f.list_ids.data(), f.codes.data(), f.labels.data(), x, keys.data());
        EXPECT_EQ(keyed->entries(), n);

        auto keyless = dev->create_mirror(f.spec(vectors));
        EXPECT_FALSE(keyless->has_keys());
        EXPECT_EQ(error_kind([&] {
                      keyless->add(n, f.list_ids.data(), f.codes.data(), f.labels.data(), x, keys.data());
                  }),
                  ErrorKind::InvalidArgument);
        EXPECT_EQ(keyless->entries(), 0u);
        keyless->add(n, f.list_ids.data(), f.codes.data(), f.labels.data(), x, nullptr);
        EXPECT_EQ(error_kind([&] {
                      keyless->search(f.x.data(), 1, k, 2, dist.data(), labels.data(), &r);
                  }),
                  ErrorKind::InvalidArgument);
        if (vectors)
            EXPECT_EQ(error_kind([&] {
                          keyless->search_exact(f.x.data(), 1, k, 2, xdist.data(), labels.data(), &r);
                      }),
                      ErrorKind::InvalidArgument);
        EXPECT_EQ(matched[0], -7);
        // Unfiltered, both serve.
        keyless->search(f.x.data(), 1, k, 2, dist.data(), labels.data(), nullptr);
        EXPECT_EQ(labels[0], f.labels[0]);
        keyed->search(f.x.data(), 1, k, 2, dist.data(), labels.data(), nullptr);
        EXPECT_EQ(labels[0], f.labels[0]);
        keyed->search(f.x.data(), 1, k, 2, dist.data(), labels.data(), &r);
        EXPECT_EQ(labels[0], f.labels[0]);
        EXPECT_GT(matched[0], 0);
    }

    // The store's load: a keyed spec without keys is refused.
    MirrorStore store(*dev);
    const MirrorKey key{1, 10, 100, 1};
    EXPECT_EQ(error_kind([&] {
                  store.load(key, keyed_spec(f, false), n, f.list_ids.data(), f.codes.data(),
                             f.labels.data(), nullptr, nullptr);
              }),
              ErrorKind::InvalidArgument);
    EXPECT_EQ(store.find(key), nullptr);
}

// The store keeps the keys (and says so) even when the budget makes it drop
// the vectors.
TEST(MirrorFilter, StoreListsFilterKeysAndKeepsThemWithinTheBudget)
{
    auto dev = make_cpu_emulation_device();
    Fixture f;
    const std::vector<int64_t> keys = make_keys(f.n, 5);
    const Entries all = entries_of(f, keys);
    const MirrorKey a{1, 10, 100, 1}, b{1, 11, 101, 1};
    MirrorStore store(*dev);
    store.load(a, keyed_spec(f, true), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), f.x.data(),
               keys.data());
    store.load(b, f.spec(true), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), f.x.data(),
               keys.data());  // keys given to a keyless spec: not kept
    std::vector<MirrorInfo> list = store.list();
    ASSERT_EQ(list.size(), 2u);
    EXPECT_EQ(list[0].key, a);
    EXPECT_TRUE(list[0].filter_keys);
    EXPECT_TRUE(list[0].vectors);
    EXPECT_EQ(list[0].bytes, dev->mirror_bytes(keyed_spec(f, true), f.n));
    EXPECT_EQ(list[1].key, b);
    EXPECT_FALSE(list[1].filter_keys);
    EXPECT_EQ(list[1].bytes, dev->mirror_bytes(f.spec(true), f.n));
    EXPECT_GT(list[0].bytes, list[1].bytes);

    // Room for codes and keys, not vectors: loaded without the vectors, with the keys.
    store.drop_all();
    store.set_budget(dev->mirror_bytes(keyed_spec(f, false), f.n));
    Mirror* m = store.load(a, keyed_spec(f, true), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(),
                           f.x.data(), keys.data());
    ASSERT_NE(m, nullptr);
    list = store.list();
    ASSERT_EQ(list.size(), 1u);
    EXPECT_FALSE(list[0].vectors);
    EXPECT_TRUE(list[0].filter_keys);
    EXPECT_TRUE(m->has_keys());
    const Batch batch = make_batch(f, kRanges.size(), 41);
    expect_filtered_equals_subset(*dev, f, *m, all, batch, 20, 3);
    // Less than the keys take: refused, not loaded without them.
    store.drop_all();
    store.set_budget(dev->mirror_bytes(keyed_spec(f, false), f.n) - 1);
    EXPECT_EQ(error_kind([&] {
                  store.load(a, keyed_spec(f, true), f.n, f.list_ids.data(), f.codes.data(),
                             f.labels.data(), f.x.data(), keys.data());
              }),
              ErrorKind::OutOfMemory);
    EXPECT_TRUE(store.list().empty());
}

// ---------------------------------------------------------------- the GPU process

}  // namespace

namespace gpuproc {
namespace {

// A socket pair and an exchange segment with the emulated server on a
// thread (what gpu_process_main.cpp runs for --emulate, minus the process);
// the client must be destroyed before the Channel (closing its socket ends
// serve()).
class Channel {
public:
    Channel()
    {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
            throw std::runtime_error(std::string("socketpair: ") + std::strerror(errno));
        client_sock_ = sv[0];
        server_sock_ = sv[1];
        exchange_ = memfd_create("gpu_ivfpq filter test exchange", MFD_CLOEXEC);
        if (exchange_ < 0)
            throw std::runtime_error(std::string("memfd_create: ") + std::strerror(errno));
        thread_ = std::thread([this] {
            auto dev = make_cpu_emulation_device();
            announce(server_sock_, dev.get(), Kind::Emulated, Status::Ok, dev->description());
            server_rc_ = serve(server_sock_, exchange_, *dev);
        });
    }
    ~Channel()
    {
        if (client_sock_ >= 0)
            ::close(client_sock_);
        if (thread_.joinable())
            thread_.join();
        ::close(server_sock_);
        ::close(exchange_);
    }
    std::unique_ptr<GpuProcess> connect()
    {
        int sock = client_sock_;
        client_sock_ = -1;
        return std::make_unique<GpuProcess>(sock, fcntl(exchange_, F_DUPFD_CLOEXEC, 0), nullptr);
    }

private:
    int client_sock_ = -1, server_sock_ = -1, exchange_ = -1;
    std::thread thread_;
    std::atomic<int> server_rc_{-1};
};

// Load, add and filtered search through the channel answer as the same
// calls on an emulated mirror in process (more queries than the server's
// 4096-query tile, so each tile must read its own queries' ranges), and
// the status lists the keys.
TEST(MirrorFilterProcess, KeyedLoadAddSearchMatchTheMirrorInProcess)
{
    Fixture f;
    const std::vector<int64_t> keys = make_keys(f.n, 5);
    auto dev = make_cpu_emulation_device();
    const MirrorKey exact_key{1, 10, 100, 1}, adc_key{1, 11, 101, 1}, plain_key{1, 12, 102, 1};
    Channel ch;
    auto gp = ch.connect();
    gp->load(exact_key, keyed_spec(f, true), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(),
             f.x.data(), keys.data());
    gp->load(adc_key, keyed_spec(f, false), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(),
             nullptr, keys.data());
    gp->load(plain_key, f.spec(false), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr,
             nullptr);
    auto direct_exact = dev->create_mirror(keyed_spec(f, true));
    auto direct_adc = dev->create_mirror(keyed_spec(f, false));
    direct_exact->add(f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), f.x.data(), keys.data());
    direct_adc->add(f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr, keys.data());

    const size_t na = 300;
    auto rows = f.new_rows(na, 21, 1000000);
    const std::vector<int64_t> new_keys = make_keys(na, 22);
    EXPECT_TRUE(gp->add(exact_key, f.m, na, rows.list_ids.data(), rows.codes.data(), rows.labels.data(),
                        rows.x.data(), f.d, new_keys.data()));
    EXPECT_TRUE(gp->add(adc_key, f.m, na, rows.list_ids.data(), rows.codes.data(), rows.labels.data(),
                        nullptr, 0, new_keys.data()));
    direct_exact->add(na, rows.list_ids.data(), rows.codes.data(), rows.labels.data(), rows.x.data(),
                      new_keys.data());
    direct_adc->add(na, rows.list_ids.data(), rows.codes.data(), rows.labels.data(), nullptr, new_keys.data());

    StoreStatus st = gp->status();
    ASSERT_EQ(st.mirrors.size(), 3u);
    EXPECT_EQ(st.mirrors[0].key, exact_key);
    EXPECT_TRUE(st.mirrors[0].filter_keys);
    EXPECT_TRUE(st.mirrors[0].vectors);
    EXPECT_EQ(st.mirrors[0].entries, f.n + na);
    EXPECT_EQ(st.mirrors[0].bytes, dev->mirror_bytes(keyed_spec(f, true), f.n + na));
    EXPECT_EQ(st.mirrors[1].key, adc_key);
    EXPECT_TRUE(st.mirrors[1].filter_keys);
    EXPECT_FALSE(st.mirrors[1].vectors);
    EXPECT_EQ(st.mirrors[2].key, plain_key);
    EXPECT_FALSE(st.mirrors[2].filter_keys);

    // 4100 queries: the last 4 in a second tile, whose ranges must be theirs.
    Batch b = make_batch(f, 4100, 43);
    for (size_t q = 1; q < b.nq; q += 7)
        std::copy(&rows.x[(q % na) * f.d], &rows.x[(q % na + 1) * f.d], &b.queries[q * f.d]);
    const size_t nq = b.nq, k = 10, nprobe = 3;
    {
        SCOPED_TRACE("with vectors");
        std::vector<double> want_dist(nq * k), exact(nq * k, -7.0);
        std::vector<int64_t> want(nq * k), got(nq * k, -7), want_matched(nq, -9), matched(nq, -7);
        KeyRanges r{b.lo.data(), b.hi.data(), want_matched.data()};
        direct_exact->search_exact(b.queries.data(), nq, k, nprobe, want_dist.data(), want.data(), &r);
        GpuIvfpqAnswerDists is_exact = GPU_IVFPQ_DISTS_NONE;
        ASSERT_TRUE(gp->search(exact_key, f.d, b.queries.data(), nq, k, nprobe, b.lo.data(), b.hi.data(),
                               matched.data(), got.data(), exact.data(), &is_exact));
        EXPECT_EQ(is_exact, GPU_IVFPQ_DISTS_EXACT);
        EXPECT_EQ(got, want);
        EXPECT_EQ(exact, want_dist);
        EXPECT_EQ(matched, want_matched);
        // Not a vacuous comparison: padded rows and new rows are in it.
        EXPECT_GT(std::count(got.begin(), got.end(), -1), 0);
        EXPECT_GT(std::count_if(got.begin(), got.end(), [](int64_t l) { return l >= 1000000; }), 0);
        // The second tile's counts are its own queries' (counted here).
        Entries all = entries_of(f, keys);
        all.append(na, rows.list_ids.data(), rows.codes.data(), rows.labels.data(), rows.x.data(),
                   new_keys.data());
        for (size_t q = 4090; q < nq; q++)
            EXPECT_EQ(matched[q], count_in(all, probed_lists(f, &b.queries[q * f.d], nprobe), b.lo[q], b.hi[q]))
                << "query " << q;
    }
    {
        SCOPED_TRACE("codes only");
        std::vector<float> want_dist(nq * k);
        std::vector<double> exact(nq * k, -7.0);
        std::vector<int64_t> want(nq * k), got(nq * k, -7), want_matched(nq, -9), matched(nq, -7);
        KeyRanges r{b.lo.data(), b.hi.data(), want_matched.data()};
        direct_adc->search(b.queries.data(), nq, k, nprobe, want_dist.data(), want.data(), &r);
        GpuIvfpqAnswerDists is_exact = GPU_IVFPQ_DISTS_EXACT;
        ASSERT_TRUE(gp->search(adc_key, f.d, b.queries.data(), nq, k, nprobe, b.lo.data(), b.hi.data(),
                               matched.data(), got.data(), exact.data(), &is_exact));
        EXPECT_EQ(is_exact, GPU_IVFPQ_DISTS_NONE);
        EXPECT_EQ(got, want);
        EXPECT_EQ(matched, want_matched);
        EXPECT_EQ(std::count(exact.begin(), exact.end(), -7.0), std::ptrdiff_t(exact.size()));
    }

    // Removal through the channel keeps the keys of the survivors.
    std::vector<int64_t> gone;
    for (size_t i = 0; i < f.n; i += 2)
        gone.push_back(f.labels[i]);
    size_t removed = 0;
    ASSERT_TRUE(gp->remove(exact_key, gone.size(), gone.data(), &removed));
    EXPECT_EQ(removed, gone.size());
    EXPECT_EQ(direct_exact->remove(gone.size(), gone.data()), gone.size());
    {
        SCOPED_TRACE("after a removal");
        const size_t nq2 = 200;
        std::vector<double> want_dist(nq2 * k), exact(nq2 * k, -7.0);
        std::vector<int64_t> want(nq2 * k), got(nq2 * k, -7), want_matched(nq2, -9), matched(nq2, -7);
        KeyRanges r{b.lo.data(), b.hi.data(), want_matched.data()};
        direct_exact->search_exact(b.queries.data(), nq2, k, nprobe, want_dist.data(), want.data(), &r);
        GpuIvfpqAnswerDists is_exact = GPU_IVFPQ_DISTS_NONE;
        ASSERT_TRUE(gp->search(exact_key, f.d, b.queries.data(), nq2, k, nprobe, b.lo.data(), b.hi.data(),
                               matched.data(), got.data(), exact.data(), &is_exact));
        EXPECT_EQ(got, want);
        EXPECT_EQ(exact, want_dist);
        EXPECT_EQ(matched, want_matched);
    }
    EXPECT_TRUE(gp->alive());
}

// Through the channel: ranges for a keyless mirror and a keyless add to a
// keyed mirror are refused (with their kind, the process lives on); keys
// sent to a keyless mirror are ignored.
TEST(MirrorFilterProcess, KeyArgumentErrorsCrossWithTheirKind)
{
    Fixture f;
    const std::vector<int64_t> keys = make_keys(f.n, 5);
    const MirrorKey keyed{1, 10, 100, 1}, plain{1, 11, 101, 1};
    Channel ch;
    auto gp = ch.connect();
    gp->load(keyed, keyed_spec(f, false), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr,
             keys.data());
    gp->load(plain, f.spec(false), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr, nullptr);

    const size_t k = 5, na = 50;
    std::vector<int64_t> labels(k), lo{kMinKey}, hi{kMaxKey}, matched{-7};
    std::vector<double> exact(k);
    GpuIvfpqAnswerDists is_exact = GPU_IVFPQ_DISTS_NONE;
    EXPECT_EQ(error_kind([&] {
                  gp->search(plain, f.d, f.x.data(), 1, k, 2, lo.data(), hi.data(), matched.data(), labels.data(),
                             exact.data(), &is_exact);
              }),
              ErrorKind::InvalidArgument);
    EXPECT_EQ(matched[0], -7);

    auto rows = f.new_rows(na, 51, 5000000);
    const std::vector<int64_t> new_keys = make_keys(na, 52);
    EXPECT_EQ(error_kind([&] {
                  gp->add(keyed, f.m, na, rows.list_ids.data(), rows.codes.data(), rows.labels.data(), nullptr, 0,
                          nullptr);
              }),
              ErrorKind::InvalidArgument);
    EXPECT_TRUE(gp->add(plain, f.m, na, rows.list_ids.data(), rows.codes.data(), rows.labels.data(), nullptr, 0,
                        new_keys.data()));
    StoreStatus st = gp->status();
    ASSERT_EQ(st.mirrors.size(), 2u);
    EXPECT_EQ(st.mirrors[0].entries, f.n);  // the refused add changed nothing
    EXPECT_EQ(st.mirrors[1].entries, f.n + na);
    EXPECT_FALSE(st.mirrors[1].filter_keys);
    EXPECT_TRUE(gp->alive());
    ASSERT_TRUE(gp->search(keyed, f.d, f.x.data(), 1, k, 2, lo.data(), hi.data(), matched.data(), labels.data(),
                           exact.data(), &is_exact));
    EXPECT_EQ(labels[0], f.labels[0]);
    EXPECT_GT(matched[0], 0);
}

}  // namespace
}  // namespace gpuproc
}  // namespace gpuivfpq
