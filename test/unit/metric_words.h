// Seeded words for the metric-search tests of the mirrors and the kernels:
// ASCII and Spanish alphabets, lengths from 0 to 200 code points (across the
// 64 and 128 of the bit-parallel distance's blocks), planted near-duplicates
// so that small radii find something, and code points past the direct table
// and the Basic Multilingual Plane.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "engine/metric/metric_index.h"

namespace metricwords {

using Word = std::vector<uint32_t>;

// Printable ASCII; Spanish letters, accented ones and ñ included, with a
// few rarer symbols (U+0153, U+20AC, U+1F600) that take the hash path.
inline const std::vector<uint32_t>& ascii_alphabet()
{
    static const std::vector<uint32_t> a = [] {
        std::vector<uint32_t> v;
        for (uint32_t c = 0x20; c < 0x7F; c++)
            v.push_back(c);
        return v;
    }();
    return a;
}

inline const std::vector<uint32_t>& spanish_alphabet()
{
    static const std::vector<uint32_t> a = {
        'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j', 'l', 'm', 'n', 'o', 'p', 'r', 's', 't',
        'u', 'v', 'z', 0xE1, 0xE9, 0xED, 0xF3, 0xFA, 0xFC, 0xF1, 0x153, 0x20AC, 0x1F600};
    return a;
}

// A length: mostly 0..12, sometimes 55..75 or 120..140 (one and two blocks
// of 64 and their edges), now and then up to 200.
inline size_t random_length(std::mt19937_64& gen)
{
    switch (gen() % 10) {
    case 0: return 55 + gen() % 21;
    case 1: return 120 + gen() % 21;
    case 2: return gen() % 201;
    default: return gen() % 13;
    }
}

inline Word random_word(std::mt19937_64& gen, const std::vector<uint32_t>& alphabet)
{
    Word w(random_length(gen));
    // A narrow slice of the alphabet for some words, so that symbols repeat.
    const size_t span = gen() % 2 ? alphabet.size() : 1 + alphabet.size() / 4;
    for (uint32_t& c : w)
        c = alphabet[gen() % span];
    return w;
}

// w after `edits` random inserts, deletes and substitutions.
inline Word mutate(std::mt19937_64& gen, Word w, size_t edits, const std::vector<uint32_t>& alphabet)
{
    for (size_t e = 0; e < edits; e++) {
        const uint32_t c = alphabet[gen() % alphabet.size()];
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

// n words: fresh ones, and with probability 0.4 a copy of an earlier word
// 0..3 edits away.
inline std::vector<Word> make_words(size_t n, uint64_t seed, const std::vector<uint32_t>& alphabet)
{
    std::mt19937_64 gen(seed);
    std::vector<Word> words;
    for (size_t i = 0; i < n; i++) {
        if (!words.empty() && gen() % 10 < 4)
            words.push_back(mutate(gen, words[gen() % words.size()], gen() % 4, alphabet));
        else
            words.push_back(random_word(gen, alphabet));
    }
    return words;
}

// Queries: stored words 0..3 edits away, and one fresh word in four.
inline std::vector<Word> make_queries(const std::vector<Word>& words, size_t nq, uint64_t seed,
                                      const std::vector<uint32_t>& alphabet)
{
    std::mt19937_64 gen(seed);
    std::vector<Word> queries;
    for (size_t i = 0; i < nq; i++)
        queries.push_back(i % 4 == 3 || words.empty()
                              ? random_word(gen, alphabet)
                              : mutate(gen, words[gen() % words.size()], gen() % 4, alphabet));
    return queries;
}

inline gpuivfpq::WordView view(const Word& w) { return gpuivfpq::WordView{w.data(), w.size()}; }

inline gpuivfpq::WordList to_list(const std::vector<Word>& words)
{
    gpuivfpq::WordList list;
    for (const Word& w : words)
        list.push_back(view(w));
    return list;
}

// Hits as "(id,dist)..." for failure messages.
inline std::string describe(const gpuivfpq::MetricHit* hits, size_t n)
{
    std::string s;
    for (size_t i = 0; i < n && i < 24; i++)
        s += "(" + std::to_string(hits[i].id) + "," + std::to_string(hits[i].dist) + ")";
    return n > 24 ? s + "..." : s;
}

}  // namespace metricwords
