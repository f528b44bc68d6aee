// IVFADC list scan: per (query, probed list) lookup tables built in shared
// memory, codes read from global memory, distances k-selected in registers
// (fused) or written out for a separate selection pass (two-pass).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "engine/search_limits.h"
#include "cuda_check.h"
#include "warp_select.cuh"

namespace gpuivfpq::gpu {

// Which of the paper's decompositions builds a (query, list) table. The
// default scan (the service's) uses kTableQuery for every metric;
// kTablePrecomputed and kTableDirect are the paper's per-list layouts (bench
// option GpuIvfPqOptions::term1_per_vector = false, and the tests);
// kTableTerm3 materialises inner-product tables for compute_tables (test aid).
enum TableMode : int {
    kTablePrecomputed = 0,  // term1[list] + term3[query]; base = ||q - c||^2 (term 2)
    kTableTerm3 = 1,        // term3[query] only; base = -<q, c> (inner product)
    kTableDirect = 2,       // ||(q - c)_j - C_jc||^2 from the residual; base = 0
    // term3[query] only, built once per block for all its probes; base =
    // term 2, plus term 1 folded per stored vector (||r||^2 + 2<c, r>, one
    // float a vector) when list_term1 is set: no per-list table at all.
    kTableQuery = 3,
};

// Tables that depend on the query alone are built once per block.
__host__ __device__ inline bool table_per_query(int mode)
{
    return mode == kTableTerm3 || mode == kTableQuery;
}

struct IvfScanArgs {
    int nq = 0, nprobe = 0, m = 0, dsub = 0, d = 0, k = 0;
    int mode = kTablePrecomputed;
    const int32_t* probe_lists = nullptr;  // nq x nprobe, -1 = none
    const float* probe_dist = nullptr;     // nq x nprobe coarse distances (term 2)
    const int32_t* prefix = nullptr;       // nq x (nprobe + 1) candidate offsets
    const uint8_t* const* list_codes = nullptr;
    const int32_t* list_len = nullptr;
    const float* const* list_term1 = nullptr;  // per stored vector (kTableQuery), or null
    const void* term1 = nullptr;    // lists x m x 256, float or half (as the tables)
    const float* term3 = nullptr;   // nq x m x 256
    const float* queries = nullptr;    // nq x d (direct mode)
    const float* centroids = nullptr;  // lists x d (direct mode)
    const float* codebooks = nullptr;  // m x 256 x dsub (direct mode)
    // Filtered search: query q scans only the entries whose key (list_keys,
    // per entry) lies in [key_lo[q], key_hi[q]]; the rest get key +inf, which
    // no k-selection ever returns (padding instead). key_lo null: no filter,
    // and the scan loads nothing more.
    const int64_t* const* list_keys = nullptr;
    const int64_t* key_lo = nullptr;  // nq
    const int64_t* key_hi = nullptr;  // nq
    // Filtered search, optional: entries in range per query (nq, zeroed
    // before the scan; blocks add their counts).
    unsigned long long* key_matched = nullptr;
    int chunks = 1, probes_per_chunk = 0;  // fused: probes split over blocks
    float* out_dist = nullptr;   // fused: (nq * chunks) x k
    int32_t* out_idx = nullptr;  // candidate positions (see prefix)
    float* all_dist = nullptr;   // two-pass (bench): nq x all_ld
    int64_t all_ld = 0;
    float* tables_out = nullptr;  // materialised tables (test aid): (nq * nprobe) x m x 256
    float* base_out = nullptr;    // (nq * nprobe)
};

constexpr int kScanThreads = 128;

// The widest code's fp32 table (kMaxGpuSubQuantizers x 256) must fit the
// opt-in shared memory of a block on sm_90 (227 KiB).
static_assert(kMaxGpuSubQuantizers * 256 * sizeof(float) <= 227 * 1024,
              "lookup table of kMaxGpuSubQuantizers does not fit in shared memory");

__device__ __forceinline__ float lut_get(const float* t, int i) { return t[i]; }
__device__ __forceinline__ float lut_get(const __half* t, int i) { return __half2float(t[i]); }
__device__ __forceinline__ void lut_set(float* t, int i, float v) { t[i] = v; }
__device__ __forceinline__ void lut_set(__half* t, int i, float v) { t[i] = __float2half_rn(v); }

// Builds the m x 256 table of (query q, list) in shared memory; returns the
// base distance. All threads of the block call it; it ends with a barrier.
// resid: d floats of shared memory (direct mode).
template <typename LutT>
__device__ float build_table(const IvfScanArgs& a, int q, int probe, int list, LutT* table,
                             float* resid)
{
    const int n = a.m * 256;
    const int64_t pi = static_cast<int64_t>(q) * a.nprobe + probe;
    if (a.mode == kTablePrecomputed) {
        const LutT* t1 = static_cast<const LutT*>(a.term1) + static_cast<int64_t>(list) * n;
        const float* t3 = a.term3 + static_cast<int64_t>(q) * n;
        for (int e = threadIdx.x; e < n; e += blockDim.x)
            lut_set(table, e, lut_get(t1, e) + t3[e]);
        __syncthreads();
        return a.probe_dist[pi];
    }
    if (table_per_query(a.mode)) {
        const float* t3 = a.term3 + static_cast<int64_t>(q) * n;
        for (int e = threadIdx.x; e < n; e += blockDim.x)
            lut_set(table, e, t3[e]);
        __syncthreads();
        return a.probe_dist[pi];
    }
    const float* qv = a.queries + static_cast<int64_t>(q) * a.d;
    const float* cv = a.centroids + static_cast<int64_t>(list) * a.d;
    for (int i = threadIdx.x; i < a.d; i += blockDim.x)
        resid[i] = qv[i] - cv[i];
    __syncthreads();
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
        const int j = e >> 8;
        const float* cw = a.codebooks + static_cast<int64_t>(e) * a.dsub;
        const float* r = resid + j * a.dsub;
        float s = 0.0f;
        for (int t = 0; t < a.dsub; ++t) {
            const float df = r[t] - cw[t];
            s = fmaf(df, df, s);
        }
        lut_set(table, e, s);
    }
    __syncthreads();
    return 0.0f;
}

template <typename LutT>
__device__ __forceinline__ float lookup4(uint32_t w, const LutT* t)
{
    return lut_get(t, w & 255) + lut_get(t, 256 + ((w >> 8) & 255)) +
           lut_get(t, 512 + ((w >> 16) & 255)) + lut_get(t, 768 + (w >> 24));
}

// The table entries of 16 code bytes (one 16-byte word of a code, its
// subquantizers' tables from t), summed in the order every scan uses.
template <typename LutT>
__device__ __forceinline__ float code_word16(const uint4 x, const LutT* t)
{
    return lookup4(x.x, t) + lookup4(x.y, t + 1024) + lookup4(x.z, t + 2048) + lookup4(x.w, t + 3072);
}

// sum_j table[j][code_j]: 16-byte code loads when m % 16 == 0 (lists are
// 256-byte aligned), 4-byte when m % 4 == 0, bytes otherwise.
template <typename LutT>
__device__ __forceinline__ float code_distance(const uint8_t* code, int m, const LutT* table)
{
    float s = 0.0f;
    if ((m & 15) == 0) {
        const uint4* p = reinterpret_cast<const uint4*>(code);
        for (int w = 0; w < (m >> 4); ++w)
            s += code_word16(__ldg(p + w), table + w * 16 * 256);
    } else if ((m & 3) == 0) {
        const uint32_t* p = reinterpret_cast<const uint32_t*>(code);
        for (int w = 0; w < (m >> 2); ++w)
            s += lookup4(__ldg(p + w), table + w * 1024);
    } else {
        for (int j = 0; j < m; ++j)
            s += lut_get(table, j * 256 + code[j]);
    }
    return s;
}

// Query q's key range (filtered scans only): lo > hi passes no entry.
// Adds a block's count of in-range entries to query q's (every thread
// calls it with its own count; a warp sum, then one atomic per warp).
__device__ __forceinline__ void add_matched(const IvfScanArgs& a, int q, unsigned count)
{
    if (a.key_matched == nullptr)
        return;
    for (int off = 16; off > 0; off >>= 1)
        count += __shfl_down_sync(0xffffffffu, count, off);
    if ((threadIdx.x & 31) == 0 && count > 0)
        atomicAdd(a.key_matched + q, static_cast<unsigned long long>(count));
}

struct KeyWindow {
    int64_t lo, hi;
    __device__ __forceinline__ bool empty() const { return lo > hi; }
    __device__ __forceinline__ bool passes(const int64_t* keys, int i) const
    {
        const int64_t key = __ldg(reinterpret_cast<const long long*>(keys) + i);
        return key >= lo && key <= hi;
    }
};

__device__ __forceinline__ KeyWindow key_window(const IvfScanArgs& a, int q)
{
    return KeyWindow{a.key_lo[q], a.key_hi[q]};
}

inline size_t scan_smem_bytes(const IvfScanArgs& a, bool half)
{
    size_t t = static_cast<size_t>(a.m) * 256 * (half ? 2 : 4);
    t = (t + 15) / 16 * 16;
    return t + (a.mode == kTableDirect ? static_cast<size_t>(a.d) * 4 : 0);
}

// Fused scan + BlockSelect: block = (query, chunk of probes).
template <int kQ, typename LutT>
__global__ void __launch_bounds__(kScanThreads) ivf_fused_kernel(IvfScanArgs a)
{
    extern __shared__ __align__(16) unsigned char smem[];
    LutT* table = reinterpret_cast<LutT*>(smem);
    float* resid = reinterpret_cast<float*>(
        smem + (static_cast<size_t>(a.m) * 256 * sizeof(LutT) + 15) / 16 * 16);
    constexpr int kT = ThreadQ<kQ>::value;
    const int q = blockIdx.x / a.chunks;
    const int chunk = blockIdx.x - q * a.chunks;
    const bool filtered = a.key_lo != nullptr;  // uniform: a kernel argument
    const KeyWindow win = filtered ? key_window(a, q) : KeyWindow{0, 0};
    const int p0 = chunk * a.probes_per_chunk;
    // An empty key range passes nothing: no probe to scan, all padding.
    const int p1 = filtered && win.empty() ? p0 : min(a.nprobe, p0 + a.probes_per_chunk);
    SelectState<kQ, kT> state;
    WarpSelect<kQ, kT> ws;
    ws.init(&state, a.k);
    unsigned matched = 0;  // in-range entries this thread saw (key_matched)
    const bool once = table_per_query(a.mode);
    if (once && p0 < p1)
        build_table<LutT>(a, q, p0, 0, table, resid);  // ends with a barrier
    for (int p = p0; p < p1; ++p) {
        const int64_t pi = static_cast<int64_t>(q) * a.nprobe + p;
        const int list = a.probe_lists[pi];
        if (list < 0)
            continue;  // uniform over the block
        const int len = a.list_len[list];
        if (len == 0)
            continue;
        float base;
        if (once) {
            base = a.probe_dist[pi];
        } else {
            __syncthreads();  // previous table no longer read
            base = build_table<LutT>(a, q, p, list, table, resid);
        }
        const uint8_t* codes = a.list_codes[list];
        const float* vt = a.list_term1 ? a.list_term1[list] : nullptr;
        const int64_t* keys = filtered ? a.list_keys[list] : nullptr;
        const int label0 = a.prefix[static_cast<int64_t>(q) * (a.nprobe + 1) + p];
        for (int i0 = 0; i0 < len; i0 += kScanThreads) {
            const int i = i0 + threadIdx.x;
            float key = INFINITY;
            // An entry out of the key range keeps +inf (its code not read):
            // WarpSelect takes only keys below its bar, which starts at +inf.
            const bool in_range = i < len && (!keys || win.passes(keys, i));
            matched += keys && in_range;
            // An in-range entry whose distance overflowed still competes
            // (rank_distance, as the CPU engine's adc_scan gives it).
            if (in_range) {
                key = base + code_distance(codes + static_cast<int64_t>(i) * a.m, a.m, table);
                if (vt)
                    key += __ldg(vt + i);
                key = rank_distance(key);
            }
            ws.add(key, label0 + i);
        }
    }
    if (filtered)
        add_matched(a, q, matched);  // uniform: every thread of the block calls it
    ws.finish();
    __shared__ float sk[kQ];
    __shared__ int sv[kQ];
    block_merge(ws, kScanThreads / 32, sk, sv);
    if (threadIdx.x >= 32)
        return;
    const int64_t out = static_cast<int64_t>(blockIdx.x) * a.k;
#pragma unroll
    for (int s = 0; s < WarpSelect<kQ, kT>::kW; ++s) {
        const int i = s * 32 + ws.lane;
        if (i < a.k) {
            a.out_dist[out + i] = ws.key_at(s);
            a.out_idx[out + i] = ws.value_at(s);
        }
    }
}

// Opts the kernel into `bytes` of dynamic shared memory when the default
// 48 KiB a block may use could be exceeded: the fused scan's own static
// arrays (BlockSelect's merge, up to 16 KiB at k = 2048) count against the
// same limit, so a 48 KiB table (m = 48 in fp32) already needs the opt-in.
template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes)
{
    if (bytes > 32 * 1024)
        GPU_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(bytes)));
}

template <int kQ>
void launch_ivf_fused_impl(const IvfScanArgs& a, bool half, cudaStream_t stream)
{
    const size_t smem = scan_smem_bytes(a, half);
    const unsigned blocks = static_cast<unsigned>(static_cast<int64_t>(a.nq) * a.chunks);
    if (!blocks)
        return;
    if (half) {
        allow_smem(ivf_fused_kernel<kQ, __half>, smem);
        ivf_fused_kernel<kQ, __half><<<blocks, kScanThreads, smem, stream>>>(a);
    } else {
        allow_smem(ivf_fused_kernel<kQ, float>, smem);
        ivf_fused_kernel<kQ, float><<<blocks, kScanThreads, smem, stream>>>(a);
    }
    GPU_KERNEL_CHECK();
}

template <int kQ>
void launch_ivf_fused_bucket(const IvfScanArgs& a, bool half, cudaStream_t stream);
template <>
void launch_ivf_fused_bucket<32>(const IvfScanArgs& a, bool half, cudaStream_t stream);
template <>
void launch_ivf_fused_bucket<64>(const IvfScanArgs& a, bool half, cudaStream_t stream);
template <>
void launch_ivf_fused_bucket<128>(const IvfScanArgs& a, bool half, cudaStream_t stream);
template <>
void launch_ivf_fused_bucket<256>(const IvfScanArgs& a, bool half, cudaStream_t stream);
template <>
void launch_ivf_fused_bucket<512>(const IvfScanArgs& a, bool half, cudaStream_t stream);
template <>
void launch_ivf_fused_bucket<1024>(const IvfScanArgs& a, bool half, cudaStream_t stream);
template <>
void launch_ivf_fused_bucket<2048>(const IvfScanArgs& a, bool half, cudaStream_t stream);

// Non-templated scan kernels (ivf_scan.cu).
void launch_ivf_fused(const IvfScanArgs& a, bool half, cudaStream_t stream);
void launch_ivf_distances(const IvfScanArgs& a, bool half, cudaStream_t stream);  // bench: two-pass, pass 0
void launch_ivf_tables(const IvfScanArgs& a, bool half, cudaStream_t stream);     // test aid: materialise
void launch_ivf_prefix(const IvfScanArgs& a, cudaStream_t stream);

}  // namespace gpuivfpq::gpu
