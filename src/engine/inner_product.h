// The CPU engine's float inner product (distances.cpp's inner_product and
// norm_sqr) and its normalisation of a row, written once for the CPU and
// the GPU: a RaBitQ build encoding on the GPU normalises Cosine rows as the
// CPU engine does, bit for bit (no fused multiply-add on either side).
#pragma once

#include <cstddef>

#include "exact_distance.h"
#include "host_device.h"

namespace gpuivfpq {

// sum_i a[i] * b[i] in float: 16 independent lanes (GCC vectorises them
// without -ffast-math: two AVX2 accumulators), summed in a fixed tree, then
// the d % 16 last products, summed in order, added.
GPU_IVFPQ_HOST_DEVICE inline float inner_product_lanes(const float* a, const float* b, size_t d)
{
    using namespace exact_detail;
    constexpr size_t kLanes = 16;
    float acc[kLanes] = {};
    size_t i = 0;
    for (; i + kLanes <= d; i += kLanes)
        for (size_t l = 0; l < kLanes; l++)
            acc[l] = add(acc[l], mul(a[i + l], b[i + l]));
    float tail = 0.0f;
    for (; i < d; i++)
        tail = add(tail, mul(a[i], b[i]));
    for (size_t w = kLanes / 2; w > 0; w /= 2)
        for (size_t l = 0; l < w; l++)
            acc[l] = add(acc[l], acc[l + w]);
    return add(acc[0], tail);
}

// Scales row (d floats) to unit length in place: times 1 / ||row||, the
// norm's square from inner_product_lanes; a zero row stays as it is.
GPU_IVFPQ_HOST_DEVICE inline void normalize_row(float* row, size_t d)
{
    using namespace exact_detail;
    const float nrm = root(inner_product_lanes(row, row, d));
    if (nrm > 0.0f) {
        const float inv = div(1.0f, nrm);
        for (size_t t = 0; t < d; t++)
            row[t] = mul(row[t], inv);
    }
}

}  // namespace gpuivfpq
