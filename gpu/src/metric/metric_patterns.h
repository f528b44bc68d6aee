// The queries' patterns of a metric search, built on the host in the layout
// the kernels read (edit_distance.cuh) and uploaded once per batch.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/metric/metric_index.h"
#include "edit_distance.cuh"

namespace gpuivfpq::gpu::metric {

// A batch's patterns, flat: query q's are info[q], which points into peq
// and table.
struct HostPatterns {
    std::vector<PatternInfo> info;
    std::vector<uint64_t> peq;
    std::vector<SymbolEntry> table;
    uint32_t max_blocks = 1;  // the most blocks of any query
    uint32_t max_length = 0;  // the longest query, in code points
};

// Most bytes of Peq rows and symbol tables one batch may take: a pattern of
// s distinct symbols and m code points takes (s + 1) * ceil(m / 64) words,
// which long texts of many symbols make large (as the engine's EditPattern).
constexpr uint64_t kMaxPatternBytes = uint64_t(1) << 30;

// Builds the patterns of queries; more than kMaxPatternBytes throws
// Error(OutOfMemory) naming the sizes.
HostPatterns build_patterns(const WordList& queries);

}  // namespace gpuivfpq::gpu::metric
