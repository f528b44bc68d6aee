// WarpSelect / BlockSelect of Johnson, Douze & Jegou: per-lane thread queues
// in registers, a sorted warp queue striped over the lanes, bitonic networks.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

namespace gpuivfpq::gpu {

constexpr unsigned kFullMask = 0xffffffffu;

// Layout: a warp-wide array of 32*S (key, value) pairs lives in k[S], v[S]
// of each lane, element e = s*32 + lane ("striped"). Strides >= 32 of a
// bitonic network then compare two registers of one lane, strides < 32 one
// register of two lanes (a shuffle). All register indices are compile-time
// constants after unrolling, so nothing goes to local memory.

// Lane exchange at xor-distance `stride`; this lane keeps the minimum of the
// pair when want_min, else the maximum. Equal keys never swap, so both lanes
// of a pair always agree.
__device__ __forceinline__ void cx_lanes(float& k, int& v, int stride, bool want_min)
{
    float ok = __shfl_xor_sync(kFullMask, k, stride);
    int ov = __shfl_xor_sync(kFullMask, v, stride);
    bool take = want_min ? (ok < k) : (ok > k);
    if (take) {
        k = ok;
        v = ov;
    }
}

// Register exchange: a is the lower element; ascending puts the smaller at a.
__device__ __forceinline__ void cx_regs(float& ka, int& va, float& kb, int& vb, bool ascending)
{
    bool swap = ascending ? (kb < ka) : (ka < kb);
    if (swap) {
        float tk = ka;
        ka = kb;
        kb = tk;
        int tv = va;
        va = vb;
        vb = tv;
    }
}

// One bitonic stage at `stride` inside blocks of `size` (direction from the
// element's bit `size`; size = N means all ascending).
template <int S>
__device__ __forceinline__ void bitonic_stage(float (&k)[S], int (&v)[S], int lane, int size,
                                              int stride)
{
    if (stride >= 32) {
        const int rs = stride >> 5;
#pragma unroll
        for (int s = 0; s < S; ++s) {
            const int p = s ^ rs;
            if (p > s)
                cx_regs(k[s], v[s], k[p], v[p], ((s << 5) & size) == 0);
        }
    } else {
#pragma unroll
        for (int s = 0; s < S; ++s) {
            const bool asc = ((((s << 5) | lane) & size) == 0);
            const bool lower = (lane & stride) == 0;
            cx_lanes(k[s], v[s], stride, lower == asc);
        }
    }
}

// Full bitonic sort, ascending, of the 32*S striped elements.
template <int S>
__device__ __forceinline__ void warp_sort(float (&k)[S], int (&v)[S], int lane)
{
#pragma unroll
    for (int size = 2; size <= 32 * S; size <<= 1) {
#pragma unroll
        for (int stride = size >> 1; stride > 0; stride >>= 1)
            bitonic_stage<S>(k, v, lane, size, stride);
    }
}

// Bitonic merge, ascending, of a bitonic sequence of 32*S striped elements.
template <int S>
__device__ __forceinline__ void warp_merge(float (&k)[S], int (&v)[S], int lane)
{
#pragma unroll
    for (int stride = 16 * S; stride > 0; stride >>= 1)
        bitonic_stage<S>(k, v, lane, 32 * S, stride);
}

// Queue state that only the (rare) merges touch: the warp queue and a copy
// of the thread queue. It lives in local memory (its address goes to the
// out-of-line merge), so the hot path keeps few registers and the merge
// network is compiled once per queue size instead of at every call site.
template <int kQ, int kT>
struct SelectState {
    float wk[kQ / 32];
    int wv[kQ / 32];
    float tk[kT];
    int tv[kT];
};

// Sort the 32*kT thread-queue entries, then keep the kQ smallest of the
// union with the warp queue: min(A[i], B[kQ-1-i]) is bitonic and holds
// exactly those, one bitonic merge sorts it. Returns the new bar: the k-th
// smallest (every lane gets it). All 32 lanes must call it.
template <int kQ, int kT>
__device__ __noinline__ float merge_thread_queues(SelectState<kQ, kT>* st, int k)
{
    constexpr int kW = kQ / 32;
    const int lane = threadIdx.x & 31;
    float wk[kW], tk[kT];
    int wv[kW], tv[kT];
#pragma unroll
    for (int s = 0; s < kW; ++s) {
        wk[s] = st->wk[s];
        wv[s] = st->wv[s];
    }
#pragma unroll
    for (int t = 0; t < kT; ++t) {
        tk[t] = st->tk[t];
        tv[t] = st->tv[t];
    }
    warp_sort<kT>(tk, tv, lane);
#pragma unroll
    for (int s = 0; s < kW; ++s) {
        const int bs = kW - 1 - s;
        float ok = INFINITY;
        int ov = -1;
        if (bs < kT) {
            const int b = bs < kT ? bs : 0;
            ok = __shfl_xor_sync(kFullMask, tk[b], 31);
            ov = __shfl_xor_sync(kFullMask, tv[b], 31);
        }
        if (ok < wk[s]) {
            wk[s] = ok;
            wv[s] = ov;
        }
    }
    warp_merge<kW>(wk, wv, lane);
    const int r = (k - 1) >> 5;
    float top = wk[0];
#pragma unroll
    for (int s = 0; s < kW; ++s) {
        st->wk[s] = wk[s];
        st->wv[s] = wv[s];
        if (s == r)
            top = wk[s];
    }
    return __shfl_sync(kFullMask, top, (k - 1) & 31);
}

// Merges another sorted warp queue (striped in shared memory) into st's.
template <int kQ, int kT>
__device__ __noinline__ void merge_shared_queue(SelectState<kQ, kT>* st, const float* sk, const int* sv)
{
    constexpr int kW = kQ / 32;
    const int lane = threadIdx.x & 31;
    float wk[kW];
    int wv[kW];
#pragma unroll
    for (int s = 0; s < kW; ++s) {
        const int j = kQ - 1 - (s * 32 + lane);
        const float ok = sk[j];
        const float mk = st->wk[s];
        const bool take = ok < mk;
        wk[s] = take ? ok : mk;
        wv[s] = take ? sv[j] : st->wv[s];
    }
    warp_merge<kW>(wk, wv, lane);
#pragma unroll
    for (int s = 0; s < kW; ++s) {
        st->wk[s] = wk[s];
        st->wv[s] = wv[s];
    }
}

// The k smallest (key, value) pairs offered by one warp. kQ: warp queue
// length, a power of two >= 32 and >= k; kT: thread queue length, a power of
// two. Every lane must call add() the same number of times (pad with +inf).
template <int kQ, int kT>
struct WarpSelect {
    static constexpr int kW = kQ / 32;
    SelectState<kQ, kT>* st;
    float tk[kT];
    int tv[kT];
    int num;    // entries in this lane's thread queue
    float top;  // the k-th smallest so far: the bar a candidate must beat
    int k;
    int lane;

    __device__ __forceinline__ void init(SelectState<kQ, kT>* state, int k_)
    {
        st = state;
        k = k_;
        lane = threadIdx.x & 31;
        num = 0;
        top = INFINITY;
#pragma unroll
        for (int s = 0; s < kW; ++s) {
            st->wk[s] = INFINITY;
            st->wv[s] = -1;
        }
#pragma unroll
        for (int t = 0; t < kT; ++t) {
            tk[t] = INFINITY;
            tv[t] = -1;
        }
    }

    // Unsorted thread queue: a candidate shifts in at slot 0 (a register
    // rotation, no run-time indexing); when any lane's queue is full, the
    // warp merges all queues into the warp queue.
    __device__ __forceinline__ void add(float key, int val)
    {
        if (key < top) {
#pragma unroll
            for (int t = kT - 1; t > 0; --t) {
                tk[t] = tk[t - 1];
                tv[t] = tv[t - 1];
            }
            tk[0] = key;
            tv[0] = val;
            ++num;
        }
        if (__any_sync(kFullMask, num == kT))
            merge();
    }

    __device__ __forceinline__ void merge()
    {
#pragma unroll
        for (int t = 0; t < kT; ++t) {
            st->tk[t] = tk[t];
            st->tv[t] = tv[t];
            tk[t] = INFINITY;
            tv[t] = -1;
        }
        num = 0;
        top = merge_thread_queues<kQ, kT>(st, k);
    }

    // Folds in what the thread queues still hold.
    __device__ __forceinline__ void finish() { merge(); }

    __device__ __forceinline__ float key_at(int s) const { return st->wk[s]; }
    __device__ __forceinline__ int value_at(int s) const { return st->wv[s]; }
};

// BlockSelect's final step: warps 1..W-1 hand their queues to warp 0 one at a
// time through shared memory (kQ keys + values). Every thread of the block
// must call it.
template <int kQ, int kT>
__device__ __forceinline__ void block_merge(WarpSelect<kQ, kT>& ws, int nwarps, float* sk, int* sv)
{
    const int warp = threadIdx.x >> 5;
    for (int w = 1; w < nwarps; ++w) {
        if (warp == w) {
#pragma unroll
            for (int s = 0; s < WarpSelect<kQ, kT>::kW; ++s) {
                sk[s * 32 + ws.lane] = ws.st->wk[s];
                sv[s * 32 + ws.lane] = ws.st->wv[s];
            }
        }
        __syncthreads();
        if (warp == 0)
            merge_shared_queue<kQ, kT>(ws.st, sk, sv);
        __syncthreads();
    }
}

// Thread-queue length per warp-queue length (powers of two; longer thread
// queues mean fewer merges, more registers).
template <int kQ>
struct ThreadQ {
    static constexpr int value = kQ <= 32 ? 2 : (kQ <= 256 ? 4 : 8);
};

}  // namespace gpuivfpq::gpu
