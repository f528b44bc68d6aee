// Device pieces that the staged search pipeline and the one-launch
// small-batch search (small_search.cu) both run, so that both compute the
// same numbers the same way: the query normalisation, the squared norm,
// the probed lists' direct base distance and the re-ranked rows' order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/exact_distance.h"
#include "engine/inner_product.h"

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
// stay as they are): normalize_rows' arithmetic, with normalize_row's
// (engine/inner_product.h) scaling by a power of two first where the
// square overflows or leaves float's normal range.
__device__ __forceinline__ void warp_normalize(float* p, int d, int lane)
{
    float s = warp_sqr_norm(p, d, lane);
    if (!(s <= 3.402823466e38f) || s < 1.175494351e-38f) {
        float top = 0.0f;
        for (int j = lane; j < d; j += 32)
            top = fmaxf(top, fabsf(p[j]));
        for (int off = 16; off > 0; off >>= 1)
            top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, off));
        if (top > 0.0f && top <= 3.402823466e38f) {
            scale_largest_to_unit(p, size_t(lane), size_t(d), 32, top);
            s = warp_sqr_norm(p, d, lane);
        }
    }
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

// exact_distance(metric, a, b, d) for L2 and inner product, a warp's work
// with the very same operations in the same order, so the same bits: the
// lanes form the products of a chunk of up to `chunk` elements (a multiple
// of 4) into scratch (shared memory, chunk doubles), then lanes 0 .. 3
// carry exact_distance's four interleaved partial sums through it in
// element order, lane 0 the tail past the last multiple of 4 as well. Every
// lane gets the result. Cosine has no such split here (its three sums run
// over every element in one chain): callers use exact_distance for it.
__device__ __forceinline__ double warp_exact_distance(Metric metric, const float* a, const float* b, int d,
                                                      int lane, double* scratch, int chunk)
{
    using namespace exact_detail;
    const bool l2 = metric == Metric::L2;
    const int d4 = d & ~3;
    double p = 0.0;
    for (int c0 = 0; c0 < d; c0 += chunk) {
        const int c1 = min(d, c0 + chunk);
        __syncwarp();  // the previous chunk's sums read scratch
        for (int i = c0 + lane; i < c1; i += 32) {
            const double x = double(a[i]), y = double(b[i]);
            double v;
            if (l2) {
                const double diff = sub(x, y);
                v = mul(diff, diff);
            } else {
                v = mul(x, y);
            }
            scratch[i - c0] = v;
        }
        __syncwarp();
        if (lane < 4) {
            const int e = min(c1, d4);
            for (int i = c0 + lane; i < e; i += 4)
                p = add(p, scratch[i - c0]);
            if (lane == 0)
                for (int i = max(c0, d4); i < c1; ++i)
                    p = add(p, scratch[i - c0]);
        }
    }
    const double p0 = __shfl_sync(0xffffffffu, p, 0), p1 = __shfl_sync(0xffffffffu, p, 1),
                 p2 = __shfl_sync(0xffffffffu, p, 2), p3 = __shfl_sync(0xffffffffu, p, 3);
    const double sum = add(add(p0, p1), add(p2, p3));
    return l2 ? root(sum) : -sum;
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
