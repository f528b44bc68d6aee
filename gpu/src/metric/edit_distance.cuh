// The bit-parallel edit distance on the device: the device's pattern layout
// (one symbol hash table per query, uploaded per batch) over the loops the
// engine runs too (src/engine/metric/myers.h: Myers' algorithm in Hyyrö's
// formulation, one word or blocked, with the bounded form's diagonal
// cut-off), so every pair gets the engine's value (min(d, k + 1)). Plain C++
// with host-device qualifiers under nvcc: the host compiles it too (the
// pattern builder's self-check).
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/metric/myers.h"

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

// A text code point's Peq slot, as the shared loops (src/engine/metric/myers.h) ask.
struct SlotOf {
    const PatternView* p;
    GPU_METRIC_HD uint32_t operator()(uint32_t c) const { return symbol_slot(*p, c); }
};

// The exact distance between the pattern and text[0, n). pv, mv, stride:
// the column state when blocks > 1 (myers::multi_block).
GPU_METRIC_HD uint32_t distance(const PatternView& p, const uint32_t* text, uint32_t n,
                                uint64_t* pv, uint64_t* mv, size_t stride)
{
    return myers::distance(p.peq, p.blocks, SlotOf{&p}, p.m, text, n, pv, mv, stride);
}

// min(distance, k + 1), as EditPattern::within (the same code: myers.h).
GPU_METRIC_HD uint32_t within(const PatternView& p, const uint32_t* text, uint32_t n, uint32_t k,
                              uint64_t* pv, uint64_t* mv, size_t stride)
{
    return myers::within(p.peq, p.blocks, SlotOf{&p}, p.m, text, n, k, pv, mv, stride);
}

// a + b, saturating at UINT32_MAX (the reach r_c + r of the LC rules).
GPU_METRIC_HD uint32_t saturating_add(uint32_t a, uint32_t b)
{
    const uint64_t s = uint64_t(a) + b;
    return s > 0xFFFFFFFFull ? 0xFFFFFFFFu : uint32_t(s);
}

}  // namespace gpuivfpq::gpu::metric
