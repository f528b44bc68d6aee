// List of Clusters and SSS against brute force (itself against the DP) on
// seeded Spanish-like words with planted near-duplicates: range and k-NN,
// after inserts and deletes, evaluation counts, batches and bad input.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "engine/metric/lc_index.h"
#include "engine/metric/metric_index.h"
#include "engine/metric/sss_index.h"
#include "test_util.h"

using namespace gpuivfpq;
using testutil::test_seed;

namespace {

using Word = std::vector<uint32_t>;

WordView view(const Word& w) { return WordView{w.data(), w.size()}; }

Word to_word(WordView v) { return Word(v.data, v.data + v.size); }

// Letters of the generator: Spanish consonants (ñ included) and vowels
// (accented and ü included).
const std::vector<uint32_t> kConsonants = {'b', 'c', 'd', 'f', 'g', 'j', 'l', 'm',
                                           'n', 'p', 'r', 's', 't', 'v', 'z', 0xF1};
const std::vector<uint32_t> kVowels = {'a', 'e', 'i', 'o', 'u', 0xE1, 0xE9, 0xED, 0xF3, 0xFA, 0xFC};

// A word of 2-5 consonant-vowel syllables, sometimes ending in a consonant.
Word random_word(std::mt19937_64& gen)
{
    Word w;
    const size_t syllables = 2 + gen() % 4;
    for (size_t s = 0; s < syllables; s++) {
        w.push_back(kConsonants[gen() % kConsonants.size()]);
        w.push_back(kVowels[gen() % kVowels.size()]);
    }
    if (gen() % 3 == 0)
        w.push_back(kConsonants[gen() % kConsonants.size()]);
    return w;
}

// w with `edits` random inserts, deletes and substitutions.
Word mutate(std::mt19937_64& gen, Word w, size_t edits)
{
    for (size_t e = 0; e < edits; e++) {
        const uint32_t c =
            gen() % 2 ? kVowels[gen() % kVowels.size()] : kConsonants[gen() % kConsonants.size()];
        const int op = int(gen() % 3);
        if (op == 0 || w.empty())
            w.insert(w.begin() + long(gen() % (w.size() + 1)), c);
        else if (op == 1)
            w.erase(w.begin() + long(gen() % w.size()));
        else
            w[gen() % w.size()] = c;
    }
    return w;
}

// n words: fresh ones, and planted near-duplicates (1-3 edits of an earlier
// word, or an exact copy) with probability `dup`.
std::vector<Word> make_words(size_t n, uint64_t seed, double dup = 0.35)
{
    std::mt19937_64 gen(seed);
    std::vector<Word> words;
    for (size_t i = 0; i < n; i++) {
        if (!words.empty() && double(gen() % 1000) < dup * 1000.0)
            words.push_back(mutate(gen, words[gen() % words.size()], gen() % 4));
        else
            words.push_back(random_word(gen));
    }
    return words;
}

// Clustered words: `stems` random words, each with variants 0-2 edits away.
std::vector<Word> clustered_words(size_t n, size_t stems, uint64_t seed)
{
    std::mt19937_64 gen(seed);
    std::vector<Word> base(stems);
    for (auto& w : base)
        w = random_word(gen);
    std::vector<Word> words(n);
    for (auto& w : words)
        w = mutate(gen, base[gen() % stems], gen() % 3);
    return words;
}

WordList to_list(const std::vector<Word>& words)
{
    WordList list;
    for (const auto& w : words)
        list.push_back(view(w));
    return list;
}

// Queries: corpus words 0-3 edits away, and fresh words.
std::vector<Word> make_queries(const std::vector<Word>& words, size_t nq, uint64_t seed)
{
    std::mt19937_64 gen(seed);
    std::vector<Word> queries;
    for (size_t i = 0; i < nq; i++)
        queries.push_back(i % 4 == 3 ? random_word(gen)
                                     : mutate(gen, words[gen() % words.size()], gen() % 4));
    return queries;
}

// Range answers by the reference DP over the live words.
std::vector<MetricHit> dp_range(const MetricIndex& index, const Word& q, uint32_t r)
{
    std::vector<MetricHit> hits;
    for (uint32_t id = 0; id < index.size(); id++) {
        if (index.is_removed(id))
            continue;
        const uint32_t d = edit_distance_dp(view(q), index.word(id));
        if (d <= r)
            hits.push_back({id, d});
    }
    std::sort(hits.begin(), hits.end(), metric_hit_less);
    return hits;
}

std::string describe(const std::vector<MetricHit>& hits)
{
    std::string s;
    for (size_t i = 0; i < hits.size() && i < 20; i++)
        s += "(" + std::to_string(hits[i].id) + "," + std::to_string(hits[i].dist) + ")";
    return hits.size() > 20 ? s + "..." : s;
}

// Same ids and distances in the same order.
void expect_same(const std::vector<MetricHit>& got, const std::vector<MetricHit>& want)
{
    ASSERT_EQ(got.size(), want.size()) << "got " << describe(got) << "\nwant " << describe(want);
    for (size_t i = 0; i < got.size(); i++) {
        ASSERT_EQ(got[i].id, want[i].id)
            << "rank " << i << "\ngot " << describe(got) << "\nwant " << describe(want);
        ASSERT_EQ(got[i].dist, want[i].dist) << "rank " << i;
    }
}

// Range (radii 0..3) and k-NN of every query equal brute force's over the
// same objects; returns the number of range hits (so tests can check they
// are not vacuous).
size_t expect_matches_brute(const MetricIndex& index, const std::vector<Word>& queries,
                            const std::vector<size_t>& ks = {1, 3, 10, 40})
{
    // Brute force over the same words and removals.
    BruteForceIndex brute(index.words());
    for (uint32_t id = 0; id < index.size(); id++)
        if (index.is_removed(id))
            brute.remove(id);
    size_t hits = 0;
    for (size_t i = 0; i < queries.size(); i++) {
        const WordView q = view(queries[i]);
        for (uint32_t r = 0; r <= 3; r++) {
            SCOPED_TRACE(testing::Message() << "query " << i << " r=" << r);
            MetricStats stats;
            const auto got = index.range(q, r, &stats);
            EXPECT_EQ(stats.live_objects, index.live());
            expect_same(got, brute.range(q, r));
            hits += got.size();
        }
        for (size_t k : ks) {
            SCOPED_TRACE(testing::Message() << "query " << i << " k=" << k);
            MetricStats stats;
            const auto got = index.knn(q, k, &stats);
            EXPECT_EQ(got.size(), std::min(k, index.live()));
            expect_same(got, brute.knn(q, k));
        }
    }
    return hits;
}

// The two invariants of a list of clusters (see lc_index.h), by brute force.
void expect_lc_invariants(const ListOfClusters& lc)
{
    std::vector<uint8_t> seen(lc.size(), 0);
    for (size_t c = 0; c < lc.clusters(); c++) {
        const EditPattern centre(lc.word(lc.centre(c)));
        ASSERT_FALSE(seen[lc.centre(c)]);
        seen[lc.centre(c)] = 1;
        for (uint32_t x : lc.members(c)) {
            ASSERT_FALSE(seen[x]) << "object " << x << " in two clusters";
            seen[x] = 1;
            ASSERT_LE(centre.distance(lc.word(x)), lc.radius(c)) << "cluster " << c;
        }
        for (size_t later = c + 1; later < lc.clusters(); later++) {
            ASSERT_GE(centre.distance(lc.word(lc.centre(later))), lc.radius(c));
            for (uint32_t x : lc.members(later))
                ASSERT_GE(centre.distance(lc.word(x)), lc.radius(c))
                    << "cluster " << c << ", object " << x << " of cluster " << later;
        }
    }
    for (size_t id = 0; id < lc.size(); id++)
        ASSERT_TRUE(seen[id]) << "object " << id << " in no cluster";
}

// Inserts, deletes and queries interleaved on `index`, checked against brute
// force after each round.
void insert_delete_rounds(MetricIndex& index, const std::vector<Word>& extra, uint64_t seed)
{
    std::mt19937_64 gen(seed);
    size_t next = 0;
    for (int round = 0; round < 4; round++) {
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " round " << round);
        // Inserts: new words, near-duplicates of stored ones (live or not),
        // exact copies, and the odd long or empty word.
        for (int i = 0; i < 250 && next < extra.size(); i++) {
            Word w;
            switch (index.size() == 0 ? 5 : gen() % 6) {
            case 0: w = to_word(index.word(uint32_t(gen() % index.size()))); break;
            case 1:
                w = mutate(gen, to_word(index.word(uint32_t(gen() % index.size()))), 1 + gen() % 2);
                break;
            case 2: w = gen() % 10 == 0 ? Word{} : Word(20 + gen() % 20, 'a' + gen() % 3); break;
            default: w = extra[next++];
            }
            const size_t before = index.size();
            EXPECT_EQ(index.insert(view(w)), before);
            ASSERT_EQ(to_word(index.word(uint32_t(before))), w);
        }
        // Deletes, including centres and pivots (the low ids).
        for (int i = 0; i < 80; i++) {
            const uint32_t id = uint32_t(i % 4 == 0 ? gen() % 50 : gen() % index.size());
            const bool was = index.is_removed(id);
            EXPECT_EQ(index.remove(id), !was);
            EXPECT_TRUE(index.is_removed(id));
        }
        std::vector<Word> stored;
        for (uint32_t id = 0; id < index.size(); id++)
            stored.push_back(to_word(index.word(id)));
        expect_matches_brute(index, make_queries(stored, 25, seed + round), {1, 5, 30});
    }
}

}  // namespace

TEST(MetricIndexWords, FromUtf8AndPushBack)
{
    const std::string buf = "cañónperroñandúpingüino";
    const std::vector<uint64_t> offsets = {0, 7, 12, 12, 19, 28};
    ASSERT_EQ(buf.size(), 28u);
    const WordList list = WordList::from_utf8(buf.data(), offsets.data(), 5);
    ASSERT_EQ(list.size(), 5u);
    EXPECT_EQ(to_word(list[0]), utf8_decode("cañón"));
    EXPECT_EQ(to_word(list[1]), utf8_decode("perro"));
    EXPECT_EQ(list[2].size, 0u);
    EXPECT_EQ(to_word(list[3]), utf8_decode("ñandú"));
    EXPECT_EQ(to_word(list[4]), utf8_decode("pingüino"));
    EXPECT_EQ(list.offsets()[5], 5u + 5u + 0u + 5u + 8u);

    // A word appended from the list itself (its storage may move).
    WordList self;
    self.push_back_utf8("ab");
    for (int i = 0; i < 100; i++)
        self.push_back(self[self.size() - 1]);
    for (size_t i = 0; i < self.size(); i++)
        ASSERT_EQ(to_word(self[i]), utf8_decode("ab"));
    self.pop_back();
    EXPECT_EQ(self.size(), 100u);
}

TEST(MetricIndexWords, BadInputIsAnInvalidArgument)
{
    const std::string buf = "okbad\xC3(";
    const std::vector<uint64_t> offsets = {0, 2, 7};
    try {
        WordList::from_utf8(buf.data(), offsets.data(), 2);
        ADD_FAILURE() << "accepted invalid UTF-8";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
        EXPECT_NE(std::string(e.what()).find("word 1: invalid UTF-8 at byte 4"), std::string::npos)
            << e.what();
    }
    const std::vector<uint64_t> backwards = {0, 4, 2};
    try {
        WordList::from_utf8(buf.data(), backwards.data(), 2);
        ADD_FAILURE() << "accepted decreasing offsets";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    }
    WordList list;
    EXPECT_THROW(list.push_back_utf8("\xFF"), Error);
    EXPECT_EQ(list.size(), 0u);
    list.push_back_utf8("x");
    const Word huge(kMaxWordCodePoints + 1, 'a');
    EXPECT_THROW(list.push_back(view(huge)), Error);
    EXPECT_EQ(list.size(), 1u);

    // Index parameters.
    const auto words = to_list(make_words(50, 1));
    for (double alpha :
         {0.0, -0.5, 1.0001, 2.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
        try {
            SparseSpatialSelection sss(words, alpha);
            ADD_FAILURE() << "accepted alpha " << alpha;
        } catch (const Error& e) {
            EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument) << alpha;
        }
    }
    EXPECT_NO_THROW(SparseSpatialSelection(words, 1.0));
    try {
        ListOfClusters lc(words, 0);
        ADD_FAILURE() << "accepted bucket 0";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    }
    ListOfClusters lc(words, 4);
    try {
        lc.remove(50);
        ADD_FAILURE() << "removed an id past the end";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    }
    EXPECT_THROW(range_search_batch(lc, words, {1, 2}, 2), Error);
    EXPECT_THROW(lc.insert(view(huge)), Error);
    EXPECT_EQ(lc.size(), 50u);
}

// The reference itself: brute force equals the DP.
TEST(MetricIndex, BruteForceEqualsDp)
{
    const uint64_t seed = test_seed(401);
    const auto words = make_words(1500, seed);
    BruteForceIndex brute(to_list(words));
    for (uint32_t id = 0; id < 1500; id += 7)
        brute.remove(id);
    size_t hits = 0;
    for (const auto& q : make_queries(words, 30, seed + 1)) {
        for (uint32_t r = 0; r <= 3; r++) {
            MetricStats stats;
            const auto got = brute.range(view(q), r, &stats);
            expect_same(got, dp_range(brute, q, r));
            EXPECT_EQ(stats.distance_evaluations, brute.live());
            hits += got.size();
        }
        // k-NN: the k first of the DP's full ranking.
        auto all = dp_range(brute, q, UINT32_MAX);
        all.resize(25);
        expect_same(brute.knn(view(q), 25), all);
    }
    EXPECT_GT(hits, 30u);
    EXPECT_TRUE(brute.knn(view(words[0]), 0).empty());
    EXPECT_EQ(brute.knn(view(words[0]), 5000).size(), brute.live());
}

TEST(LcIndex, RangeAndKnnEqualBruteForce)
{
    const uint64_t seed = test_seed(402);
    const auto words = make_words(3000, seed);
    const auto queries = make_queries(words, 50, seed + 1);
    for (size_t bucket : {1, 8, 32}) {
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " bucket=" << bucket);
        const ListOfClusters lc(to_list(words), bucket);
        EXPECT_EQ(lc.bucket_size(), bucket);
        EXPECT_EQ(lc.clusters(), (3000 + bucket) / (bucket + 1));
        EXPECT_EQ(lc.centre(0), 0u);
        const size_t hits = expect_matches_brute(lc, queries);
        EXPECT_GT(hits, 100u);
    }
}

TEST(LcIndex, InvariantsAfterBuildAndInserts)
{
    const uint64_t seed = test_seed(403);
    const auto words = make_words(800, seed);
    for (size_t bucket : {1, 8, 32}) {
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " bucket=" << bucket);
        ListOfClusters lc(to_list(words), bucket);
        expect_lc_invariants(lc);
        // Buckets by construction: full except the last, ids ascending.
        for (size_t c = 0; c + 1 < lc.clusters(); c++) {
            EXPECT_EQ(lc.members(c).size(), bucket);
            EXPECT_TRUE(std::is_sorted(lc.members(c).begin(), lc.members(c).end()));
        }
        std::mt19937_64 gen(seed + bucket);
        for (int i = 0; i < 400; i++) {
            const Word w =
                i % 3 ? mutate(gen, words[gen() % words.size()], gen() % 3) : random_word(gen);
            lc.insert(view(w));
        }
        expect_lc_invariants(lc);
    }
}

// The next centre maximises the sum of distances to the earlier centres, and
// the bucket holds the nearest remaining objects.
TEST(LcIndex, BuildFollowsTheRules)
{
    const uint64_t seed = test_seed(404);
    const auto words = make_words(300, seed);
    const size_t bucket = 5;
    const ListOfClusters lc(to_list(words), bucket);
    std::vector<uint8_t> gone(words.size(), 0);
    std::vector<uint64_t> sum(words.size(), 0);
    for (size_t c = 0; c < lc.clusters(); c++) {
        uint32_t best = UINT32_MAX;
        for (uint32_t x = 0; x < words.size(); x++)
            if (!gone[x] && (best == UINT32_MAX || sum[x] > sum[best]))
                best = x;
        ASSERT_EQ(lc.centre(c), best) << "cluster " << c;
        gone[best] = 1;
        // The bucket: the nearest remaining by (distance, id).
        std::vector<MetricHit> rest;
        for (uint32_t x = 0; x < words.size(); x++)
            if (!gone[x])
                rest.push_back({x, edit_distance_dp(view(words[best]), view(words[x]))});
        std::sort(rest.begin(), rest.end(), metric_hit_less);
        std::vector<uint32_t> want;
        uint32_t radius = 0;
        for (size_t t = 0; t < std::min(bucket, rest.size()); t++) {
            want.push_back(rest[t].id);
            radius = std::max(radius, rest[t].dist);
            gone[rest[t].id] = 1;
        }
        std::sort(want.begin(), want.end());
        ASSERT_EQ(lc.members(c), want) << "cluster " << c;
        ASSERT_EQ(lc.radius(c), radius);
        for (uint32_t x = 0; x < words.size(); x++)
            if (!gone[x])
                sum[x] += edit_distance_dp(view(words[best]), view(words[x]));
    }
}

TEST(LcIndex, ExactAfterInsertsAndDeletes)
{
    const uint64_t seed = test_seed(405);
    const auto words = make_words(3000, seed);
    const std::vector<Word> first(words.begin(), words.begin() + 2000);
    const std::vector<Word> extra(words.begin() + 2000, words.end());
    for (size_t bucket : {1, 8, 32}) {
        SCOPED_TRACE(testing::Message() << "bucket=" << bucket);
        ListOfClusters lc(to_list(first), bucket);
        insert_delete_rounds(lc, extra, seed + bucket);
        expect_lc_invariants(lc);
    }
    // From nothing: every object arrives by insert.
    ListOfClusters empty(WordList(), 8);
    EXPECT_TRUE(empty.range(view(words[0]), 3).empty());
    EXPECT_TRUE(empty.knn(view(words[0]), 3).empty());
    insert_delete_rounds(empty, extra, seed + 99);
    expect_lc_invariants(empty);
}

TEST(SssIndex, RangeAndKnnEqualBruteForce)
{
    const uint64_t seed = test_seed(406);
    const auto words = make_words(3000, seed);
    const auto queries = make_queries(words, 50, seed + 1);
    for (double alpha : {0.3, 0.5, 0.7}) {
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " alpha=" << alpha);
        const SparseSpatialSelection sss(to_list(words), alpha);
        EXPECT_EQ(sss.alpha(), alpha);
        EXPECT_GT(sss.pivots(), 1u);
        EXPECT_EQ(sss.pivot(0), 0u);
        const size_t hits = expect_matches_brute(sss, queries);
        EXPECT_GT(hits, 100u);
    }
}

// Pivots are far from each other, every other object is near some pivot
// (the selection rule), and the table holds the clamped distances.
TEST(SssIndex, PivotsAndTableFollowTheRules)
{
    const uint64_t seed = test_seed(407);
    auto words = make_words(600, seed);
    // Long words, so that some distances pass the table's clamp.
    std::mt19937_64 gen(seed);
    words.push_back(Word(300, 'a'));
    words.push_back(Word(280, 'b'));
    for (int i = 0; i < 5; i++)
        words.push_back(mutate(gen, Word(290, 0xF1), 3));
    const WordList list = to_list(words);
    const uint32_t m = SparseSpatialSelection::estimate_max_distance(list, 1);
    uint32_t true_max = 0;
    for (size_t a = 0; a < words.size(); a += 3)
        for (size_t b = 0; b < words.size(); b++)
            true_max = std::max(true_max, edit_distance(view(words[a]), view(words[b])));
    EXPECT_LE(m, true_max);
    EXPECT_GE(2 * m, true_max);
    for (double alpha : {0.3, 0.5, 0.7}) {
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " alpha=" << alpha);
        const SparseSpatialSelection sss(list, alpha);
        EXPECT_EQ(sss.max_distance(), m);
        const double need = alpha * double(m);
        for (uint32_t x = 0; x < words.size(); x++) {
            double nearest = std::numeric_limits<double>::infinity();
            size_t earlier_pivots = 0;
            for (size_t p = 0; p < sss.pivots(); p++) {
                const uint32_t d = edit_distance_dp(view(words[sss.pivot(p)]), view(words[x]));
                ASSERT_EQ(sss.table_entry(x, p), std::min(d, SparseSpatialSelection::kTableMax))
                    << "object " << x << " pivot " << p;
                // The layout documented for mirrors: object-major rows.
                ASSERT_EQ(sss.table()[x * sss.pivots() + p], sss.table_entry(x, p));
                if (sss.pivot(p) < x) {
                    nearest = std::min(nearest, double(d));
                    earlier_pivots++;
                }
            }
            // A pivot is far from every earlier pivot; any other object is
            // near one.
            if (sss.is_pivot(x))
                ASSERT_TRUE(nearest >= need && nearest > 0) << "pivot " << x;
            else
                ASSERT_TRUE(earlier_pivots > 0 && (nearest < need || nearest == 0)) << x;
        }
    }
}

// Distances past kTableMax: the clamped entries may only bound from below,
// else the long near-duplicates below would be filtered out wrongly.
TEST(SssIndex, ClampedTableStaysExact)
{
    const uint64_t seed = test_seed(408);
    std::mt19937_64 gen(seed);
    std::vector<Word> words = {Word{'x'}};  // object 0, the first pivot: short
    for (int i = 0; i < 40; i++)
        words.push_back(random_word(gen));
    const Word long_a(400, 'a');
    for (int i = 0; i < 30; i++)
        words.push_back(mutate(gen, long_a, gen() % 4));
    const SparseSpatialSelection sss(to_list(words), 0.9);
    EXPECT_EQ(sss.table_entry(uint32_t(words.size() - 1), 0), SparseSpatialSelection::kTableMax);
    std::vector<Word> queries;
    for (int i = 0; i < 10; i++)
        queries.push_back(mutate(gen, long_a, gen() % 3));
    queries.push_back(Word(300, 'a'));
    const size_t hits = expect_matches_brute(sss, queries);
    EXPECT_GT(hits, 50u);
}

// A cap on the pivots ends the selection early; queries stay exact.
TEST(SssIndex, MaxPivotsCapsTheSelection)
{
    const uint64_t seed = test_seed(413);
    const auto words = make_words(2000, seed);
    const SparseSpatialSelection free_choice(to_list(words), 0.3);
    ASSERT_GT(free_choice.pivots(), 40u);
    const SparseSpatialSelection capped(to_list(words), 0.3, 1, 0, 40);
    ASSERT_EQ(capped.pivots(), 40u);
    for (size_t p = 0; p < 40; p++)
        EXPECT_EQ(capped.pivot(p), free_choice.pivot(p));
    EXPECT_GT(expect_matches_brute(capped, make_queries(words, 30, seed + 1)), 50u);
}

TEST(SssIndex, ExactAfterInsertsAndDeletes)
{
    const uint64_t seed = test_seed(409);
    const auto words = make_words(3000, seed);
    const std::vector<Word> first(words.begin(), words.begin() + 2000);
    const std::vector<Word> extra(words.begin() + 2000, words.end());
    for (double alpha : {0.3, 0.5, 0.7}) {
        SCOPED_TRACE(testing::Message() << "alpha=" << alpha);
        SparseSpatialSelection sss(to_list(first), alpha);
        const size_t pivots = sss.pivots();
        insert_delete_rounds(sss, extra, seed + uint64_t(alpha * 10));
        EXPECT_EQ(sss.pivots(), pivots);  // inserts add rows, never pivots
        // Each inserted row holds its clamped pivot distances.
        for (uint32_t x = 2000; x < sss.size(); x += 37)
            for (size_t p = 0; p < sss.pivots(); p++)
                ASSERT_EQ(sss.table_entry(x, p),
                          std::min(edit_distance(sss.word(sss.pivot(p)), sss.word(x)),
                                   SparseSpatialSelection::kTableMax));
    }
    SparseSpatialSelection empty(WordList(), 0.5);
    EXPECT_EQ(empty.pivots(), 0u);
    EXPECT_TRUE(empty.range(view(words[0]), 3).empty());
    insert_delete_rounds(empty, extra, seed + 99);
}

// Degenerate sets: all words equal (M = 0, one pivot; clusters of radius 0),
// a single word, the empty word.
TEST(MetricIndex, DegenerateSets)
{
    const std::vector<Word> same(200, utf8_decode("año"));
    const SparseSpatialSelection sss(to_list(same), 0.5);
    EXPECT_EQ(sss.max_distance(), 0u);
    EXPECT_EQ(sss.pivots(), 1u);
    const ListOfClusters lc(to_list(same), 8);
    for (size_t c = 0; c < lc.clusters(); c++)
        EXPECT_EQ(lc.radius(c), 0u);
    const std::vector<Word> queries = {utf8_decode("año"), utf8_decode("ano"), Word{},
                                       utf8_decode("años")};
    for (const MetricIndex* index :
         {static_cast<const MetricIndex*>(&sss), static_cast<const MetricIndex*>(&lc)}) {
        expect_matches_brute(*index, queries, {1, 10, 199, 200, 500});
        EXPECT_EQ(index->range(view(queries[0]), 0).size(), 200u);
        EXPECT_EQ(index->range(view(queries[1]), 0).size(), 0u);
        EXPECT_EQ(index->range(view(queries[1]), 1).size(), 200u);
    }
    const std::vector<Word> tiny = {Word{}, Word{'a'}};
    expect_matches_brute(ListOfClusters(to_list(tiny), 1), queries);
    expect_matches_brute(SparseSpatialSelection(to_list(tiny), 1.0), queries);
}

// A thread count changes the build's speed, never the index.
TEST(MetricIndex, BuildIndependentOfThreads)
{
    const auto words = to_list(make_words(3000, test_seed(410)));
    const ListOfClusters lc1(words, 8, 1), lc4(words, 8, 4);
    ASSERT_EQ(lc1.clusters(), lc4.clusters());
    for (size_t c = 0; c < lc1.clusters(); c++) {
        ASSERT_EQ(lc1.centre(c), lc4.centre(c));
        ASSERT_EQ(lc1.radius(c), lc4.radius(c));
        ASSERT_EQ(lc1.members(c), lc4.members(c));
    }
    EXPECT_EQ(lc1.build_evaluations(), lc4.build_evaluations());
    const SparseSpatialSelection s1(words, 0.5, 1), s4(words, 0.5, 4);
    ASSERT_EQ(s1.pivots(), s4.pivots());
    EXPECT_EQ(s1.max_distance(), s4.max_distance());
    for (size_t p = 0; p < s1.pivots(); p++)
        ASSERT_EQ(s1.pivot(p), s4.pivot(p));
    const size_t table_bytes = s1.size() * s1.pivots();
    EXPECT_TRUE(std::equal(s1.table(), s1.table() + table_bytes, s4.table()));
}

TEST(MetricIndex, BatchEqualsSingleQueries)
{
    const uint64_t seed = test_seed(411);
    const auto words = make_words(2500, seed);
    const auto queries = make_queries(words, 97, seed + 1);
    const WordList qlist = to_list(queries);
    std::vector<uint32_t> radii(queries.size());
    for (size_t i = 0; i < radii.size(); i++)
        radii[i] = uint32_t(i % 4);
    ListOfClusters lc(to_list(words), 8);
    SparseSpatialSelection sss(to_list(words), 0.5);
    BruteForceIndex brute(to_list(words));
    for (MetricIndex* index : {static_cast<MetricIndex*>(&lc), static_cast<MetricIndex*>(&sss),
                               static_cast<MetricIndex*>(&brute)}) {
        for (uint32_t id = 5; id < 2500; id += 11)
            index->remove(id);
        for (int threads : {1, 4}) {
            SCOPED_TRACE(testing::Message() << "threads=" << threads);
            const auto batch = range_search_batch(*index, qlist, radii, threads);
            const auto one_radius = range_search_batch(*index, qlist, {2}, threads);
            const auto knn = knn_search_batch(*index, qlist, 7, threads);
            ASSERT_EQ(batch.offsets.size(), queries.size() + 1);
            ASSERT_EQ(batch.stats.size(), queries.size());
            ASSERT_EQ(batch.offsets.back(), batch.hits.size());
            for (size_t i = 0; i < queries.size(); i++) {
                MetricStats stats;
                auto slice = [](const MetricBatchResult& b, size_t i) {
                    return std::vector<MetricHit>(b.hits.begin() + long(b.offsets[i]),
                                                  b.hits.begin() + long(b.offsets[i + 1]));
                };
                expect_same(slice(batch, i), index->range(view(queries[i]), radii[i], &stats));
                EXPECT_EQ(batch.stats[i].distance_evaluations, stats.distance_evaluations);
                expect_same(slice(one_radius, i), index->range(view(queries[i]), 2));
                expect_same(slice(knn, i), index->knn(view(queries[i]), 7));
            }
        }
        EXPECT_TRUE(range_search_batch(*index, WordList(), {}, 4).hits.empty());
    }
}

// On clustered words both indexes compute far fewer distances than brute
// force (the paper's Figure 3a measures this fraction; printed here).
TEST(MetricIndex, FewerEvaluationsThanBruteForceOnClusteredWords)
{
    const uint64_t seed = test_seed(412);
    const auto words = clustered_words(4000, 150, seed);
    const auto queries = make_queries(words, 100, seed + 1);
    const ListOfClusters lc8(to_list(words), 8), lc32(to_list(words), 32);
    const SparseSpatialSelection sss3(to_list(words), 0.3), sss5(to_list(words), 0.5);
    const std::vector<std::pair<const char*, const MetricIndex*>> indexes = {
        {"LC bucket 8", &lc8},
        {"LC bucket 32", &lc32},
        {"SSS alpha 0.3", &sss3},
        {"SSS alpha 0.5", &sss5}};
    for (const auto& [name, index] : indexes) {
        for (uint32_t r : {1u, 2u}) {
            uint64_t evaluations = 0, brute = 0;
            for (const auto& q : queries) {
                MetricStats stats;
                index->range(view(q), r, &stats);
                evaluations += stats.distance_evaluations;
                brute += stats.live_objects;
            }
            const double fraction = double(evaluations) / double(brute);
            std::printf("  %-14s r=%u: %.3f of brute force's distance evaluations\n", name, r,
                        fraction);
            EXPECT_LT(fraction, 0.6) << name << " r=" << r;
        }
        uint64_t evaluations = 0, brute = 0;
        for (const auto& q : queries) {
            MetricStats stats;
            index->knn(view(q), 10, &stats);
            evaluations += stats.distance_evaluations;
            brute += stats.live_objects;
        }
        std::printf("  %-14s k=10: %.3f of brute force's distance evaluations\n", name,
                    double(evaluations) / double(brute));
        EXPECT_LT(evaluations, brute) << name << " k-NN";
    }
}
