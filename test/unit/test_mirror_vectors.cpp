// Mirrors that keep each entry's exact vector (MirrorSpec::vectors) and the
// exact distance they re-rank by (engine/exact_distance.h).
//
// Why: an index scan served by the device must return the values a
// sequential scan computes, bit for bit. So every distance search_exact
// returns is compared with EXPECT_EQ against gpuivfpq::exact_distance of
// the query and the row the label names, computed here; the candidates must
// be exactly the ADC search's (the re-rank reorders, never adds or drops);
// a removal that compacts codes and labels but leaves a vector behind would
// pair labels with other rows' vectors, so removals hit the middle of
// lists; and a mirror whose vectors do not fit the budget must still load,
// without them, and say so.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "engine/error.h"
#include "engine/exact_distance.h"
#include "engine/ivfpq.h"
#include "engine/search_limits.h"
#include "gpu_process/compute_device.h"
#include "gpu_process/mirror_store.h"
#include "mirror_fixture.h"
#include "test_util.h"

namespace gpuivfpq {
namespace {

using Fixture = testutil::EncodedSet;
using testutil::error_kind;

constexpr Metric kMetrics[] = {Metric::L2, Metric::InnerProduct, Metric::Cosine};
constexpr double kInf = std::numeric_limits<double>::infinity();

// A CPU emulation mirror of the first n entries of f, with their vectors.
std::unique_ptr<Mirror> mirror_with_vectors(ComputeDevice& dev, const Fixture& f, size_t n)
{
    auto mirror = dev.create_mirror(f.spec(true));
    mirror->add(n, f.list_ids.data(), f.codes.data(), f.labels.data(), f.x.data(), nullptr);
    return mirror;
}

// Queries: row 5 of x first (its own nearest entry), then Gaussian rows.
std::vector<float> make_queries(const Fixture& f, size_t nq, uint64_t seed)
{
    std::vector<float> q = testutil::gaussian_vectors(nq, f.d, seed);
    std::copy(f.x.begin() + 5 * f.d, f.x.begin() + 6 * f.d, q.begin());
    return q;
}

// Checks one row of search_exact: each distance is the exact distance of
// the query and the vector stored under the label (vector_of), the row is in
// exact_less order, and padding is (+inf, -1) after the last candidate.
// Returns the number of candidates.
template <typename VectorOf>
size_t check_exact_row(Metric metric, const float* query, size_t d, const double* dist,
                       const int64_t* labels, size_t k, VectorOf&& vector_of)
{
    size_t found = 0;
    while (found < k && labels[found] != -1)
        found++;
    for (size_t i = 0; i < found; i++) {
        const float* v = vector_of(labels[i]);
        if (v == nullptr) {
            ADD_FAILURE() << "rank " << i << ": label " << labels[i] << " was never added";
            continue;
        }
        EXPECT_EQ(dist[i], exact_distance(metric, query, v, d))
            << "rank " << i << ", label " << labels[i];
        if (i > 0)
            EXPECT_TRUE(exact_less(dist[i - 1], labels[i - 1], dist[i], labels[i]))
                << "ranks " << i - 1 << " and " << i << ": (" << dist[i - 1] << ", "
                << labels[i - 1] << ") then (" << dist[i] << ", " << labels[i] << ")";
    }
    for (size_t i = found; i < k; i++) {
        EXPECT_EQ(labels[i], -1) << "rank " << i;
        EXPECT_EQ(dist[i], kInf) << "rank " << i;
    }
    return found;
}

std::vector<int64_t> sorted(const int64_t* begin, const int64_t* end)
{
    std::vector<int64_t> v(begin, end);
    std::sort(v.begin(), v.end());
    return v;
}

// ---------------------------------------------------------------- the mirror

// search_exact takes search's candidates, and only reorders them: the same
// label set per query, each with its exact distance, rows in exact order.
TEST(MirrorVectors, SearchExactReranksTheAdcCandidates)
{
    auto dev = make_cpu_emulation_device();
    for (Metric metric : kMetrics) {
        SCOPED_TRACE(testutil::metric_name(metric));
        Fixture f(metric);
        auto mirror = mirror_with_vectors(*dev, f, f.n);
        EXPECT_TRUE(mirror->has_vectors());
        EXPECT_EQ(mirror->entries(), f.n);

        const size_t nq = 40, k = 20, nprobe = 3;
        std::vector<float> queries = make_queries(f, nq, 41);
        std::vector<float> adc(nq * k);
        std::vector<int64_t> adc_labels(nq * k), labels(nq * k, -7);
        std::vector<double> dist(nq * k, -7.0);
        mirror->search(queries.data(), nq, k, nprobe, adc.data(), adc_labels.data(), nullptr);
        mirror->search_exact(queries.data(), nq, k, nprobe, dist.data(), labels.data(), nullptr);

        size_t reordered = 0;
        for (size_t q = 0; q < nq; q++) {
            SCOPED_TRACE("query " + std::to_string(q));
            const int64_t* got = &labels[q * k];
            EXPECT_EQ(sorted(got, got + k), sorted(&adc_labels[q * k], &adc_labels[(q + 1) * k]));
            size_t found = check_exact_row(metric, &queries[q * f.d], f.d, &dist[q * k], got, k,
                                           [&](int64_t l) { return f.vector_of(l); });
            EXPECT_EQ(found, k);  // 3 of 8 lists of 2000 entries hold 20
            reordered += !std::equal(got, got + k, &adc_labels[q * k]);
        }
        // PQ with m = 4 on 16 dimensions is coarse: the exact order differs
        // from the ADC order for most queries (else this test proves little).
        EXPECT_GT(reordered, nq / 2);
        if (metric == Metric::L2) {
            EXPECT_EQ(labels[0], f.labels[5]);  // query 0 is row 5: distance exactly 0
            EXPECT_EQ(dist[0], 0.0);
        }
    }
}

// Rows past the float range, whose ADC distances overflow: with every list
// probed and k = every entry, both searches return every entry (the
// overflowed ones after all others, marked kOverflowDistance, in the ADC
// search), and the re-ranked order is the exact one, for queries of every
// size.
TEST(MirrorVectors, OverflowedCandidatesStillCompete)
{
    auto dev = make_cpu_emulation_device();
    for (Metric metric : kMetrics) {
        SCOPED_TRACE(testutil::metric_name(metric));
        Fixture f(metric);
        for (size_t i = 0; i < 10; i++)
            for (size_t t = 0; t < f.d; t++)
                f.x[i * 150 * f.d + t] = (t + i) % 2 ? -3e38f : 1e20f * float(t + 1);
        f.model.encode(f.x.data(), f.n, f.list_ids.data(), f.codes.data());
        auto mirror = mirror_with_vectors(*dev, f, f.n);
        const size_t k = f.n, nq = 2;
        std::vector<float> queries = make_queries(f, nq, 43);
        std::copy(f.x.begin() + 150 * f.d, f.x.begin() + 151 * f.d, queries.begin() + f.d);
        std::vector<float> adc(nq * k);
        std::vector<int64_t> adc_labels(nq * k), labels(nq * k);
        std::vector<double> dist(nq * k);
        mirror->search(queries.data(), nq, k, f.lists, adc.data(), adc_labels.data(), nullptr);
        mirror->search_exact(queries.data(), nq, k, f.lists, dist.data(), labels.data(), nullptr);
        for (size_t q = 0; q < nq; q++) {
            SCOPED_TRACE("query " + std::to_string(q));
            EXPECT_EQ(sorted(&adc_labels[q * k], &adc_labels[(q + 1) * k]), sorted(f.labels.data(), f.labels.data() + f.n));
            size_t found = check_exact_row(metric, &queries[q * f.d], f.d, &dist[q * k], &labels[q * k], k,
                                           [&](int64_t l) { return f.vector_of(l); });
            EXPECT_EQ(found, k);
            for (size_t i = 0; i < k; i++)
                EXPECT_FALSE(std::isnan(adc[q * k + i]) || adc[q * k + i] == std::numeric_limits<float>::infinity());
        }
        if (metric == Metric::L2)
            EXPECT_EQ(labels[k], f.labels[150]);  // the huge row found by its own vector
    }
}

// k beyond the probed entries: both searches pad with the same count, the
// exact one with (+inf, -1).
TEST(MirrorVectors, SearchExactPadsPastTheCandidates)
{
    auto dev = make_cpu_emulation_device();
    for (Metric metric : kMetrics) {
        SCOPED_TRACE(testutil::metric_name(metric));
        Fixture f(metric);
        // 5 entries, all lists probed: 5 candidates for k = 12.
        {
            auto mirror = mirror_with_vectors(*dev, f, 5);
            const size_t k = 12;
            std::vector<double> dist(k, -7.0);
            std::vector<int64_t> labels(k, -7);
            mirror->search_exact(f.x.data() + 100 * f.d, 1, k, f.lists, dist.data(), labels.data(), nullptr);
            EXPECT_EQ(check_exact_row(metric, f.x.data() + 100 * f.d, f.d, dist.data(),
                                      labels.data(), k, [&](int64_t l) { return f.vector_of(l); }),
                      5u);
            EXPECT_EQ(sorted(labels.data(), labels.data() + 5),
                      std::vector<int64_t>(f.labels.begin(), f.labels.begin() + 5));
        }
        // All entries, one list probed, k at the limit: the one list's entries.
        {
            auto mirror = mirror_with_vectors(*dev, f, f.n);
            const size_t k = kMaxSelectK, nq = 3;
            std::vector<float> queries = make_queries(f, nq, 43);
            std::vector<float> adc(nq * k);
            std::vector<int64_t> adc_labels(nq * k), labels(nq * k);
            std::vector<double> dist(nq * k);
            mirror->search(queries.data(), nq, k, 1, adc.data(), adc_labels.data(), nullptr);
            mirror->search_exact(queries.data(), nq, k, 1, dist.data(), labels.data(), nullptr);
            for (size_t q = 0; q < nq; q++) {
                SCOPED_TRACE("query " + std::to_string(q));
                size_t adc_found = k - size_t(std::count(&adc_labels[q * k],
                                                         &adc_labels[(q + 1) * k], int64_t(-1)));
                size_t found =
                    check_exact_row(metric, &queries[q * f.d], f.d, &dist[q * k], &labels[q * k], k,
                                    [&](int64_t l) { return f.vector_of(l); });
                EXPECT_EQ(found, adc_found);
                EXPECT_GT(found, 0u);
                EXPECT_LT(found, f.n);  // one list of 8
                EXPECT_EQ(sorted(&labels[q * k], &labels[(q + 1) * k]),
                          sorted(&adc_labels[q * k], &adc_labels[(q + 1) * k]));
            }
        }
    }
}

// Removal compacts each list in place: the vectors must move with their
// codes and labels. Every third row goes (the middle of every list), then
// the removed labels come back with other vectors.
TEST(MirrorVectors, RemoveKeepsEachEntrysOwnVector)
{
    auto dev = make_cpu_emulation_device();
    for (Metric metric : kMetrics) {
        SCOPED_TRACE(testutil::metric_name(metric));
        Fixture f(metric);
        auto mirror = mirror_with_vectors(*dev, f, f.n);

        std::vector<int64_t> gone;
        for (size_t i = 1; i < f.n; i += 3)
            gone.push_back(f.labels[i]);
        // And a run of consecutive rows, to shift the tails of lists far.
        for (size_t i = 900; i < 960; i++)
            if (i % 3 != 1)
                gone.push_back(f.labels[i]);
        EXPECT_EQ(mirror->remove(gone.size(), gone.data()), gone.size());
        EXPECT_EQ(mirror->entries(), f.n - gone.size());
        const size_t bytes_per_entry = f.m + sizeof(int64_t) + f.d * sizeof(float);
        EXPECT_EQ(mirror->bytes(), mirror->entries() * bytes_per_entry);
        std::sort(gone.begin(), gone.end());
        auto removed = [&](int64_t l) { return std::binary_search(gone.begin(), gone.end(), l); };

        // Queries: removed rows (their own label must not come back) and kept ones.
        const size_t nq = 60, k = 40;
        std::vector<float> queries(nq * f.d);
        for (size_t q = 0; q < nq; q++) {
            size_t row = q % 2 == 0 ? 1 + 3 * q : 3 * q;
            std::copy(f.x.begin() + row * f.d, f.x.begin() + (row + 1) * f.d, &queries[q * f.d]);
        }
        std::vector<double> dist(nq * k);
        std::vector<int64_t> labels(nq * k);
        mirror->search_exact(queries.data(), nq, k, f.lists, dist.data(), labels.data(), nullptr);
        for (size_t q = 0; q < nq; q++) {
            SCOPED_TRACE("query " + std::to_string(q));
            const int64_t* row = &labels[q * k];
            for (size_t i = 0; i < k; i++)
                EXPECT_FALSE(removed(row[i])) << "rank " << i << ": removed label " << row[i];
            EXPECT_EQ(check_exact_row(metric, &queries[q * f.d], f.d, &dist[q * k], row, k,
                                      [&](int64_t l) { return f.vector_of(l); }),
                      k);
        }

        // The same as a mirror loaded without the removed entries.
        std::vector<int32_t> lists;
        std::vector<uint8_t> codes;
        std::vector<int64_t> kept;
        std::vector<float> vectors;
        for (size_t i = 0; i < f.n; i++) {
            if (removed(f.labels[i]))
                continue;
            lists.push_back(f.list_ids[i]);
            codes.insert(codes.end(), &f.codes[i * f.m], &f.codes[(i + 1) * f.m]);
            kept.push_back(f.labels[i]);
            vectors.insert(vectors.end(), &f.x[i * f.d], &f.x[(i + 1) * f.d]);
        }
        auto fresh = dev->create_mirror(f.spec(true));
        fresh->add(kept.size(), lists.data(), codes.data(), kept.data(), vectors.data(), nullptr);
        std::vector<double> want_dist(nq * k);
        std::vector<int64_t> want(nq * k);
        fresh->search_exact(queries.data(), nq, k, f.lists, want_dist.data(), want.data(), nullptr);
        EXPECT_EQ(labels, want);
        EXPECT_EQ(dist, want_dist);

        // The removed labels come back with other vectors (the negated rows,
        // encoded again): the new vectors count, never the removed ones.
        const size_t back = 200;
        std::vector<float> y(back * f.d);
        std::vector<int64_t> ylabels(gone.begin(), gone.begin() + back);
        for (size_t i = 0; i < back; i++)
            for (size_t j = 0; j < f.d; j++)
                y[i * f.d + j] = -f.vector_of(ylabels[i])[j];
        std::vector<int32_t> ylists(back);
        std::vector<uint8_t> ycodes(back * f.m);
        f.model.encode(y.data(), back, ylists.data(), ycodes.data());
        mirror->add(back, ylists.data(), ycodes.data(), ylabels.data(), y.data(), nullptr);
        std::map<int64_t, const float*> readded;
        for (size_t i = 0; i < back; i++)
            readded[ylabels[i]] = &y[i * f.d];
        auto vector_now = [&](int64_t l) -> const float* {
            auto it = readded.find(l);
            if (it != readded.end())
                return it->second;
            return removed(l) ? nullptr : f.vector_of(l);
        };
        mirror->search_exact(y.data(), nq, k, f.lists, dist.data(), labels.data(), nullptr);
        size_t own_first = 0;
        for (size_t q = 0; q < nq; q++) {
            SCOPED_TRACE("re-added, query " + std::to_string(q));
            EXPECT_EQ(check_exact_row(metric, &y[q * f.d], f.d, &dist[q * k], &labels[q * k], k,
                                      vector_now),
                      k);
            own_first += labels[q * k] == ylabels[q];
        }
        // Each is its own nearest for L2 and Cosine (not for InnerProduct,
        // where longer vectors win).
        if (metric != Metric::InnerProduct)
            EXPECT_GT(own_first, nq / 2) << "the re-added vectors are not found for themselves";
    }
}

// Vectors are given exactly when the mirror keeps them; search_exact needs them.
// brute_force ranks every stored vector, not the probed lists' ADC
// candidates: each row is the k nearest by exact distance over all entries
// (checked against a sort of every entry here), and a removed entry is gone.
TEST(MirrorVectors, BruteForceIsExactOverEveryEntry)
{
    for (Metric metric : kMetrics) {
        SCOPED_TRACE(int(metric));
        Fixture f(metric);
        auto dev = make_cpu_emulation_device();
        auto mirror = mirror_with_vectors(*dev, f, f.n);
        const size_t nq = 6, k = 25;
        std::vector<float> q = make_queries(f, nq, 78);
        std::vector<double> dist(nq * k);
        std::vector<int64_t> labels(nq * k);
        std::map<int64_t, size_t> row_of;
        for (size_t i = 0; i < f.n; i++)
            row_of[f.labels[i]] = i;
        auto check = [&](const std::vector<char>& present) {
            mirror->brute_force(q.data(), nq, k, dist.data(), labels.data());
            for (size_t qi = 0; qi < nq; qi++) {
                std::vector<std::pair<double, int64_t>> all;
                for (size_t i = 0; i < f.n; i++)
                    if (present[i])
                        all.emplace_back(exact_distance(metric, &q[qi * f.d], &f.x[i * f.d], f.d), f.labels[i]);
                std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
                    return exact_less(a.first, a.second, b.first, b.second);
                });
                for (size_t r = 0; r < k; r++) {
                    EXPECT_EQ(labels[qi * k + r], all[r].second) << "query " << qi << " rank " << r;
                    EXPECT_EQ(dist[qi * k + r], all[r].first) << "query " << qi << " rank " << r;
                }
            }
        };
        std::vector<char> present(f.n, 1);
        check(present);
        // The nearest row of query 0 (row 5 itself) goes: the next takes its place.
        const int64_t gone = labels[0];
        EXPECT_EQ(mirror->remove(1, &gone), 1u);
        present[row_of[gone]] = 0;
        check(present);
        // Past the entries: padding.
        std::vector<double> d2(f.n + 10);
        std::vector<int64_t> l2(f.n + 10);
        mirror->brute_force(q.data(), 1, f.n + 10, d2.data(), l2.data());
        EXPECT_EQ(l2[f.n - 1], -1);
        EXPECT_EQ(d2[f.n - 1], kInf);
        EXPECT_NE(l2[f.n - 2], -1);
        // Without vectors, or k out of range: refused.
        auto codes_only = dev->create_mirror(f.spec(false));
        EXPECT_EQ(error_kind([&] { codes_only->brute_force(q.data(), 1, k, dist.data(), labels.data()); }),
                  ErrorKind::Unsupported);
        EXPECT_EQ(error_kind([&] { mirror->brute_force(q.data(), 1, 0, dist.data(), labels.data()); }),
                  ErrorKind::InvalidArgument);
    }
}

TEST(MirrorVectors, RefusesVectorsAgainstTheSpec)
{
    Fixture f;
    auto dev = make_cpu_emulation_device();
    auto codes_only = dev->create_mirror(f.spec(false));
    EXPECT_FALSE(codes_only->has_vectors());
    EXPECT_EQ(error_kind([&] {
                  codes_only->add(10, f.list_ids.data(), f.codes.data(), f.labels.data(),
                                  f.x.data(), nullptr);
              }),
              ErrorKind::InvalidArgument);
    EXPECT_EQ(codes_only->entries(), 0u);
    codes_only->add(10, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr, nullptr);
    EXPECT_EQ(codes_only->entries(), 10u);
    std::vector<double> dist(5);
    std::vector<int64_t> labels(5);
    EXPECT_EQ(error_kind([&] {
                  codes_only->search_exact(f.x.data(), 1, 5, 2, dist.data(), labels.data(), nullptr);
              }),
              ErrorKind::Unsupported);

    auto with = dev->create_mirror(f.spec(true));
    EXPECT_TRUE(with->has_vectors());
    EXPECT_EQ(error_kind([&] {
                  with->add(10, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr, nullptr);
              }),
              ErrorKind::InvalidArgument);
    EXPECT_EQ(with->entries(), 0u);
    with->add(10, f.list_ids.data(), f.codes.data(), f.labels.data(), f.x.data(), nullptr);
    EXPECT_EQ(with->entries(), 10u);
    // The same limits as search.
    const size_t big = kMaxSelectK + 1;
    std::vector<double> big_dist(big);
    std::vector<int64_t> big_labels(big);
    EXPECT_EQ(error_kind([&] {
                  with->search_exact(f.x.data(), 1, 0, 2, big_dist.data(), big_labels.data(), nullptr);
              }),
              ErrorKind::InvalidArgument);
    EXPECT_EQ(error_kind([&] {
                  with->search_exact(f.x.data(), 1, big, 2, big_dist.data(), big_labels.data(), nullptr);
              }),
              ErrorKind::InvalidArgument);
}

// ---------------------------------------------------------------- the store

// A budget that holds the codes but not the vectors: the mirror loads
// without them (and says so); a larger one keeps them; bytes count them.
TEST(MirrorStoreVectors, BudgetFallsBackToCodesOnly)
{
    Fixture f;
    auto dev = make_cpu_emulation_device();
    const size_t with_bytes = dev->mirror_bytes(f.spec(true), f.n);
    const size_t codes_bytes = dev->mirror_bytes(f.spec(false), f.n);
    ASSERT_GT(with_bytes, codes_bytes);
    const MirrorKey key{1, 10, 100, 1};

    MirrorStore store(*dev);
    store.set_budget(codes_bytes);
    Mirror* mirror = store.load(key, f.spec(true), f.n, f.list_ids.data(), f.codes.data(),
                                f.labels.data(), f.x.data(), nullptr);
    ASSERT_NE(mirror, nullptr);
    EXPECT_FALSE(mirror->has_vectors());
    EXPECT_EQ(mirror->entries(), f.n);
    ASSERT_EQ(store.list().size(), 1u);
    EXPECT_FALSE(store.list()[0].vectors);
    EXPECT_EQ(store.list()[0].bytes, codes_bytes);
    EXPECT_EQ(store.bytes(), codes_bytes);
    size_t d = 0, m = 0;
    ASSERT_TRUE(store.shape(key, &d, &m));
    EXPECT_EQ(d, f.d);
    EXPECT_EQ(m, f.m);
    // It searches as codes only, and later adds take no vectors.
    std::vector<float> dist(5);
    std::vector<double> exact(5);
    std::vector<int64_t> labels(5);
    mirror->search(f.x.data(), 1, 5, 2, dist.data(), labels.data(), nullptr);
    EXPECT_EQ(labels[0], f.labels[0]);
    EXPECT_EQ(
        error_kind([&] { mirror->search_exact(f.x.data(), 1, 5, 2, exact.data(), labels.data(), nullptr); }),
        ErrorKind::Unsupported);
    EXPECT_EQ(error_kind([&] {
                  mirror->add(1, f.list_ids.data(), f.codes.data(), f.labels.data(), f.x.data(), nullptr);
              }),
              ErrorKind::InvalidArgument);
    mirror->add(1, f.list_ids.data(), f.codes.data(), f.labels.data(), nullptr, nullptr);
    EXPECT_EQ(mirror->entries(), f.n + 1);

    // Room for the vectors: the same key loads again with them.
    store.set_budget(with_bytes);
    mirror = store.load(key, f.spec(true), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(),
                        f.x.data(), nullptr);
    ASSERT_NE(mirror, nullptr);
    EXPECT_TRUE(mirror->has_vectors());
    ASSERT_EQ(store.list().size(), 1u);
    EXPECT_TRUE(store.list()[0].vectors);
    EXPECT_EQ(store.list()[0].bytes, with_bytes);
    EXPECT_EQ(store.bytes(), with_bytes);
    EXPECT_GT(store.bytes(), codes_bytes);
    mirror->search_exact(f.x.data(), 1, 5, 2, exact.data(), labels.data(), nullptr);
    EXPECT_EQ(labels[0], f.labels[0]);
    EXPECT_EQ(exact[0], 0.0);

    // A codes-only spec never keeps vectors, whatever the budget.
    store.set_budget(SIZE_MAX);
    mirror = store.load(key, f.spec(false), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(),
                        nullptr, nullptr);
    EXPECT_FALSE(mirror->has_vectors());
    EXPECT_FALSE(store.list().at(0).vectors);

    // Below the codes-only size: refused, vectors or not.
    store.drop_all();
    store.set_budget(codes_bytes - 1);
    EXPECT_EQ(error_kind([&] {
                  store.load(key, f.spec(true), f.n, f.list_ids.data(), f.codes.data(),
                             f.labels.data(), f.x.data(), nullptr);
              }),
              ErrorKind::OutOfMemory);
    EXPECT_TRUE(store.list().empty());
    EXPECT_EQ(store.evictions(), 0u);
}

// The fallback is for a mirror that cannot fit even alone: one that fits
// alone keeps its vectors and evicts the others to make room.
TEST(MirrorStoreVectors, EvictsForVectorsThatFitAlone)
{
    Fixture f;
    auto dev = make_cpu_emulation_device();
    const size_t with_bytes = dev->mirror_bytes(f.spec(true), f.n);
    const MirrorKey a{1, 10, 100, 1}, b{1, 11, 101, 1};
    MirrorStore store(*dev);
    store.set_budget(with_bytes + with_bytes / 2);
    store.load(a, f.spec(true), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(),
               f.x.data(), nullptr);
    store.load(b, f.spec(true), f.n, f.list_ids.data(), f.codes.data(), f.labels.data(),
               f.x.data(), nullptr);
    EXPECT_EQ(store.find(a), nullptr);
    Mirror* mb = store.find(b);
    ASSERT_NE(mb, nullptr);
    EXPECT_TRUE(mb->has_vectors());
    EXPECT_EQ(store.evictions(), 1u);
    ASSERT_EQ(store.list().size(), 1u);
    EXPECT_TRUE(store.list()[0].vectors);
    EXPECT_LE(store.bytes(), store.budget());
}

// ---------------------------------------------------------------- exact_distance

TEST(ExactDistance, CosineOfAZeroVectorIsNaN)
{
    const float zero[3] = {0, 0, 0}, a[3] = {1, 2, 3};
    EXPECT_TRUE(std::isnan(exact_distance(Metric::Cosine, zero, a, 3)));
    EXPECT_TRUE(std::isnan(exact_distance(Metric::Cosine, a, zero, 3)));
    EXPECT_TRUE(std::isnan(exact_distance(Metric::Cosine, zero, zero, 3)));
    // The other metrics have a value for it.
    EXPECT_EQ(exact_distance(Metric::L2, zero, zero, 3), 0.0);
    EXPECT_EQ(exact_distance(Metric::InnerProduct, zero, a, 3), 0.0);
}

// 1 - cos, clamped to [0, 2] where rounding would step outside.
TEST(ExactDistance, CosineStaysWithinZeroAndTwo)
{
    std::vector<float> v = testutil::gaussian_vectors(200, 7, 9);
    for (size_t i = 0; i < 200; i++) {
        const float* a = &v[i * 7];
        float scaled[7], neg[7];
        for (int j = 0; j < 7; j++) {
            scaled[j] = a[j] * 3.0f;
            neg[j] = -a[j];
        }
        double same = exact_distance(Metric::Cosine, a, scaled, 7);
        double opposite = exact_distance(Metric::Cosine, a, neg, 7);
        EXPECT_GE(same, 0.0) << i;
        EXPECT_LE(same, 1e-6) << i;
        EXPECT_LE(opposite, 2.0) << i;
        EXPECT_GE(opposite, 2.0 - 1e-6) << i;
    }
    const float x[2] = {1, 0}, y[2] = {0, 1};
    EXPECT_EQ(exact_distance(Metric::Cosine, x, y, 2), 1.0);
    EXPECT_EQ(exact_distance(Metric::Cosine, x, x, 2), 0.0);
}

TEST(ExactDistance, ExactLessPutsNaNLastAndTiesByLabel)
{
    const double nan = std::nan("");
    EXPECT_TRUE(exact_less(1.0, 9, 2.0, 1));  // the distance first
    EXPECT_FALSE(exact_less(2.0, 1, 1.0, 9));
    EXPECT_TRUE(exact_less(3.0, 1, 3.0, 2));  // then the label
    EXPECT_FALSE(exact_less(3.0, 2, 3.0, 1));
    EXPECT_FALSE(exact_less(3.0, 2, 3.0, 2));  // irreflexive
    EXPECT_TRUE(exact_less(-0.0, 1, 0.0, 2));  // -0 == 0: by label
    EXPECT_FALSE(exact_less(0.0, 2, -0.0, 1));
    EXPECT_TRUE(exact_less(kInf, 5, nan, 1));  // NaN after +inf
    EXPECT_FALSE(exact_less(nan, 1, kInf, 5));
    EXPECT_TRUE(exact_less(-kInf, 5, 1.0, 1));
    EXPECT_TRUE(exact_less(nan, 1, nan, 2));  // NaN ties by label
    EXPECT_FALSE(exact_less(nan, 2, nan, 1));
    EXPECT_FALSE(exact_less(nan, 2, nan, 2));

    // As a sort order.
    std::vector<std::pair<double, int64_t>> v = {{nan, 4},  {1.5, 7},  {kInf, 2},
                                                 {nan, 1},  {-2.0, 9}, {1.5, 3},
                                                 {kInf, 1}, {0.0, 8},  {-0.0, 6}};
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
        return exact_less(a.first, a.second, b.first, b.second);
    });
    const std::vector<int64_t> want = {9, 6, 8, 3, 7, 1, 2, 1, 4};
    for (size_t i = 0; i < v.size(); i++)
        EXPECT_EQ(v[i].second, want[i]) << "position " << i;
    EXPECT_EQ(v[0].first, -2.0);
    EXPECT_EQ(v[6].first, kInf);
    EXPECT_TRUE(std::isnan(v[7].first));
    EXPECT_TRUE(std::isnan(v[8].first));
}

// Small integers: every partial sum is exact whatever the order, so the
// distances equal the straightforward double formulas exactly.
TEST(ExactDistance, SmallIntegersAreExact)
{
    const float a[3] = {1, 2, 3}, b[3] = {4, 6, 3};
    EXPECT_EQ(exact_distance(Metric::L2, a, b, 3), 5.0);  // (-3, -4, 0)
    EXPECT_EQ(exact_distance(Metric::InnerProduct, a, b, 3), -25.0);

    std::mt19937 gen(17);
    std::uniform_int_distribution<int> small(-9, 9);
    for (size_t d : {size_t(1), size_t(3), size_t(4), size_t(9), size_t(13)}) {
        for (int trial = 0; trial < 50; trial++) {
            std::vector<float> x(d), y(d);
            for (size_t j = 0; j < d; j++) {
                x[j] = float(small(gen));
                y[j] = float(small(gen));
            }
            double l2 = 0, ip = 0;
            for (size_t j = 0; j < d; j++) {
                l2 += (double(x[j]) - double(y[j])) * (double(x[j]) - double(y[j]));
                ip += double(x[j]) * double(y[j]);
            }
            EXPECT_EQ(exact_distance(Metric::L2, x.data(), y.data(), d), std::sqrt(l2))
                << "d " << d << ", trial " << trial;
            EXPECT_EQ(exact_distance(Metric::InnerProduct, x.data(), y.data(), d), -ip)
                << "d " << d << ", trial " << trial;
        }
    }
}

}  // namespace
}  // namespace gpuivfpq
