// Levenshtein distance on code points: strict UTF-8 decoding, the reference
// DP, and Myers/Hyyrö's bit-parallel algorithm (one word and blocked).
#include "edit_distance.h"

#include <algorithm>
#include <cstdio>

#include "engine/error.h"
#include "myers.h"

namespace gpuivfpq {

namespace {

// Throws the decoding error for byte `at` of a len-byte text.
[[noreturn]] void utf8_error(const char* s, size_t len, size_t at, const char* why)
{
    char msg[256];
    std::snprintf(msg, sizeof msg,
                  "invalid UTF-8 at byte %zu of a %zu-byte text (byte 0x%02X): %s; edit "
                  "distances are measured on Unicode code points, so text must be valid "
                  "UTF-8 (convert it first)",
                  at, len, unsigned(uint8_t(s[at])), why);
    throw Error(ErrorKind::InvalidArgument, msg);
}

// Whether byte b continues a multi-byte sequence (10xxxxxx).
inline bool is_continuation(uint8_t b) { return (b & 0xC0) == 0x80; }

}  // namespace

void utf8_decode(const char* s, size_t len, std::vector<uint32_t>& out)
{
    const size_t start = out.size();
    const auto* u = reinterpret_cast<const uint8_t*>(s);
    size_t i = 0;
    try {
        while (i < len) {
            const uint8_t b0 = u[i];
            if (b0 < 0x80) {
                out.push_back(b0);
                i++;
                continue;
            }
            // Lead byte: the sequence's length and the range its second byte
            // must fall in (which excludes overlong forms, surrogates and
            // values past U+10FFFF, per RFC 3629's table).
            size_t need;
            uint8_t lo = 0x80, hi = 0xBF;
            uint32_t cp;
            if (b0 < 0xC2) {
                utf8_error(s, len, i,
                           is_continuation(b0) ? "a continuation byte with no lead byte"
                                               : "an overlong two-byte form");
            } else if (b0 < 0xE0) {
                need = 1;
                cp = b0 & 0x1F;
            } else if (b0 < 0xF0) {
                need = 2;
                cp = b0 & 0x0F;
                if (b0 == 0xE0)
                    lo = 0xA0;  // overlong below U+0800
                if (b0 == 0xED)
                    hi = 0x9F;  // U+D800..U+DFFF are surrogates
            } else if (b0 < 0xF5) {
                need = 3;
                cp = b0 & 0x07;
                if (b0 == 0xF0)
                    lo = 0x90;  // overlong below U+10000
                if (b0 == 0xF4)
                    hi = 0x8F;  // past U+10FFFF
            } else {
                utf8_error(s, len, i, "a byte that never occurs in UTF-8");
            }
            if (len - i <= need)
                utf8_error(s, len, i, "a sequence cut short by the end of the text");
            for (size_t t = 1; t <= need; t++) {
                const uint8_t b = u[i + t];
                if (!is_continuation(b))
                    utf8_error(s, len, i + t, "a lead byte not followed by a continuation byte");
                if (t == 1 && (b < lo || b > hi))
                    utf8_error(s, len, i + t,
                               "an overlong form, a surrogate or a value past U+10FFFF");
                cp = (cp << 6) | (b & 0x3F);
            }
            out.push_back(cp);
            i += need + 1;
        }
    } catch (...) {
        out.resize(start);
        throw;
    }
}

std::vector<uint32_t> utf8_decode(std::string_view s)
{
    std::vector<uint32_t> out;
    out.reserve(s.size());
    utf8_decode(s.data(), s.size(), out);
    return out;
}

uint32_t edit_distance_dp(WordView a, WordView b)
{
    // row[j] = D[i][j]: the distance of a's first i symbols to b's first j.
    std::vector<uint32_t> row(b.size + 1);
    for (size_t j = 0; j <= b.size; j++)
        row[j] = uint32_t(j);
    for (size_t i = 1; i <= a.size; i++) {
        uint32_t diag = row[0];  // D[i-1][j-1]
        row[0] = uint32_t(i);
        for (size_t j = 1; j <= b.size; j++) {
            const uint32_t up = row[j];  // D[i-1][j]
            const uint32_t sub = diag + (a.data[i - 1] == b.data[j - 1] ? 0 : 1);
            row[j] = std::min({sub, up + 1, row[j - 1] + 1});
            diag = up;
        }
    }
    return row[b.size];
}

namespace {

// Fibonacci hashing of a code point into `32 - shift` bits.
inline uint32_t hash_symbol(uint32_t c, uint32_t shift)
{
    return uint32_t(c * 0x9E3779B1u) >> shift;
}

}  // namespace

void check_word_length(size_t n, const char* what)
{
    if (n <= kMaxWordCodePoints)
        return;
    char msg[200];
    std::snprintf(msg, sizeof msg, "%s has %zu code points; edit distances take words of at most %zu",
                  what, n, kMaxWordCodePoints);
    throw Error(ErrorKind::InvalidArgument, msg);
}

EditPattern::EditPattern() : peq_(1, 0)
{
    std::fill(std::begin(direct_slot_), std::end(direct_slot_), 0u);
}

EditPattern::EditPattern(const uint32_t* pattern, size_t m) : m_(m)
{
    check_word_length(m);
    blocks_ = std::max<size_t>(1, (m + 63) / 64);
    std::fill(std::begin(direct_slot_), std::end(direct_slot_), 0u);

    std::vector<uint32_t> sorted(pattern, pattern + m);
    std::sort(sorted.begin(), sorted.end());
    sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
    slots_ = sorted.size() + 1;
    require(slots_ <= UINT32_MAX, "edit distance: pattern has too many distinct symbols");

    const size_t wide =
        size_t(sorted.end() - std::lower_bound(sorted.begin(), sorted.end(), kDirectSymbols));
    if (wide > 0) {
        // At most a quarter full, so a miss (the common case: most text symbols
        // are not in the pattern) ends after a probe or two.
        uint32_t bits = 1;
        while ((size_t(1) << bits) < 4 * wide)
            bits++;
        hash_shift_ = 32 - bits;
        hash_key_.assign(size_t(1) << bits, 0);
        hash_slot_.assign(size_t(1) << bits, 0);
    }
    const uint32_t mask = uint32_t(hash_key_.size()) - 1;
    for (size_t s = 0; s < sorted.size(); s++) {
        const uint32_t c = sorted[s];
        if (c < kDirectSymbols) {
            direct_slot_[c] = uint32_t(s + 1);
            continue;
        }
        uint32_t h = hash_symbol(c, hash_shift_);
        while (hash_slot_[h] != 0)
            h = (h + 1) & mask;
        hash_key_[h] = c;
        hash_slot_[h] = uint32_t(s + 1);
    }

    peq_.assign(slots_ * blocks_, 0);
    for (size_t i = 0; i < m; i++)
        peq_[size_t(slot(pattern[i])) * blocks_ + i / 64] |= uint64_t(1) << (i % 64);
}

uint32_t EditPattern::slot(uint32_t c) const
{
    if (c < kDirectSymbols)
        return direct_slot_[c];
    if (hash_key_.empty())
        return 0;
    const uint32_t mask = uint32_t(hash_key_.size()) - 1;
    for (uint32_t h = hash_symbol(c, hash_shift_);; h = (h + 1) & mask) {
        const uint32_t s = hash_slot_[h];
        if (s == 0 || hash_key_[h] == c)
            return s;
    }
}

namespace {

// A text code point's Peq slot, as the shared loops (myers.h) ask for it.
struct SlotOf {
    const EditPattern* pattern;
    uint32_t operator()(uint32_t c) const { return pattern->slot(c); }
};

uint32_t text_length(size_t n)
{
    check_word_length(n);
    return uint32_t(n);
}

}  // namespace

// The column state the blocked form needs: on the stack up to
// kStackBlocks blocks, else allocated for the call.
template <typename F>
uint32_t EditPattern::with_state(F&& f) const
{
    if (blocks_ <= kStackBlocks) {
        uint64_t pv[kStackBlocks], mv[kStackBlocks];
        return f(pv, mv);
    }
    std::vector<uint64_t> state(2 * blocks_);
    return f(state.data(), state.data() + blocks_);
}

uint32_t EditPattern::distance(const uint32_t* text, size_t n) const
{
    const uint32_t len = text_length(n);
    if (blocks_ == 1 || m_ == 0 || n == 0)
        return myers::distance(peq_.data(), uint32_t(blocks_), SlotOf{this}, uint32_t(m_), text, len, nullptr,
                               nullptr, 1);
    return with_state([&](uint64_t* pv, uint64_t* mv) {
        return myers::distance(peq_.data(), uint32_t(blocks_), SlotOf{this}, uint32_t(m_), text, len, pv, mv, 1);
    });
}

uint32_t EditPattern::within(const uint32_t* text, size_t n, uint32_t k) const
{
    const uint32_t len = text_length(n);
    if (blocks_ == 1 || m_ == 0 || n == 0)
        return myers::within(peq_.data(), uint32_t(blocks_), SlotOf{this}, uint32_t(m_), text, len, k, nullptr,
                             nullptr, 1);
    return with_state([&](uint64_t* pv, uint64_t* mv) {
        return myers::within(peq_.data(), uint32_t(blocks_), SlotOf{this}, uint32_t(m_), text, len, k, pv, mv, 1);
    });
}

uint32_t edit_distance(WordView a, WordView b)
{
    if (a.size > b.size)
        std::swap(a, b);
    return EditPattern(a).distance(b);
}

uint32_t edit_distance_within(WordView a, WordView b, uint32_t k)
{
    if (a.size > b.size)
        std::swap(a, b);
    return EditPattern(a).within(b, k);
}

uint32_t edit_distance_utf8(std::string_view a, std::string_view b)
{
    const std::vector<uint32_t> ca = utf8_decode(a), cb = utf8_decode(b);
    return edit_distance(WordView{ca.data(), ca.size()}, WordView{cb.data(), cb.size()});
}

}  // namespace gpuivfpq
