// The generic k-selection kernel (WarpSelect: a warp per row, BlockSelect:
// 4 warps per row) and the k = 1 arg-min kernel, over SelectArgs inputs.
#pragma once

#include <cstdint>

#include "cuda_check.h"
#include "select_args.h"
#include "warp_select.cuh"

namespace gpuivfpq::gpu {

constexpr int kSelectThreads = 128;

// The transform as key = max(min(alpha * x + rn + cn, hi), lo), uniform
// per kernel and branch-free per element (cosine aside). hi is
// kOverflowDistance for the metric transforms, where min(v, hi) is
// rank_distance(v) (fminf drops a NaN): a distance that overflowed still
// competes, as the CPU engine ranks it. The plain transforms have hi = +inf
// and keep +inf, the padding.
struct KeyFn {
    float alpha, lo, hi, rn;
    bool cosine;
    __device__ __forceinline__ float operator()(float x, float cn) const
    {
        if (cosine) {
            const float nn = rn * cn;
            return rank_distance(nn > 0.0f ? 1.0f - x * rsqrtf(nn) : 1.0f);
        }
        return fmaxf(fminf(fmaf(alpha, x, rn + cn), hi), lo);
    }
};

// Whether a's transform reads row and column norms.
__device__ __forceinline__ bool transform_norms(const SelectArgs& a)
{
    return a.transform == kTransformL2 || a.transform == kTransformCosine;
}

// The key function of row `row` of a (its transform and row norm).
__device__ __forceinline__ KeyFn key_fn_of(const SelectArgs& a, int64_t row)
{
    const bool norms = transform_norms(a);
    KeyFn key_of;
    key_of.alpha = a.transform == kTransformL2 ? -2.0f
                   : (a.transform == kTransformNegate || a.transform == kTransformIP) ? -1.0f
                                                                                       : 1.0f;
    key_of.lo = a.transform == kTransformL2 ? 0.0f : -INFINITY;
    key_of.rn = norms ? a.row_norms[row] : 0.0f;
    key_of.hi = norms || a.transform == kTransformIP ? kOverflowDistance : INFINITY;
    key_of.cosine = a.transform == kTransformCosine;
    return key_of;
}

// The columns [begin, end) of output row orow (its row's chunk), and its row.
struct ChunkSpan {
    int64_t row, begin, end;
};
__device__ __forceinline__ ChunkSpan chunk_span(const SelectArgs& a, int64_t orow)
{
    const int64_t row = orow / a.chunks;
    const int chunk = static_cast<int>(orow - row * a.chunks);
    const int64_t len = a.row_len ? a.row_len[row * a.row_len_stride] : a.n;
    const int64_t clen = a.chunks_split_len ? ((len + a.chunks - 1) / a.chunks + 3) / 4 * 4 : a.chunk_len;
    const int64_t begin = static_cast<int64_t>(chunk) * clen;
    return ChunkSpan{row, begin, begin + clen < len ? begin + clen : len};
}

// Calls f(key, label) for every candidate of one output row, t = this
// thread's index among the nt threads serving the row. Every thread makes
// the same number of calls (padding with (+inf, -1)), as WarpSelect needs.
// f (WarpSelect::add, which may inline a whole merge network) appears at
// only two call sites, inside loops that are not unrolled: this keeps code
// size and compile time in check; loads are software-pipelined instead.
template <typename F>
__device__ __forceinline__ void for_each_candidate(const SelectArgs& a, int64_t orow, int t, int nt,
                                                   F&& f)
{
    const ChunkSpan cols = chunk_span(a, orow);
    const int64_t row = cols.row, begin = cols.begin, end = cols.end;
    const int chunk = static_cast<int>(orow - row * a.chunks);
    const float* rp = a.in + row * a.ld;
    const int32_t* lp = a.in_labels ? a.in_labels + row * a.ld : nullptr;
    const bool norms = transform_norms(a);
    const KeyFn key_of = key_fn_of(a, row);
    // 16-byte loads, two per thread per step, the next step's two in flight
    // while the current eight values are offered (memory-level parallelism
    // is what the selection pass lacks, not instructions); the rest of the
    // row goes through the scalar slots.
    const bool vec = !lp && (a.ld & 3) == 0 && (begin & 3) == 0 &&
                     (reinterpret_cast<uintptr_t>(a.in) & 15) == 0 &&
                     (!norms || (reinterpret_cast<uintptr_t>(a.col_norms) & 15) == 0);
    const int64_t span = end > begin ? end - begin : 0;
    const int64_t step = 8 * nt;
    const int64_t vec_end = vec ? begin + span / step * step : begin;

    // Scalar slots first: the prefix candidates (a running top-k, chunk 0
    // only: it sets a tight bar early), then the row's unaligned tail.
    const int plen = (chunk == 0) ? a.prefix_len : 0;
    const int64_t pslots = (plen + nt - 1) / nt * nt;
    const int64_t slots = pslots + (end > vec_end ? end - vec_end : 0);
    const float* pd = plen ? a.prefix_dist + row * a.prefix_ld : nullptr;
    const int32_t* pi = plen ? a.prefix_idx + row * a.prefix_ld : nullptr;
    for (int64_t s0 = 0; s0 < slots; s0 += nt) {
        const int64_t s = s0 + t;
        float key = INFINITY;
        int lab = -1;
        if (s < pslots) {
            if (s < plen) {
                key = pd[s];
                lab = pi[s];
            }
        } else if (s < slots) {
            const int64_t c = vec_end + (s - pslots);
            key = key_of(rp[c], norms ? a.col_norms[c] : 0.0f);
            lab = lp ? lp[c] : a.label_base + static_cast<int>(c);
        }
        f(key, lab);
    }

    if (vec_end > begin) {
        const float4 z4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        auto ld4 = [&](int64_t c) { return __ldcs(reinterpret_cast<const float4*>(rp + c)); };
        auto ldn = [&](int64_t c) {
            return norms ? __ldg(reinterpret_cast<const float4*>(a.col_norms + c)) : z4;
        };
        const int64_t o0 = 4 * t, o1 = 4 * nt + 4 * t;
        float4 x0 = ld4(begin + o0), x1 = ld4(begin + o1);
        float4 n0 = ldn(begin + o0), n1 = ldn(begin + o1);
        for (int64_t i = begin; i < vec_end; i += step) {
            const int64_t nxt = i + step;
            float4 y0 = z4, y1 = z4, m0 = z4, m1 = z4;
            if (nxt < vec_end) {
                y0 = ld4(nxt + o0);
                y1 = ld4(nxt + o1);
                m0 = ldn(nxt + o0);
                m1 = ldn(nxt + o1);
            }
            // Eight explicit calls: f is small now that the merge network
            // is out of line.
            const int l0 = a.label_base + static_cast<int>(i + o0);
            const int l1 = a.label_base + static_cast<int>(i + o1);
            f(key_of(x0.x, n0.x), l0);
            f(key_of(x0.y, n0.y), l0 + 1);
            f(key_of(x0.z, n0.z), l0 + 2);
            f(key_of(x0.w, n0.w), l0 + 3);
            f(key_of(x1.x, n1.x), l1);
            f(key_of(x1.y, n1.y), l1 + 1);
            f(key_of(x1.z, n1.z), l1 + 2);
            f(key_of(x1.w, n1.w), l1 + 3);
            x0 = y0;
            x1 = y1;
            n0 = m0;
            n1 = m1;
        }
    }
}

__device__ __forceinline__ void store_label(const SelectArgs& a, int64_t pos, int lab)
{
    if (a.out_idx64)
        a.out_idx64[pos] = lab;
    else
        a.out_idx[pos] = lab;
}

template <int kQ, int kWarps>
__global__ void __launch_bounds__(kSelectThreads) select_kernel(SelectArgs a)
{
    constexpr int kT = ThreadQ<kQ>::value;
    const int warp = threadIdx.x >> 5;
    const int64_t total = a.rows * a.chunks;
    const int64_t orow =
        kWarps == 1 ? static_cast<int64_t>(blockIdx.x) * (kSelectThreads / 32) + warp : blockIdx.x;
    if (kWarps == 1 && orow >= total)
        return;  // whole warp leaves: WarpSelect needs no block barrier
    const int t = kWarps == 1 ? (threadIdx.x & 31) : threadIdx.x;
    SelectState<kQ, kT> state;
    WarpSelect<kQ, kT> ws;
    ws.init(&state, a.k);
    for_each_candidate(a, orow, t, 32 * kWarps, [&](float key, int lab) { ws.add(key, lab); });
    ws.finish();
    if (kWarps > 1) {
        __shared__ float sk[kQ];
        __shared__ int sv[kQ];
        block_merge(ws, kWarps, sk, sv);
        if (warp != 0)
            return;
    }
    const int64_t base = orow * a.k;
#pragma unroll
    for (int s = 0; s < WarpSelect<kQ, kT>::kW; ++s) {
        const int i = s * 32 + ws.lane;
        if (i < a.k) {
            a.out_dist[base + i] = a.out_sign * ws.key_at(s);
            store_label(a, base + i, ws.value_at(s));
        }
    }
}

template <int kQ>
void launch_select_impl(const SelectArgs& a, bool block_per_row, cudaStream_t stream)
{
    const int64_t total = a.rows * a.chunks;
    if (total == 0)
        return;
    // A 2048-entry warp queue needs ~230 registers: one warp per row would
    // spill, so that bucket always runs as BlockSelect.
    if (block_per_row || kQ >= 2048) {
        select_kernel<kQ, 4><<<static_cast<unsigned>(total), kSelectThreads, 0, stream>>>(a);
    } else {
        const int64_t blocks = (total + 3) / 4;
        select_kernel<kQ < 2048 ? kQ : 32, 1><<<static_cast<unsigned>(blocks), kSelectThreads, 0, stream>>>(a);
    }
    GPU_KERNEL_CHECK();
}

}  // namespace gpuivfpq::gpu
