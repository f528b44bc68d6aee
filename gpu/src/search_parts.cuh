// Device pieces that the staged search pipeline and the one-launch
// small-batch search (small_search.cu) both run, so that both compute the
// same numbers the same way: the query normalisation, the squared norm,
// the probed lists' direct base distance and the re-ranked rows' order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/exact_distance.h"

namespace gpuivfpq::gpu {

// A warp's sum of p[j] * p[j] (lane-strided fma chains, then an xor
// butterfly): every lane gets it. row_norms and normalize_rows use it.
__device__ __forceinline__ float warp_sqr_norm(const float* p, int d, int lane)
{
    float s = 0.0f;
    for (int j = lane; j < d; j += 32)
        s = fmaf(p[j], p[j], s);
    for (int off = 16; off > 0; off >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, off);
    return s;
}

// Scales p (d floats) to unit length in place, a warp's work (zero rows
// stay as they are): normalize_rows' arithmetic.
__device__ __forceinline__ void warp_normalize(float* p, int d, int lane)
{
    const float s = warp_sqr_norm(p, d, lane);
    if (s > 0.0f) {
        const float inv = 1.0f / sqrtf(s);
        for (int j = lane; j < d; j += 32)
            p[j] *= inv;
    }
}

// A probed list's base distance recomputed directly, a warp's work (every
// lane gets it): ||q - c||^2, or -<q, c> for inner product. The GEMM form
// cancels badly near a centroid (the CPU engine does the same).
__device__ __forceinline__ float warp_probe_base(const float* q, const float* c, int d, bool ip, int lane)
{
    float s = 0.0f;
    for (int j = lane; j < d; j += 32) {
        const float v = ip ? q[j] * c[j] : (q[j] - c[j]) * (q[j] - c[j]);
        s += v;
    }
    for (int off = 16; off > 0; off >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, off);
    return ip ? -s : s;
}

// A re-ranked row's order: present candidates before missing ones (the
// padding follows every real result, NaN distances included), then
// exact_less.
__device__ __forceinline__ bool rerank_before(bool pa, double da, int64_t la, bool pb, double db, int64_t lb)
{
    if (pa != pb)
        return pa;
    return exact_less(da, la, db, lb);
}

}  // namespace gpuivfpq::gpu
