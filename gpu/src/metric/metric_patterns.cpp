// Builds the queries' Peq rows and symbol tables for the metric kernels.
#include "metric_patterns.h"

#include <algorithm>
#include <cstdio>

#include "engine/error.h"

namespace gpuivfpq::gpu::metric {

namespace {

// log2 of a symbol table's entries for s distinct symbols: at least twice s
// (so a probe sequence meets an empty entry soon) and at least 8.
uint32_t table_bits_for(size_t distinct)
{
    uint32_t bits = 3;
    while ((size_t(1) << bits) < 2 * distinct)
        bits++;
    return bits;
}

}  // namespace

HostPatterns build_patterns(const WordList& queries)
{
    const size_t nq = queries.size();
    HostPatterns out;
    out.info.resize(nq);
    // Sizes first, so that an oversized batch is refused before it is built.
    std::vector<std::vector<uint32_t>> symbols(nq);
    uint64_t peq_words = 0, table_entries = 0;
    for (size_t q = 0; q < nq; q++) {
        const WordView w = queries[q];
        std::vector<uint32_t>& s = symbols[q];
        s.assign(w.data, w.data + w.size);
        std::sort(s.begin(), s.end());
        s.erase(std::unique(s.begin(), s.end()), s.end());
        PatternInfo& info = out.info[q];
        info.length = uint32_t(w.size);
        info.blocks = uint32_t(std::max<size_t>(1, (w.size + 63) / 64));
        info.table_bits = table_bits_for(s.size());
        info.peq = peq_words;
        info.table = table_entries;
        peq_words += uint64_t(s.size() + 1) * info.blocks;
        table_entries += uint64_t(1) << info.table_bits;
        out.max_blocks = std::max(out.max_blocks, info.blocks);
        out.max_length = std::max(out.max_length, info.length);
    }
    const uint64_t bytes = peq_words * sizeof(uint64_t) + table_entries * sizeof(SymbolEntry);
    if (bytes > kMaxPatternBytes) {
        char msg[240];
        std::snprintf(msg, sizeof msg,
                      "metric search: the patterns of %zu queries (longest %u code points) take "
                      "%llu bytes, more than the %llu a batch may; send fewer or shorter queries",
                      nq, out.max_length, (unsigned long long)bytes,
                      (unsigned long long)kMaxPatternBytes);
        throw Error(ErrorKind::OutOfMemory, msg);
    }
    out.peq.assign(size_t(peq_words), 0);
    out.table.assign(size_t(table_entries), SymbolEntry{0, 0});
    for (size_t q = 0; q < nq; q++) {
        const PatternInfo& info = out.info[q];
        const std::vector<uint32_t>& s = symbols[q];
        SymbolEntry* table = out.table.data() + info.table;
        const uint32_t mask = (uint32_t(1) << info.table_bits) - 1;
        for (size_t i = 0; i < s.size(); i++) {
            uint32_t h = hash_symbol(s[i], info.table_bits);
            while (table[h].slot != 0)
                h = (h + 1) & mask;
            table[h] = SymbolEntry{s[i], uint32_t(i + 1)};
        }
        // Bit i of word b of slot v: pattern[64 b + i] is slot v's symbol.
        const WordView w = queries[q];
        uint64_t* peq = out.peq.data() + info.peq;
        for (size_t i = 0; i < w.size; i++) {
            const size_t slot =
                size_t(std::lower_bound(s.begin(), s.end(), w.data[i]) - s.begin()) + 1;
            peq[slot * info.blocks + i / 64] |= uint64_t(1) << (i % 64);
        }
    }
    return out;
}

}  // namespace gpuivfpq::gpu::metric
