// RaBitQ codes on the GPU: the list scan of the codes of
// src/engine/rabitq.h (docs/rabitq-codes.md), for many (query, list) pairs
// in one launch. Each estimate and bound is RabitqModel::scan's, bit for
// bit (the same sums in the same order, no fused multiply-add), so the GPU
// and the CPU engine rank rows alike.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/rabitq.h"

namespace gpuivfpq::gpu {

class GpuContext;

// One (query, list) pair to scan: rows [first, first + count) of the codes
// and factors, their estimates (and bounds) to [out, out + count); the
// constants of the pair's RabitqListQuery.
struct RabitqPair {
    uint64_t first = 0;
    uint64_t out = 0;
    uint32_t count = 0;
    float base = 0, add_scale = 0, ip_scale = 0, bound_scale = 0;
};

// The pair of a list query prepared on the host (RabitqModel::prepare_list).
RabitqPair rabitq_pair(const RabitqListQuery& lq, uint64_t first, uint32_t count, uint64_t out);

// Scans npairs pairs (device array): pair i reads its byte tables at
// luts + i * rabitq_plane_words(d) * 4 * 256 (device floats, each pair's
// RabitqListQuery::lut) and the codes (device, code_stride bytes apart, a
// multiple of 4 at least rabitq_code_bytes(d, bits)) and factors (device)
// of its rows, and writes estimate (device) and, where bound is not null,
// bound. d <= kRabitqMaxDims, 1 <= bits <= 8, eps0 >= 0. Queued on the
// context's stream.
void rabitq_scan(GpuContext& ctx, const RabitqPair* pairs, size_t npairs, const float* luts, size_t d,
                 int bits, const uint8_t* codes, size_t code_stride, const RabitqFactors* factors, float eps0,
                 float* estimate, float* bound);

}  // namespace gpuivfpq::gpu
