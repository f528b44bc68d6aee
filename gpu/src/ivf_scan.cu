// IVF scan launchers not tied to a k bucket: candidate offsets and the k
// dispatch of the fused scan (the service's path); the two-pass distance pass
// (bench: the paper's scheme, measured against the fused scan) and the
// materialised tables (test aid).
#include "ivf_scan.cuh"

namespace gpuivfpq::gpu {

namespace {

// Bench: pass 0 of the two-pass scan (ScanAlgo::TwoPass): block = (query,
// probe); every candidate's distance goes to all_dist[q][prefix[q][p] + i]
// (rank_distance: one that overflowed still competes), +inf for an entry out
// of the query's key range (filtered search), which the selection pass
// never returns.
template <typename LutT>
__global__ void __launch_bounds__(kScanThreads) ivf_distances_kernel(IvfScanArgs a)
{
    extern __shared__ __align__(16) unsigned char smem[];
    LutT* table = reinterpret_cast<LutT*>(smem);
    float* resid = reinterpret_cast<float*>(
        smem + (static_cast<size_t>(a.m) * 256 * sizeof(LutT) + 15) / 16 * 16);
    const int q = blockIdx.x / a.nprobe;
    const int p = blockIdx.x - q * a.nprobe;
    const int list = a.probe_lists[blockIdx.x];
    if (list < 0)
        return;
    const int len = a.list_len[list];
    if (len == 0)
        return;
    const bool filtered = a.key_lo != nullptr;  // uniform: a kernel argument
    const KeyWindow win = filtered ? key_window(a, q) : KeyWindow{0, 0};
    const int64_t* keys = filtered ? a.list_keys[list] : nullptr;
    // An empty key range reads no code: no table to build (uniform per block).
    const float base = filtered && win.empty() ? 0.0f : build_table<LutT>(a, q, p, list, table, resid);
    const uint8_t* codes = a.list_codes[list];
    float* out = a.all_dist + static_cast<int64_t>(q) * a.all_ld +
                 a.prefix[static_cast<int64_t>(q) * (a.nprobe + 1) + p];
    const float* vt = a.list_term1 ? a.list_term1[list] : nullptr;
    unsigned matched = 0;  // in-range entries this thread saw (key_matched)
    for (int i = threadIdx.x; i < len; i += blockDim.x) {
        const bool in_range = !keys || win.passes(keys, i);
        matched += keys && in_range;
        out[i] = in_range ? rank_distance(base + code_distance(codes + static_cast<int64_t>(i) * a.m, a.m, table) +
                                          (vt ? __ldg(vt + i) : 0.0f))
                          : INFINITY;
    }
    if (filtered)
        add_matched(a, q, matched);  // uniform: every thread of the block calls it
}

// Test aid (GpuIvfPqIndex::compute_tables): each (query, probe)'s table and
// base distance written out.
template <typename LutT>
__global__ void __launch_bounds__(kScanThreads) ivf_tables_kernel(IvfScanArgs a)
{
    extern __shared__ __align__(16) unsigned char smem[];
    LutT* table = reinterpret_cast<LutT*>(smem);
    float* resid = reinterpret_cast<float*>(
        smem + (static_cast<size_t>(a.m) * 256 * sizeof(LutT) + 15) / 16 * 16);
    const int q = blockIdx.x / a.nprobe;
    const int p = blockIdx.x - q * a.nprobe;
    const int list = a.probe_lists[blockIdx.x];
    const int n = a.m * 256;
    float* out = a.tables_out + static_cast<int64_t>(blockIdx.x) * n;
    if (list < 0) {
        for (int e = threadIdx.x; e < n; e += blockDim.x)
            out[e] = 0.0f;
        if (threadIdx.x == 0)
            a.base_out[blockIdx.x] = INFINITY;
        return;
    }
    const float base = build_table<LutT>(a, q, p, list, table, resid);
    for (int e = threadIdx.x; e < n; e += blockDim.x)
        out[e] = lut_get(table, e);
    if (threadIdx.x == 0)
        a.base_out[blockIdx.x] = base;
}

// prefix[q][p] = candidates in probes 0..p-1 of query q: a warp per query,
// 32 probes' lengths loaded at once and scanned across the lanes (a thread
// per query waited on nprobe dependent loads: 20-35 us at nprobe 80).
__global__ void ivf_prefix_kernel(IvfScanArgs a)
{
    const int q = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (q >= a.nq)
        return;
    int32_t* pre = const_cast<int32_t*>(a.prefix) + static_cast<int64_t>(q) * (a.nprobe + 1);
    const int32_t* pl = a.probe_lists + static_cast<int64_t>(q) * a.nprobe;
    int32_t s = 0;  // candidates before this group of 32 probes
    for (int p0 = 0; p0 < a.nprobe; p0 += 32) {
        const int p = p0 + lane;
        const int l = p < a.nprobe ? pl[p] : -1;
        const int32_t len = l >= 0 ? a.list_len[l] : 0;
        int32_t incl = len;
        for (int off = 1; off < 32; off <<= 1) {
            const int32_t v = __shfl_up_sync(0xffffffffu, incl, off);
            if (lane >= off)
                incl += v;
        }
        if (p < a.nprobe)
            pre[p] = s + incl - len;
        s += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0)
        pre[a.nprobe] = s;
}

}  // namespace

void launch_ivf_fused(const IvfScanArgs& a, bool half, cudaStream_t stream)
{
    static_assert(kMaxSelectK <= 2048, "no fused-scan bucket for kMaxSelectK");
    if (a.k <= 32)
        launch_ivf_fused_bucket<32>(a, half, stream);
    else if (a.k <= 64)
        launch_ivf_fused_bucket<64>(a, half, stream);
    else if (a.k <= 128)
        launch_ivf_fused_bucket<128>(a, half, stream);
    else if (a.k <= 256)
        launch_ivf_fused_bucket<256>(a, half, stream);
    else if (a.k <= 512)
        launch_ivf_fused_bucket<512>(a, half, stream);
    else if (a.k <= 1024)
        launch_ivf_fused_bucket<1024>(a, half, stream);
    else
        launch_ivf_fused_bucket<2048>(a, half, stream);
}

void launch_ivf_distances(const IvfScanArgs& a, bool half, cudaStream_t stream)
{
    const size_t smem = scan_smem_bytes(a, half);
    const unsigned blocks = static_cast<unsigned>(static_cast<int64_t>(a.nq) * a.nprobe);
    if (!blocks)
        return;
    if (half) {
        allow_smem(ivf_distances_kernel<__half>, smem);
        ivf_distances_kernel<__half><<<blocks, kScanThreads, smem, stream>>>(a);
    } else {
        allow_smem(ivf_distances_kernel<float>, smem);
        ivf_distances_kernel<float><<<blocks, kScanThreads, smem, stream>>>(a);
    }
    GPU_KERNEL_CHECK();
}

void launch_ivf_tables(const IvfScanArgs& a, bool half, cudaStream_t stream)
{
    const size_t smem = scan_smem_bytes(a, half);
    const unsigned blocks = static_cast<unsigned>(static_cast<int64_t>(a.nq) * a.nprobe);
    if (!blocks)
        return;
    if (half) {
        allow_smem(ivf_tables_kernel<__half>, smem);
        ivf_tables_kernel<__half><<<blocks, kScanThreads, smem, stream>>>(a);
    } else {
        allow_smem(ivf_tables_kernel<float>, smem);
        ivf_tables_kernel<float><<<blocks, kScanThreads, smem, stream>>>(a);
    }
    GPU_KERNEL_CHECK();
}

void launch_ivf_prefix(const IvfScanArgs& a, cudaStream_t stream)
{
    if (!a.nq)
        return;
    ivf_prefix_kernel<<<(a.nq + 3) / 4, 128, 0, stream>>>(a);
    GPU_KERNEL_CHECK();
}

}  // namespace gpuivfpq::gpu
