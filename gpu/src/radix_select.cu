// k-selection by block radix select (block_radix.cuh): a block per (row,
// chunk) takes the chunk's keys into shared memory a tile at a time, cuts
// them to the k best at each tile (radix_cut: a few histogram passes, no
// sorting network), keeps only keys below the running bar from the second
// tile on, and writes its k best in (key, label) order by a rank count; a
// second launch of the same kernel merges a row's chunks. For small
// batches, where WarpSelect's per-entry queue merges and its block merge
// are a chain of latencies on few SMs.
#include <string>

#include "block_radix.cuh"
#include "cuda_check.h"
#include "select_args.h"
#include "select_kernel.cuh"

namespace gpuivfpq::gpu {

namespace {

// The shared memory of a block for k = kk: tile keys and labels (after the
// kept ones), the cut's scratch (kk each), the histogram and the scan's
// scratch (64 ints: block_radix.cuh's routines use up to scan[56]).
size_t radix_smem_bytes(int kk)
{
    return (2 * size_t(kRadixTileKeys + kk) + 2 * size_t(kk) + kRadixThreads + 64) * 4;
}

// kk lanes' worth of rank counting over a power-of-two group of G lanes
// per entry (G <= 32, as many as the block's threads allow).
__device__ __forceinline__ int rank_group(int kept)
{
    int g = 1;
    while (g < 32 && g * 2 * kept <= kRadixThreads)
        g *= 2;
    return g;
}

__global__ void __launch_bounds__(kRadixThreads) radix_select_kernel(SelectArgs a)
{
    extern __shared__ __align__(16) unsigned char smem[];
    const int kk = a.k;
    float* keys = reinterpret_cast<float*>(smem);
    int* labels = reinterpret_cast<int*>(keys + kRadixTileKeys + kk);
    float* tk = reinterpret_cast<float*>(labels + kRadixTileKeys + kk);
    int* tl = reinterpret_cast<int*>(tk + kk);
    int* hist = tl + kk;
    int* scan = hist + kRadixThreads;
    const int tid = threadIdx.x;

    const int64_t orow = blockIdx.x;
    // The chunk's columns, as for_each_candidate splits a row.
    const ChunkSpan cols = chunk_span(a, orow);
    const int64_t row = cols.row, begin = cols.begin, end = cols.end;
    const float* rp = a.in + row * a.ld;
    const int32_t* lp = a.in_labels ? a.in_labels + row * a.ld : nullptr;
    const bool norms = transform_norms(a);
    const KeyFn key_of = key_fn_of(a, row);  // WarpSelect's keys, bit for bit

    // Tiles in column order: the kept entries (from earlier columns) stay
    // first, so that positions in the buffer follow the labels and ties go
    // to the smaller label. A key not below the bar once k are kept cannot
    // enter (a later equal key loses its tie); +inf (and NaN, which the
    // key function turns into +inf or its overflow bound) is no candidate,
    // as for WarpSelect.
    int kept = 0;
    uint32_t bar = 0;
    for (int64_t t0 = begin; t0 < end; t0 += kRadixTileKeys) {  // uniform over the block
        const int tn = static_cast<int>(end - t0 < kRadixTileKeys ? end - t0 : kRadixTileKeys);
        const bool full = kept == kk;
        for (int i = tid; i < tn; i += kRadixThreads) {
            const int64_t c = t0 + i;
            float f = key_of(rp[c], norms ? a.col_norms[c] : 0.0f);
            if (!(f < INFINITY) || (full && order_bits(f) >= bar))
                f = INFINITY;
            keys[kept + i] = f;
            labels[kept + i] = lp ? lp[c] : a.label_base + static_cast<int>(c);
        }
        kept = cut_to_best(keys, labels, kept + tn, kk, hist, scan, tk, tl, &bar);
    }

    // The kept entries (in label order) to their places in (key, label)
    // order: G lanes count an entry's predecessors, each over 1/G of them.
    const int64_t base = orow * kk;
    const int g = rank_group(kept);
    const int per_round = kRadixThreads / g;
    for (int e0 = 0; e0 < kept; e0 += per_round) {  // uniform over the block
        const int e = e0 + tid / g, part = tid & (g - 1);
        float key = 0.0f;
        int lab = 0, at = 0;
        if (e < kept) {
            key = keys[e];
            lab = labels[e];
            for (int j = part; j < kept; j += g) {
                const float kj = keys[j];
                at += kj < key || (kj == key && labels[j] < lab);
            }
        }
        for (int off = 1; off < g; off <<= 1)
            at += __shfl_xor_sync(kFullMask, at, off);
        if (e < kept && part == 0) {
            a.out_dist[base + at] = a.out_sign * key;
            store_label(a, base + at, lab);
        }
    }
    for (int e = kept + tid; e < kk; e += kRadixThreads) {
        a.out_dist[base + e] = a.out_sign * INFINITY;
        store_label(a, base + e, -1);
    }
}

void launch_radix(const SelectArgs& a, cudaStream_t stream)
{
    const int64_t total = a.rows * a.chunks;
    if (total == 0)
        return;
    require(total < (int64_t(1) << 31), "too many rows for the radix k-selection");
    radix_select_kernel<<<static_cast<unsigned>(total), kRadixThreads, radix_smem_bytes(a.k), stream>>>(a);
    GPU_KERNEL_CHECK();
}

}  // namespace

void launch_select_radix(SelectArgs a, float* cdist, int32_t* cidx, float* out_dist, int32_t* out_idx,
                         cudaStream_t stream)
{
    require(a.k >= 1 && a.k <= kRadixMaxK,
            "the radix k-selection supports 1 <= k <= " + std::to_string(kRadixMaxK));
    require(a.prefix_len == 0, "the radix k-selection takes no prefix candidates");
    require(a.chunks >= 1, "the radix k-selection needs a chunk at least");
    const bool merge = a.chunks > 1;
    int64_t* out64 = a.out_idx64;
    const float sign = a.out_sign;
    if (merge) {  // the chunks' keys as they are, their positions as int32
        a.out_dist = cdist;
        a.out_idx = cidx;
        a.out_idx64 = nullptr;
        a.out_sign = 1.0f;
    } else {
        a.out_dist = out_dist;
        a.out_idx = out_idx;
    }
    launch_radix(a, stream);
    if (!merge)
        return;
    SelectArgs m;
    m.in = cdist;
    m.in_labels = cidx;
    m.ld = static_cast<int64_t>(a.chunks) * a.k;
    m.n = m.ld;
    m.rows = a.rows;
    m.chunk_len = m.ld;
    m.k = a.k;
    m.out_sign = sign;
    m.out_dist = out_dist;
    m.out_idx = out_idx;
    m.out_idx64 = out64;
    launch_radix(m, stream);
}

}  // namespace gpuivfpq::gpu
