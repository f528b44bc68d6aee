// k-selection on the GPU (WarpSelect / BlockSelect) over an rows x n matrix.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/search_limits.h"

namespace gpuivfpq::gpu {

class GpuContext;

// The k limit is the engine's (src/engine/limits.h), shared with the CPU.
using gpuivfpq::kMaxSelectK;

// Auto picks BlockSelect (a block of 4 warps per row) when there are too few
// rows to fill the device with one warp per row, WarpSelect otherwise.
// Radix (test aid: the radix selection of set_radix_select, k up to 256
// only, else InvalidArgument) splits each row into chunks of 8192 columns
// (at most 64), a block each, then merges them; equal values are taken and
// ordered by column.
enum class SelectAlgo { Auto, Warp, Block, Radix };

// For each row of in (device, rows x n, row stride ld >= n floats), the k
// smallest (largest = false) or largest values, sorted best first, and their
// column indices. Rows with n < k are padded with (+inf or -inf, -1).
// out_dist / out_idx: device, rows x k. Throws InvalidArgument for k = 0 or
// k > kMaxSelectK. Values must not be NaN.
void k_select(GpuContext& ctx, const float* in, size_t rows, size_t n, size_t ld, size_t k,
              bool largest, float* out_dist, int32_t* out_idx, SelectAlgo algo = SelectAlgo::Auto);

}  // namespace gpuivfpq::gpu
