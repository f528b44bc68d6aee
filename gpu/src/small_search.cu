// One-launch search_exact for small batches (see small_search.h): a cluster
// of C blocks per query (C up to 16, sized so that the batch fills the
// device). Each block takes 1/C of the work of every stage and the blocks
// exchange what the next stage needs through distributed shared memory:
//   1. the term-3 lookup table: each block computes 1/C of its entries and
//      stores them into every block's table;
//   2. the coarse step: each block ranks 1/C of the centroids (GEMM form,
//      as exact_knn), selected in shared memory (radix select; a share
//      larger than the key buffer keeps only the keys below a running bar,
//      cut to the best whenever the buffer fills, FilterSink); the C sorted
//      lists' keys go to every block and
//      each block finds the global rank of its own entries by binary search
//      in the others (a merge with no sorting network; only the entries
//      that can rank below k); the winners' direct base distances go to
//      every block at their rank;
//   3. the list scan: each block scans 1/C of the probed lists' entries
//      (concatenated, so uneven lists split evenly) into its top k, ranked
//      across the cluster the same way;
//   4. the re-rank: the winners' positions go to every block at their rank
//      (slot), and each block re-ranks 1/C of the slots (exact_distance,
//      one thread per row, as the staged re-rank), stored into every block;
//   5. the final order by exact_less: each block places 1/C of the rows.
// Five cluster barriers in all; nothing goes through device memory but the
// inputs and the answers.
#include "small_search.h"

#include <cooperative_groups.h>

#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include "block_radix.cuh"
#include "cuda_check.h"
#include "engine/exact_distance.h"
#include "engine/search_limits.h"
#include "ivf_scan.cuh"
#include "search_parts.cuh"
#include "warp_select.cuh"

namespace cg = cooperative_groups;

namespace gpuivfpq::gpu {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxCluster = 16;

// Keys a block selects from in shared memory (radix select); a block with
// more candidates than this keeps those below a running bar (FilterSink).
constexpr int kKeysPerThread = 16;
constexpr int kKeyCap = kThreads * kKeysPerThread;
static_assert(kThreads == kRadixThreads, "the selections run on block_radix.cuh's blocks");

// The dynamic shared memory of a block, the same in every block of a
// cluster (remote accesses use local offsets). The C sorted lists are kQ + 1
// entries apart, so that lanes searching different lists hit different banks.
struct Layout {
    size_t table, qv, ctile, keys, hist, scan, merge_k, merge_v, all_k, all_v, rank, win, plist, pbase, prefix,
        pcodes, pvt, pkeys, pvec, pids, rd, rl, rp, spos, misc, total;
};

struct Bump {
    size_t off = 0;
    __host__ __device__ size_t take(size_t bytes)
    {
        const size_t at = off;
        off = (off + bytes + 15) / 16 * 16;
        return at;
    }
};

__host__ __device__ inline Layout layout_of(int m, int d, int cluster, int kq)
{
    Layout L;
    Bump b;
    const size_t lists = static_cast<size_t>(cluster) * (kq + 1);
    L.table = b.take(static_cast<size_t>(m) * 256 * sizeof(float));
    L.qv = b.take(static_cast<size_t>(d) * sizeof(float));
    L.ctile = b.take(static_cast<size_t>(kWarps) * 32 * 32 * sizeof(float));
    L.keys = b.take(kKeyCap * sizeof(float));
    L.hist = b.take(256 * sizeof(int));
    L.scan = b.take(64 * sizeof(int));
    L.merge_k = b.take(static_cast<size_t>(kq) * sizeof(float));  // a select's kk keys, a cut's scratch
    L.merge_v = b.take(static_cast<size_t>(kq) * sizeof(int));
    L.all_k = b.take(lists * sizeof(float));
    L.all_v = b.take(lists * sizeof(int));
    L.rank = b.take(kq * sizeof(int));
    L.win = b.take(kq * sizeof(int));
    L.plist = b.take(kq * sizeof(int));
    L.pbase = b.take(kq * sizeof(float));
    L.prefix = b.take((kq + 1) * sizeof(int));
    L.pcodes = b.take(kq * sizeof(void*));
    L.pvt = b.take(kq * sizeof(void*));
    L.pkeys = b.take(kq * sizeof(void*));
    L.pvec = b.take(kq * sizeof(void*));
    L.pids = b.take(kq * sizeof(void*));
    L.rd = b.take(kq * sizeof(double));
    L.rl = b.take(kq * sizeof(int64_t));
    L.rp = b.take(kq * sizeof(int));
    L.spos = b.take(kq * sizeof(int));
    L.misc = b.take(32);  // winners (int), in-range count (u64 at +8), query norm (float at +16)
    L.total = b.off;
    return L;
}

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

// Bench aid (SmallSearchArgs::trace): block 0's clock at the phase ends.
#define SMALL_TRACE(i)                                  \
    do {                                                \
        if (a.trace && blockIdx.x == 0 && tid == 0)     \
            a.trace[i] = clock64();                     \
    } while (0)

// Bench aid: block 0's global timer (ns) at trace point i (its start and
// end), so that the cycles above convert to time at the clock it ran.
#define SMALL_TRACE_NS(i)                                                             \
    do {                                                                              \
        if (a.trace && blockIdx.x == 0 && tid == 0) {                                 \
            unsigned long long ns_;                                                   \
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns_));                  \
            a.trace[i] = ns_;                                                         \
        }                                                                             \
    } while (0)

// Bench aid: every block's global timer (ns) at its start (which 0) or end
// (which 1), and at its start the multiprocessor it runs on.
#define SMALL_TRACE_BLOCK(which)                                                          \
    do {                                                                                  \
        if (a.trace && tid == 0 && blockIdx.x < static_cast<unsigned>(kSmallTraceBlocks)) { \
            unsigned long long ns_;                                                       \
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns_));                      \
            unsigned long long* w_ = a.trace + kSmallTracePoints + 3 * blockIdx.x;        \
            w_[which] = ns_;                                                              \
            if ((which) == 0) {                                                           \
                unsigned sm_;                                                             \
                asm volatile("mov.u32 %0, %%smid;" : "=r"(sm_));                          \
                w_[2] = sm_;                                                              \
            }                                                                             \
        }                                                                                 \
    } while (0)

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
__device__ __forceinline__ float coarse_key(const SmallSearchArgs& a, bool ip, float s, float rn, int c)
{
    return ip ? fmaxf(fminf(fmaf(-1.0f, s, 0.0f), kOverflowDistance), -INFINITY)
              : fmaxf(fminf(fmaf(-2.0f, s, rn + __ldg(a.centroid_norms + c)), kOverflowDistance), 0.0f);
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

// What a block's list scan reads: the probed lists (shared memory), the
// query's table and key window.
struct ScanShare {
    const int* prefix;  // nprobe + 1 offsets of the probes in the concatenation
    int nprobe, m;
    const uint8_t* const* pcodes;
    const float* const* pvt;
    const int64_t* const* pkeys;
    const float* pbase;
    const float* table;
    KeyWindow kw;
    int ahead;  // > 0: each step asks for the lines of the entries this far ahead in L1
};

// The block's share [i0, i1) of the probed entries, kU entries per thread
// at a time: their codes (kW 16-byte words each, m == 16 * kW), filter keys
// and per-vector terms are loaded before any of them is summed, so that kU
// entries' loads are in flight together rather than one entry's at a time.
// A thread's entries rise, so the probe they fall in only moves forward:
// its bounds and pointers stay in registers (Probe) and are read from
// shared memory again only when an entry passes the probe's end. Each key
// is what the staged scan computes (code_word16 in its order, the probe's
// base first, the per-vector term after, rank_distance); an out-of-range
// entry keeps +inf with its code unread. Each step's kU keys, of entries
// b0 + u * kThreads + threadIdx.x, go to sink.step(b0, keys) (every thread
// calls it the same number of times). p: the probe of the thread's first
// entry (any probe when it has none).
struct Probe {
    int p, lo, hi;  // the probe and its entries' positions [lo, hi)
    const uint8_t* codes;
    const float* vt;
    const int64_t* keys;
    float base;
    __device__ __forceinline__ void load(const ScanShare& s)
    {
        lo = s.prefix[p];
        hi = s.prefix[p + 1];
        codes = s.pcodes[p];
        vt = s.pvt[p];
        keys = s.pkeys[p];
        base = s.pbase[p];
    }
    // To the probe holding position i (i below the concatenation's end, at
    // or past this probe's start).
    __device__ __forceinline__ void reach(const ScanShare& s, int i)
    {
        if (i >= hi) {
            do
                ++p;
            while (s.prefix[p + 1] <= i);
            load(s);
        }
    }
};

template <int kW, int kU, typename Sink>
__device__ __forceinline__ unsigned scan_share_batched(const ScanShare& s, int i0, int i1, int p, Sink& sink)
{
    constexpr int kM = 16 * kW;
    unsigned in_range_count = 0;
    Probe pr;
    pr.p = p;
    pr.load(s);
    for (int b0 = i0; b0 < i1; b0 += kU * kThreads) {  // uniform over the block
        if (s.ahead > 0) {
            constexpr int per_line = 128 / kM;
            const int j1 = min(i1, b0 + s.ahead + kU * kThreads);
            for (int j = b0 + s.ahead + static_cast<int>(threadIdx.x) * per_line; j < j1; j += kThreads * per_line) {
                const int pj = probe_of(s.prefix, s.nprobe, j);
                const int off = j - s.prefix[pj];
                prefetch_l1(s.pcodes[pj] + static_cast<int64_t>(off) * kM);
                if (s.pvt[pj] && (off & 31) < per_line)
                    prefetch_l1(s.pvt[pj] + off);
            }
        }
        uint4 x[kU][kW];
        float vt[kU], base[kU];
        bool live[kU], has_vt[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u) {
            const int i = b0 + u * kThreads + static_cast<int>(threadIdx.x);
            live[u] = false;
            has_vt[u] = false;
            vt[u] = 0.0f;
            base[u] = 0.0f;
            if (i < i1) {
                pr.reach(s, i);
                const int off = i - pr.lo;
                const bool in_range = !pr.keys || s.kw.passes(pr.keys, off);
                in_range_count += pr.keys && in_range;
                live[u] = in_range;
                if (in_range) {
                    const uint4* c = reinterpret_cast<const uint4*>(pr.codes + static_cast<int64_t>(off) * kM);
#pragma unroll
                    for (int w = 0; w < kW; ++w)
                        x[u][w] = __ldg(c + w);
                    base[u] = pr.base;
                    has_vt[u] = pr.vt != nullptr;
                    if (pr.vt)
                        vt[u] = __ldg(pr.vt + off);
                }
            }
        }
        float key[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u) {
            key[u] = INFINITY;
            if (live[u]) {
                float sum = 0.0f;
#pragma unroll
                for (int w = 0; w < kW; ++w)
                    sum += code_word16(x[u][w], s.table + w * 16 * 256);
                float k = base[u] + sum;
                if (has_vt[u])
                    k += vt[u];
                key[u] = rank_distance(k);
            }
        }
        sink.template step<kU>(b0, key);
    }
    return in_range_count;
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

// The block's share [i0, i1) of the probed entries into sink: the common
// code sizes (16-byte words) batched, the others one entry at a time
// (none: an empty key range, every key +inf).
template <typename Sink>
__device__ __forceinline__ unsigned scan_share(const ScanShare& s, int i0, int i1, int p, bool none, Sink& sink)
{
    if (!none && s.m == 16)
        return scan_share_batched<1, 4>(s, i0, i1, p, sink);
    if (!none && s.m == 32)
        return scan_share_batched<2, 4>(s, i0, i1, p, sink);
    if (!none && s.m == 48)
        return scan_share_batched<3, 2>(s, i0, i1, p, sink);
    if (!none && s.m == 64)
        return scan_share_batched<4, 2>(s, i0, i1, p, sink);
    // Sentence-embedding sizes (768 dimensions: m 96, or 128): a code's
    // words loaded together, not one wait each as in the loop below.
    if (!none && s.m == 96)
        return scan_share_batched<6, 1>(s, i0, i1, p, sink);
    if (!none && s.m == 128)
        return scan_share_batched<8, 1>(s, i0, i1, p, sink);
    unsigned in_range_count = 0;
    for (int b0 = i0; b0 < i1; b0 += kThreads) {  // uniform over the block
        const int i = b0 + static_cast<int>(threadIdx.x);
        float key = INFINITY;
        if (i < i1 && !none) {
            while (s.prefix[p + 1] <= i)
                ++p;
            const int off = i - s.prefix[p];
            const int64_t* keys = s.pkeys[p];
            // As the staged scan: an out-of-range entry keeps +inf (its
            // code not read); an overflowed distance still competes.
            const bool in_range = !keys || s.kw.passes(keys, off);
            in_range_count += keys && in_range;
            if (in_range) {
                key = s.pbase[p] + code_distance(s.pcodes[p] + static_cast<int64_t>(off) * s.m, s.m, s.table);
                if (s.pvt[p])
                    key += __ldg(s.pvt[p] + off);
                key = rank_distance(key);
            }
        }
        sink.template step<1>(b0, &key);
    }
    return in_range_count;
}

template <int kQ>
__global__ void __launch_bounds__(kThreads, 2) small_search_kernel(SmallSearchArgs a)
{
    extern __shared__ __align__(16) unsigned char smem[];
    constexpr int kS = kQ + 1;  // list stride
    cg::cluster_group cluster = cg::this_cluster();
    const int C = static_cast<int>(cluster.num_blocks());
    const int r = static_cast<int>(cluster.block_rank());
    const int q = static_cast<int>(blockIdx.x) / C;
    const Layout L = layout_of(a.m, a.d, C, kQ);
    float* table = reinterpret_cast<float*>(smem + L.table);
    float* qv = reinterpret_cast<float*>(smem + L.qv);
    float* keybuf = reinterpret_cast<float*>(smem + L.keys);
    int* hist = reinterpret_cast<int*>(smem + L.hist);
    int* scan = reinterpret_cast<int*>(smem + L.scan);
    float* mk = reinterpret_cast<float*>(smem + L.merge_k);
    int* mv = reinterpret_cast<int*>(smem + L.merge_v);
    float* all_k = reinterpret_cast<float*>(smem + L.all_k);
    int* all_v = reinterpret_cast<int*>(smem + L.all_v);
    int* rank = reinterpret_cast<int*>(smem + L.rank);
    int* win = reinterpret_cast<int*>(smem + L.win);
    int* plist = reinterpret_cast<int*>(smem + L.plist);
    float* pbase = reinterpret_cast<float*>(smem + L.pbase);
    int* prefix = reinterpret_cast<int*>(smem + L.prefix);
    const uint8_t** pcodes = reinterpret_cast<const uint8_t**>(smem + L.pcodes);
    const float** pvt = reinterpret_cast<const float**>(smem + L.pvt);
    const int64_t** pkeys = reinterpret_cast<const int64_t**>(smem + L.pkeys);
    const float** pvec = reinterpret_cast<const float**>(smem + L.pvec);
    const int64_t** pids = reinterpret_cast<const int64_t**>(smem + L.pids);
    double* rd = reinterpret_cast<double*>(smem + L.rd);
    int64_t* rl = reinterpret_cast<int64_t*>(smem + L.rl);
    int* rp = reinterpret_cast<int*>(smem + L.rp);
    int* spos = reinterpret_cast<int*>(smem + L.spos);
    int* nwin = reinterpret_cast<int*>(smem + L.misc);
    unsigned long long* matched = reinterpret_cast<unsigned long long*>(smem + L.misc + 8);
    float* qnorm = reinterpret_cast<float*>(smem + L.misc + 16);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    float* tile = reinterpret_cast<float*>(smem + L.ctile) + warp * 32 * 32;
    // The scan's kept positions (FilterSink) in the coarse step's tiles,
    // free by then.
    int* held_labels = reinterpret_cast<int*>(smem + L.ctile);
    static_assert(kWarps * 32 * 32 >= kKeyCap, "the coarse tiles hold kKeyCap labels");
    const bool ip = a.metric == Metric::InnerProduct;
    const int d = a.d, m = a.m, dsub = d / m;
    const float* qraw = a.queries + static_cast<int64_t>(q) * d;
    const bool filtered = a.key_lo != nullptr;  // uniform: a kernel argument
    SMALL_TRACE_NS(22);
    SMALL_TRACE_BLOCK(0);
    SMALL_TRACE(0);
    // This block's centroid rows (or their keys) on their way to L1 while the query loads.
    const int c0 = static_cast<int>(static_cast<int64_t>(a.lists) * r / C);
    const int c1 = static_cast<int>(static_cast<int64_t>(a.lists) * (r + 1) / C);
    if (a.coarse_keys)
        prefetch_span(a.coarse_keys + static_cast<int64_t>(q) * a.lists + c0,
                      static_cast<size_t>(c1 - c0) * sizeof(float), tid, kThreads);
    else
        prefetch_span(a.centroids + static_cast<int64_t>(c0) * d, static_cast<size_t>(c1 - c0) * d * sizeof(float),
                      tid, kThreads);

    // The query as the coarse step and the tables see it (normalised for
    // cosine, as normalize_rows does) and its squared norm (row_norms).
    for (int j = tid; j < d; j += kThreads)
        qv[j] = qraw[j];
    if (tid == 0) {
        *nwin = 0;
        *matched = 0;
    }
    __syncthreads();
    if (warp == 0) {
        if (a.metric == Metric::Cosine)
            warp_normalize(qv, d, lane);
        __syncwarp();
        const float s = warp_sqr_norm(qv, d, lane);
        if (lane == 0)
            *qnorm = s;
    }
    // Every block of the cluster runs (and has its shared memory) before
    // any block writes into another's.
    cluster.sync();
    SMALL_TRACE(1);

    // 1. Term 3, -2<q_j, C_jc> (-1x for inner product): this block's share
    // of the m x 256 entries, stored into every block's table.
    {
        const int n = m * 256;
        const float scale = ip ? -1.0f : -2.0f;
        const int e0 = static_cast<int>(static_cast<int64_t>(n) * r / C);
        const int e1 = static_cast<int>(static_cast<int64_t>(n) * (r + 1) / C);
        for (int e = e0 + tid; e < e1; e += kThreads) {
            const float* cw = a.codebooks + static_cast<int64_t>(e) * dsub;
            const float* qs = qv + (e >> 8) * dsub;
            float s = 0.0f;
            for (int t = 0; t < dsub; ++t)
                s = fmaf(qs[t], __ldg(cw + t), s);
            const float v = scale * s;
            for (int b = 0; b < C; ++b)
                cluster.map_shared_rank(table, b)[e] = v;
        }
    }
    SMALL_TRACE(2);

    // 2. Coarse step over this block's share of the centroids: a lane per
    // centroid summing its products in order, the GEMM form's key as
    // exact_knn's selection makes it. A warp takes 32 centroids at a time,
    // 32 columns at a time, through a tile in shared memory (tile_at's
    // swizzle): coalesced loads, conflict-free 16-byte reads; a share of at
    // most 128 centroids (many blocks a query, few lists) 16 or 8 a warp, 64
    // or 128 columns at a time (coarse_rows_per_warp), the same sums.
    // Kept in shared memory and radix-selected when they fit.
    // A share larger than keybuf goes through FilterSink, keys in its first
    // half and labels (centroids) in the second (the tiles are in use).
    const bool coarse_smem = c1 - c0 <= kKeyCap;  // uniform
    FilterSink coarse_sink{keybuf, reinterpret_cast<int*>(keybuf + kKeyCap / 2), a.nprobe, hist, scan, mk, mv,
                           kKeyCap / 2};
    {
        // Keys computed for the batch before this launch (coarse_keys_kernel)
        // are the same keys, fed in the same order.
        const float* kq = a.coarse_keys ? a.coarse_keys + static_cast<int64_t>(q) * a.lists : nullptr;
        const float rn = ip ? 0.0f : *qnorm;
        const int per_warp = kq ? 32 : coarse_rows_per_warp(c1 - c0);  // uniform
        if (per_warp < 32) {
            // A few centroids: each in keybuf (coarse_smem: c1 - c0 <= 128).
            const int g = c0 + warp * per_warp, c = g + lane;
            if (g < c1) {  // uniform over the warp
                float s[1] = {0.0f};
                if (per_warp == 8)
                    coarse_rows<8>(a.centroids + static_cast<int64_t>(g) * d, min(8, c1 - g), d, qv, 0, tile,
                                   lane, s);
                else
                    coarse_rows<16>(a.centroids + static_cast<int64_t>(g) * d, min(16, c1 - g), d, qv, 0, tile,
                                    lane, s);
                if (lane < per_warp && c < c1)
                    keybuf[c - c0] = coarse_key(a, ip, s[0], rn, c);
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
                coarse_rows<32>(a.centroids + static_cast<int64_t>(g) * d, min(32, c1 - g), d, qv, 0, tile, lane,
                                s);
                if (c < c1)
                    key = coarse_key(a, ip, s[0], rn, c);
            }
            if (!coarse_smem)
                coarse_sink.step<1>(g0, &key);  // labels g0 + tid: c
            else if (c < c1)
                keybuf[c - c0] = key;
        }
    }
    SMALL_TRACE(3);
    __syncthreads();  // keybuf complete
    if (coarse_smem)
        select_smem<kQ>(keybuf, c1 - c0, a.nprobe, c0, nullptr, hist, scan, win, mk, all_k, all_v, r, C, nullptr);
    else
        select_smem<kQ>(keybuf, coarse_sink.n, a.nprobe, 0, coarse_sink.labels, hist, scan, win, mk, all_k, all_v,
                        r, C, nullptr);
    SMALL_TRACE(4);
    cluster.sync();
    SMALL_TRACE(5);
    // The probes this block's entries win: their direct base distances (a
    // warp each, as exact_base), stored into every block at their rank.
    rank_entries<kQ>(all_k, C, r, a.nprobe, rank);
    for (int i = tid; i < a.nprobe; i += kThreads)
        if (rank[i] < a.nprobe)
            win[atomicAdd(nwin, 1)] = i;
    __syncthreads();
    for (int w = tid; w < *nwin; w += kThreads) {
        const int list = all_v[r * kS + win[w]];
        if (list >= 0)
            prefetch_span(a.centroids + static_cast<int64_t>(list) * d, d * sizeof(float), 0, 1);
    }
    for (int w = warp; w < *nwin; w += kWarps) {
        const int i = win[w];
        const int list = all_v[r * kS + i];
        const int slot = rank[i];
        const float base =
            list >= 0 ? warp_probe_base(qv, a.centroids + static_cast<int64_t>(list) * d, d, ip, lane) : 0.0f;
        if (lane < C) {
            cluster.map_shared_rank(plist, lane)[slot] = list;
            cluster.map_shared_rank(pbase, lane)[slot] = base;
        }
    }
    SMALL_TRACE(6);
    cluster.sync();  // tables and probes complete in every block
    SMALL_TRACE(7);

    // 3. The probed lists: candidate offsets and list pointers (each block
    // for itself), a thread a probe, so that every probe's loads are in
    // flight at once (a warp taking 32 probes at a time waited for each
    // group's loads in turn).
    static_assert(kSmallSearchMaxK <= kThreads, "a thread a probe");
    {
        const int p = tid;
        int len = 0;
        if (p < a.nprobe) {
            const int list = plist[p];
            len = list >= 0 ? a.list_len[list] : 0;
            pcodes[p] = list >= 0 ? a.list_codes[list] : nullptr;
            pvt[p] = list >= 0 && a.list_term1 ? a.list_term1[list] : nullptr;
            pkeys[p] = list >= 0 && filtered ? a.list_keys[list] : nullptr;
            pvec[p] = list >= 0 ? a.list_vectors[list] : nullptr;
            pids[p] = list >= 0 ? a.list_ids[list] : nullptr;
        }
        int sum = 0;
        const int before = block_exclusive_scan(len, scan, &sum);
        if (p < a.nprobe)
            prefix[p] = before;
        if (p == 0)
            prefix[a.nprobe] = sum;
    }
    __syncthreads();

    // This block's share of the concatenated probed entries (labels:
    // positions, as the staged scan's): keys into shared memory and radix
    // selected when they fit, else only those below a running bar kept
    // (FilterSink) and radix selected from there.
    const int total = prefix[a.nprobe];
    const int i0 = static_cast<int>(static_cast<int64_t>(total) * r / C);
    const int i1 = static_cast<int>(static_cast<int64_t>(total) * (r + 1) / C);
    const bool scan_smem = i1 - i0 <= kKeyCap;  // uniform
    const KeyWindow kw = filtered ? KeyWindow{a.key_lo[q], a.key_hi[q]} : KeyWindow{0, 0};
    const bool none = filtered && kw.empty();  // an empty key range passes nothing
    unsigned in_range_count = 0;
    SMALL_TRACE(8);
    // Entries the scan asks for ahead of its steps (scan_prefetch 3), the
    // first window before it.
    constexpr int kAhead = 2048;
    const int ahead = a.scan_prefetch == 3 && (m == 16 || m == 32 || m == 48 || m == 64 || m == 96 || m == 128) ? kAhead : 0;
    if (!none && a.scan_prefetch != 1) {
        // The block's codes (and per-vector terms) on their way to L1: a
        // line per thread and step, found by its probe.
        const int per_line = m >= 128 ? 1 : 128 / m;
        const int pf1 = ahead > 0 ? min(i1, i0 + ahead) : i1;
        for (int i = i0 + tid * per_line; i < pf1; i += kThreads * per_line) {
            const int pp = probe_of(prefix, a.nprobe, i);
            const int off = i - prefix[pp];
            if (a.scan_prefetch == 2)
                prefetch_l2(pcodes[pp] + static_cast<int64_t>(off) * m);
            else
                prefetch_l1(pcodes[pp] + static_cast<int64_t>(off) * m);
            if (m > 128)
                prefetch_span(pcodes[pp] + static_cast<int64_t>(off) * m, m, 0, 1);
            if (pvt[pp] && (off & 31) < per_line)
                prefetch_l1(pvt[pp] + off);
        }
    }
    const int p_start = !none && i0 + tid < total ? probe_of(prefix, a.nprobe, i0 + tid) : 0;
    const ScanShare share{prefix, a.nprobe, m, pcodes, pvt, pkeys, pbase, table, kw, ahead};
    int held = 0;  // a larger share: the entries FilterSink kept
    if (scan_smem) {
        KeybufSink sink{keybuf, i0, i1};
        in_range_count = scan_share(share, i0, i1, p_start, none, sink);
    } else {
        FilterSink sink{keybuf, held_labels, a.k, hist, scan, mk, mv, kKeyCap};
        in_range_count = scan_share(share, i0, i1, p_start, none, sink);
        held = sink.n;
    }
    SMALL_TRACE(9);
    __syncthreads();  // keybuf complete
    if (scan_smem)
        select_smem<kQ>(keybuf, i1 - i0, a.k, i0, nullptr, hist, scan, win, mk, all_k, all_v, r, C,
                        a.trace ? a.trace + 16 : nullptr);
    else
        select_smem<kQ>(keybuf, held, a.k, 0, held_labels, hist, scan, win, mk, all_k, all_v, r, C,
                        a.trace ? a.trace + 16 : nullptr);
    if (filtered) {
        for (int off = 16; off > 0; off >>= 1)
            in_range_count += __shfl_down_sync(kFullMask, in_range_count, off);
        if (lane == 0 && in_range_count)
            atomicAdd(cluster.map_shared_rank(matched, 0), static_cast<unsigned long long>(in_range_count));
    }
    // The vectors of this block's candidates towards L2: the winners among
    // them are read right after the merge.
    __syncthreads();
    for (int i = tid; i < a.k; i += kThreads) {
        const int pos = all_v[r * kS + i];
        if (pos >= 0 && pos < total) {
            const int p = probe_of(prefix, a.nprobe, pos);
            const float* v = pvec[p] + static_cast<int64_t>(pos - prefix[p]) * d;
            for (int o = 0; o < d; o += 32)
                prefetch_l2(v + o);
        }
    }
    SMALL_TRACE(10);
    cluster.sync();
    SMALL_TRACE(11);

    // 4. The k winners: each block sends the positions of the winners it
    // holds to every block at their ADC ranks (slots), then re-ranks an
    // equal share of the slots, whoever held them (the winners crowd into
    // the blocks that scanned the nearest lists; an even share keeps the
    // slowest block's work to k / C rows): exact_distance on the query as
    // given, one thread per row, stored into every block at its slot;
    // missing candidates as (+inf, -1).
    rank_entries<kQ>(all_k, C, r, a.k, rank);
    SMALL_TRACE(12);
    if (tid == 0)
        *nwin = 0;
    __syncthreads();
    for (int i = tid; i < a.k; i += kThreads)
        if (rank[i] < a.k)
            win[atomicAdd(nwin, 1)] = i;
    __syncthreads();
    {
        const int nw = *nwin;
        for (int t = tid; t < nw * C; t += kThreads) {  // (winner, block) pairs
            const int w = t / C, b = t - w * C;
            cluster.map_shared_rank(spos, b)[rank[win[w]]] = all_v[r * kS + win[w]];
        }
    }
    // The query as given, staged while the positions travel (qv holds it
    // unless cosine normalised it: the queries may be in host memory).
    float* qs = d <= kWarps * 32 * 32 ? reinterpret_cast<float*>(smem + L.ctile) : nullptr;
    if (qs)
        for (int j = tid; j < d; j += kThreads)
            qs[j] = a.metric == Metric::Cosine ? qraw[j] : qv[j];
    cluster.sync();  // every slot's position in every block
    SMALL_TRACE(21);
    // This block's slots: their vectors (as many as fit the key buffer,
    // free now) staged in shared memory, a warp per row with coalesced
    // loads, their ids beside them: exact_distance then reads the rows in
    // its fixed order without waiting on memory at every line. The same
    // floats, so the same distances.
    const int s0 = static_cast<int>(static_cast<int64_t>(a.k) * r / C);
    const int s1 = static_cast<int>(static_cast<int64_t>(a.k) * (r + 1) / C);
    const int ns = s1 - s0;
    const int staged = d <= kKeyCap ? min(ns, kKeyCap / d) : 0;
    for (int w = warp; w < staged; w += kWarps) {
        const int pos = spos[s0 + w];
        if (pos >= 0) {
            const int p = probe_of(prefix, a.nprobe, pos);
            const int64_t off = pos - prefix[p];
            const float* src = pvec[p] + off * d;
            float* dst = keybuf + w * d;
            if (lane == 0)  // the row's id while the vector loads
                rl[s0 + w] = __ldg(reinterpret_cast<const long long*>(pids[p]) + off);
#pragma unroll 4
            for (int j = lane; j < d; j += 32)
                dst[j] = __ldg(src + j);
        }
    }
    __syncthreads();
    SMALL_TRACE(20);
    // Each row into this block's own copy of rd / rl / rp, then (below)
    // into the other blocks' copies.
    // A warp per row where there are few rows (it splits the products
    // among its lanes: warp_exact_distance, the same bits), else a thread
    // per row; cosine always a thread per row. Scratch: the second half of
    // the tile region (the query takes the first).
    const bool warp_rows = a.metric != Metric::Cosine && qs != nullptr && d <= kWarps * 32 * 16 &&
                           ns <= 2 * kWarps;
    // Row w of this block's slots: its id and vector (staged, or in the
    // mirror), or false for a missing candidate.
    auto row_of = [&](int w, int64_t& id, const float*& v) {
        const int pos = spos[s0 + w];
        if (pos < 0)
            return false;
        const int p = probe_of(prefix, a.nprobe, pos);
        const int64_t off = pos - prefix[p];
        id = w < staged ? rl[s0 + w] : __ldg(reinterpret_cast<const long long*>(pids[p]) + off);
        v = w < staged ? keybuf + w * d : pvec[p] + off * d;
        return true;
    };
    double* scratch = reinterpret_cast<double*>(smem + L.ctile + kWarps * 32 * 16 * sizeof(float)) +
                      warp * (32 * 16 * sizeof(float) / sizeof(double));
    constexpr int kChunk = 32 * 16 * sizeof(float) / sizeof(double);  // 256 doubles a warp
    const int step = warp_rows ? kWarps : kThreads;
    for (int w = warp_rows ? warp : tid; w < ns; w += step) {  // uniform over a warp when warp_rows
        double dist = INFINITY;
        int64_t id = -1;
        const float* v = nullptr;
        const bool present = row_of(w, id, v);
        if (present)
            dist = warp_rows ? warp_exact_distance(a.metric, qs, v, d, lane, scratch, kChunk)
                             : exact_distance(a.metric, qs ? qs : qraw, v, static_cast<size_t>(d));
        if (warp_rows)
            __syncwarp();  // every lane has read rl[] before lane 0 writes it
        if (!warp_rows || lane == 0) {
            rd[s0 + w] = dist;
            rl[s0 + w] = id;
            rp[s0 + w] = present ? 1 : 0;
        }
    }
    __syncthreads();
    // The threads over (row, other block) pairs: one remote row each, all
    // at once.
    for (int t = tid; t < ns * (C - 1); t += kThreads) {
        const int w = t / (C - 1), o = t - w * (C - 1);
        const int b = o < r ? o : o + 1;
        const int slot = s0 + w;
        cluster.map_shared_rank(rd, b)[slot] = rd[slot];
        cluster.map_shared_rank(rl, b)[slot] = rl[slot];
        cluster.map_shared_rank(rp, b)[slot] = rp[slot];
    }
    SMALL_TRACE(13);
    cluster.sync();  // the last remote access: no block reads another's memory after this
    SMALL_TRACE(14);

    // 5. The final order (present first, then exact_less; equal rows by
    // slot): each block places its 1/C of the rows, a warp per row.
    const int j0 = static_cast<int>(static_cast<int64_t>(a.k) * r / C);
    const int j1 = static_cast<int>(static_cast<int64_t>(a.k) * (r + 1) / C);
    const int64_t out = static_cast<int64_t>(q) * a.k;
    for (int j = j0 + warp; j < j1; j += kWarps) {
        const bool pj = rp[j] != 0;
        const double dj = rd[j];
        const int64_t lj = rl[j];
        int before = 0;
        for (int i = lane; i < a.k; i += 32) {
            const bool pi = rp[i] != 0;
            const double di = rd[i];
            const int64_t li = rl[i];
            before += rerank_before(pi, di, li, pj, dj, lj) || (i < j && !rerank_before(pj, dj, lj, pi, di, li));
        }
        for (int off = 16; off > 0; off >>= 1)
            before += __shfl_xor_sync(kFullMask, before, off);
        if (lane == 0) {
            a.out_dist[out + before] = dj;
            a.out_labels[out + before] = lj;
        }
    }
    if (filtered && a.key_matched && r == 0 && tid == 0)
        a.key_matched[q] = static_cast<int64_t>(*matched);
    SMALL_TRACE(15);
    SMALL_TRACE_NS(23);
    SMALL_TRACE_BLOCK(1);
}

// A batch's coarse keys (launch_coarse_keys): a block takes kCoarseQueries
// queries and kWarps * R centroids, a warp R rows through its tile
// (coarse_rows, as the one-launch kernel reads them; R 32, or 16 or 8 where
// the batch's blocks would not fill the device), each row read
// once for those queries. The query is what the one-launch kernel's coarse
// step sees (normalised by warp_normalize for cosine, its squared norm by
// warp_sqr_norm), and the sums and keys are made by the same code, so that
// every key has the kernel's bits.
constexpr int kCoarseQueries = kWarps / 2;  // a warp prepares each query

template <int R>
__global__ void __launch_bounds__(kThreads) coarse_keys_kernel(SmallSearchArgs a, float* keys)
{
    extern __shared__ __align__(16) float qs[];  // tiles, then kCoarseQueries x d, then their squared norms
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int d = a.d;
    const int ds = (d + 3) / 4 * 4;  // a query's stride: its 16-byte reads aligned
    const int q0 = static_cast<int>(blockIdx.y) * kCoarseQueries;
    const int nqb = min(kCoarseQueries, a.nq - q0);
    float* tile = qs + warp * 32 * 32;
    float* qv = qs + kWarps * 32 * 32;
    float* norms = qv + kCoarseQueries * ds;
    for (int i = tid; i < kCoarseQueries * ds; i += kThreads) {
        const int qi = i / ds, j = i - qi * ds;
        qv[i] = qi < nqb && j < d ? a.queries[static_cast<int64_t>(q0 + qi) * d + j] : 0.0f;
    }
    __syncthreads();
    if (warp < nqb) {
        float* v = qv + warp * ds;
        if (a.metric == Metric::Cosine)
            warp_normalize(v, d, lane);
        __syncwarp();
        const float n = warp_sqr_norm(v, d, lane);
        if (lane == 0)
            norms[warp] = n;
    }
    __syncthreads();
    const bool ip = a.metric == Metric::InnerProduct;
    const int r0 = static_cast<int>(blockIdx.x) * kWarps * R;
    const int r1 = min(a.lists, r0 + kWarps * R);
    for (int g = r0 + warp * R; g < r1; g += kWarps * R) {  // uniform over the warp
        float acc[kCoarseQueries];
#pragma unroll
        for (int i = 0; i < kCoarseQueries; ++i)
            acc[i] = 0.0f;
        coarse_rows<R, kCoarseQueries>(a.centroids + static_cast<int64_t>(g) * d, min(R, r1 - g), d, qv, ds,
                                       tile, lane, acc);
        const int c = g + lane;
        if (lane < R && c < r1)
            for (int i = 0; i < nqb; ++i)
                keys[static_cast<int64_t>(q0 + i) * a.lists + c] = coarse_key(a, ip, acc[i], ip ? 0.0f : norms[i], c);
    }
}

int device_attribute(cudaDeviceAttr attr)
{
    int dev = 0, v = 0;
    GPU_CUDA_CHECK(cudaGetDevice(&dev));
    GPU_CUDA_CHECK(cudaDeviceGetAttribute(&v, attr, dev));
    return v;
}

int max_optin_smem() { return device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin); }

// How many clusters of `cluster` blocks asking for smem bytes each can be
// resident on the current device at once (0: none fits).
template <int kQ>
int active_clusters(int cluster, size_t smem)
{
    int device = 0;
    GPU_CUDA_CHECK(cudaGetDevice(&device));
    auto kernel = small_search_kernel<kQ>;
    // Raised once to the device's limit (a launch of any smaller size then
    // fits), and clusters past the portable 8 allowed.
    {
        static std::mutex raised_mutex;
        static std::set<int> raised;  // devices
        std::lock_guard<std::mutex> lock(raised_mutex);
        if (!raised.count(device)) {
            GPU_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_optin_smem()));
            GPU_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
            raised.insert(device);
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

// Per (device, queue size, cluster, shared memory): how many clusters can
// be resident at once.
std::mutex g_fit_mutex;
std::map<std::tuple<int, int, int, size_t>, int> g_fit;

template <int kQ>
int resident_clusters(int cluster, size_t smem)
{
    std::lock_guard<std::mutex> lock(g_fit_mutex);
    int device = 0;
    GPU_CUDA_CHECK(cudaGetDevice(&device));
    const auto key = std::make_tuple(device, kQ, cluster, smem);
    auto it = g_fit.find(key);
    if (it != g_fit.end())
        return it->second;
    const int n = active_clusters<kQ>(cluster, smem);
    g_fit[key] = n;
    return n;
}

template <int kQ>
bool cluster_fits(int cluster, size_t smem)
{
    return resident_clusters<kQ>(cluster, smem) > 0;
}

int queue_of(const SmallSearchArgs& a) { return a.k <= 32 && a.nprobe <= 32 ? 32 : kSmallSearchMaxK; }

template <int kQ>
SmallLaunch pick_launch(const SmallSearchArgs& a, int sms, int forced, bool spread)
{
    int c = 1;
    if (forced > 0) {
        c = std::min(forced, kMaxCluster);
    } else {
        // About two blocks per multiprocessor over the batch; 16 a query
        // only while the batch's blocks fit one per multiprocessor (two
        // 16-block clusters seldom find room in one GPC together: batch 16
        // took 1.2-1.3x the time with 16 than with 8 on an H200), else 8.
        const int64_t nq = a.nq;
        const int most = nq * kMaxCluster <= sms ? kMaxCluster : kMaxCluster / 2;
        while (c < most && nq * c * 2 <= 2 * static_cast<int64_t>(sms))
            c <<= 1;
        // Every cluster of the batch resident at once: the clusters that do
        // not fit wait for the first ones to finish, and the call takes two
        // rounds (batch 32 in clusters of 8 on an H200: 30 fit; the call
        // took 140 us, the first round 80). The largest size at or below c
        // whose nq clusters fit, whatever the power (rank_entries takes any
        // size up to 16).
        while (c > 1 && resident_clusters<kQ>(c, layout_of(a.m, a.d, c, kQ).total) < nq)
            c--;
    }
    const int limit = max_optin_smem();
    // More than half of a multiprocessor's shared memory: one block per SM.
    const size_t half_sm = static_cast<size_t>(device_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor)) / 2 + 16;
    for (; c >= 1; c >>= 1) {
        const size_t need = layout_of(a.m, a.d, c, kQ).total;
        if (need > static_cast<size_t>(limit))
            continue;
        if (spread && static_cast<int64_t>(a.nq) * c <= sms && half_sm > need &&
            half_sm <= static_cast<size_t>(limit) && cluster_fits<kQ>(c, half_sm))
            return SmallLaunch{c, half_sm};
        if (cluster_fits<kQ>(c, need))
            return SmallLaunch{c, need};
    }
    return SmallLaunch{};
}

template <int kQ>
void launch_impl(const SmallSearchArgs& a, const SmallLaunch& plan, cudaStream_t st)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(a.nq) * static_cast<unsigned>(plan.cluster));
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
    GPU_CUDA_CHECK(cudaLaunchKernelEx(&cfg, small_search_kernel<kQ>, a));
    GPU_KERNEL_CHECK();
}

}  // namespace

SmallLaunch small_search_plan(const SmallSearchArgs& a, int sms, int forced_cluster, bool spread)
{
    if (a.nq < 1 || a.k < 1 || a.k > kSmallSearchMaxK || a.nprobe < 1 || a.nprobe > kSmallSearchMaxK ||
        a.nprobe > a.lists || a.m < 1 || a.d < 1 || a.d % a.m != 0)
        return SmallLaunch{};
    return queue_of(a) == 32 ? pick_launch<32>(a, sms, forced_cluster, spread)
                             : pick_launch<kSmallSearchMaxK>(a, sms, forced_cluster, spread);
}

SmallOccupancy small_search_occupancy(const SmallSearchArgs& a, int cluster, size_t smem)
{
    SmallOccupancy o;
    const int kq = queue_of(a) == 32 ? 32 : kSmallSearchMaxK;
    o.smem = layout_of(a.m, a.d, cluster, kq).total;
    const size_t ask = smem ? smem : o.smem;
    o.clusters = kq == 32 ? active_clusters<32>(cluster, ask) : active_clusters<kSmallSearchMaxK>(cluster, ask);
    cudaFuncAttributes attr{};
    GPU_CUDA_CHECK(kq == 32 ? cudaFuncGetAttributes(&attr, small_search_kernel<32>)
                            : cudaFuncGetAttributes(&attr, small_search_kernel<kSmallSearchMaxK>));
    o.registers = attr.numRegs;
    return o;
}

void launch_coarse_keys(const SmallSearchArgs& a, float* keys, cudaStream_t st)
{
    if (a.nq < 1)
        return;
    const size_t smem = (static_cast<size_t>(kWarps) * 32 * 32 +
                         static_cast<size_t>(kCoarseQueries) * ((a.d + 3) / 4 * 4) + kCoarseQueries) *
                        sizeof(float);
    // 32 rows a warp while the batch's blocks fill the device, else 16 or 8
    // (more blocks, wider chunks: the same keys).
    const int groups = (a.nq + kCoarseQueries - 1) / kCoarseQueries;
    const int sms = device_attribute(cudaDevAttrMultiProcessorCount);
    int r = 32;
    while (r > 8 && static_cast<int64_t>((a.lists + kWarps * r - 1) / (kWarps * r)) * groups < sms)
        r /= 2;
    const dim3 grid(static_cast<unsigned>((a.lists + kWarps * r - 1) / (kWarps * r)), static_cast<unsigned>(groups));
    auto launch = [&](auto kernel) {
        if (smem > 48 * 1024)
            GPU_CUDA_CHECK(
                cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
        kernel<<<grid, kThreads, smem, st>>>(a, keys);
        GPU_KERNEL_CHECK();
    };
    if (r == 32)
        launch(coarse_keys_kernel<32>);
    else if (r == 16)
        launch(coarse_keys_kernel<16>);
    else
        launch(coarse_keys_kernel<8>);
}

void launch_small_search(const SmallSearchArgs& a, const SmallLaunch& plan, cudaStream_t st)
{
    if (a.nq < 1)
        return;
    if (plan.cluster < 1)
        throw Error(ErrorKind::InvalidArgument, "GPU IVFPQ one-launch search: the shape has no launch plan");
    if (queue_of(a) == 32)
        launch_impl<32>(a, plan, st);
    else
        launch_impl<kSmallSearchMaxK>(a, plan, st);
}

}  // namespace gpuivfpq::gpu
