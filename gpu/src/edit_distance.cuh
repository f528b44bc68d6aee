// The bit-parallel edit distance on the device: Myers' algorithm in Hyyrö's
// formulation on code points, one 64-bit word of column state or Myers'
// blocked form, with the diagonal cut-off of the bounded form, step for step
// as src/engine/edit_distance.cpp computes it, so every pair gets the
// engine's value (min(d, k + 1)). Plain C++ with host-device qualifiers
// under nvcc: the host compiles it too (the pattern builder's self-check).
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define GPU_METRIC_HD __host__ __device__ __forceinline__
#else
#define GPU_METRIC_HD inline
#endif

namespace gpuivfpq::gpu::metric {

// One entry of a pattern's symbol table: a code point and its Peq slot;
// slot 0 marks an empty entry (slot 0 is also "not in the pattern").
struct alignas(8) SymbolEntry {
    uint32_t key;
    uint32_t slot;
};

// Where one query's pattern lies in its batch's arrays. The layout differs
// from EditPattern's (one hash table for every symbol, no direct table): a
// kernel reads an entry with one 8-byte load, and only the values matter.
struct PatternInfo {
    uint64_t peq = 0;         // its first Peq word: slots x blocks words, slot-major
    uint64_t table = 0;       // its first symbol entry: 2^table_bits of them
    uint32_t length = 0;      // m, in code points
    uint32_t blocks = 1;      // 64-bit words per slot: max(1, ceil(m / 64))
    uint32_t table_bits = 3;  // the table is at most half full, so probes end
    uint32_t reserved = 0;
};

// One query's pattern as the distance reads it.
struct PatternView {
    const uint64_t* peq;
    const SymbolEntry* table;
    uint32_t m, blocks, bits;
};

GPU_METRIC_HD PatternView pattern_view(const PatternInfo& info, const uint64_t* peq,
                                       const SymbolEntry* table)
{
    return PatternView{peq + info.peq, table + info.table, info.length, info.blocks,
                       info.table_bits};
}

// Fibonacci hashing into `bits` bits (1 <= bits <= 31).
GPU_METRIC_HD uint32_t hash_symbol(uint32_t c, uint32_t bits)
{
    return uint32_t(c * 0x9E3779B1u) >> (32 - bits);
}

// The Peq slot of code point c (0 when the pattern does not hold it).
GPU_METRIC_HD uint32_t symbol_slot(const PatternView& p, uint32_t c)
{
    const uint32_t mask = (uint32_t(1) << p.bits) - 1;
    for (uint32_t h = hash_symbol(c, p.bits);; h = (h + 1) & mask) {
        const SymbolEntry e = p.table[h];
        if (e.slot == 0 || e.key == c)
            return e.slot;
    }
}

// One 64-bit word of column state (patterns of 1..64 code points, n >= 1):
// vertical deltas D[i+1][j] - D[i][j] are bit i of pv (+1) and mv (-1),
// horizontal ones of row i+1 bit i of ph and mh; row 0 grows by one per
// text symbol, hence the 1 shifted into ph. Bounded: follows the diagonal
// cell that ends in D[m][n] and gives up (k + 1) once it exceeds k.
template <bool Bounded>
GPU_METRIC_HD uint32_t single_block(const PatternView& p, const uint32_t* text, uint32_t n,
                                    uint32_t k)
{
    const uint32_t m = p.m;
    const uint64_t high = uint64_t(1) << (m - 1);
    uint64_t pv = ~uint64_t(0), mv = 0;
    uint32_t score = m;
    // The diagonal enters the table at row m - n (column 0) or at column
    // n - m (row 0), with value |m - n|.
    const uint32_t first = n > m ? n - m : 0;
    uint32_t i = m > n ? m - n : 0;
    uint32_t diag = m > n ? m - n : n - m;
    for (uint32_t j = 0; j < n; j++) {
        const uint64_t eq = p.peq[symbol_slot(p, text[j])];
        const uint64_t xv = eq | mv;
        const uint64_t xh = (((eq & pv) + pv) ^ pv) | eq;
        uint64_t ph = mv | ~(xh | pv);
        uint64_t mh = pv & xh;
        if (!Bounded) {
            score += (ph & high) ? 1 : 0;
            score -= (mh & high) ? 1 : 0;
        }
        ph = (ph << 1) | 1;
        mh <<= 1;
        pv = mh | ~(xv | ph);
        mv = ph & xv;
        if (Bounded && j >= first) {
            // D[i+1][j+1] = D[i][j] + the horizontal delta of row i + the
            // vertical delta of row i+1, both read from the new column.
            diag += uint32_t((ph >> i) & 1) + uint32_t((pv >> i) & 1);
            diag -= uint32_t((mh >> i) & 1) + uint32_t((mv >> i) & 1);
            i++;
            if (diag > k)
                return k + 1;
        }
    }
    return Bounded ? diag : score;
}

// Myers' blocked form (patterns of more than 64 code points, n >= 1): the
// blocks of a column are advanced from the top, each passing the horizontal
// delta of its last row (-1, 0, +1) to the next. The column state of block b
// is pv[b * stride], mv[b * stride]: a thread's own array (stride 1) or its
// column of a scratch area shared by a grid (stride = the grid's threads,
// so that a warp's accesses to one block are contiguous).
template <bool Bounded>
GPU_METRIC_HD uint32_t multi_block(const PatternView& p, const uint32_t* text, uint32_t n,
                                   uint32_t k, uint64_t* pv, uint64_t* mv, size_t stride)
{
    const uint32_t nb = p.blocks, m = p.m;
    const uint64_t last_high = uint64_t(1) << ((m - 1) % 64);
    for (uint32_t b = 0; b < nb; b++) {
        pv[b * stride] = ~uint64_t(0);
        mv[b * stride] = 0;
    }
    uint32_t score = m;
    const uint32_t first = n > m ? n - m : 0;
    uint32_t i = m > n ? m - n : 0;
    uint32_t diag = m > n ? m - n : n - m;
    for (uint32_t j = 0; j < n; j++) {
        const uint64_t* eqrow = p.peq + uint64_t(symbol_slot(p, text[j])) * nb;
        const uint32_t diag_block = i / 64;
        uint64_t diag_ph = 0, diag_mh = 0;
        int hin = 1;  // row 0 grows by one per column
        for (uint32_t b = 0; b < nb; b++) {
            uint64_t eq = eqrow[b];
            const uint64_t pvb = pv[b * stride], mvb = mv[b * stride];
            const uint64_t xv = eq | mvb;
            if (hin < 0)
                eq |= 1;
            const uint64_t xh = (((eq & pvb) + pvb) ^ pvb) | eq;
            uint64_t ph = mvb | ~(xh | pvb);
            uint64_t mh = pvb & xh;
            const uint64_t high = b + 1 < nb ? uint64_t(1) << 63 : last_high;
            const int hout = (ph & high) ? 1 : ((mh & high) ? -1 : 0);
            ph <<= 1;
            mh <<= 1;
            if (hin < 0)
                mh |= 1;
            else if (hin > 0)
                ph |= 1;
            pv[b * stride] = mh | ~(xv | ph);
            mv[b * stride] = ph & xv;
            if (Bounded && b == diag_block) {
                diag_ph = ph;
                diag_mh = mh;
            }
            hin = hout;
        }
        score += uint32_t(hin);  // the last block's delta: the bottom row's
        if (Bounded && j >= first) {
            const uint32_t bit = i % 64;
            diag += uint32_t((diag_ph >> bit) & 1) +
                    uint32_t((pv[size_t(diag_block) * stride] >> bit) & 1);
            diag -= uint32_t((diag_mh >> bit) & 1) +
                    uint32_t((mv[size_t(diag_block) * stride] >> bit) & 1);
            i++;
            if (diag > k)
                return k + 1;
        }
    }
    return score;
}

// The exact distance between the pattern and text[0, n). pv, mv, stride:
// the column state when blocks > 1 (see multi_block).
GPU_METRIC_HD uint32_t distance(const PatternView& p, const uint32_t* text, uint32_t n,
                                uint64_t* pv, uint64_t* mv, size_t stride)
{
    if (p.m == 0)
        return n;
    if (n == 0)
        return p.m;
    return p.blocks == 1 ? single_block<false>(p, text, n, 0)
                         : multi_block<false>(p, text, n, 0, pv, mv, stride);
}

// min(distance, k + 1), as EditPattern::within: exact when k >= max(m, n)
// (k + 1 could overflow there), k + 1 at once when the lengths differ by
// more than k, else the bounded forms.
GPU_METRIC_HD uint32_t within(const PatternView& p, const uint32_t* text, uint32_t n, uint32_t k,
                              uint64_t* pv, uint64_t* mv, size_t stride)
{
    const uint32_t longer = p.m > n ? p.m : n;
    if (k >= longer)
        return distance(p, text, n, pv, mv, stride);
    const uint32_t gap = p.m > n ? p.m - n : n - p.m;
    if (gap > k)
        return k + 1;
    // Both lengths are at least 1 here: an empty side makes gap = longer.
    return p.blocks == 1 ? single_block<true>(p, text, n, k)
                         : multi_block<true>(p, text, n, k, pv, mv, stride);
}

// a + b, saturating at UINT32_MAX (the reach r_c + r of the LC rules).
GPU_METRIC_HD uint32_t saturating_add(uint32_t a, uint32_t b)
{
    const uint64_t s = uint64_t(a) + b;
    return s > 0xFFFFFFFFull ? 0xFFFFFFFFu : uint32_t(s);
}

}  // namespace gpuivfpq::gpu::metric
