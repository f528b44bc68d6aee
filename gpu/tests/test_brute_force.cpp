// search_brute_force: exact k-NN over every vector the index stores
// (store_vectors), fp32 preselection then the shared exact distance
// (src/engine/exact_distance.h). Checked against a host brute force over the
// same vectors with the same header and exact_less: bit-identical distances
// rank by rank, the same ids except among rows tied at the k-th distance
// (where the preselection may keep a different subset of the tie), exact_less
// order, padding; after removals and appends; the errors.
#include <algorithm>
#include <cmath>
#include <iomanip>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/exact_distance.h"
#include "engine/search_limits.h"
#include "exact_fixture.h"
#include "gpu_ivfpq/ivfpq_index.h"
#include "gpu_test_util.h"

using namespace gputest;
using gpuivfpq::ErrorKind;
using gpuivfpq::Metric;
using gpuivfpq::gpu::GpuIvfPqIndex;

namespace {

using gputest::kind_of;

const Metric kMetrics[] = {Metric::L2, Metric::InnerProduct, Metric::Cosine};

// The index's current contents as the test knows them: id -> vector.
using Store = std::map<int64_t, std::vector<float>>;

Store store_of(const ExactFixture& f, size_t i0, size_t i1)
{
    Store s;
    for (size_t i = i0; i < i1; ++i)
        s[f.ids[i]].assign(f.x.begin() + i * f.d, f.x.begin() + (i + 1) * f.d);
    return s;
}

struct Result {
    std::vector<double> dist;
    std::vector<int64_t> labels;
};

// The header's exact distance on the host, kept out of interprocedural
// optimisation: with d propagated as a constant GCC warns spuriously on
// the header's dead remainder loop (-Waggressive-loop-optimizations).
[[gnu::noipa]] double host_exact(Metric metric, const float* a, const float* b, size_t d)
{
    return gpuivfpq::exact_distance(metric, a, b, d);
}

// Host brute force: every stored vector's exact distance, sorted by
// exact_less, the first k, padded with (+inf, -1).
Result host_brute_force(const Store& st, Metric metric, size_t d, const std::vector<float>& q, size_t k)
{
    const size_t nq = q.size() / d;
    Result r;
    r.dist.assign(nq * k, std::numeric_limits<double>::infinity());
    r.labels.assign(nq * k, -1);
    std::vector<std::pair<double, int64_t>> all;
    for (size_t i = 0; i < nq; ++i) {
        all.clear();
        for (const auto& [id, v] : st)
            all.emplace_back(host_exact(metric, q.data() + i * d, v.data(), d), id);
        const size_t take = std::min(k, all.size());
        std::partial_sort(all.begin(), all.begin() + take, all.end(), [](const auto& a, const auto& b) {
            return gpuivfpq::exact_less(a.first, a.second, b.first, b.second);
        });
        for (size_t j = 0; j < take; ++j) {
            r.dist[i * k + j] = all[j].first;
            r.labels[i * k + j] = all[j].second;
        }
    }
    return r;
}

// Equal as distances: both NaN or ==, so that -0.0 and 0.0 (an inner
// product of zeros may give either, and exact_less ties them) compare equal
// rank by rank; the bits are checked against the host's evaluation of each
// returned id separately.
bool same_value(double a, double b) { return std::isnan(a) ? std::isnan(b) : a == b; }
bool same_bits(double a, double b) { return std::isnan(a) ? std::isnan(b) : bits_of(a) == bits_of(b); }

// search_brute_force against the host: rank by rank the same distance (and
// the returned id's distance bit for bit the host's exact_distance of it),
// the same id except at ranks tied with the k-th distance, distinct ids
// from the store, exact_less order, (+inf, -1) past the store's size.
void check_brute_force(const GpuIvfPqIndex& idx, const Store& st, Metric metric, size_t d,
                       const std::vector<float>& q, size_t k, const std::string& what)
{
    SCOPED_TRACE(what + " k=" + std::to_string(k));
    const size_t nq = q.size() / d;
    Result g;
    g.dist.assign(nq * k, 12345.0);
    g.labels.assign(nq * k, -7);
    const size_t before = idx.ntotal();
    idx.search_brute_force(q.data(), nq, k, g.dist.data(), g.labels.data());
    EXPECT_EQ(idx.ntotal(), before);
    const Result h = host_brute_force(st, metric, d, q, k);
    int bad = 0;
    for (size_t i = 0; i < nq && bad < 5; ++i) {
        const double kth = h.dist[i * k + k - 1];
        std::set<int64_t> seen;
        for (size_t j = 0; j < k && bad < 5; ++j) {
            const double gd = g.dist[i * k + j], hd = h.dist[i * k + j];
            const int64_t gl = g.labels[i * k + j], hl = h.labels[i * k + j];
            if (hl < 0) {
                if (!(gl == -1 && std::isinf(gd) && gd > 0)) {
                    ADD_FAILURE() << "query " << i << " rank " << j << ": (" << gd << ", " << gl
                                  << ") where (+inf, -1) padding belongs";
                    ++bad;
                }
                continue;
            }
            if (!same_value(gd, hd)) {
                ADD_FAILURE() << std::setprecision(17) << "query " << i << " rank " << j << ": gpu (" << gd
                              << ", " << gl << ") host (" << hd << ", " << hl << ")";
                ++bad;
                continue;
            }
            const auto it = st.find(gl);
            if (it == st.end()) {
                ADD_FAILURE() << "query " << i << " rank " << j << ": id " << gl << " not stored";
                ++bad;
                continue;
            }
            if (!seen.insert(gl).second) {
                ADD_FAILURE() << "query " << i << " rank " << j << ": id " << gl << " twice";
                ++bad;
            }
            const double own = host_exact(metric, q.data() + i * d, it->second.data(), d);
            if (!same_bits(own, gd)) {
                ADD_FAILURE() << std::setprecision(17) << "query " << i << " rank " << j << " id " << gl
                              << ": gpu " << gd << " host " << own;
                ++bad;
            }
            // A different id only within the tie at the k-th distance.
            if (gl != hl && !same_value(hd, kth)) {
                ADD_FAILURE() << std::setprecision(17) << "query " << i << " rank " << j << ": id " << gl
                              << ", host " << hl << " at distance " << hd << " (k-th: " << kth << ")";
                ++bad;
            }
            if (j + 1 < k && g.labels[i * k + j + 1] >= 0 &&
                !gpuivfpq::exact_less(gd, gl, g.dist[i * k + j + 1], g.labels[i * k + j + 1])) {
                ADD_FAILURE() << std::setprecision(17) << "query " << i << " ranks " << j << ", " << j + 1
                              << " out of exact_less order: (" << gd << ", " << gl << ") then ("
                              << g.dist[i * k + j + 1] << ", " << g.labels[i * k + j + 1] << ")";
                ++bad;
            }
        }
    }
}

}  // namespace

TEST(BruteForce, MatchesHostExact)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(3101);
    for (Metric metric : kMetrics)
        // m = 48 / d = 96: d not a multiple of 64, a code width of its own.
        for (size_t m : {16, 48}) {
            const size_t d = m == 48 ? 96 : 128;
            const std::string what =
                shape("brute", {{"d", double(d)}, {"m", double(m)}, {"metric", double(int(metric))}}, s + m);
            SCOPED_TRACE(what);
            ExactFixture f(d, 32, m, 3000, 40, metric, s + m);
            auto idx = f.empty({});
            f.add_rows(*idx, 0, f.n);
            Store st = store_of(f, 0, f.n);
            // Exact duplicates of 20 stored vectors under larger ids: ties at
            // every distance from them, resolved by id.
            std::vector<float> dup(f.x.begin(), f.x.begin() + 20 * d);
            std::vector<int64_t> dup_ids(20);
            for (size_t i = 0; i < 20; ++i) {
                dup_ids[i] = 1000000 + int64_t(i);
                st[dup_ids[i]].assign(dup.begin() + i * d, dup.begin() + (i + 1) * d);
            }
            f.add_extra(*idx, dup, dup_ids);
            ASSERT_EQ(idx->ntotal(), st.size());
            // The fixture's queries, stored vectors themselves (distance 0 /
            // a tie with their duplicate), and a zero query (Cosine: NaN for
            // every vector; inner product: every distance zero).
            std::vector<float> q = f.q;
            q.insert(q.end(), f.x.begin(), f.x.begin() + 10 * d);
            q.insert(q.end(), f.x.begin() + 500 * d, f.x.begin() + 505 * d);
            q.insert(q.end(), d, 0.0f);
            for (size_t k : {size_t(1), size_t(10), size_t(100)})
                check_brute_force(*idx, st, metric, d, q, k, what);
        }
}

TEST(BruteForce, FollowsRemovalsAndAppends)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(3202);
    for (Metric metric : kMetrics) {
        const std::string what = shape("brute update", {{"metric", double(int(metric))}}, s);
        SCOPED_TRACE(what);
        const size_t d = 64;
        ExactFixture f(d, 16, 8, 2000, 30, metric, s);
        auto idx = f.empty({});
        f.add_rows(*idx, 0, 1500);
        Store st = store_of(f, 0, 1500);
        check_brute_force(*idx, st, metric, d, f.q, 10, what + " initial");
        // Every third id goes, with unknown and repeated ids in the request.
        std::vector<int64_t> gone;
        for (size_t i = 0; i < 1500; i += 3) {
            gone.push_back(f.ids[i]);
            st.erase(f.ids[i]);
        }
        gone.push_back(-5);
        gone.push_back(f.ids[0]);
        ASSERT_EQ(idx->remove_ids(gone.data(), gone.size()), 500u);
        ASSERT_EQ(idx->ntotal(), st.size());
        for (size_t k : {size_t(1), size_t(10), size_t(100)})
            check_brute_force(*idx, st, metric, d, f.q, k, what + " removed");
        // Appends: the fixture's remaining rows, then new vectors.
        f.add_rows(*idx, 1500, f.n);
        for (size_t i = 1500; i < f.n; ++i)
            st[f.ids[i]].assign(f.x.begin() + i * d, f.x.begin() + (i + 1) * d);
        const std::vector<float> extra = clustered(300, d, 10, 4.0f, s + 9);
        std::vector<int64_t> extra_ids(300);
        for (size_t i = 0; i < 300; ++i) {
            extra_ids[i] = 5000000 + int64_t(i) * 11;
            st[extra_ids[i]].assign(extra.begin() + i * d, extra.begin() + (i + 1) * d);
        }
        f.add_extra(*idx, extra, extra_ids);
        ASSERT_EQ(idx->ntotal(), st.size());
        for (size_t k : {size_t(1), size_t(10), size_t(100)})
            check_brute_force(*idx, st, metric, d, f.q, k, what + " appended");
        // The queries' current neighbours removed: the next ones come up.
        {
            std::vector<double> dd(f.nq);
            std::vector<int64_t> dl(f.nq);
            idx->search_brute_force(f.q.data(), f.nq, 1, dd.data(), dl.data());
            std::vector<int64_t> nearest;
            for (int64_t id : dl)
                if (id >= 0 && st.erase(id))
                    nearest.push_back(id);
            EXPECT_EQ(idx->remove_ids(nearest.data(), nearest.size()), nearest.size());
            check_brute_force(*idx, st, metric, d, f.q, 10, what + " nearest removed");
        }
        // Everything removed: padding only.
        std::vector<int64_t> all;
        for (const auto& e : st)
            all.push_back(e.first);
        EXPECT_EQ(idx->remove_ids(all.data(), all.size()), all.size());
        st.clear();
        EXPECT_EQ(idx->ntotal(), 0u);
        check_brute_force(*idx, st, metric, d, f.q, 10, what + " emptied");
    }
}

TEST(BruteForce, PadsWhenKExceedsEntries)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(3303);
    for (Metric metric : kMetrics) {
        const std::string what = shape("brute pad", {{"metric", double(int(metric))}}, s);
        SCOPED_TRACE(what);
        const size_t d = 32;
        ExactFixture f(d, 8, 8, 600, 12, metric, s);
        auto idx = f.empty({});
        // An empty index: every row padding.
        check_brute_force(*idx, Store{}, metric, d, f.q, 5, what + " empty");
        // Three rows: most lists empty (the gather skips them), k above n.
        f.add_rows(*idx, 0, 3);
        check_brute_force(*idx, store_of(f, 0, 3), metric, d, f.q, 5, what + " three rows");
        f.add_rows(*idx, 3, 50);
        const Store st = store_of(f, 0, 50);
        for (size_t k : {size_t(49), size_t(50), size_t(51), size_t(100), gpuivfpq::kMaxSelectK})
            check_brute_force(*idx, st, metric, d, f.q, k, what);
    }
}

// More queries than one tile of the brute force (4096 queries).
TEST(BruteForce, ManyQueries)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(3404);
    const size_t d = 32;
    ExactFixture f(d, 8, 8, 600, 4100, Metric::L2, s);
    auto idx = f.empty({});
    f.add_rows(*idx, 0, f.n);
    check_brute_force(*idx, store_of(f, 0, f.n), Metric::L2, d, f.q, 10,
                      shape("brute many", {{"nq", double(f.nq)}}, s));
}

TEST(BruteForce, Errors)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(3505);
    const size_t d = 32;
    ExactFixture f(d, 8, 8, 600, 4, Metric::L2, s);
    std::vector<double> dist(f.nq * (gpuivfpq::kMaxSelectK + 1));
    std::vector<int64_t> labels(dist.size());
    {
        auto plain = f.empty({}, /*store=*/false);
        f.add_rows(*plain, 0, f.n, /*store=*/false);
        EXPECT_EQ(kind_of([&] { plain->search_brute_force(f.q.data(), f.nq, 10, dist.data(), labels.data()); }),
                  ErrorKind::Unsupported);
    }
    auto idx = f.empty({});
    f.add_rows(*idx, 0, f.n);
    EXPECT_EQ(kind_of([&] { idx->search_brute_force(f.q.data(), f.nq, 0, dist.data(), labels.data()); }),
              ErrorKind::InvalidArgument);
    EXPECT_EQ(kind_of([&] {
                  idx->search_brute_force(f.q.data(), f.nq, gpuivfpq::kMaxSelectK + 1, dist.data(),
                                          labels.data());
              }),
              ErrorKind::InvalidArgument);
    // No queries: nothing to do, no error.
    idx->search_brute_force(f.q.data(), 0, 10, dist.data(), labels.data());
    // The index still serves after the refusals.
    check_brute_force(*idx, store_of(f, 0, f.n), Metric::L2, d, f.q, 10, "after errors");
}
