// Levenshtein distance on Unicode code points: UTF-8 decoding, the reference
// dynamic programme, and the bit-parallel algorithm of Myers and Hyyrö.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gpuivfpq {

// A word as the distance sees it: code points, not bytes, so that 'ñ' (two
// UTF-8 bytes) costs one edit like 'n'. A pointer and a length, which a page
// format and a CUDA kernel can hold as they are.
struct WordView {
    const uint32_t* data = nullptr;
    size_t size = 0;
};

// Largest Unicode code point; decoding refuses anything above it.
constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// Longest word an edit distance takes, in code points, on either side (and
// so the longest word a metric index stores, and the longest query). A
// pattern of m code points of s distinct symbols takes (s + 1) * ceil(m / 64)
// 64-bit words, and one distance ceil(m / 64) steps per code point of the
// other word: this bound keeps the worst case (every symbol distinct) near
// 8 MB and a few milliseconds, whatever the alphabet. Distances then stay
// far below 2^24, so they are exact as the floats that TopK ranks.
constexpr size_t kMaxWordCodePoints = 8192;

// Throws Error(InvalidArgument) unless a word of n code points fits
// kMaxWordCodePoints; the message calls the word `what` ("a word", "word 7").
void check_word_length(size_t n, const char* what = "a word");

// Appends the code points of the UTF-8 text s[0, len) to out. Invalid UTF-8
// (a stray continuation byte, a truncated sequence, an overlong form, a
// surrogate, a value past U+10FFFF) throws Error(InvalidArgument) naming the
// byte offset, and leaves out as it was.
void utf8_decode(const char* s, size_t len, std::vector<uint32_t>& out);

// The code points of the UTF-8 text s (see the overload above).
std::vector<uint32_t> utf8_decode(std::string_view s);

// Levenshtein distance (insert, delete, substitute, each cost 1) by the
// textbook O(nm) dynamic programme: the reference the faster forms are
// tested against. Allocates one row.
uint32_t edit_distance_dp(WordView a, WordView b);

// A pattern preprocessed for the bit-parallel distance: built once per query
// and reused for every candidate. Its state is read-only during a search, so
// one pattern serves many threads. Layout, for a mirror on the GPU:
//  - the pattern's distinct code points get slots 1..s; slot 0 is every
//    code point the pattern does not hold;
//  - peq() holds blocks() 64-bit words per slot, slot-major: bit i of word b
//    of slot v is set when pattern[64 b + i] is that slot's code point;
//  - code points below kDirectSymbols (ASCII and Latin-1, so every Spanish
//    letter) find their slot in a direct table, the others in a small
//    open-addressing hash table (linear probing, at most a quarter full).
class EditPattern {
public:
    // The empty pattern (distance = the text's length).
    EditPattern();
    // Preprocesses pattern[0, m) (code points; any value, valid or not);
    // m past kMaxWordCodePoints throws Error(InvalidArgument).
    EditPattern(const uint32_t* pattern, size_t m);
    explicit EditPattern(WordView pattern) : EditPattern(pattern.data, pattern.size) {}

    size_t length() const { return m_; }
    // 64-bit words per slot: ceil(m / 64), at least 1.
    size_t blocks() const { return blocks_; }
    // Distinct code points of the pattern (slots 1..symbols()).
    size_t symbols() const { return slots_ - 1; }
    const uint64_t* peq() const { return peq_.data(); }
    // The slot of code point c (0 when the pattern does not contain c).
    uint32_t slot(uint32_t c) const;

    // Exact Levenshtein distance between the pattern and text[0, n); n past
    // kMaxWordCodePoints throws Error(InvalidArgument). Allocation-free for
    // patterns of up to kStackBlocks * 64 code points.
    uint32_t distance(const uint32_t* text, size_t n) const;
    uint32_t distance(WordView text) const { return distance(text.data, text.size); }

    // min(distance, k + 1): the exact distance when it is at most k, else
    // k + 1, found without finishing the table once the distance is known to
    // exceed k (length difference > k, or a cell of the diagonal that ends in
    // the result exceeds k: values never decrease along a diagonal).
    uint32_t within(const uint32_t* text, size_t n, uint32_t k) const;
    uint32_t within(WordView text, uint32_t k) const { return within(text.data, text.size, k); }

    // Blocks of column state a search keeps on the stack; longer patterns
    // allocate it per call.
    static constexpr size_t kStackBlocks = 16;
    // Code points looked up by direct index rather than by hash.
    static constexpr uint32_t kDirectSymbols = 256;

private:
    // Runs f(pv, mv) with the blocked form's column state (myers.h).
    template <typename F>
    uint32_t with_state(F&& f) const;

    size_t m_ = 0;
    size_t blocks_ = 1;
    size_t slots_ = 1;
    uint32_t direct_slot_[kDirectSymbols];
    // The hash table of the other symbols: a power of two of entries; slot 0
    // marks an empty entry, so any key value (UINT32_MAX too) can be stored.
    std::vector<uint32_t> hash_key_;
    std::vector<uint32_t> hash_slot_;
    uint32_t hash_shift_ = 32;
    std::vector<uint64_t> peq_;
};

// Edit distance of two code-point words (one-off: builds a pattern of the
// shorter; hot loops build an EditPattern once and call it).
uint32_t edit_distance(WordView a, WordView b);

// min(edit distance, k + 1), as EditPattern::within.
uint32_t edit_distance_within(WordView a, WordView b, uint32_t k);

// Edit distance of two UTF-8 texts on their code points; invalid UTF-8
// throws Error(InvalidArgument).
uint32_t edit_distance_utf8(std::string_view a, std::string_view b);

}  // namespace gpuivfpq
