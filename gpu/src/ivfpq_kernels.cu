// Small IVFPQ kernels: term 1, term 3 (cuBLAS), PQ encoding, residuals,
// slices, gathers, label decoding and id removal.
#include <cuda_fp16.h>

#include <cub/block/block_scan.cuh>

#include <sstream>

#include "context_impl.h"
#include "cuda_check.h"
#include "ivfpq_kernels.h"
#include "list_layout.cuh"
#include "search_parts.cuh"

namespace gpuivfpq::gpu {

namespace {

template <typename T>
__device__ __forceinline__ void store_as(T* p, int64_t i, float v);
template <>
__device__ __forceinline__ void store_as<float>(float* p, int64_t i, float v) { p[i] = v; }
template <>
__device__ __forceinline__ void store_as<__half>(__half* p, int64_t i, float v)
{
    p[i] = __float2half_rn(v);
}

template <typename T>
__global__ void term1_kernel(const float* centroids, int64_t lists, const float* codebooks, int d,
                             int m, T* out)
{
    const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t per_list = static_cast<int64_t>(m) * 256;
    if (e >= lists * per_list)
        return;
    const int64_t l = e / per_list;
    const int jc = static_cast<int>(e - l * per_list);
    const int j = jc >> 8;
    const int dsub = d / m;
    const float* cw = codebooks + static_cast<int64_t>(jc) * dsub;
    const float* cl = centroids + l * d + j * dsub;
    float s = 0.0f;
    for (int t = 0; t < dsub; ++t)
        s += cw[t] * cw[t] + 2.0f * cl[t] * cw[t];
    store_as<T>(out, e, s);
}

__global__ void vector_term1_kernel(const uint8_t* codes, const int32_t* list_ids, int64_t n,
                                    const float* centroids, const float* codebooks, int d, int m,
                                    float* out)
{
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    const int dsub = d / m;
    const float* cl = centroids + static_cast<int64_t>(list_ids[i]) * d;
    float s = 0.0f;
    for (int j = 0; j < m; ++j) {
        const float* cw = codebooks + (static_cast<int64_t>(j) * 256 + codes[i * m + j]) * dsub;
        for (int t = 0; t < dsub; ++t)
            s += cw[t] * cw[t] + 2.0f * cl[j * dsub + t] * cw[t];
    }
    out[i] = s;
}

__global__ void residuals_kernel(const float* x, int64_t n, int d, const float* centroids,
                                 const int32_t* assign, float* out)
{
    const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (e >= n * d)
        return;
    const int64_t i = e / d;
    const int c = static_cast<int>(e - i * d);
    out[e] = x[e] - centroids[static_cast<int64_t>(assign[i]) * d + c];
}

// A thread per (vector, sub-quantizer); ties go to the smaller code, as a
// strict '<' scan over codes does on the CPU.
__global__ void pq_encode_kernel(const float* resid, int64_t n, int d, int m, const float* codebooks,
                                 uint8_t* codes)
{
    const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (e >= n * m)
        return;
    const int64_t i = e / m;
    const int j = static_cast<int>(e - i * m);
    const int dsub = d / m;
    const float* r = resid + i * d + j * dsub;
    const float* cb = codebooks + static_cast<int64_t>(j) * 256 * dsub;
    float best = INFINITY;
    int arg = 0;
    for (int c = 0; c < 256; ++c) {
        const float* cw = cb + c * dsub;
        float s = 0.0f;
        for (int t = 0; t < dsub; ++t) {
            const float df = r[t] - cw[t];
            s = fmaf(df, df, s);
        }
        if (s < best) {
            best = s;
            arg = c;
        }
    }
    codes[e] = static_cast<uint8_t>(arg);
}

__global__ void column_slice_kernel(const float* x, int64_t n, int d, int col0, int w, float* out)
{
    const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (e >= n * w)
        return;
    const int64_t i = e / w;
    out[e] = x[i * d + col0 + (e - i * w)];
}

__global__ void gather_rows_kernel(const float* x, const int64_t* idx, int64_t n, int d, float* out)
{
    const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (e >= n * d)
        return;
    const int64_t i = e / d;
    out[e] = x[idx[i] * d + (e - i * d)];
}

__global__ void decode_kernel(const int32_t* pos, int64_t nq, int k, int nprobe,
                              const int32_t* prefix, const int32_t* probe_lists,
                              const int64_t* const* list_ids, int64_t* out)
{
    const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (e >= nq * k)
        return;
    const int64_t q = e / k;
    const int p = pos[e];
    if (p < 0) {
        out[e] = -1;
        return;
    }
    const int32_t* pre = prefix + q * (nprobe + 1);
    // Last probe whose first candidate is <= p (empty probes share offsets).
    int lo = 0, hi = nprobe;  // invariant: pre[lo] <= p < pre[hi]
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (pre[mid] <= p)
            lo = mid;
        else
            hi = mid;
    }
    const int list = probe_lists[q * nprobe + lo];
    const int off = p - pre[lo];
    out[e] = list_ids ? list_ids[list][off]
                      : (static_cast<int64_t>(list) << 32) | static_cast<uint32_t>(off);
}

__global__ void exact_base_kernel(const float* queries, int64_t nq, int nprobe, int d,
                                  const float* centroids, const int32_t* probe_lists, bool ip,
                                  float* probe_dist)
{
    const int64_t e = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (e >= nq * nprobe)
        return;
    const int list = probe_lists[e];
    if (list < 0)
        return;
    const float* q = queries + (e / nprobe) * d;
    const float* c = centroids + static_cast<int64_t>(list) * d;
    const float s = warp_probe_base(q, c, d, ip, lane);
    if (lane == 0)
        probe_dist[e] = s;
}

// Whether v is in sorted[0..n) (ascending).
__device__ bool sorted_contains(const int64_t* sorted, int64_t n, int64_t v)
{
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        const int64_t mid = (lo + hi) >> 1;
        if (sorted[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && sorted[lo] == v;
}

constexpr int kRemoveThreads = 256;
// Stored vectors and word-wise codes move this many rows at a time (see
// remove_ids_kernel).
constexpr int kRemoveRowGroup = 8;
// Row-major codes up to this many bytes are staged a chunk at a time in
// shared memory (PQ codes); wider ones (RaBitQ rows, a multiple of 4 bytes)
// and interleaved ones of any width move column-wise as 32-bit words, like
// the vectors.
constexpr int kRemoveStagedMaxM = 128;

// Moves the kept rows of a chunk (width elements each, rows base .. base +
// chunk) to their slots column-wise: each thread owns columns threadIdx.x +
// i * blockDim.x of every row and moves them row after row in list order,
// as a sequential in-place compaction does; a slot lies below its row, so
// within a column every value is read (by its owner) before a later row's
// move can overwrite it, with no barrier. Rows go kRemoveRowGroup at a
// time, all read before any is written (memory-level parallelism), which
// keeps that order within the group. move_to[r]: row base + r's slot, or -1.
template <typename T, typename At>
__device__ void move_rows(T* rows, int width, int base, int chunk, const int* move_to, At at)
{
    for (int r0 = 0; r0 < chunk; r0 += kRemoveRowGroup) {
        const int nr = min(kRemoveRowGroup, chunk - r0);
        for (int t = threadIdx.x; t < width; t += kRemoveThreads) {
            T v[kRemoveRowGroup];
#pragma unroll
            for (int u = 0; u < kRemoveRowGroup; ++u)
                v[u] = u < nr && move_to[r0 + u] >= 0 ? rows[at(static_cast<int64_t>(base) + r0 + u, t)] : T();
#pragma unroll
            for (int u = 0; u < kRemoveRowGroup; ++u)
                if (u < nr && move_to[r0 + u] >= 0)
                    rows[at(static_cast<int64_t>(move_to[r0 + u]), t)] = v[u];
        }
    }
}

// A block per list compacts it in place, keeping order: chunk by chunk, each
// thread reads its entry (the chunk's codes staged in shared memory when
// they are narrow), a block scan gives the kept entries their slots, then
// they are written. Slots are never past the entry's own position and the
// next chunk is read after the barrier, so nothing is overwritten before it
// is read. Stored vectors (d floats, too many to stage a chunk of) and wide
// or interleaved codes move column-wise (move_rows; a thread owns a word
// of every row, wherever the layout puts it).
__global__ void __launch_bounds__(kRemoveThreads)
    remove_ids_kernel(uint8_t* const* list_codes, int64_t* const* list_ids, float* const* list_vt,
                      float* const* list_vectors, int64_t* const* list_keys, const int32_t* list_len,
                      int m, int d, const int64_t* gone, int64_t ngone, int32_t* new_len, bool interleaved)
{
    using BlockScan = cub::BlockScan<int, kRemoveThreads>;
    __shared__ typename BlockScan::TempStorage scan_storage;
    __shared__ int move_to[kRemoveThreads];  // chunk entry -> its new row, -1: stays or goes
    extern __shared__ uint8_t staged_codes[];  // kRemoveThreads x m (narrow codes)
    const bool staged = m <= kRemoveStagedMaxM && !interleaved;
    const int list = blockIdx.x;
    const int len = list_len[list];
    uint8_t* codes = list_codes[list];
    int64_t* ids = list_ids[list];
    float* vt = list_vt[list];  // null without per-vector term 1
    float* vecs = list_vectors ? list_vectors[list] : nullptr;  // null without stored vectors
    int64_t* keys = list_keys ? list_keys[list] : nullptr;      // null without filter keys
    int kept = 0;
    for (int base = 0; base < len; base += kRemoveThreads) {
        const int i = base + threadIdx.x;
        const int chunk = min(kRemoveThreads, len - base);
        int64_t id = 0, key = 0;
        float term = 0.0f;
        int keep = 0;
        if (i < len) {
            id = ids[i];
            keep = sorted_contains(gone, ngone, id) ? 0 : 1;
            if (vt)
                term = vt[i];
            if (keys)
                key = keys[i];
        }
        if (staged) {
            const uint8_t* src = codes + static_cast<int64_t>(base) * m;
            for (int e = threadIdx.x; e < chunk * m; e += kRemoveThreads)
                staged_codes[e] = src[e];
        }
        int slot = 0, chunk_kept = 0;
        BlockScan(scan_storage).ExclusiveSum(keep, slot, chunk_kept);
        __syncthreads();  // the whole chunk is read before any write
        const int dst = kept + slot;
        if (keep && dst != i) {
            ids[dst] = id;
            if (vt)
                vt[dst] = term;
            if (keys)
                keys[dst] = key;
            if (staged) {
                uint8_t* out = codes + static_cast<int64_t>(dst) * m;
                for (int j = 0; j < m; ++j)
                    out[j] = staged_codes[threadIdx.x * m + j];
            }
        }
        if (vecs || !staged) {
            move_to[threadIdx.x] = i < len && keep && dst != i ? dst : -1;
            __syncthreads();
            if (vecs)
                move_rows(vecs, d, base, chunk, move_to, [d](int64_t r, int t) { return r * d + t; });
            const int words = m / 4;
            if (interleaved)
                move_rows(reinterpret_cast<uint32_t*>(codes), words, base, chunk, move_to,
                          [words](int64_t r, int t) { return interleaved_word(r, t, words); });
            else if (!staged)
                move_rows(reinterpret_cast<uint32_t*>(codes), words, base, chunk, move_to,
                          [words](int64_t r, int t) { return r * words + t; });
        }
        kept += chunk_kept;
        __syncthreads();  // staged codes, scan storage and move_to are reused
    }
    if (threadIdx.x == 0)
        new_len[list] = kept;
}

unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace

void launch_term1(const float* centroids, int64_t lists, const float* codebooks, int d, int m,
                  void* out, bool half, cudaStream_t st)
{
    const int64_t n = lists * m * 256;
    if (!n)
        return;
    if (half)
        term1_kernel<__half><<<blocks_for(n, 256), 256, 0, st>>>(centroids, lists, codebooks, d, m,
                                                                  static_cast<__half*>(out));
    else
        term1_kernel<float><<<blocks_for(n, 256), 256, 0, st>>>(centroids, lists, codebooks, d, m,
                                                                 static_cast<float*>(out));
    GPU_KERNEL_CHECK();
}

void launch_vector_term1(const uint8_t* codes, const int32_t* list_ids, int64_t n, const float* centroids,
                         const float* codebooks, int d, int m, float* out, cudaStream_t st)
{
    if (!n)
        return;
    vector_term1_kernel<<<blocks_for(n, 128), 128, 0, st>>>(codes, list_ids, n, centroids, codebooks, d,
                                                             m, out);
    GPU_KERNEL_CHECK();
}

void compute_term3(GpuContext& ctx, const float* queries, int64_t nq, const float* codebooks, int d,
                   int m, float scale, float* out)
{
    if (!nq)
        return;
    const int dsub = d / m;
    const float zero = 0.0f;
    // Column-major view: batch j computes C_j (256 x nq, ldc = m*256, at
    // row offset j*256) = A_j^T B_j with A_j = codebook j (dsub x 256) and
    // B_j = query slice j (dsub x nq, ldb = d, at offset j*dsub).
    std::ostringstream shapes;
    shapes << "m=256 n=" << nq << " k=" << dsub << " batches=" << m;
    GPU_CUBLAS_CHECK(cublasSgemmStridedBatched(
                         ctx.impl().cublas, CUBLAS_OP_T, CUBLAS_OP_N, 256, static_cast<int>(nq),
                         dsub, &scale, codebooks, dsub, static_cast<long long>(256) * dsub, queries,
                         d, dsub, &zero, out, m * 256, 256, m),
                     shapes.str());
}

void launch_residuals(const float* x, int64_t n, int d, const float* centroids,
                      const int32_t* assign, float* out, cudaStream_t st)
{
    if (!n)
        return;
    residuals_kernel<<<blocks_for(n * d, 256), 256, 0, st>>>(x, n, d, centroids, assign, out);
    GPU_KERNEL_CHECK();
}

void launch_pq_encode(const float* resid, int64_t n, int d, int m, const float* codebooks,
                      uint8_t* codes, cudaStream_t st)
{
    if (!n)
        return;
    pq_encode_kernel<<<blocks_for(n * m, 128), 128, 0, st>>>(resid, n, d, m, codebooks, codes);
    GPU_KERNEL_CHECK();
}

void launch_column_slice(const float* x, int64_t n, int d, int col0, int w, float* out,
                         cudaStream_t st)
{
    if (!n)
        return;
    column_slice_kernel<<<blocks_for(n * w, 256), 256, 0, st>>>(x, n, d, col0, w, out);
    GPU_KERNEL_CHECK();
}

void launch_gather_rows(const float* x, const int64_t* idx, int64_t n, int d, float* out,
                        cudaStream_t st)
{
    if (!n)
        return;
    gather_rows_kernel<<<blocks_for(n * d, 256), 256, 0, st>>>(x, idx, n, d, out);
    GPU_KERNEL_CHECK();
}

void launch_exact_base(const float* queries, int64_t nq, int nprobe, int d, const float* centroids,
                       const int32_t* probe_lists, bool inner_product, float* probe_dist,
                       cudaStream_t st)
{
    const int64_t n = nq * nprobe;
    if (!n)
        return;
    exact_base_kernel<<<blocks_for(n, 8), 256, 0, st>>>(queries, nq, nprobe, d, centroids,
                                                         probe_lists, inner_product, probe_dist);
    GPU_KERNEL_CHECK();
}

void launch_remove_ids(uint8_t* const* list_codes, int64_t* const* list_ids, float* const* list_vt,
                       float* const* list_vectors, int64_t* const* list_keys, const int32_t* list_len,
                       int64_t lists, int m, int d, const int64_t* sorted_ids, int64_t n,
                       int32_t* new_len, bool interleaved, cudaStream_t st)
{
    if (!lists)
        return;
    require((m <= kRemoveStagedMaxM && !interleaved) || m % 4 == 0,
            "remove_ids: codes wider than 128 bytes or interleaved must be whole words");
    const bool staged = m <= kRemoveStagedMaxM && !interleaved;
    remove_ids_kernel<<<static_cast<unsigned>(lists), kRemoveThreads,
                        staged ? static_cast<size_t>(kRemoveThreads) * m : 0, st>>>(
        list_codes, list_ids, list_vt, list_vectors, list_keys, list_len, m, d, sorted_ids, n, new_len, interleaved);
    GPU_KERNEL_CHECK();
}

constexpr int kAppendThreads = 128;

// One block per appended entry (see launch_append_entries).
__global__ void __launch_bounds__(kAppendThreads)
    append_entries_kernel(uint8_t* const* list_codes, int64_t* const* list_ids, float* const* list_vt,
                          float* const* list_vectors, int64_t* const* list_keys, int32_t* list_len,
                          const int32_t* lists, const int32_t* pos, int m, int d, const uint8_t* codes,
                          const int64_t* ids, const float* vt, const float* vectors, const int64_t* keys,
                          const int32_t* touched, const int32_t* new_len, int64_t nt, bool interleaved)
{
    const int64_t s = blockIdx.x;
    const int l = lists[s];
    const int64_t p = pos[s];
    if (interleaved) {
        const int words = m / 4;
        uint32_t* dw = reinterpret_cast<uint32_t*>(list_codes[l]);
        const uint8_t* src = codes + s * m;
        for (int j = threadIdx.x; j < words; j += blockDim.x)
            dw[interleaved_word(p, j, words)] = uint32_t(src[4 * j]) | uint32_t(src[4 * j + 1]) << 8 |
                                                uint32_t(src[4 * j + 2]) << 16 | uint32_t(src[4 * j + 3]) << 24;
    } else {
        uint8_t* dc = list_codes[l] + p * m;
        for (int j = threadIdx.x; j < m; j += blockDim.x)
            dc[j] = codes[s * m + j];
    }
    if (vectors != nullptr) {
        float* dv = list_vectors[l] + p * d;
        for (int j = threadIdx.x; j < d; j += blockDim.x)
            dv[j] = vectors[s * d + j];
    }
    if (threadIdx.x == 0) {
        list_ids[l][p] = ids[s];
        if (vt != nullptr)
            list_vt[l][p] = vt[s];
        if (keys != nullptr)
            list_keys[l][p] = keys[s];
        if (s < nt)
            list_len[touched[s]] = new_len[s];
    }
}

void launch_append_entries(uint8_t* const* list_codes, int64_t* const* list_ids, float* const* list_vt,
                           float* const* list_vectors, int64_t* const* list_keys, int32_t* list_len,
                           const int32_t* lists, const int32_t* pos, int64_t n, int m, int d,
                           const uint8_t* codes, const int64_t* ids, const float* vt, const float* vectors,
                           const int64_t* keys, const int32_t* touched, const int32_t* new_len, int64_t nt,
                           bool interleaved, cudaStream_t st)
{
    if (n <= 0)
        return;
    require(!interleaved || m % 4 == 0, "append: interleaved codes must be whole words");
    append_entries_kernel<<<static_cast<unsigned>(n), kAppendThreads, 0, st>>>(
        list_codes, list_ids, list_vt, list_vectors, list_keys, list_len, lists, pos, m, d, codes, ids, vt,
        vectors, keys, touched, new_len, nt, interleaved);
    GPU_KERNEL_CHECK();
}

void launch_decode_labels(const int32_t* pos, int64_t nq, int k, int nprobe, const int32_t* prefix,
                          const int32_t* probe_lists, const int64_t* const* list_ids,
                          int64_t* out, cudaStream_t st)
{
    if (!nq)
        return;
    decode_kernel<<<blocks_for(nq * k, 256), 256, 0, st>>>(pos, nq, k, nprobe, prefix, probe_lists,
                                                            list_ids, out);
    GPU_KERNEL_CHECK();
}

}  // namespace gpuivfpq::gpu
