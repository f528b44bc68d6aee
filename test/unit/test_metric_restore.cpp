// Restoring List of Clusters and SSS indexes from the state they expose (as
// the gpu_metric access method stores it in its pages): the restored index
// answers and takes inserts exactly as the original, and a broken state is
// an InvalidArgument, never a crash.
#include <algorithm>
#include <random>
#include <vector>

#include "engine/error.h"
#include "engine/metric/lc_index.h"
#include "engine/metric/metric_index.h"
#include "engine/metric/sss_index.h"
#include "test_util.h"

using namespace gpuivfpq;
using testutil::test_seed;

namespace {

using Word = std::vector<uint32_t>;

WordView view(const Word& w) { return WordView{w.data(), w.size()}; }

// Lowercase letters and a few Spanish ones (ñ, á, é), so that words share
// symbols and distances spread over 0..10.
const std::vector<uint32_t> kLetters = {'a', 'e', 'o', 's', 'r', 'n', 'c', 'l', 't', 'd', 0xF1, 0xE1, 0xE9};

// n words of 2-9 letters; a third are 1-2 edits of an earlier word.
std::vector<Word> make_words(size_t n, uint64_t seed)
{
    std::mt19937_64 gen(seed);
    std::vector<Word> words;
    for (size_t i = 0; i < n; i++) {
        Word w;
        if (!words.empty() && gen() % 3 == 0) {
            w = words[gen() % words.size()];
            for (size_t e = 1 + gen() % 2; e > 0; e--) {
                const uint32_t c = kLetters[gen() % kLetters.size()];
                if (w.empty() || gen() % 2)
                    w.insert(w.begin() + long(gen() % (w.size() + 1)), c);
                else
                    w[gen() % w.size()] = c;
            }
        } else {
            for (size_t len = 2 + gen() % 8; len > 0; len--)
                w.push_back(kLetters[gen() % kLetters.size()]);
        }
        words.push_back(w);
    }
    return words;
}

WordList to_list(const std::vector<Word>& words)
{
    WordList list;
    for (const Word& w : words)
        list.push_back(view(w));
    return list;
}

std::vector<uint8_t> removed_flags(const MetricIndex& index)
{
    std::vector<uint8_t> removed(index.size());
    for (uint32_t id = 0; id < index.size(); id++)
        removed[id] = index.is_removed(id);
    return removed;
}

std::unique_ptr<ListOfClusters> restore_lc(const ListOfClusters& lc)
{
    std::vector<uint32_t> centres, radii;
    for (size_t c = 0; c < lc.clusters(); c++) {
        centres.push_back(lc.centre(c));
        radii.push_back(lc.radius(c));
    }
    return ListOfClusters::restore(lc.words(), removed_flags(lc), lc.bucket_size(), centres, radii,
                                   lc.cluster_assignment());
}

std::unique_ptr<SparseSpatialSelection> restore_sss(const SparseSpatialSelection& sss)
{
    std::vector<uint32_t> pivots;
    for (size_t p = 0; p < sss.pivots(); p++)
        pivots.push_back(sss.pivot(p));
    return SparseSpatialSelection::restore(
        sss.words(), removed_flags(sss), sss.alpha(), sss.max_distance(), pivots,
        std::vector<uint8_t>(sss.table(), sss.table() + sss.size() * sss.pivots()));
}

void expect_same_hits(const std::vector<MetricHit>& a, const std::vector<MetricHit>& b)
{
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); i++) {
        EXPECT_EQ(a[i].id, b[i].id) << "hit " << i;
        EXPECT_EQ(a[i].dist, b[i].dist) << "hit " << i;
    }
}

// Both indexes give the same answers and, when same_work (the same structure
// searched the same way), the same evaluation counts.
void expect_same_answers(const MetricIndex& a, const MetricIndex& b, const std::vector<Word>& queries,
                         bool same_work = true)
{
    ASSERT_EQ(a.size(), b.size());
    ASSERT_EQ(a.live(), b.live());
    for (const Word& q : queries) {
        for (uint32_t r = 0; r <= 3; r++) {
            MetricStats sa, sb;
            expect_same_hits(a.range(view(q), r, &sa), b.range(view(q), r, &sb));
            if (same_work)
                EXPECT_EQ(sa.distance_evaluations, sb.distance_evaluations);
        }
        for (size_t k : {1, 7, 40}) {
            MetricStats sa, sb;
            expect_same_hits(a.knn(view(q), k, &sa), b.knn(view(q), k, &sb));
            if (same_work)
                EXPECT_EQ(sa.distance_evaluations, sb.distance_evaluations);
        }
    }
}

void expect_same_lc(const ListOfClusters& a, const ListOfClusters& b)
{
    ASSERT_EQ(a.clusters(), b.clusters());
    EXPECT_EQ(a.bucket_size(), b.bucket_size());
    for (size_t c = 0; c < a.clusters(); c++) {
        EXPECT_EQ(a.centre(c), b.centre(c));
        EXPECT_EQ(a.radius(c), b.radius(c));
        EXPECT_EQ(a.members(c), b.members(c));
    }
}

}  // namespace

TEST(MetricRestore, ListOfClustersAnswersAndGrowsAsTheOriginal)
{
    const uint64_t seed = test_seed(911);
    const auto words = make_words(1500, seed);
    const auto extra = make_words(400, seed + 1);
    const auto queries = make_words(40, seed + 2);
    for (size_t bucket : {1, 6, 32}) {
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " bucket=" << bucket);
        ListOfClusters lc(to_list(words), bucket, 2);
        for (size_t i = 0; i < 200; i++)
            lc.insert(view(extra[i]));
        for (uint32_t id = 0; id < lc.size(); id += 7)
            lc.remove(id);
        auto restored = restore_lc(lc);
        expect_same_lc(lc, *restored);
        expect_same_answers(lc, *restored, queries);
        // The same inserts and removals afterwards keep them equal.
        for (size_t i = 200; i < extra.size(); i++)
            EXPECT_EQ(lc.insert(view(extra[i])), restored->insert(view(extra[i])));
        for (uint32_t id = 3; id < lc.size(); id += 11)
            EXPECT_EQ(lc.remove(id), restored->remove(id));
        expect_same_lc(lc, *restored);
        expect_same_answers(lc, *restored, queries);
    }
}

TEST(MetricRestore, SparseSpatialSelectionAnswersAndGrowsAsTheOriginal)
{
    const uint64_t seed = test_seed(912);
    const auto words = make_words(1500, seed);
    const auto extra = make_words(400, seed + 1);
    const auto queries = make_words(40, seed + 2);
    for (double alpha : {0.3, 0.5}) {
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " alpha=" << alpha);
        SparseSpatialSelection sss(to_list(words), alpha, 2);
        for (size_t i = 0; i < 200; i++)
            sss.insert(view(extra[i]));
        for (uint32_t id = 0; id < sss.size(); id += 5)
            sss.remove(id);
        auto restored = restore_sss(sss);
        EXPECT_EQ(restored->pivots(), sss.pivots());
        EXPECT_EQ(restored->alpha(), sss.alpha());
        EXPECT_EQ(restored->max_distance(), sss.max_distance());
        expect_same_answers(sss, *restored, queries);
        for (size_t i = 200; i < extra.size(); i++)
            EXPECT_EQ(sss.insert(view(extra[i])), restored->insert(view(extra[i])));
        ASSERT_EQ(restored->size(), sss.size());
        EXPECT_TRUE(std::equal(sss.table(), sss.table() + sss.size() * sss.pivots(),
                               restored->table()));
        expect_same_answers(sss, *restored, queries);
    }
}

TEST(MetricRestore, EmptyIndexes)
{
    const auto words = make_words(50, test_seed(913));
    auto lc = ListOfClusters::restore(WordList(), {}, 4, {}, {}, {});
    auto sss = SparseSpatialSelection::restore(WordList(), {}, 0.5, 0, {}, {});
    EXPECT_EQ(lc->size(), 0u);
    EXPECT_TRUE(lc->range(view(words[0]), 5).empty());
    EXPECT_TRUE(sss->knn(view(words[0]), 5).empty());
    // Filled by inserts alone, they stay exact (the SSS without pivots).
    ListOfClusters lc_ref(WordList(), 4);
    for (const Word& w : words) {
        lc->insert(view(w));
        lc_ref.insert(view(w));
        sss->insert(view(w));
    }
    expect_same_lc(*lc, lc_ref);
    BruteForceIndex brute(to_list(words));
    expect_same_answers(*sss, brute, words, false);
    expect_same_answers(*lc, brute, words, false);
}

TEST(MetricRestore, BrokenStateIsAnInvalidArgument)
{
    const auto words = make_words(60, test_seed(914));
    const ListOfClusters lc(to_list(words), 5);
    std::vector<uint32_t> centres, radii;
    for (size_t c = 0; c < lc.clusters(); c++) {
        centres.push_back(lc.centre(c));
        radii.push_back(lc.radius(c));
    }
    const auto cluster_of = lc.cluster_assignment();
    const std::vector<uint8_t> removed(words.size(), 0);
    auto expect_invalid = [](auto&& fn) {
        try {
            fn();
            ADD_FAILURE() << "no error";
        } catch (const Error& e) {
            EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument) << e.what();
        }
    };
    // Sound: no error.
    EXPECT_NO_THROW(ListOfClusters::restore(to_list(words), removed, 5, centres, radii, cluster_of));
    expect_invalid([&] {
        ListOfClusters::restore(to_list(words), std::vector<uint8_t>(3, 0), 5, centres, radii,
                                cluster_of);
    });
    expect_invalid([&] {
        ListOfClusters::restore(to_list(words), removed, 0, centres, radii, cluster_of);
    });
    expect_invalid([&] {
        auto r = radii;
        r.pop_back();
        ListOfClusters::restore(to_list(words), removed, 5, centres, r, cluster_of);
    });
    expect_invalid([&] {
        auto c = centres;
        c[1] = uint32_t(words.size());
        ListOfClusters::restore(to_list(words), removed, 5, c, radii, cluster_of);
    });
    expect_invalid([&] {
        auto c = centres;
        c[1] = c[0];  // a centre twice: assigned to cluster 0, not 1
        ListOfClusters::restore(to_list(words), removed, 5, c, radii, cluster_of);
    });
    expect_invalid([&] {
        auto a = cluster_of;
        a[words.size() - 1] = uint32_t(centres.size());
        ListOfClusters::restore(to_list(words), removed, 5, centres, radii, a);
    });

    const SparseSpatialSelection sss(to_list(words), 0.5);
    std::vector<uint32_t> pivots;
    for (size_t p = 0; p < sss.pivots(); p++)
        pivots.push_back(sss.pivot(p));
    const std::vector<uint8_t> table(sss.table(), sss.table() + sss.size() * sss.pivots());
    ASSERT_GE(pivots.size(), 2u);
    EXPECT_NO_THROW(SparseSpatialSelection::restore(to_list(words), removed, 0.5, 9, pivots, table));
    expect_invalid([&] {
        SparseSpatialSelection::restore(to_list(words), removed, 0.0, 9, pivots, table);
    });
    expect_invalid([&] {
        auto t = table;
        t.pop_back();
        SparseSpatialSelection::restore(to_list(words), removed, 0.5, 9, pivots, t);
    });
    expect_invalid([&] {
        auto p = pivots;
        p[1] = p[0];
        SparseSpatialSelection::restore(to_list(words), removed, 0.5, 9, p, table);
    });
    expect_invalid([&] {
        auto p = pivots;
        p[1] = uint32_t(words.size() + 3);
        SparseSpatialSelection::restore(to_list(words), removed, 0.5, 9, p, table);
    });
}
