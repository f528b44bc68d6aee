// The CPU engine's float inner product (distances.cpp's inner_product and
// norm_sqr) and its normalisation of a row, written once for the CPU and
// the GPU: a RaBitQ build encoding on the GPU normalises Cosine rows as the
// CPU engine does, bit for bit (no fused multiply-add on either side).
#pragma once

#include <cmath>
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

// Multiplies p[first], p[first + stride], ... (below d) by 2^-e, where top
// = m 2^e (m in [0.5, 1)) is the largest magnitude among them, in steps
// that keep each factor a normal float: the largest becomes m. normalize_row
// (every element) and the GPU's warp_normalize (a lane's) call it.
GPU_IVFPQ_HOST_DEVICE inline void scale_largest_to_unit(float* p, size_t first, size_t d, size_t stride, float top)
{
    using namespace exact_detail;
    int e = 0;
    (void)frexpf(top, &e);
    for (int shift = -e; shift != 0;) {
        const int step = shift > 100 ? 100 : shift < -100 ? -100 : shift;
        const float scale = ldexpf(1.0f, step);
        for (size_t t = first; t < d; t += stride)
            p[t] = mul(p[t], scale);
        shift -= step;
    }
}

// Scales row (d floats) to unit length in place: times 1 / ||row||, the
// norm's square from inner_product_lanes; a zero row stays as it is. A
// square that overflows float (a norm above about 1.8e19) or falls below
// its normal range (components below about 1e-19) is taken again after the
// row is scaled by the power of two that brings its largest component into
// [0.5, 1) (exact but for components that become subnormal), so that such
// a row still gets its direction; other rows are not touched by it.
GPU_IVFPQ_HOST_DEVICE inline void normalize_row(float* row, size_t d)
{
    using namespace exact_detail;
    float ss = inner_product_lanes(row, row, d);
    if (!(ss <= 3.402823466e38f) || ss < 1.175494351e-38f) {
        float top = 0.0f;
        for (size_t t = 0; t < d; t++)
            top = fmaxf(top, fabsf(row[t]));
        if (top > 0.0f && top <= 3.402823466e38f) {
            scale_largest_to_unit(row, 0, d, 1, top);
            ss = inner_product_lanes(row, row, d);
        }
    }
    const float nrm = root(ss);
    if (nrm > 0.0f) {
        const float inv = div(1.0f, nrm);
        for (size_t t = 0; t < d; t++)
            row[t] = mul(row[t], inv);
    }
}

}  // namespace gpuivfpq
