// P x in double for rows x (RabitqRotation::apply's order, bit for bit):
// the queries of a RaBitQ search (rabitq_index.cu) and a build's unit
// residuals (rabitq_encode.cu).
#pragma once

#include <cstdint>

namespace gpuivfpq::gpu {

// out[s * d + i] = sum_k P[i * d + k] x[s * d + k] in double for the n rows
// of x, R rows a block: four partial sums by k % 4 over the first d - d % 4
// terms, the rest added to the first, then (p0 + p1) + (p2 + p3), products
// and sums rounded separately (rabitq_dot's order). 128 threads a block, a
// coordinate each; grid (ceil(d / 128), ceil(n / R)); R * d doubles of
// dynamic shared memory. Pt is P transposed (Pt[k * d + i] = P[i * d + k]),
// so that the threads of a warp, coordinates i side by side, read each k's
// entries in one coalesced load (P's rows, a row per thread, took 32 cache
// lines a load: 2.4 ms of a 768-d search of 1000 queries).
template <typename T, int R>
__global__ void __launch_bounds__(128) rabitq_rotate_kernel(const float* Pt, int d, const T* x, int64_t n, double* out)
{
    extern __shared__ double xs[];
    const int64_t s0 = int64_t(blockIdx.y) * R;
    for (int e = threadIdx.x; e < R * d; e += blockDim.x) {
        const int64_t s = s0 + e / d;
        xs[e] = s < n ? double(x[s * d + e % d]) : 0.0;
    }
    __syncthreads();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= d)
        return;
    const float* col = Pt + i;  // P[i * d + k] is col[k * d]
    double a[R][4];
#pragma unroll
    for (int s = 0; s < R; s++)
        a[s][0] = a[s][1] = a[s][2] = a[s][3] = 0.0;
    const int full = d / 4 * 4;
    // Unrolled so that a thread's loads are in flight together; the sums
    // keep their order.
#pragma unroll 4
    for (int k = 0; k < full; k += 4) {
        const double p[4] = {double(col[int64_t(k) * d]), double(col[int64_t(k + 1) * d]),
                             double(col[int64_t(k + 2) * d]), double(col[int64_t(k + 3) * d])};
#pragma unroll
        for (int s = 0; s < R; s++)
#pragma unroll
            for (int j = 0; j < 4; j++)
                a[s][j] = __dadd_rn(a[s][j], __dmul_rn(p[j], xs[s * d + k + j]));
    }
    for (int k = full; k < d; k++) {
        const double p = double(col[int64_t(k) * d]);
#pragma unroll
        for (int s = 0; s < R; s++)
            a[s][0] = __dadd_rn(a[s][0], __dmul_rn(p, xs[s * d + k]));
    }
#pragma unroll
    for (int s = 0; s < R; s++)
        if (s0 + s < n)
            out[(s0 + s) * d + i] = __dadd_rn(__dadd_rn(a[s][0], a[s][1]), __dadd_rn(a[s][2], a[s][3]));
}

// The same P x, bit for bit, for small batches: a coordinate's four partial
// sums by four warps (warp j: the terms k = j mod 4 in k order, a lane a
// coordinate, so that the warp reads each k's entries in one coalesced
// load), sixteen loads of a lane in flight before their terms are summed,
// then (p0 + p1) + (p2 + p3); the tail (d % 4 terms) added to the first by
// warp 0. rabitq_rotate_kernel's thread a coordinate waits on d / 16 rounds
// of loads; here a chain is a quarter as long. 128 threads a block, grid
// (ceil(d / 32), n) (n at most 65535); (d + 128) doubles of dynamic shared
// memory.
template <typename T>
__global__ void __launch_bounds__(128) rabitq_rotate_split_kernel(const float* Pt, int d, const T* x, int64_t n,
                                                                  double* out)
{
    extern __shared__ double xs[];  // the row (d), then the 4 x 32 partial sums
    double* part = xs + d;
    const int64_t s = blockIdx.y;
    if (s >= n)
        return;  // uniform over the block
    for (int e = threadIdx.x; e < d; e += blockDim.x)
        xs[e] = double(x[s * d + e]);
    __syncthreads();
    const int lane = threadIdx.x & 31, j = threadIdx.x >> 5;
    const int i = blockIdx.x * 32 + lane;
    const int full = d / 4 * 4;
    double acc = 0.0;
    if (i < d) {
        const float* col = Pt + i;  // P[i * d + k] is col[k * d]
        int k = j;
        for (; k + 60 < full; k += 64) {
            float p[16];
#pragma unroll
            for (int t = 0; t < 16; t++)
                p[t] = col[int64_t(k + 4 * t) * d];
#pragma unroll
            for (int t = 0; t < 16; t++)
                acc = __dadd_rn(acc, __dmul_rn(double(p[t]), xs[k + 4 * t]));
        }
        for (; k < full; k += 4)
            acc = __dadd_rn(acc, __dmul_rn(double(col[int64_t(k) * d]), xs[k]));
        if (j == 0)
            for (int t = full; t < d; t++)
                acc = __dadd_rn(acc, __dmul_rn(double(col[int64_t(t) * d]), xs[t]));
    }
    part[j * 32 + lane] = acc;
    __syncthreads();
    if (j == 0 && i < d)
        out[s * d + i] = __dadd_rn(__dadd_rn(part[lane], part[32 + lane]), __dadd_rn(part[64 + lane], part[96 + lane]));
}

}  // namespace gpuivfpq::gpu
