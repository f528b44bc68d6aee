// The parts of the one-launch searches (small_search.cu for IVFPQ,
// rabitq_small.cu for RaBitQ codes) that do not depend on the codes: a
// thread-block cluster per query, the coarse step over its share of the
// centroids, the selections in shared memory and their merge across the
// cluster (radix select, rank by binary search), the scan sinks, and the
// host's choice of blocks per query. Both kernels call these, so that
// their coarse steps and selections give the same keys, order and ties.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <utility>

#include "block_radix.cuh"
#include "cuda_check.h"
#include "engine/search_limits.h"
#include "ivf_scan.cuh"
#include "search_parts.cuh"
#include "small_search.h"
#include "warp_select.cuh"

namespace gpuivfpq::gpu {

namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxCluster = 16;

// Keys a block selects from in shared memory (radix select); a block with
// more candidates than this keeps those below a running bar (FilterSink).
constexpr int kKeysPerThread = 16;
constexpr int kKeyCap = kThreads * kKeysPerThread;
static_assert(kThreads == kRadixThreads, "the selections run on block_radix.cuh's blocks");

struct Bump {
    size_t off = 0;
    __host__ __device__ size_t take(size_t bytes)
    {
        const size_t at = off;
        off = (off + bytes + 15) / 16 * 16;
        return at;
    }
};

// Asks for the 128-byte line at p in L1 or L2 (no register, no wait): the
// loops below read their rows one float at a time in a fixed order (the
// order of the sums they must reproduce), which alone would wait on memory
// at every line.
__device__ __forceinline__ void prefetch_l1(const void* p)
{
    asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
}
__device__ __forceinline__ void prefetch_l2(const void* p)
{
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// The lines of n bytes from p, split over `lanes` threads (t of them).
__device__ __forceinline__ void prefetch_span(const void* p, size_t n, int t, int lanes)
{
    const char* c = static_cast<const char*>(p);
    for (size_t o = static_cast<size_t>(t) * 128; o < n; o += static_cast<size_t>(lanes) * 128)
        prefetch_l1(c + o);
}

// A warp's tile of centroid rows (coarse step): R rows (32, 16 or 8) of W =
// 1024 / R columns, element (row, col) with its 16-byte group of four
// columns swizzled by the row within each eight groups, so that the eight
// rows a quarter-warp reads (four columns each, the same group) and the
// eight groups of one row it writes fall in distinct banks with no padding.
template <int R>
__device__ __forceinline__ int tile_at(int row, int col)
{
    constexpr int W = 1024 / R;
    const int g = col >> 2;
    return row * W + (((g & ~7) | ((g ^ row) & 7)) << 2) + (col & 3);
}

// The coarse step's dot products for the `rows` (<= R) centroid rows at
// base (d floats each), a lane a row: acc[i] += <query i, row lane> for the
// Q queries at qv + i * qstride (shared memory), every sum in column order
// with fmaf, so the same bits whatever R. The warp takes W = 1024 / R
// columns at a time through tile (1024 floats of shared memory, tile_at's
// swizzle): coalesced loads, conflict-free 16-byte reads. With d a
// multiple of 4, the next W columns are loaded (into registers, eight
// 16-byte words a lane) while the warp sums the current ones, so that a
// row's loads do not wait on memory one chunk at a time. Fewer rows a warp
// (R 8 or 16: a block with few centroids, wide rows) take as many floats a
// chunk in fewer, wider chunks: fewer waits on memory a row. Called by the
// whole warp.
template <int R, int Q>
__device__ __forceinline__ void coarse_sum_chunk(const float* qv, int qstride, const float* tile, int lane, int j0,
                                                 int w, float (&acc)[Q])
{
    constexpr int W = 1024 / R;
    if (w == W) {
        // Four columns per shared load, in column order.
#pragma unroll 8
        for (int c4 = 0; c4 < W; c4 += 4) {
            const float4 t4 = *reinterpret_cast<const float4*>(tile + tile_at<R>(lane, c4));
#pragma unroll
            for (int i = 0; i < Q; ++i) {
                const float4 q4 = *reinterpret_cast<const float4*>(qv + i * qstride + j0 + c4);
                acc[i] = fmaf(q4.x, t4.x, acc[i]);
                acc[i] = fmaf(q4.y, t4.y, acc[i]);
                acc[i] = fmaf(q4.z, t4.z, acc[i]);
                acc[i] = fmaf(q4.w, t4.w, acc[i]);
            }
        }
    } else {
        for (int col = 0; col < w; ++col) {
            const float t = tile[tile_at<R>(lane, col)];
#pragma unroll
            for (int i = 0; i < Q; ++i)
                acc[i] = fmaf(qv[i * qstride + j0 + col], t, acc[i]);
        }
    }
}

template <int R, int Q>
__device__ __forceinline__ void coarse_rows(const float* base, int rows, int d, const float* qv, int qstride,
                                            float* tile, int lane, float (&acc)[Q])
{
    constexpr int W = 1024 / R, G = W / 4;  // columns a chunk, 16-byte groups a row
    if ((d & 3) == 0) {
        // Lane's words: rows (lane + 32 i) / G, columns 4 ((lane + 32 i) % G) .. + 3.
        float4 next[8];
        auto fetch = [&](int j0) {
            const int w = min(W, d - j0);
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int f = lane + 32 * i, row = f / G, c4 = (f % G) * 4;
                next[i] = row < rows && c4 < w ? __ldg(reinterpret_cast<const float4*>(
                                                     base + static_cast<int64_t>(row) * d + j0 + c4))
                                               : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
        };
        fetch(0);
        for (int j0 = 0; j0 < d; j0 += W) {
            const int w = min(W, d - j0);
            __syncwarp();  // the previous chunk read
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int f = lane + 32 * i, row = f / G, c4 = (f % G) * 4;
                if (row < rows && c4 < w)
                    *reinterpret_cast<float4*>(tile + tile_at<R>(row, c4)) = next[i];
            }
            if (j0 + W < d)
                fetch(j0 + W);
            __syncwarp();
            if (lane < rows)
                coarse_sum_chunk<R, Q>(qv, qstride, tile, lane, j0, w, acc);
        }
        return;
    }
    for (int j0 = 0; j0 < d; j0 += W) {
        const int w = min(W, d - j0);
        __syncwarp();  // the previous chunk read
        for (int f = lane; f < R * W; f += 32) {
            const int row = f / W, col = f % W;
            if (row < rows && col < w)
                tile[tile_at<R>(row, col)] = __ldg(base + static_cast<int64_t>(row) * d + j0 + col);
        }
        __syncwarp();
        if (lane < rows)
            coarse_sum_chunk<R, Q>(qv, qstride, tile, lane, j0, w, acc);
    }
}

// Rows a warp takes in the coarse step when a block (or the batch's coarse
// keys kernel) has `rows` centroids to rank: all warps busy, each with the
// widest chunks that keeps them so (8, 16 or 32).
__host__ __device__ inline int coarse_rows_per_warp(int rows)
{
    return rows <= kWarps * 8 ? 8 : rows <= kWarps * 16 ? 16 : 32;
}

// A coarse key from the dot product s of the query with centroid c: the
// GEMM form exact_knn's selection makes (rn: the query's squared norm).
__device__ __forceinline__ float coarse_key(const float* centroid_norms, bool ip, float s, float rn, int c)
{
    return ip ? fmaxf(fminf(fmaf(-1.0f, s, 0.0f), kOverflowDistance), -INFINITY)
              : fmaxf(fminf(fmaf(-2.0f, s, rn + __ldg(centroid_norms + c)), kOverflowDistance), 0.0f);
}

// Bench aid: the scan selection's own phase ends, at tr[0 .. 3] (null: off).
#define SELECT_TRACE(i)                           \
    do {                                          \
        if (tr && blockIdx.x == 0 && tid == 0)    \
            tr[(i) - 1] = clock64();              \
    } while (0)

// The kk keys of this block's list `own` of all_k into the same list of
// every other block of the cluster: the block's threads spread over
// (block, entry) pairs, consecutive threads on consecutive entries of one
// block. Every thread calls it after the list is complete.
template <int kQ>
__device__ void broadcast_list(float* all_k, int kk, int own, int C)
{
    cg::cluster_group cluster = cg::this_cluster();
    const float* mine = all_k + own * (kQ + 1);
    const int work = kk * (C - 1);
    for (int t = threadIdx.x; t < work; t += kThreads) {
        const int o = t / kk, e = t - o * kk;
        const int b = o < own ? o : o + 1;
        cluster.map_shared_rank(all_k, b)[own * (kQ + 1) + e] = mine[e];
    }
}

// The kk smallest of keys[0 .. n) (shared memory, n <= kKeyCap; +inf is no
// candidate) in (key, position) order, as (key, label) into list `own` of
// this block's all_k / all_v (stride kQ + 1), the keys also into every
// other block's all_k, padded with (+inf, -1); an entry's label is
// label0 + its position, or lab[position] where lab is given (its
// positions then in label order). radix_cut finds the k-th key; the
// entries below it, the tied ones by position, then a rank count among the
// kk. Every thread calls it.
template <int kQ>
__device__ void select_smem(const float* keys, int n, int kk, int label0, const int* lab, int* hist, int* scan,
                            int* sel, float* selk, float* all_k, int* all_v, int own, int C, unsigned long long* tr)
{
    const int tid = threadIdx.x, lane = tid & 31;
    int* ctl = scan + 32;  // [4] selected count
    if (tid == 0)
        ctl[4] = 0;  // before radix_cut's barriers
    const RadixCut cut = radix_cut(keys, n, kk, hist, scan);
    SELECT_TRACE(1);
    // Selected: below the bin, or in it (all of it, or by index when tied).
    // Each thread takes a contiguous chunk (the ties by index need the
    // order); the warp claims its places in sel with one atomic per step.
    const int per = (n + kThreads - 1) / kThreads;
    const int c0 = min(n, tid * per), c1 = min(n, c0 + per);
    const int eq = cut_ties(cut, keys, c0, c1);  // tied entries in this thread's contiguous chunk
    int eq_total;
    int eq_before = cut.ties ? block_exclusive_scan(eq, scan, &eq_total) : 0;
    for (int j = 0; j < per; ++j) {  // uniform over the block
        const int i = c0 + j;
        const bool take = i < c1 && cut_takes(cut, kk, keys[i], eq_before);
        const unsigned ballot = __ballot_sync(kFullMask, take);
        if (ballot) {
            int at = 0;
            if (lane == 0)
                at = atomicAdd(ctl + 4, __popc(ballot));
            at = __shfl_sync(kFullMask, at, 0);
            if (take)
                sel[at + __popc(ballot & ((1u << lane) - 1u))] = i;
        }
    }
    __syncthreads();
    const int nsel = ctl[4];
    for (int e = tid; e < nsel; e += kThreads)
        selk[e] = keys[sel[e]];
    __syncthreads();
    SELECT_TRACE(2);
    // Rank count among the selected, (key, index) order, into this block's
    // own list (padding after); then the keys, in order, into the other
    // blocks' copies of it (consecutive threads, consecutive places: the
    // remote stores coalesce). The labels stay here: only this block reads
    // them.
    // kS consecutive lanes count for one entry, each over 1/kS of the
    // selected, summed by shuffles.
    constexpr int kS = kThreads / kQ;  // a power of two: 2 or 8
    static_assert(kS >= 1 && (kS & (kS - 1)) == 0 && kS <= 32, "lanes per entry");
    float* mine_k = all_k + own * (kQ + 1);
    int* mine_v = all_v + own * (kQ + 1);
    {  // kk <= kQ: one entry per kS threads covers them all
        const int e = tid / kS, part = tid % kS;
        float key = INFINITY;
        int i = -1, at = 0;
        if (e < kk && e < nsel) {
            i = sel[e];
            key = selk[e];
            for (int f = part; f < nsel; f += kS) {
                const float kj = selk[f];
                const int j = sel[f];
                at += kj < key || (kj == key && j < i);
            }
        }
#pragma unroll
        for (int off = 1; off < kS; off <<= 1)
            at += __shfl_xor_sync(kFullMask, at, off);
        if (part == 0 && e < kk) {
            if (e >= nsel)
                at = e;  // padding after the selected
            mine_k[at] = key;
            mine_v[at] = e < nsel ? (lab ? lab[i] : label0 + i) : -1;
        }
    }
    __syncthreads();
    SELECT_TRACE(3);
    broadcast_list<kQ>(all_k, kk, own, C);
    SELECT_TRACE(4);
}

// out[i] = the rank of entry i of this block's list (`own`) among the C
// sorted lists of kk entries, ordered by (key, list, position), for the
// entries that can rank below kk; kk for the others. Those that can: the
// first ceil(kk / C) entries of every list (at least kk entries) are all at
// most T, the largest of their last keys, so an entry with a larger key
// has kk entries before it; the list is sorted, so the entries up to T are
// a prefix of it (all of it when T is +inf). A group of G consecutive
// lanes serves an entry (G the power of two at or above C, C <= 16; lane b
// of the group searches list b, those from C on idle), a binary search
// each, summed by shuffles. Every thread calls it.
template <int kQ>
__device__ void rank_entries(const float* all_k, int C, int own, int kk, int* out)
{
    const int lane = threadIdx.x & 31;
    const float* mine = all_k + own * (kQ + 1);
    // T, and how many of this list's entries are at most T (every thread
    // computes both, from the same shared memory: no barrier).
    const int head = (kk + C - 1) / C - 1;
    float t = lane < C ? all_k[lane * (kQ + 1) + head] : -INFINITY;
    for (int off = 16; off > 0; off >>= 1)
        t = fmaxf(t, __shfl_xor_sync(kFullMask, t, off));
    int cnt = 0;
    {
        int lo = 0, hi = kk;  // entries <= t: the first cnt
        while (lo < hi) {
            const int mid = (lo + hi) >> 1;
            if (mine[mid] <= t)
                lo = mid + 1;
            else
                hi = mid;
        }
        cnt = lo;
    }
    for (int i = cnt + static_cast<int>(threadIdx.x); i < kk; i += kThreads)
        out[i] = kk;
    int G = 1;
    while (G < C)
        G <<= 1;
    const int work = cnt * G;
    const int lg = __ffs(G) - 1;
    for (int t0 = 0; t0 < work; t0 += kThreads) {  // uniform over the block
        const int w = t0 + static_cast<int>(threadIdx.x);
        const int i = w >> lg, b = w & (G - 1);
        int lo = 0;
        if (w < work && b < C && b != own) {
            const float v = mine[i];
            const float* lb = all_k + b * (kQ + 1);
            int hi = kk;  // entries of list b before v: key < v, or key <= v for b < own
            while (lo < hi) {
                const int mid = (lo + hi) >> 1;
                if (b < own ? lb[mid] <= v : lb[mid] < v)
                    lo = mid + 1;
                else
                    hi = mid;
            }
        }
        for (int off = 1; off < G; off <<= 1)
            lo += __shfl_xor_sync(kFullMask, lo, off);
        if (w < work && b == 0)
            out[i] = i + lo;
    }
    __syncthreads();
}

// The probe holding candidate position pos (prefix: nprobe + 1 offsets,
// pos < prefix[nprobe]): the last p with prefix[p] <= pos, a non-empty list.
__device__ __forceinline__ int probe_of(const int* prefix, int nprobe, int pos)
{
    int lo = 0, hi = nprobe;
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (prefix[mid] <= pos)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

// Scan sinks (scan_share_batched's and the one-entry loop's): keys into
// shared memory at their position (a share that fits keybuf), or
// FilterSink below.
struct KeybufSink {
    float* keybuf;
    int i0, i1;
    template <int kU>
    __device__ __forceinline__ void step(int b0, const float* key)
    {
#pragma unroll
        for (int u = 0; u < kU; ++u) {
            const int i = b0 + u * kThreads + static_cast<int>(threadIdx.x);
            if (i < i1)
                keybuf[i - i0] = key[u];
        }
    }
};

// A share larger than keybuf: the keys that can still be among the block's
// kk best, with their positions (labels), appended to keys / labels in
// position order; when a step might not fit, the buffer is cut to its kk
// best (cut_to_best), whose largest key then bars every later entry whose
// key is not below it (a later entry ranks after an equal one: its
// position is larger). Before the first cut only +inf (no candidate) is
// barred. n: the entries held, the same in every thread.
struct FilterSink {
    float* keys;
    int* labels;
    int kk;
    int* hist;  // scratch: two sets of step counts (cut_to_best uses all of it)
    int* scan;
    float* tk;  // cut_to_best's scratch, kk entries each
    int* tl;
    int cap;  // entries keys and labels hold
    int n = 0, steps = 0;
    uint32_t bar = 0xff800000u;  // order_bits(+inf)
    template <int kU>
    __device__ __forceinline__ void step(int b0, const float* key)
    {
        static_assert(kU * kWarps <= 32, "a warp scans the step's counts");
        const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
        if (n + kU * kThreads > cap)  // uniform
            n = cut_to_best(keys, labels, n, kk, hist, scan, tk, tl, &bar);
        // Counts per (u, warp), in position order; two sets used in turn, so
        // that a step's counts never overwrite those another warp still reads.
        int* cnt = hist + (steps++ & 1) * 96;
        unsigned ballot[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u) {
            ballot[u] = __ballot_sync(kFullMask, order_bits(key[u]) < bar);
            if (lane == 0)
                cnt[u * kWarps + warp] = __popc(ballot[u]);
        }
        __syncthreads();
        if (warp == 0) {
            const int v = lane < kU * kWarps ? cnt[lane] : 0;
            int x = v;
            for (int off = 1; off < 32; off <<= 1) {
                const int y = __shfl_up_sync(kFullMask, x, off);
                if (lane >= off)
                    x += y;
            }
            cnt[32 + lane] = n + x - v;
            if (lane == 31)
                cnt[64] = n + x;
        }
        __syncthreads();
#pragma unroll
        for (int u = 0; u < kU; ++u)
            if (ballot[u] & (1u << lane)) {
                const int at = cnt[32 + u * kWarps + warp] + __popc(ballot[u] & ((1u << lane) - 1u));
                keys[at] = key[u];
                labels[at] = b0 + u * kThreads + tid;
            }
        n = cnt[64];
    }
};

// The coarse step's keys over a block's share [c0, c1) of the centroids
// (called by every thread of the block): a lane per centroid summing its
// products in order, the GEMM form's key as exact_knn's selection makes it.
// A warp takes 32 centroids at a time, 32 columns at a time, through its
// tile in shared memory (tile_at's swizzle): coalesced loads, conflict-free
// 16-byte reads; a share of at most 128 centroids (many blocks a query, few
// lists) 16 or 8 a warp, 64 or 128 columns at a time
// (coarse_rows_per_warp), the same sums. kq (or null): the query's keys
// computed for the batch before the launch (coarse_keys_kernel), the same
// keys fed in the same order. The keys stay in keybuf when they fit; a
// share larger than keybuf goes through FilterSink, keys in its first half
// and labels (centroids) in the second (the tiles are in use). rn: the
// query's squared norm (0 for inner product).
struct HeldKeys {
    int n;              // keys held in keybuf
    const int* labels;  // their labels, or null: keybuf[i]'s is label0 + i (select_held)
};

__device__ __forceinline__ HeldKeys coarse_step_keys(const float* centroids, const float* centroid_norms,
                                                       const float* kq, int c0, int c1, int d, int nprobe, bool ip,
                                                       float rn, const float* qv, float* tile, float* keybuf,
                                                       int* hist, int* scan, float* mk, int* mv, int warp, int lane)
{
    const bool coarse_smem = c1 - c0 <= kKeyCap;  // uniform
    FilterSink coarse_sink{keybuf, reinterpret_cast<int*>(keybuf + kKeyCap / 2), nprobe, hist, scan, mk, mv,
                           kKeyCap / 2};
    const int per_warp = kq ? 32 : coarse_rows_per_warp(c1 - c0);  // uniform
    if (per_warp < 32) {
        // A few centroids: each in keybuf (coarse_smem: c1 - c0 <= 128).
        const int g = c0 + warp * per_warp, c = g + lane;
        if (g < c1) {  // uniform over the warp
            float s[1] = {0.0f};
            if (per_warp == 8)
                coarse_rows<8>(centroids + static_cast<int64_t>(g) * d, min(8, c1 - g), d, qv, 0, tile, lane, s);
            else
                coarse_rows<16>(centroids + static_cast<int64_t>(g) * d, min(16, c1 - g), d, qv, 0, tile, lane, s);
            if (lane < per_warp && c < c1)
                keybuf[c - c0] = coarse_key(centroid_norms, ip, s[0], rn, c);
        }
    }
    for (int g0 = c0; per_warp == 32 && g0 < c1; g0 += kWarps * 32) {  // uniform over the block
        const int g = g0 + warp * 32, c = g + lane;
        float key = INFINITY;
        if (kq) {
            if (c < c1)
                key = kq[c];
        } else if (g < c1) {  // uniform over the warp
            float s[1] = {0.0f};
            coarse_rows<32>(centroids + static_cast<int64_t>(g) * d, min(32, c1 - g), d, qv, 0, tile, lane, s);
            if (c < c1)
                key = coarse_key(centroid_norms, ip, s[0], rn, c);
        }
        if (!coarse_smem)
            coarse_sink.step<1>(g0, &key);  // labels g0 + tid: c
        else if (c < c1)
            keybuf[c - c0] = key;
    }
    return coarse_smem ? HeldKeys{c1 - c0, nullptr} : HeldKeys{coarse_sink.n, coarse_sink.labels};
}

// The kk best of the keys h holds in keybuf (the coarse step's, or a list
// scan's), into this block's list of all_k / all_v and every other block's
// all_k (select_smem; tr: its bench trace, or null). Every thread calls it.
template <int kQ>
__device__ __forceinline__ void select_held(const HeldKeys& h, const float* keybuf, int label0, int kk, int* hist,
                                            int* scan, int* win, float* mk, float* all_k, int* all_v, int r, int C,
                                            unsigned long long* tr = nullptr)
{
    __syncthreads();  // keybuf complete
    if (!h.labels)
        select_smem<kQ>(keybuf, h.n, kk, label0, nullptr, hist, scan, win, mk, all_k, all_v, r, C, tr);
    else
        select_smem<kQ>(keybuf, h.n, kk, 0, h.labels, hist, scan, win, mk, all_k, all_v, r, C, tr);
}

// win[0 .. *nwin): the entries i of this block's list whose rank[i] is
// below kk (rank_entries), *nwin counted up from its value. Every thread
// calls it; a barrier after.
__device__ __forceinline__ void list_winners(const int* rank, int kk, int* win, int* nwin)
{
    for (int i = threadIdx.x; i < kk; i += kThreads)
        if (rank[i] < kk)
            win[atomicAdd(nwin, 1)] = i;
    __syncthreads();
}

// The probes this block's entries of the coarse step won: rank (their rank
// among the cluster's, rank_entries), win[0 .. *nwin) (list_winners), and
// their centroid rows asked for in L1.
template <int kQ>
__device__ __forceinline__ void probe_winners(const float* all_k, const int* all_v, int C, int r, int nprobe,
                                              int* rank, int* win, int* nwin, const float* centroids, int d)
{
    rank_entries<kQ>(all_k, C, r, nprobe, rank);
    list_winners(rank, nprobe, win, nwin);
    for (int w = threadIdx.x; w < *nwin; w += kThreads) {
        const int list = all_v[r * (kQ + 1) + win[w]];
        if (list >= 0)
            prefetch_span(centroids + static_cast<int64_t>(list) * d, d * sizeof(float), 0, 1);
    }
}

// A list scan's count of entries in the key range: this thread's n summed
// over its warp and added to total (shared memory of the cluster's block
// 0). Called by whole warps.
__device__ __forceinline__ void add_in_range(unsigned n, unsigned long long* total)
{
    for (int off = 16; off > 0; off >>= 1)
        n += __shfl_down_sync(kFullMask, n, off);
    if ((threadIdx.x & 31) == 0 && n)
        atomicAdd(total, static_cast<unsigned long long>(n));
}

// The probed lists' offsets in the concatenation of their rows (each block
// for itself), a thread a probe, so that every probe's loads are in flight
// at once (a warp taking 32 probes at a time waited for each group's loads
// in turn): rows(p) gives probe p's rows (and keeps its list's pointers);
// prefix: nprobe + 1 offsets. Every thread calls it; a barrier after.
static_assert(kSmallSearchMaxK <= kThreads, "a thread a probe");
template <typename Rows>
__device__ __forceinline__ void probe_offsets(int nprobe, int* scan, int* prefix, Rows rows)
{
    const int p = threadIdx.x;
    const int len = p < nprobe ? rows(p) : 0;
    int sum = 0;
    const int before = block_exclusive_scan(len, scan, &sum);
    if (p < nprobe)
        prefix[p] = before;
    if (p == 0)
        prefix[nprobe] = sum;
    __syncthreads();
}

// ------------------------------------------------------------------ host

int device_attribute(cudaDeviceAttr attr)
{
    int dev = 0, v = 0;
    GPU_CUDA_CHECK(cudaGetDevice(&dev));
    GPU_CUDA_CHECK(cudaDeviceGetAttribute(&v, attr, dev));
    return v;
}

int max_optin_smem() { return device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin); }

// How many clusters of `cluster` blocks of kernel (kThreads threads each)
// asking for smem bytes each can be resident on the current device at
// once (0: none fits).
int active_clusters(const void* kernel, int cluster, size_t smem)
{
    int device = 0;
    GPU_CUDA_CHECK(cudaGetDevice(&device));
    // Raised once to the device's limit (a launch of any smaller size then
    // fits), and clusters past the portable 8 allowed.
    {
        static std::mutex raised_mutex;
        static std::set<std::pair<int, const void*>> raised;  // (device, kernel)
        std::lock_guard<std::mutex> lock(raised_mutex);
        if (!raised.count({device, kernel})) {
            GPU_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_optin_smem()));
            GPU_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
            raised.insert({device, kernel});
        }
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(cluster));
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = static_cast<unsigned>(cluster);
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    int n = 0;
    const cudaError_t err = cudaOccupancyMaxActiveClusters(&n, kernel, &cfg);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();  // not fitting is an answer, not an error
        return 0;
    }
    return n;
}

// active_clusters, remembered per (device, kernel, cluster, shared memory).
int resident_clusters(const void* kernel, int cluster, size_t smem)
{
    static std::mutex fit_mutex;
    static std::map<std::tuple<int, const void*, int, size_t>, int> fit;
    std::lock_guard<std::mutex> lock(fit_mutex);
    int device = 0;
    GPU_CUDA_CHECK(cudaGetDevice(&device));
    const auto key = std::make_tuple(device, kernel, cluster, smem);
    auto it = fit.find(key);
    if (it != fit.end())
        return it->second;
    const int n = active_clusters(kernel, cluster, smem);
    fit[key] = n;
    return n;
}

// The launch of nq queries, a cluster of blocks of kernel each (see
// small_search_plan for the rule and its measurements), or cluster 0 when
// no size fits; need(c): the dynamic shared memory a block asks for in
// clusters of c blocks.
template <typename Need>
SmallLaunch plan_cluster_launch(const void* kernel, int64_t nq, int sms, int forced, bool spread, Need need)
{
    int c = 1;
    if (forced > 0) {
        c = std::min(forced, kMaxCluster);
    } else {
        // About two blocks per multiprocessor over the batch; 16 a query
        // only while the batch's blocks fit one per multiprocessor (two
        // 16-block clusters seldom find room in one GPC together: batch 16
        // took 1.2-1.3x the time with 16 than with 8 on an H200), else 8.
        const int most = nq * kMaxCluster <= sms ? kMaxCluster : kMaxCluster / 2;
        while (c < most && nq * c * 2 <= 2 * static_cast<int64_t>(sms))
            c <<= 1;
        // Every cluster of the batch resident at once: the clusters that do
        // not fit wait for the first ones to finish, and the call takes two
        // rounds (batch 32 in clusters of 8 on an H200: 30 fit; the call
        // took 140 us, the first round 80). The largest size at or below c
        // whose nq clusters fit, whatever the power (rank_entries takes any
        // size up to 16).
        while (c > 1 && resident_clusters(kernel, c, need(c)) < nq)
            c--;
    }
    const int limit = max_optin_smem();
    // More than half of a multiprocessor's shared memory: one block per SM.
    const size_t half_sm = static_cast<size_t>(device_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor)) / 2 + 16;
    for (; c >= 1; c >>= 1) {
        const size_t bytes = need(c);
        if (bytes > static_cast<size_t>(limit))
            continue;
        if (spread && nq * c <= sms && half_sm > bytes && half_sm <= static_cast<size_t>(limit) &&
            resident_clusters(kernel, c, half_sm) > 0)
            return SmallLaunch{c, half_sm};
        if (resident_clusters(kernel, c, bytes) > 0)
            return SmallLaunch{c, bytes};
    }
    return SmallLaunch{};
}

// Launches kernel(a) for nq queries, a cluster of plan.cluster blocks each
// (kThreads threads, plan.smem bytes of dynamic shared memory), on st.
template <typename Args>
void launch_clusters(void (*kernel)(Args), const Args& a, int nq, const SmallLaunch& plan, cudaStream_t st)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(nq) * static_cast<unsigned>(plan.cluster));
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = plan.smem;
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = static_cast<unsigned>(plan.cluster);
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    GPU_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, a));
    GPU_KERNEL_CHECK();
}

}  // namespace

}  // namespace gpuivfpq::gpu
