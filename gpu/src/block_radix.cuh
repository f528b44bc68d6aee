// Block-wide radix selection in shared memory, for blocks of kRadixThreads
// threads: the one-launch search's selections (small_search.cu) and the
// radix k-selection kernel (radix_select.cu) call the same routines.
#pragma once

#include <cstdint>

#include "warp_select.cuh"

namespace gpuivfpq::gpu {

constexpr int kRadixThreads = 256;
constexpr int kRadixWarps = kRadixThreads / 32;
static_assert(kRadixThreads == 256, "the radix select's histogram has a bin per thread");

// A float's bits in an unsigned order that follows the float order.
__device__ __forceinline__ uint32_t order_bits(float f)
{
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Exclusive prefix sum of v over the block (every thread calls it; scratch:
// kRadixWarps + 1 ints of shared memory); *total gets the sum.
__device__ inline int block_exclusive_scan(int v, int* scratch, int* total)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int x = v;
    for (int off = 1; off < 32; off <<= 1) {
        const int y = __shfl_up_sync(kFullMask, x, off);
        if (lane >= off)
            x += y;
    }
    if (lane == 31)
        scratch[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int w = lane < kRadixWarps ? scratch[lane] : 0;
        for (int off = 1; off < 32; off <<= 1) {
            const int y = __shfl_up_sync(kFullMask, w, off);
            if (lane >= off)
                w += y;
        }
        if (lane < kRadixWarps)
            scratch[lane] = w;  // inclusive warp totals
    }
    __syncthreads();
    const int before = (warp ? scratch[warp - 1] : 0) + x - v;
    *total = scratch[kRadixWarps - 1];
    __syncthreads();  // scratch free again
    return before;
}

// Where the kk smallest of keys[0 .. n) (shared memory; +inf is no
// candidate) end, in (key, position) order: a radix select of the k-th key
// over digits of its ordered bits (stopping at the first digit whose bin
// holds exactly the entries still needed). The digits start at the highest
// bit in which the valid keys differ (the bits above it are common to all
// of them: distances of one query share their sign and most of their
// exponent, so a first digit over the top 8 bits would put nearly every key
// into one bin, each a contended shared-memory atomic); the digits below it
// are 8 bits wide, the last one narrower. An entry is among the kk when
// cut_takes says so (ties by position: the caller counts them in order).
// Every thread calls it; scan[0 .. 36] and hist are its scratch.
struct RadixCut {
    uint32_t prefix, mask;
    int remaining, nvalid;
    bool ties;  // entries equal to the k-th in all of mask's bits: by position
};

__device__ inline RadixCut radix_cut(const float* keys, int n, int kk, int* hist, int* scan)
{
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int* ctl = scan + 32;  // [0] prefix, [2] remaining, [3] ties, [4] selected count
    // Per warp, the AND and the OR of its valid keys' ordered bits (read
    // after block_exclusive_scan's barriers).
    uint32_t* warp_and = reinterpret_cast<uint32_t*>(scan + 16);
    uint32_t* warp_or = reinterpret_cast<uint32_t*>(scan + 24);
    static_assert(kRadixWarps <= 8, "scan holds 8 AND and 8 OR words from offset 16");
    // Valid entries, and the bits they share.
    int valid = 0;
    uint32_t band = 0xffffffffu, bor = 0u;
    for (int i = tid; i < n; i += kRadixThreads) {
        const float f = keys[i];
        if (f != INFINITY) {
            const uint32_t u = order_bits(f);
            ++valid;
            band &= u;
            bor |= u;
        }
    }
    for (int off = 16; off > 0; off >>= 1) {
        band &= __shfl_xor_sync(kFullMask, band, off);
        bor |= __shfl_xor_sync(kFullMask, bor, off);
    }
    if (lane == 0) {
        warp_and[warp] = band;
        warp_or[warp] = bor;
    }
    int nvalid;
    block_exclusive_scan(valid, scan, &nvalid);
    band = 0xffffffffu;
    bor = 0u;
#pragma unroll
    for (int w = 0; w < kRadixWarps; ++w) {
        band &= warp_and[w];
        bor |= warp_or[w];
    }
    uint32_t prefix = 0, mask = 0;
    int remaining = kk < nvalid ? kk : nvalid;
    bool ties = false;  // entries equal to the k-th in all 32 bits: by index
    if (nvalid > kk) {
        const uint32_t differ = band ^ bor;
        if (differ == 0) {
            // Every valid key has the same bits: the first kk by index.
            prefix = band;
            mask = 0xffffffffu;
            ties = true;
        } else {
            const int top = 31 - __clz(differ);
            mask = top == 31 ? 0u : 0xffffffffu << (top + 1);
            prefix = band & mask;
        }
        for (int hi = differ == 0 ? -1 : 31 - __clz(differ); hi >= 0; hi -= 8) {
            const int shift = hi >= 7 ? hi - 7 : 0;
            const uint32_t digit = (2u << (hi - shift)) - 1u;  // hi - shift + 1 bits, at most 8
            hist[tid] = 0;  // kRadixThreads == 256 bins
            __syncthreads();
            for (int i = tid; i < n; i += kRadixThreads) {
                const float f = keys[i];
                const uint32_t u = order_bits(f);
                if (f != INFINITY && (u & mask) == prefix)
                    atomicAdd(hist + ((u >> shift) & digit), 1);
            }
            __syncthreads();
            if (warp == 0) {
                // Bins 8 per lane: the bin where the count reaches remaining.
                int c[8], sum = 0;
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    c[j] = hist[lane * 8 + j];
                    sum += c[j];
                }
                int x = sum;
                for (int off = 1; off < 32; off <<= 1) {
                    const int y = __shfl_up_sync(kFullMask, x, off);
                    if (lane >= off)
                        x += y;
                }
                int before = x - sum;
                if (before < remaining && remaining <= x) {  // one lane
                    int bin = lane * 8;
#pragma unroll
                    for (int j = 0; j < 8; ++j) {
                        if (before + c[j] >= remaining) {
                            bin = lane * 8 + j;
                            break;
                        }
                        before += c[j];
                    }
                    ctl[0] = static_cast<int>(prefix | (static_cast<uint32_t>(bin) << shift));
                    ctl[2] = remaining - before;
                    ctl[3] = hist[bin] != remaining - before;  // more in the bin than needed
                }
            }
            __syncthreads();
            prefix = static_cast<uint32_t>(ctl[0]);
            mask |= digit << shift;
            remaining = ctl[2];
            ties = ctl[3] != 0;
            __syncthreads();
            if (!ties)
                break;  // the bin's entries are exactly those still needed
        }
    }
    return RadixCut{prefix, mask, remaining, nvalid, ties};
}

// Whether the entry of key f is among radix_cut's kk; eq_before: the tied
// entries before it (in position order) taken so far, counted up.
__device__ __forceinline__ bool cut_takes(const RadixCut& c, int kk, float f, int& eq_before)
{
    if (f == INFINITY)
        return false;
    const uint32_t u = order_bits(f) & c.mask;
    bool take = c.nvalid <= kk || u < c.prefix;
    if (!take && u == c.prefix)
        take = !c.ties || eq_before++ < c.remaining;
    return take;
}

// The tied entries (equal to the cut in mask's bits) of keys[c0 .. c1).
__device__ __forceinline__ int cut_ties(const RadixCut& c, const float* keys, int c0, int c1)
{
    int eq = 0;
    if (c.ties)
        for (int i = c0; i < c1; ++i)
            eq += keys[i] != INFINITY && (order_bits(keys[i]) & c.mask) == c.prefix;
    return eq;
}

// Cuts keys / labels[0 .. n) (shared memory, in label order; +inf is no
// candidate) to their kk smallest in (key, label) order, kept in label
// order at [0 .. kk), through tk / tl (kk entries of scratch); returns how
// many were kept (kk: n is larger) and puts the largest kept key's ordered
// bits into *bar. Every thread calls it.
__device__ inline int cut_to_best(float* keys, int* labels, int n, int kk, int* hist, int* scan, float* tk, int* tl,
                           uint32_t* bar)
{
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    __syncthreads();  // the keys complete
    const RadixCut cut = radix_cut(keys, n, kk, hist, scan);
    const int per = (n + kRadixThreads - 1) / kRadixThreads;
    const int c0 = min(n, tid * per), c1 = min(n, c0 + per);
    const int eq = cut_ties(cut, keys, c0, c1);
    int eq_total;
    const int eq_first = cut.ties ? block_exclusive_scan(eq, scan, &eq_total) : 0;
    int mine = 0, eq_before = eq_first;
    for (int i = c0; i < c1; ++i)
        mine += cut_takes(cut, kk, keys[i], eq_before);
    int kept;
    int at = block_exclusive_scan(mine, scan, &kept);
    eq_before = eq_first;
    for (int i = c0; i < c1; ++i)
        if (cut_takes(cut, kk, keys[i], eq_before)) {
            tk[at] = keys[i];
            tl[at] = labels[i];
            at++;
        }
    __syncthreads();
    uint32_t top = 0;
    for (int e = tid; e < kept; e += kRadixThreads) {
        keys[e] = tk[e];
        labels[e] = tl[e];
        top = max(top, order_bits(tk[e]));
    }
    for (int off = 16; off > 0; off >>= 1)
        top = max(top, __shfl_xor_sync(kFullMask, top, off));
    uint32_t* tops = reinterpret_cast<uint32_t*>(scan + 48);
    if (lane == 0)
        tops[warp] = top;
    __syncthreads();
    top = 0;
#pragma unroll
    for (int w = 0; w < kRadixWarps; ++w)
        top = max(top, tops[w]);
    *bar = top;
    __syncthreads();  // tops and the kept entries read before any reuse
    return kept;
}

}  // namespace gpuivfpq::gpu
