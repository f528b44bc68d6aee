// The bit-parallel edit distance's inner loops (Myers' algorithm in Hyyrö's
// formulation), written once for the CPU and the GPU: the engine's
// EditPattern (edit_distance.cpp) and the device's patterns
// (gpu/src/metric/edit_distance.cuh) both run this code, so every pair of words gets
// the same value on either device. A pattern is its Peq words (slots x
// blocks, slot-major: bit i of word b of a slot is set when pattern[64 b + i]
// is that slot's code point; slot 0 is every code point the pattern does not
// hold) and a functor that gives a code point's slot; each side keeps its
// own symbol table.
#pragma once

#include <cstddef>
#include <cstdint>

#ifdef __CUDACC__
#define GPU_IVFPQ_MYERS __host__ __device__ __forceinline__
#else
#define GPU_IVFPQ_MYERS inline
#endif

namespace gpuivfpq {
namespace myers {

// One 64-bit word of column state (patterns of 1..64 code points, n >= 1):
// vertical deltas D[i+1][j] - D[i][j] are bit i of pv (+1) and mv (-1),
// horizontal ones of row i+1 bit i of ph and mh; row 0 grows by one per
// text symbol, hence the 1 shifted into ph. Bounded: follows the diagonal
// cell that ends in D[m][n] (it enters the table at row m - n, column 0, or
// at column n - m, row 0, with value |m - n|; values never decrease along a
// diagonal) and gives up (k + 1) once it exceeds k.
template <bool Bounded, typename SlotOf>
GPU_IVFPQ_MYERS uint32_t single_block(const uint64_t* peq, SlotOf slot_of, uint32_t m, const uint32_t* text,
                                      uint32_t n, uint32_t k)
{
    const uint64_t high = uint64_t(1) << (m - 1);
    uint64_t pv = ~uint64_t(0), mv = 0;
    uint32_t score = m;
    const uint32_t first = n > m ? n - m : 0;
    uint32_t i = m > n ? m - n : 0;
    uint32_t diag = m > n ? m - n : n - m;
    for (uint32_t j = 0; j < n; j++) {
        const uint64_t eq = peq[slot_of(text[j])];
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
// is pv[b * stride], mv[b * stride]: the caller's array (stride 1), or a
// thread's column of a scratch area a GPU grid shares (stride = the grid's
// threads, so that a warp's accesses to one block are contiguous).
template <bool Bounded, typename SlotOf>
GPU_IVFPQ_MYERS uint32_t multi_block(const uint64_t* peq, uint32_t nb, SlotOf slot_of, uint32_t m,
                                     const uint32_t* text, uint32_t n, uint32_t k, uint64_t* pv,
                                     uint64_t* mv, size_t stride)
{
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
        const uint64_t* eqrow = peq + uint64_t(slot_of(text[j])) * nb;
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
            diag += uint32_t((diag_ph >> bit) & 1) + uint32_t((pv[size_t(diag_block) * stride] >> bit) & 1);
            diag -= uint32_t((diag_mh >> bit) & 1) + uint32_t((mv[size_t(diag_block) * stride] >> bit) & 1);
            i++;
            if (diag > k)
                return k + 1;
        }
    }
    return score;
}

// The exact distance between a pattern of m code points (nb blocks) and
// text[0, n): pv, mv, stride are the column state when nb > 1.
template <typename SlotOf>
GPU_IVFPQ_MYERS uint32_t distance(const uint64_t* peq, uint32_t nb, SlotOf slot_of, uint32_t m,
                                  const uint32_t* text, uint32_t n, uint64_t* pv, uint64_t* mv, size_t stride)
{
    if (m == 0)
        return n;
    if (n == 0)
        return m;
    return nb == 1 ? single_block<false>(peq, slot_of, m, text, n, 0)
                   : multi_block<false>(peq, nb, slot_of, m, text, n, 0, pv, mv, stride);
}

// min(distance, k + 1): exact when k >= max(m, n) (the bound cannot bite,
// and k + 1 could overflow), k + 1 at once when the lengths differ by more
// than k, else the bounded forms.
template <typename SlotOf>
GPU_IVFPQ_MYERS uint32_t within(const uint64_t* peq, uint32_t nb, SlotOf slot_of, uint32_t m,
                                const uint32_t* text, uint32_t n, uint32_t k, uint64_t* pv, uint64_t* mv,
                                size_t stride)
{
    const uint32_t longer = m > n ? m : n;
    if (k >= longer)
        return distance(peq, nb, slot_of, m, text, n, pv, mv, stride);
    const uint32_t gap = m > n ? m - n : n - m;
    if (gap > k)
        return k + 1;
    // Here m, n >= 1: an empty side has gap = the other's length > k.
    return nb == 1 ? single_block<true>(peq, slot_of, m, text, n, k)
                   : multi_block<true>(peq, nb, slot_of, m, text, n, k, pv, mv, stride);
}

}  // namespace myers
}  // namespace gpuivfpq
