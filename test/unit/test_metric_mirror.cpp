// Metric mirrors and what they rely on in the engine: an insert at the
// placement the engine's rule chose (ListOfClusters::placement / insert_at,
// SparseSpatialSelection::table_row / insert_at) leaves a copy of an index
// exactly as insert() leaves the original, and a placement no insert makes
// is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "engine/error.h"
#include "engine/lc_index.h"
#include "engine/metric_index.h"
#include "engine/sss_index.h"
#include "metric_words.h"
#include "test_util.h"

using namespace gpuivfpq;
using metricwords::to_list;
using metricwords::view;
using metricwords::Word;
using testutil::test_seed;

namespace {

std::vector<uint8_t> removed_flags(const MetricIndex& index)
{
    std::vector<uint8_t> removed(index.size());
    for (uint32_t id = 0; id < index.size(); id++)
        removed[id] = index.is_removed(id);
    return removed;
}

std::unique_ptr<ListOfClusters> copy_of(const ListOfClusters& lc)
{
    std::vector<uint32_t> centres, radii;
    for (size_t c = 0; c < lc.clusters(); c++) {
        centres.push_back(lc.centre(c));
        radii.push_back(lc.radius(c));
    }
    return ListOfClusters::restore(lc.words(), removed_flags(lc), lc.bucket_size(), centres, radii,
                                   lc.cluster_assignment());
}

std::unique_ptr<SparseSpatialSelection> copy_of(const SparseSpatialSelection& sss)
{
    std::vector<uint32_t> pivots;
    for (size_t p = 0; p < sss.pivots(); p++)
        pivots.push_back(sss.pivot(p));
    return SparseSpatialSelection::restore(
        sss.words(), removed_flags(sss), sss.alpha(), sss.max_distance(), pivots,
        std::vector<uint8_t>(sss.table(), sss.table() + sss.size() * sss.pivots()));
}

void expect_same_lc(const ListOfClusters& a, const ListOfClusters& b)
{
    ASSERT_EQ(a.size(), b.size());
    ASSERT_EQ(a.clusters(), b.clusters());
    for (size_t c = 0; c < a.clusters(); c++) {
        ASSERT_EQ(a.centre(c), b.centre(c)) << "cluster " << c;
        ASSERT_EQ(a.radius(c), b.radius(c)) << "cluster " << c;
        ASSERT_EQ(a.members(c), b.members(c)) << "cluster " << c;
    }
}

template <class Fn>
void expect_invalid(Fn&& fn)
{
    try {
        fn();
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument) << e.what();
    }
}

}  // namespace

// The copy takes every insert at the original's placement, found on the
// copy itself; both stay identical (clusters, radii, buckets).
TEST(MetricPlacement, ListOfClustersInsertAtFollowsInsert)
{
    const uint64_t seed = test_seed(951);
    const auto& alphabet = metricwords::spanish_alphabet();
    const auto words = metricwords::make_words(600, seed, alphabet);
    const auto extra = metricwords::make_words(500, seed + 1, alphabet);
    // Every kind of placement occurs somewhere (new clusters at small
    // buckets, a grown last radius, first fits).
    size_t new_clusters = 0, grown = 0;
    for (size_t bucket : {1, 8, 32}) {
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " bucket=" << bucket);
        ListOfClusters lc(to_list(words), bucket);
        auto copy = copy_of(lc);
        for (const Word& w : extra) {
            const LcPlacement p = copy->placement(view(w));
            const size_t before = lc.clusters();
            new_clusters += p.cluster == before;
            grown += p.cluster + 1 == before && p.radius > lc.radius(p.cluster);
            EXPECT_EQ(copy->insert_at(view(w), p), lc.insert(view(w)));
        }
        expect_same_lc(lc, *copy);
    }
    EXPECT_GT(new_clusters, 0u);
    EXPECT_GT(grown, 0u);
}

TEST(MetricPlacement, ListOfClustersRefusesPlacementsNoInsertMakes)
{
    const auto words = metricwords::make_words(200, test_seed(952), metricwords::ascii_alphabet());
    ListOfClusters lc(to_list(words), 6);
    ASSERT_GE(lc.clusters(), 3u);
    const size_t nc = lc.clusters();
    const Word w = {'x', 'y'};
    uint32_t mid = 0;
    while (mid + 1 < nc && lc.radius(mid) == 0)
        mid++;
    ASSERT_LT(mid + 1, nc);
    expect_invalid([&] { lc.insert_at(view(w), LcPlacement{uint32_t(nc + 1), 0}); });
    expect_invalid([&] { lc.insert_at(view(w), LcPlacement{uint32_t(nc), 1}); });
    expect_invalid([&] { lc.insert_at(view(w), LcPlacement{mid, lc.radius(mid) - 1}); });
    expect_invalid([&] { lc.insert_at(view(w), LcPlacement{mid, lc.radius(mid) + 1}); });
    EXPECT_EQ(lc.size(), words.size());
    EXPECT_EQ(lc.clusters(), nc);
    // What the rule does make: a first fit as it is, the last radius grown,
    // a new cluster.
    EXPECT_EQ(lc.insert_at(view(w), LcPlacement{mid, lc.radius(mid)}), words.size());
    const uint32_t last = uint32_t(lc.clusters() - 1);
    lc.insert_at(view(w), LcPlacement{last, lc.radius(last) + 5});
    EXPECT_EQ(lc.members(last).back(), words.size() + 1);
    lc.insert_at(view(w), LcPlacement{uint32_t(lc.clusters()), 0});
    EXPECT_EQ(lc.clusters(), nc + 1);
    EXPECT_EQ(lc.centre(nc), words.size() + 2);
}

TEST(MetricPlacement, SssInsertAtFollowsInsert)
{
    const uint64_t seed = test_seed(953);
    const auto& alphabet = metricwords::ascii_alphabet();
    const auto words = metricwords::make_words(500, seed, alphabet);
    const auto extra = metricwords::make_words(300, seed + 1, alphabet);
    for (double alpha : {0.3, 0.5, 0.7}) {
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " alpha=" << alpha);
        SparseSpatialSelection sss(to_list(words), alpha);
        auto copy = copy_of(sss);
        for (const Word& w : extra) {
            const std::vector<uint8_t> row = copy->table_row(view(w));
            ASSERT_EQ(row.size(), sss.pivots());
            EXPECT_EQ(copy->insert_at(view(w), row.data()), sss.insert(view(w)));
        }
        ASSERT_EQ(copy->size(), sss.size());
        EXPECT_TRUE(std::equal(sss.table(), sss.table() + sss.size() * sss.pivots(), copy->table()));
        EXPECT_FALSE(copy->is_pivot(uint32_t(copy->size() - 1)));
    }
    SparseSpatialSelection sss(to_list(words), 0.5);
    const Word w = {'a'};
    expect_invalid([&] { sss.insert_at(view(w), nullptr); });
    EXPECT_EQ(sss.size(), words.size());
}
