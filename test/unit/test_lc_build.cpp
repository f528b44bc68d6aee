// The List of Clusters build: the same index for any thread count, and the
// same as a straightforward build by the rules (docs/metric-search.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "engine/metric/edit_distance.h"
#include "engine/metric/lc_index.h"
#include "metric_words.h"
#include "test_util.h"

namespace {

using gpuivfpq::EditPattern;
using gpuivfpq::ListOfClusters;
using gpuivfpq::WordList;

struct RefCluster {
    uint32_t centre;
    uint32_t radius;
    std::vector<uint32_t> bucket;
};

// The build as the rules state it, with no shortcut: the first centre is 0;
// each next one the remaining object with the largest sum of distances to
// the centres so far (ties: the smaller id); its bucket the `bucket`
// remaining objects nearest to it by (distance, id), by a full sort.
std::vector<RefCluster> reference_build(const WordList& words, size_t bucket)
{
    const size_t n = words.size();
    std::vector<uint64_t> sum(n, 0);
    std::vector<uint8_t> gone(n, 0);
    std::vector<RefCluster> out;
    size_t left = n;
    bool first = true;
    while (left > 0) {
        uint32_t c = UINT32_MAX;
        for (uint32_t x = 0; x < n; x++)
            if (!gone[x] && (c == UINT32_MAX || (!first && sum[x] > sum[c])))
                c = x;
        first = false;
        gone[c] = 1;
        left--;
        const EditPattern p(words[c]);
        std::vector<std::pair<uint32_t, uint32_t>> by;    // (distance, id)
        for (uint32_t x = 0; x < n; x++)
            if (!gone[x])
                by.push_back({p.distance(words[x]), x});
        std::sort(by.begin(), by.end());
        RefCluster rc{c, 0, {}};
        for (size_t i = 0; i < by.size(); i++) {
            if (i < bucket) {
                rc.bucket.push_back(by[i].second);
                rc.radius = std::max(rc.radius, by[i].first);
                gone[by[i].second] = 1;
                left--;
            } else {
                sum[by[i].second] += by[i].first;
            }
        }
        std::sort(rc.bucket.begin(), rc.bucket.end());
        out.push_back(std::move(rc));
    }
    return out;
}

void expect_same(const ListOfClusters& a, const ListOfClusters& b)
{
    ASSERT_EQ(a.clusters(), b.clusters());
    for (size_t c = 0; c < a.clusters(); c++) {
        ASSERT_EQ(a.centre(c), b.centre(c)) << "cluster " << c;
        ASSERT_EQ(a.radius(c), b.radius(c)) << "cluster " << c;
        ASSERT_EQ(a.members(c), b.members(c)) << "cluster " << c;
    }
    EXPECT_EQ(a.build_evaluations(), b.build_evaluations());
}

void expect_reference(const ListOfClusters& lc, const std::vector<RefCluster>& ref)
{
    ASSERT_EQ(lc.clusters(), ref.size());
    for (size_t c = 0; c < ref.size(); c++) {
        ASSERT_EQ(lc.centre(c), ref[c].centre) << "cluster " << c;
        ASSERT_EQ(lc.radius(c), ref[c].radius) << "cluster " << c;
        ASSERT_EQ(lc.members(c), ref[c].bucket) << "cluster " << c;
    }
}

// Words past the parallel threshold (2048 remaining objects), many of them
// near-duplicates, so that ties of distance and of sum are common.
WordList build_words(size_t n, uint64_t seed)
{
    return metricwords::to_list(metricwords::make_words(n, seed, metricwords::spanish_alphabet()));
}

}  // namespace

TEST(LcBuild, SameForAnyThreadCountAndEqualToReference)
{
    const WordList words = build_words(5000, testutil::test_seed(901));
    for (size_t bucket : {size_t(1), size_t(8), size_t(33), size_t(3000)}) {
        SCOPED_TRACE(bucket);
        const ListOfClusters lc1(words, bucket, 1), lc2(words, bucket, 2), lc4(words, bucket, 4);
        expect_same(lc1, lc2);
        expect_same(lc1, lc4);
        if (bucket >= 8)    // bucket 1: n^2 / 2 distances, too slow for the reference
            expect_reference(lc1, reference_build(words, bucket));
    }
}

// Only ties: every word the same, so every choice falls to the smaller id.
TEST(LcBuild, AllEqualWordsChooseBySmallerId)
{
    WordList words;
    const std::vector<uint32_t> w = {'c', 'a', 's', 'a'};
    for (size_t i = 0; i < 4100; i++)
        words.push_back(gpuivfpq::WordView{w.data(), w.size()});
    const ListOfClusters lc1(words, 16, 1), lc4(words, 16, 4);
    expect_same(lc1, lc4);
    expect_reference(lc1, reference_build(words, 16));
    ASSERT_EQ(lc1.clusters(), (4100 + 16) / 17);
    EXPECT_EQ(lc1.centre(1), 17u);
}

// Small and empty inputs (the serial path only).
TEST(LcBuild, SmallInputs)
{
    for (size_t n : {size_t(0), size_t(1), size_t(2), size_t(40)}) {
        const WordList words = build_words(n, 902 + n);
        const ListOfClusters lc1(words, 3, 1), lc2(words, 3, 2);
        expect_same(lc1, lc2);
        expect_reference(lc1, reference_build(words, 3));
    }
}
