// k-selection dispatch: k = 1 by an arg-min kernel, otherwise WarpSelect /
// BlockSelect instantiated per warp-queue bucket (select_q*.cu).
#include <string>

#include "select_kernel.cuh"

namespace gpuivfpq::gpu {

namespace {

// Smallest key wins; equal keys go to the smaller label (deterministic).
// +inf is never a result, as with WarpSelect (whose bar starts at +inf): a
// row without a finite key gives (+inf, -1), so entries keyed +inf (the IVF
// scan's out-of-range entries) read as padding.
__device__ __forceinline__ void better(float& bk, int& bl, float k, int l)
{
    if (k < bk || (k == bk && k < INFINITY && l >= 0 && (bl < 0 || l < bl))) {
        bk = k;
        bl = l;
    }
}

template <int kWarps>
__global__ void __launch_bounds__(kSelectThreads) argmin_kernel(SelectArgs a)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t total = a.rows * a.chunks;
    const int64_t orow =
        kWarps == 1 ? static_cast<int64_t>(blockIdx.x) * (kSelectThreads / 32) + warp : blockIdx.x;
    if (kWarps == 1 && orow >= total)
        return;
    const int t = kWarps == 1 ? lane : threadIdx.x;
    float bk = INFINITY;
    int bl = -1;
    for_each_candidate(a, orow, t, 32 * kWarps, [&](float k, int l) { better(bk, bl, k, l); });
    for (int off = 16; off > 0; off >>= 1) {
        float ok = __shfl_xor_sync(kFullMask, bk, off);
        int ol = __shfl_xor_sync(kFullMask, bl, off);
        better(bk, bl, ok, ol);
    }
    if (kWarps > 1) {
        __shared__ float sk[kWarps];
        __shared__ int sl[kWarps];
        if (lane == 0) {
            sk[warp] = bk;
            sl[warp] = bl;
        }
        __syncthreads();
        if (threadIdx.x != 0)
            return;
        for (int w = 1; w < kWarps; ++w)
            better(bk, bl, sk[w], sl[w]);
    } else if (lane != 0) {
        return;
    }
    a.out_dist[orow] = a.out_sign * bk;
    store_label(a, orow, bl);
}

}  // namespace

void launch_select(const SelectArgs& a, bool block_per_row, cudaStream_t stream)
{
    // The largest warp-queue bucket below must hold kMaxSelectK entries.
    static_assert(kMaxSelectK <= 2048, "no k-selection bucket for kMaxSelectK");
    require(a.k >= 1 && static_cast<size_t>(a.k) <= kMaxSelectK,
            "k-selection supports 1 <= k <= " + std::to_string(kMaxSelectK));
    const int64_t total = a.rows * a.chunks;
    if (total == 0)
        return;
    require(total < (int64_t(1) << 31) * (block_per_row ? 1 : 4), "too many rows for k-selection");
    if (a.k == 1) {
        if (block_per_row)
            argmin_kernel<4><<<static_cast<unsigned>(total), kSelectThreads, 0, stream>>>(a);
        else
            argmin_kernel<1><<<static_cast<unsigned>((total + 3) / 4), kSelectThreads, 0, stream>>>(a);
        GPU_KERNEL_CHECK();
        return;
    }
    if (a.k <= 32)
        launch_select_bucket<32>(a, block_per_row, stream);
    else if (a.k <= 64)
        launch_select_bucket<64>(a, block_per_row, stream);
    else if (a.k <= 128)
        launch_select_bucket<128>(a, block_per_row, stream);
    else if (a.k <= 256)
        launch_select_bucket<256>(a, block_per_row, stream);
    else if (a.k <= 512)
        launch_select_bucket<512>(a, block_per_row, stream);
    else if (a.k <= 1024)
        launch_select_bucket<1024>(a, block_per_row, stream);
    else
        launch_select_bucket<2048>(a, block_per_row, stream);
}

void launch_select_merge(int64_t rows, int chunks, int k, const float* cdist, const int32_t* cidx,
                         float* out_dist, int32_t* out_idx, int multiprocessors, cudaStream_t stream)
{
    SelectArgs m;
    m.in = cdist;
    m.in_labels = cidx;
    m.ld = static_cast<int64_t>(chunks) * k;
    m.n = m.ld;
    m.rows = rows;
    m.chunk_len = m.ld;
    m.k = k;
    m.out_dist = out_dist;
    m.out_idx = out_idx;
    launch_select(m, rows < static_cast<int64_t>(multiprocessors) * 16, stream);
}

void launch_select_chunked(SelectArgs a, float* cdist, int32_t* cidx, float* out_dist, int32_t* out_idx,
                           int multiprocessors, cudaStream_t stream)
{
    const bool merge = a.chunks > 1;
    a.out_dist = merge ? cdist : out_dist;
    a.out_idx = merge ? cidx : out_idx;
    // One chunk a row: a block per row where a warp per row leaves SMs idle.
    launch_select(a, !merge && a.rows < static_cast<int64_t>(multiprocessors) * 16, stream);
    if (merge)
        launch_select_merge(a.rows, a.chunks, a.k, cdist, cidx, out_dist, out_idx, multiprocessors, stream);
}

}  // namespace gpuivfpq::gpu
