// Edit distance on code points: UTF-8 decoding, and the bit-parallel and
// bounded forms against the reference DP on ASCII and Spanish text.
#include <chrono>
#include <cstdio>
#include <string>

#include "engine/metric/edit_distance.h"
#include "test_util.h"

using namespace gpuivfpq;
using testutil::test_seed;

namespace {

// UTF-8 of code points (an encoder independent of the decoder under test).
std::string encode(const std::vector<uint32_t>& cps)
{
    std::string s;
    for (uint32_t c : cps) {
        if (c < 0x80) {
            s += char(c);
        } else if (c < 0x800) {
            s += char(0xC0 | (c >> 6));
            s += char(0x80 | (c & 0x3F));
        } else if (c < 0x10000) {
            s += char(0xE0 | (c >> 12));
            s += char(0x80 | ((c >> 6) & 0x3F));
            s += char(0x80 | (c & 0x3F));
        } else {
            s += char(0xF0 | (c >> 18));
            s += char(0x80 | ((c >> 12) & 0x3F));
            s += char(0x80 | ((c >> 6) & 0x3F));
            s += char(0x80 | (c & 0x3F));
        }
    }
    return s;
}

WordView view(const std::vector<uint32_t>& w) { return WordView{w.data(), w.size()}; }

// The alphabets of the random tests: small ones make long common runs.
const std::vector<uint32_t> kAscii = {'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j', 'k',
                                      'l', 'm', 'n', 'o', 'p', 'q', 'r', 's', 't', 'u', 'v',
                                      'w', 'x', 'y', 'z', 'A', 'Z', '0', ' ', '-'};
const std::vector<uint32_t> kSmallAscii = {'a', 'b', 'c'};
// á é í ó ú ñ ü among plain letters, and two code points past the BMP's
// Latin range (a CJK ideograph, an emoji: 3- and 4-byte UTF-8).
const std::vector<uint32_t> kSpanish = {'a',  'e',  'i',  'o',  'n',  'c',  's',    'r',
                                        0xE1, 0xE9, 0xED, 0xF3, 0xFA, 0xF1, 0xFC,   0xD1,
                                        'u',  'l',  't',  'd',  'm',  'p',  0x4E2D, 0x1F600};
const std::vector<uint32_t> kSmallSpanish = {'n', 0xF1, 0xFC, 0xE1};
// Cyrillic and CJK, every symbol past the direct table (the hash path).
const std::vector<uint32_t> kWide = {0x430,  0x431,  0x432,  0x433,   0x434,    0x435, 0x436, 0x437,
                                     0x438,  0x439,  0x43A,  0x43B,   0x43C,    0x43D, 0x43E, 0x43F,
                                     0x4E00, 0x4E2D, 0x6587, 0x1F600, 0x10FFFF, 0x100};

std::vector<uint32_t> random_word(std::mt19937_64& gen, const std::vector<uint32_t>& alphabet,
                                  size_t len)
{
    std::vector<uint32_t> w(len);
    for (auto& c : w)
        c = alphabet[gen() % alphabet.size()];
    return w;
}

// b = a with `edits` random inserts, deletes and substitutions (so that pairs
// at small distances, where the bounded form must be exact, are common).
std::vector<uint32_t> mutate(std::mt19937_64& gen, std::vector<uint32_t> a,
                             const std::vector<uint32_t>& alphabet, size_t edits)
{
    for (size_t e = 0; e < edits; e++) {
        const int op = int(gen() % 3);
        const uint32_t c = alphabet[gen() % alphabet.size()];
        if (op == 0 || a.empty())
            a.insert(a.begin() + long(gen() % (a.size() + 1)), c);
        else if (op == 1)
            a.erase(a.begin() + long(gen() % a.size()));
        else
            a[gen() % a.size()] = c;
    }
    return a;
}

// Checks distance and within (several k around the answer) against the DP,
// for the pattern a and the text b.
void expect_matches_dp(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b)
{
    const uint32_t want = edit_distance_dp(view(a), view(b));
    const EditPattern pattern(view(a));
    ASSERT_EQ(pattern.distance(view(b)), want) << "m=" << a.size() << " n=" << b.size();
    ASSERT_EQ(edit_distance(view(a), view(b)), want);
    for (uint32_t k :
         {0u, 1u, 2u, 3u, 5u, want > 0 ? want - 1 : 0u, want, want + 1, 64u, 200u, UINT32_MAX}) {
        const uint32_t expected = want <= k ? want : k + 1;
        ASSERT_EQ(pattern.within(view(b), k), expected)
            << "m=" << a.size() << " n=" << b.size() << " k=" << k << " d=" << want;
        ASSERT_EQ(edit_distance_within(view(b), view(a), k), expected) << "k=" << k;
    }
}

}  // namespace

TEST(EditDistanceUtf8, DecodesCodePoints)
{
    EXPECT_EQ(utf8_decode(""), std::vector<uint32_t>{});
    EXPECT_EQ(utf8_decode("cañón"), (std::vector<uint32_t>{'c', 'a', 0xF1, 0xF3, 'n'}));
    EXPECT_EQ(utf8_decode("\xE4\xB8\xAD\xF0\x9F\x98\x80"),
              (std::vector<uint32_t>{0x4E2D, 0x1F600}));
    // The edges of each sequence length.
    EXPECT_EQ(
        utf8_decode("\x7F\xC2\x80\xDF\xBF\xE0\xA0\x80\xEF\xBF\xBF\xF0\x90\x80\x80\xF4\x8F\xBF\xBF"),
        (std::vector<uint32_t>{0x7F, 0x80, 0x7FF, 0x800, 0xFFFF, 0x10000, 0x10FFFF}));
    // Round trip of every kind of symbol the tests use.
    std::mt19937_64 gen(test_seed(11));
    for (int t = 0; t < 100; t++) {
        const auto w = random_word(gen, kSpanish, gen() % 40);
        EXPECT_EQ(utf8_decode(encode(w)), w);
    }
    // Appends to what is there.
    std::vector<uint32_t> out = {7};
    utf8_decode("ü", 2, out);
    EXPECT_EQ(out, (std::vector<uint32_t>{7, 0xFC}));
}

TEST(EditDistanceUtf8, InvalidIsAnInvalidArgument)
{
    const std::vector<std::string> bad = {
        "\x80",              // continuation with no lead
        "ab\xBF",            // same, later
        "\xC0\xAF",          // overlong '/'
        "\xC1\xBF",          // overlong
        "\xE0\x80\xAF",      // overlong 3-byte
        "\xF0\x80\x80\xAF",  // overlong 4-byte
        "\xED\xA0\x80",      // surrogate U+D800
        "\xED\xBF\xBF",      // surrogate U+DFFF
        "\xF4\x90\x80\x80",  // U+110000
        "\xF5\x80\x80\x80",  // never a lead
        "\xFF",              // never in UTF-8
        "\xC3",              // cut short
        "a\xE4\xB8",         // cut short
        "\xC3\x41",          // lead then ASCII
        "\xE4\xB8\xC3\xB1",  // lead, continuation, then a new lead
        std::string("\xF0\x9F\x98", 3),
    };
    for (const auto& s : bad) {
        SCOPED_TRACE(testing::Message() << "bytes=" << testing::PrintToString(s));
        std::vector<uint32_t> out = {1, 2};
        try {
            utf8_decode(s.data(), s.size(), out);
            ADD_FAILURE() << "accepted invalid UTF-8";
        } catch (const Error& e) {
            EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
            EXPECT_NE(std::string(e.what()).find("invalid UTF-8 at byte"), std::string::npos)
                << e.what();
        }
        EXPECT_EQ(out, (std::vector<uint32_t>{1, 2})) << "left partial output behind";
        EXPECT_THROW(edit_distance_utf8(s, "abc"), Error);
        EXPECT_THROW(edit_distance_utf8("abc", s), Error);
    }
    // The message names the offending byte's offset.
    try {
        utf8_decode(std::string_view("abc\xC3(", 5));
        ADD_FAILURE();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("byte 4 of a 5-byte text"), std::string::npos)
            << e.what();
    }
}

TEST(EditDistance, KnownValues)
{
    EXPECT_EQ(edit_distance_utf8("kitten", "sitting"), 3u);
    EXPECT_EQ(edit_distance_utf8("cañón", "canon"), 2u);  // two substitutions, not four bytes
    EXPECT_EQ(edit_distance_utf8("canon", "cañón"), 2u);
    EXPECT_EQ(edit_distance_utf8("pingüino", "pinguino"), 1u);
    EXPECT_EQ(edit_distance_utf8("año", "ano"), 1u);
    EXPECT_EQ(edit_distance_utf8("", ""), 0u);
    EXPECT_EQ(edit_distance_utf8("", "ñandú"), 5u);
    EXPECT_EQ(edit_distance_utf8("ñandú", ""), 5u);
    EXPECT_EQ(edit_distance_utf8("flaw", "lawn"), 2u);
    EXPECT_EQ(edit_distance_utf8("intention", "execution"), 5u);
    const auto a = utf8_decode("cañón"), b = utf8_decode("canon");
    EXPECT_EQ(edit_distance_dp(view(a), view(b)), 2u);
    EXPECT_EQ(EditPattern(view(a)).within(view(b), 1), 2u);  // k + 1: more than k
    EXPECT_EQ(EditPattern(view(a)).within(view(b), 2), 2u);
    // The empty pattern.
    const EditPattern empty;
    EXPECT_EQ(empty.distance(view(a)), 5u);
    EXPECT_EQ(empty.within(view(a), 3), 4u);
    EXPECT_EQ(empty.distance(nullptr, 0), 0u);
}

TEST(EditDistance, PatternTable)
{
    const auto w = utf8_decode("cañónñ");
    const EditPattern p(view(w));
    EXPECT_EQ(p.length(), 6u);
    EXPECT_EQ(p.blocks(), 1u);
    EXPECT_EQ(p.symbols(), 5u);  // a c n ñ ó
    EXPECT_EQ(p.slot('z'), 0u);
    EXPECT_EQ(p.slot(0x1F600), 0u);
    ASSERT_NE(p.slot(0xF1), 0u);
    EXPECT_EQ(p.peq()[p.slot(0xF1)], (uint64_t(1) << 2) | (uint64_t(1) << 5));
    EXPECT_EQ(p.peq()[p.slot('c')], uint64_t(1));
    EXPECT_EQ(p.peq()[0], 0u);
    std::vector<uint32_t> long_word(130, 'x');
    long_word[129] = 0x1F600;
    const EditPattern lp(view(long_word));
    EXPECT_EQ(lp.blocks(), 3u);
    EXPECT_EQ(lp.peq()[lp.slot(0x1F600) * 3 + 2], uint64_t(1) << 1);
    // Many symbols past the direct table: each finds its own slot in the
    // hash table, and symbols the pattern lacks find slot 0.
    std::vector<uint32_t> cjk;
    for (uint32_t c = 0x4E00; c < 0x4E00 + 300; c++)
        cjk.push_back(c * 7 % 0x10000 + 0x10000);
    const EditPattern hp(view(cjk));
    EXPECT_EQ(hp.symbols(), cjk.size());
    for (size_t i = 0; i < cjk.size(); i++) {
        const uint32_t s = hp.slot(cjk[i]);
        ASSERT_NE(s, 0u);
        EXPECT_EQ(hp.peq()[s * hp.blocks() + i / 64], uint64_t(1) << (i % 64)) << i;
    }
    for (uint32_t c : {0u, uint32_t('a'), 0x3000u, 0x10FFFFu, uint32_t(UINT32_MAX)})
        EXPECT_EQ(hp.slot(c), 0u) << c;
    // A key equal to the hash table's own markers is an ordinary symbol.
    const std::vector<uint32_t> odd = {UINT32_MAX, 0, 0x200};
    const EditPattern op(view(odd));
    EXPECT_NE(op.slot(UINT32_MAX), 0u);
    EXPECT_NE(op.slot(0), 0u);
    EXPECT_EQ(op.slot(0x201), 0u);
}

// Every length pair 0..200 in steps that cross 64 and 128, random alphabets,
// pairs unrelated and pairs a few edits apart.
TEST(EditDistance, BitParallelAndBoundedEqualDp)
{
    const uint64_t seed = test_seed(12);
    std::mt19937_64 gen(seed);
    std::vector<size_t> lengths = {0,   1,   2,   3,   7,   12,  31,  63,  64, 65,
                                   100, 127, 128, 129, 150, 191, 192, 193, 200};
    const std::vector<const std::vector<uint32_t>*> alphabets = {&kAscii, &kSmallAscii, &kSpanish,
                                                                 &kSmallSpanish, &kWide};
    size_t pairs = 0;
    for (const auto* alphabet : alphabets) {
        for (size_t m : lengths) {
            for (size_t n : lengths) {
                SCOPED_TRACE(testing::Message() << "seed=" << seed << " alphabet size="
                                                << alphabet->size() << " m=" << m << " n=" << n);
                const auto a = random_word(gen, *alphabet, m);
                const auto b = random_word(gen, *alphabet, n);
                expect_matches_dp(a, b);
                pairs++;
            }
            for (size_t edits : {1, 2, 3, 5, 9}) {
                SCOPED_TRACE(testing::Message()
                             << "seed=" << seed << " m=" << m << " edits=" << edits);
                const auto a = random_word(gen, *alphabet, m);
                expect_matches_dp(a, mutate(gen, a, *alphabet, edits));
                expect_matches_dp(mutate(gen, a, *alphabet, edits), a);
                pairs += 2;
            }
        }
    }
    // Random lengths everywhere in 0..200.
    for (int t = 0; t < 3000; t++) {
        const auto& alphabet = *alphabets[gen() % alphabets.size()];
        const auto a = random_word(gen, alphabet, gen() % 201);
        const auto b =
            t % 2 ? random_word(gen, alphabet, gen() % 201) : mutate(gen, a, alphabet, gen() % 12);
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " t=" << t);
        expect_matches_dp(a, b);
        pairs++;
    }
    EXPECT_GT(pairs, 5000u);
}

// One pattern, many texts: no state leaks from one call into the next.
TEST(EditDistance, PatternReusedAcrossTexts)
{
    std::mt19937_64 gen(test_seed(13));
    for (size_t m : {5, 64, 70, 140}) {
        const auto a = random_word(gen, kSpanish, m);
        const EditPattern p(view(a));
        for (int t = 0; t < 200; t++) {
            const auto b = t % 3 ? mutate(gen, a, kSpanish, gen() % 6)
                                 : random_word(gen, kSpanish, gen() % 150);
            const uint32_t want = edit_distance_dp(view(a), view(b));
            ASSERT_EQ(p.distance(view(b)), want);
            ASSERT_EQ(p.within(view(b), 2), std::min(want, 3u));
        }
    }
}

// A pattern longer than the stack state (kStackBlocks words) allocates it.
TEST(EditDistance, VeryLongPattern)
{
    std::mt19937_64 gen(test_seed(14));
    const size_t m = EditPattern::kStackBlocks * 64 + 70;
    const auto a = random_word(gen, kSmallSpanish, m);
    const auto b = mutate(gen, a, kSmallSpanish, 40);
    const uint32_t want = edit_distance_dp(view(a), view(b));
    const EditPattern p(view(a));
    EXPECT_GT(p.blocks(), EditPattern::kStackBlocks);
    EXPECT_EQ(p.distance(view(b)), want);
    EXPECT_EQ(p.within(view(b), want), want);
    EXPECT_EQ(p.within(view(b), want - 1), want);
    EXPECT_EQ(p.within(view(b), 5), 6u);
}

// Words of kMaxWordCodePoints code points are measured, one more is refused
// as a pattern and as a text: the bound on a pattern's memory and a
// distance's time, whatever the alphabet.
TEST(EditDistance, LongestWord)
{
    std::vector<uint32_t> longest(kMaxWordCodePoints);
    for (size_t i = 0; i < longest.size(); i++)
        longest[i] = uint32_t(0x10000 + i);  // every symbol distinct: the largest pattern
    std::vector<uint32_t> shifted(longest.begin() + 1, longest.end());
    shifted.push_back(0x41);
    const EditPattern p(view(longest));
    EXPECT_EQ(p.symbols(), kMaxWordCodePoints);
    EXPECT_EQ(p.distance(view(shifted)), 2u);
    EXPECT_EQ(p.within(view(shifted), 1), 2u);
    const std::vector<uint32_t> too_long(kMaxWordCodePoints + 1, 'a');
    try {
        EditPattern refused(view(too_long));
        ADD_FAILURE() << "accepted a pattern past the limit";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
        EXPECT_NE(std::string(e.what()).find(std::to_string(kMaxWordCodePoints)), std::string::npos)
            << e.what();
    }
    EXPECT_THROW(p.distance(view(too_long)), Error);
    EXPECT_THROW(p.within(view(too_long), 3), Error);
    EXPECT_THROW(edit_distance(view(too_long), view(shifted)), Error);
    EXPECT_THROW(edit_distance(view(shifted), view(too_long)), Error);
}

// ns per distance for 8-12 letter words: DP, bit-parallel, bounded (k = 2),
// over ASCII and Spanish words held back to back as an index holds them.
// Disabled: run with --gtest_also_run_disabled_tests --gtest_filter='*Bench*'.
TEST(EditDistanceBench, DISABLED_ShortWords)
{
    for (const auto* alphabet : {&kAscii, &kSpanish, &kWide}) {
        std::mt19937_64 gen(15);
        const size_t n = 20000;
        std::vector<uint32_t> cps;
        std::vector<size_t> offsets = {0};
        for (size_t i = 0; i < n; i++) {
            const auto w = random_word(gen, *alphabet, 8 + gen() % 5);
            cps.insert(cps.end(), w.begin(), w.end());
            offsets.push_back(cps.size());
        }
        const auto q = random_word(gen, *alphabet, 10);
        const EditPattern p(view(q));
        std::printf("%s alphabet (%zu symbols), query of 10, words of 8-12:\n",
                    alphabet == &kAscii     ? "ASCII"
                    : alphabet == &kSpanish ? "Spanish"
                                            : "Cyrillic/CJK",
                    alphabet->size());
        // Times f over all words, returning ns per word (the sum keeps the work).
        auto time = [&](const char* what, auto&& f) {
            const int reps = 20;
            uint64_t sum = 0;
            const auto t0 = std::chrono::steady_clock::now();
            for (int rep = 0; rep < reps; rep++)
                for (size_t i = 0; i < n; i++)
                    sum += f(WordView{cps.data() + offsets[i], offsets[i + 1] - offsets[i]});
            const double ns =
                std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0)
                    .count() /
                double(reps * n);
            std::printf("  %-40s %7.1f ns/distance (checksum %llu)\n", what, ns,
                        (unsigned long long)sum);
        };
        time("reference DP", [&](WordView w) { return edit_distance_dp(view(q), w); });
        time("bit-parallel (EditPattern::distance)", [&](WordView w) { return p.distance(w); });
        time("bounded k=1 (EditPattern::within)", [&](WordView w) { return p.within(w, 1); });
        time("bounded k=3 (EditPattern::within)", [&](WordView w) { return p.within(w, 3); });
        time("one-off edit_distance (builds pattern)",
             [&](WordView w) { return edit_distance(view(q), w); });
    }
}
