// Exact k-NN: cuBLAS SGEMM per (query tile, base tile) into a distance
// tile, then one selection kernel that adds the norms and k-selects the tile
// together with the running top-k of the earlier base tiles.
#include <algorithm>
#include <sstream>
#include <string>

#include "context_impl.h"
#include "cuda_check.h"
#include "gpu_ivfpq/device_buffer.h"
#include "gpu_ivfpq/exact_search.h"
#include "gpu_ivfpq/k_select.h"
#include "search_parts.cuh"
#include "select_args.h"

namespace gpuivfpq::gpu {

namespace {

__global__ void row_norms_kernel(const float* x, int64_t n, int d, float* out)
{
    const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= n)
        return;
    const float s = warp_sqr_norm(x + row * d, d, lane);
    if (lane == 0)
        out[row] = s;
}

__global__ void normalize_kernel(float* x, int64_t n, int d)
{
    const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= n)
        return;
    warp_normalize(x + row * d, d, lane);
}

// The selection's transform of an inner-product tile into metric's ranking
// distance; the metric may come from disk, so an unknown one is an error.
int transform_of(Metric metric)
{
    switch (metric) {
    case Metric::L2:
        return kTransformL2;
    case Metric::InnerProduct:
        return kTransformIP;
    case Metric::Cosine:
        return kTransformCosine;
    }
    throw Error(ErrorKind::InvalidArgument, "exact search: unknown metric");
}

bool prefer_block(GpuContext& ctx, int64_t rows)
{
    // A warp per row leaves SMs idle when rows are few: 16 warps per SM wanted.
    return rows < static_cast<int64_t>(ctx.multiprocessors()) * 16;
}

struct Tiling {
    size_t tq, tn, ld;
};

Tiling plan_tiles(GpuContext& ctx, size_t nq, size_t n, size_t tile_bytes)
{
    if (!tile_bytes) {
        const size_t free_b = ctx.budget() > ctx.bytes_in_use() ? ctx.budget() - ctx.bytes_in_use() : 0;
        tile_bytes = std::min<size_t>(size_t(1) << 30, free_b / 4);
    }
    tile_bytes = std::max<size_t>(tile_bytes, size_t(1) << 16);
    const size_t floats = tile_bytes / sizeof(float);
    Tiling t;
    // Base tiles of up to 128k columns (multiple of 128 keeps rows 16-byte
    // aligned), then as many query rows as the budget allows.
    t.tn = std::min<size_t>(n, 131072);
    t.tn = std::max<size_t>(1, std::min(t.tn, floats));
    t.ld = (t.tn + 3) / 4 * 4;
    t.tq = std::max<size_t>(1, std::min(nq, floats / t.ld));
    t.tq = std::min<size_t>(t.tq, 65536);
    return t;
}

void gemm_ip(GpuContext& ctx, const float* q, size_t nq, const float* y, size_t n, size_t d,
             float* out, size_t ldc)
{
    // Row-major out (nq x n) = Q Y^T is column-major out^T (n x nq) = Y^T... as
    // cuBLAS sees it: op(A) = Y^T with A = Y (d x n, col-major), B = Q (d x nq).
    const float one = 1.0f, zero = 0.0f;
    std::ostringstream shapes;
    shapes << "m=" << n << " n=" << nq << " k=" << d << " ldc=" << ldc;
    GPU_CUBLAS_CHECK(cublasSgemm(ctx.impl().cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n),
                                 static_cast<int>(nq), static_cast<int>(d), &one, y,
                                 static_cast<int>(d), q, static_cast<int>(d), &zero, out,
                                 static_cast<int>(ldc)),
                     shapes.str());
}

void exact_impl(GpuContext& ctx, const float* queries, size_t nq, const float* base, size_t n,
                size_t d, Metric metric, size_t k, float* out_dist, int32_t* out32,
                int64_t* out64, const float* base_norms, size_t tile_bytes)
{
    require(k >= 1 && k <= kMaxSelectK,
            "exact search: k must be in [1, " + std::to_string(kMaxSelectK) + "]");
    require(d >= 1, "exact search: d must be >= 1");
    require(n < (size_t(1) << 31), "exact search: more than 2^31 base vectors");
    const int transform = transform_of(metric);
    if (nq == 0)
        return;
    cudaStream_t st = stream_of(ctx);
    const bool norms = metric == Metric::L2 || metric == Metric::Cosine;
    // Two tiles: the GEMM of one tile (main stream) overlaps the selection
    // of the previous one (aux stream): compute-bound next to memory-bound.
    if (!tile_bytes) {
        const size_t free_b = ctx.budget() > ctx.bytes_in_use() ? ctx.budget() - ctx.bytes_in_use() : 0;
        tile_bytes = std::min<size_t>(size_t(1) << 30, free_b / 4);
    }
    Tiling t = plan_tiles(ctx, nq, std::max<size_t>(n, 1), std::max<size_t>(tile_bytes / 2, 1));
    const bool one_tile = nq <= t.tq && n <= t.tn;
    // One tile of few rows (the coarse step of a small batch): the radix
    // selection where set_radix_select asks for it, in chunks of about
    // kRadixChunkKeys columns, a block each, no more than the merge takes
    // in one tile, at most about eight blocks a multiprocessor.
    const bool radix = ctx.impl().radix_select && one_tile && n > 0 && k >= 2 && k <= size_t(kRadixMaxK) &&
                       prefer_block(ctx, static_cast<int64_t>(nq));
    size_t rchunks = 1;
    if (radix) {
        const size_t sms = size_t(std::max(ctx.multiprocessors(), 1));
        rchunks = std::min({(n + kRadixChunkKeys - 1) / kRadixChunkKeys, size_t(kRadixTileKeys) / k,
                            std::max<size_t>(1, sms * 8 / nq)});
        rchunks = std::max<size_t>(rchunks, 1);
    }
    Carver sizing;
    sizing.take<float>(norms ? nq : 0);
    sizing.take<float>(norms && !base_norms ? n : 0);
    sizing.take<float>(n ? t.tq * t.ld : 0);
    sizing.take<float>(n ? t.tq * t.ld : 0);
    for (int b = 0; b < 2; ++b) {
        sizing.take<float>(t.tq * k);
        sizing.take<int32_t>(t.tq * k);
    }
    sizing.take<float>(rchunks > 1 ? nq * rchunks * k : 0);
    sizing.take<int32_t>(rchunks > 1 ? nq * rchunks * k : 0);
    Scratch scratch(ctx, sizing.size());
    Carver carve(scratch.data());
    float* qn = carve.take<float>(norms ? nq : 0);
    float* yn = carve.take<float>(norms && !base_norms ? n : 0);
    float* tiles[2];
    tiles[0] = carve.take<float>(n ? t.tq * t.ld : 0);
    tiles[1] = carve.take<float>(n ? t.tq * t.ld : 0);
    // Without the overlap (bench aid), or with one tile only (a small
    // batch: the coarse quantizer of a search), selection on the main
    // stream, strictly after its GEMM, and no events: nothing to overlap,
    // and a dozen fewer API calls (a CUDA graph captures a single stream).
    cudaStream_t aux = ctx.impl().exact_overlap && !one_tile ? ctx.impl().aux : st;
    const bool two = aux != st;
    // gemm_done[b]: tile b written (main -> aux); sel_done[b]: tile b read (aux -> main).
    cudaEvent_t gemm_done[2] = {}, sel_done[2] = {};
    for (int b = 0; two && b < 2; ++b) {
        GPU_CUDA_CHECK(cudaEventCreateWithFlags(&gemm_done[b], cudaEventDisableTiming));
        GPU_CUDA_CHECK(cudaEventCreateWithFlags(&sel_done[b], cudaEventDisableTiming));
    }
    // On every exit (errors included) the main stream waits for the aux
    // stream before the scratch is released on it, then the events go.
    struct Events {
        cudaEvent_t* e;
        cudaStream_t main, aux;
        ~Events()
        {
            if (main == aux)
                return;
            cudaEventRecord(e[0], aux);
            cudaStreamWaitEvent(main, e[0], 0);
            for (int i = 0; i < 4; ++i)
                cudaEventDestroy(e[i]);
        }
    };
    cudaEvent_t all_ev[4] = {gemm_done[0], gemm_done[1], sel_done[0], sel_done[1]};
    Events guard{all_ev, st, aux};
    auto record = [two](cudaEvent_t e, cudaStream_t s) {
        if (two)
            GPU_CUDA_CHECK(cudaEventRecord(e, s));
    };
    auto wait = [two](cudaStream_t s, cudaEvent_t e) {
        if (two)
            GPU_CUDA_CHECK(cudaStreamWaitEvent(s, e, 0));
    };
    float* run_d[2];
    int32_t* run_i[2];
    for (int b = 0; b < 2; ++b) {
        run_d[b] = carve.take<float>(t.tq * k);
        run_i[b] = carve.take<int32_t>(t.tq * k);
    }
    float* rdist = carve.take<float>(rchunks > 1 ? nq * rchunks * k : 0);
    int32_t* ridx = carve.take<int32_t>(rchunks > 1 ? nq * rchunks * k : 0);
    if (norms) {
        row_norms(ctx, queries, nq, d, qn);
        if (!base_norms && n) {
            row_norms(ctx, base, n, d, yn);
            base_norms = yn;
        }
    }
    // The aux stream starts after everything queued so far (norms, inputs).
    record(sel_done[0], st);
    wait(aux, sel_done[0]);
    record(sel_done[0], aux);
    record(sel_done[1], aux);
    int tb = 0;  // tile buffer in turn
    for (size_t q0 = 0; q0 < nq; q0 += t.tq) {
        const size_t tq = std::min(t.tq, nq - q0);
        int cur = 0;
        size_t n0 = 0;
        do {
            const size_t tn = n ? std::min(t.tn, n - n0) : 0;
            const bool last = n0 + tn >= n;
            float* tile = tiles[tb];
            wait(st, sel_done[tb]);
            if (tn)
                gemm_ip(ctx, queries + q0 * d, tq, base + n0 * d, tn, d, tile, t.ld);
            record(gemm_done[tb], st);
            wait(aux, gemm_done[tb]);
            SelectArgs a;
            a.in = tile;
            a.ld = static_cast<int64_t>(t.ld);
            a.n = static_cast<int64_t>(tn);
            a.rows = static_cast<int64_t>(tq);
            a.chunk_len = static_cast<int64_t>(tn);
            a.k = static_cast<int>(k);
            a.transform = transform;
            a.row_norms = norms ? qn + q0 : nullptr;
            a.col_norms = norms && tn ? base_norms + n0 : nullptr;
            a.label_base = static_cast<int32_t>(n0);
            if (n0 > 0) {
                a.prefix_dist = run_d[cur];
                a.prefix_idx = run_i[cur];
                a.prefix_len = static_cast<int>(k);
                a.prefix_ld = static_cast<int64_t>(k);
            }
            if (last) {
                a.out_dist = out_dist + q0 * k;
                if (out64)
                    a.out_idx64 = out64 + q0 * k;
                else
                    a.out_idx = out32 + q0 * k;
            } else {
                a.out_dist = run_d[cur ^ 1];
                a.out_idx = run_i[cur ^ 1];
            }
            if (radix) {  // one tile: n0 = 0, last
                a.chunks = static_cast<int>(rchunks);
                a.chunk_len = static_cast<int64_t>((tn + rchunks - 1) / rchunks);
                launch_select_radix(a, rdist, ridx, a.out_dist, a.out_idx, aux);
            } else {
                launch_select(a, prefer_block(ctx, static_cast<int64_t>(tq)), aux);
            }
            record(sel_done[tb], aux);
            tb ^= 1;
            cur ^= 1;
            n0 += tn;
        } while (n0 < n);
    }
    // Everything later on the main stream (the caller's reads, the scratch
    // release) waits for the last selection: the guard's destructor.
}

}  // namespace

void row_norms(GpuContext& ctx, const float* x, size_t n, size_t d, float* out)
{
    if (!n)
        return;
    row_norms_kernel<<<static_cast<unsigned>((n + 7) / 8), 256, 0, stream_of(ctx)>>>(
        x, static_cast<int64_t>(n), static_cast<int>(d), out);
    GPU_KERNEL_CHECK();
}

void normalize_rows(GpuContext& ctx, float* x, size_t n, size_t d)
{
    if (!n)
        return;
    normalize_kernel<<<static_cast<unsigned>((n + 7) / 8), 256, 0, stream_of(ctx)>>>(
        x, static_cast<int64_t>(n), static_cast<int>(d));
    GPU_KERNEL_CHECK();
}

void exact_knn(GpuContext& ctx, const float* queries, size_t nq, const float* base, size_t n,
               size_t d, Metric metric, size_t k, float* out_dist, int64_t* out_label,
               const float* base_norms, size_t tile_bytes)
{
    exact_impl(ctx, queries, nq, base, n, d, metric, k, out_dist, nullptr, out_label, base_norms,
               tile_bytes);
}

void exact_knn_i32(GpuContext& ctx, const float* queries, size_t nq, const float* base, size_t n,
                   size_t d, Metric metric, size_t k, float* out_dist, int32_t* out_label,
                   const float* base_norms, size_t tile_bytes)
{
    exact_impl(ctx, queries, nq, base, n, d, metric, k, out_dist, out_label, nullptr, base_norms,
               tile_bytes);
}

void gemm_tiles_only(GpuContext& ctx, const float* queries, size_t nq, const float* base, size_t n,
                     size_t d, size_t tile_bytes)
{
    if (!nq || !n)
        return;
    Tiling t = plan_tiles(ctx, nq, n, tile_bytes);
    Scratch tile(ctx, t.tq * t.ld * sizeof(float));
    for (size_t q0 = 0; q0 < nq; q0 += t.tq)
        for (size_t n0 = 0; n0 < n; n0 += t.tn)
            gemm_ip(ctx, queries + q0 * d, std::min(t.tq, nq - q0), base + n0 * d,
                    std::min(t.tn, n - n0), d, tile.as<float>(), t.ld);
}

void set_exact_overlap(GpuContext& ctx, bool on) { ctx.impl().exact_overlap = on; }

void set_radix_select(GpuContext& ctx, bool on) { ctx.impl().radix_select = on; }

void k_select(GpuContext& ctx, const float* in, size_t rows, size_t n, size_t ld, size_t k,
              bool largest, float* out_dist, int32_t* out_idx, SelectAlgo algo)
{
    if (k == 0 || k > kMaxSelectK) {
        std::ostringstream os;
        os << "k-selection: k = " << k << " outside [1, " << kMaxSelectK << "]";
        throw Error(ErrorKind::InvalidArgument, os.str());
    }
    require(ld >= n, "k-selection: row stride smaller than the row");
    require(n < (size_t(1) << 31), "k-selection: rows longer than 2^31");
    SelectArgs a;
    a.in = in;
    a.ld = static_cast<int64_t>(ld);
    a.n = static_cast<int64_t>(n);
    a.rows = static_cast<int64_t>(rows);
    a.chunk_len = static_cast<int64_t>(n);
    a.k = static_cast<int>(k);
    a.transform = largest ? kTransformNegate : kTransformNone;
    a.out_sign = largest ? -1.0f : 1.0f;
    a.out_dist = out_dist;
    a.out_idx = out_idx;
    if (algo == SelectAlgo::Radix) {
        require(k <= size_t(kRadixMaxK), "k-selection: the radix selection takes k <= 256");
        a.chunks = int(std::min<size_t>(64, std::max<size_t>(1, (n + 8191) / 8192)));
        a.chunk_len = static_cast<int64_t>((n + size_t(a.chunks) - 1) / size_t(a.chunks));
        DeviceBuffer cd(ctx, a.chunks > 1 ? rows * size_t(a.chunks) * k * sizeof(float) : 0);
        DeviceBuffer ci(ctx, a.chunks > 1 ? rows * size_t(a.chunks) * k * sizeof(int32_t) : 0);
        launch_select_radix(a, cd.as<float>(), ci.as<int32_t>(), out_dist, out_idx, stream_of(ctx));
        ctx.synchronize();  // the chunks' buffers outlive the kernels
        return;
    }
    bool block = algo == SelectAlgo::Block ||
                 (algo == SelectAlgo::Auto && prefer_block(ctx, static_cast<int64_t>(rows)));
    launch_select(a, block, stream_of(ctx));
}

}  // namespace gpuivfpq::gpu
