// A build's RaBitQ codes on the GPU (rabitq_encode.cu), for GpuRabitqIndex.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/distances.h"

namespace gpuivfpq::gpu {

class GpuContext;

// The rows (rabitq_row_bytes(d, bits) bytes each: bit planes, then
// RabitqFactors) of n rows x (host) against their lists list_ids (host,
// each below lists, else Error(InvalidArgument)), written to rows (host):
// RabitqModel::encode's, bit for bit. centroids (lists x d floats, the
// normalised rows' for Cosine) and the rotation P transposed (rotation_t[k *
// d + i] = P[i * d + k], d x d floats: rabitq_rotate_kernel's input) on the
// device.
void rabitq_encode_rows(GpuContext& ctx, const float* centroids, const float* rotation_t, size_t d, size_t lists,
                        int bits, Metric metric, const float* x, size_t n, const int32_t* list_ids, uint8_t* rows);

}  // namespace gpuivfpq::gpu
