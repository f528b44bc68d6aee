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

#include "cuda_check.h"
#include "engine/exact_distance.h"
#include "engine/search_limits.h"
#include "small_parts.cuh"

namespace gpuivfpq::gpu {

namespace {


// The dynamic shared memory of a block, the same in every block of a
// cluster (remote accesses use local offsets). The C sorted lists are kQ + 1
// entries apart, so that lanes searching different lists hit different banks.
struct Layout {
    size_t table, qv, ctile, keys, hist, scan, merge_k, merge_v, all_k, all_v, rank, win, plist, pbase, prefix,
        pcodes, pvt, pkeys, pvec, pids, rd, rl, rp, spos, misc, total;
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

    // 2. Coarse step over this block's share of the centroids (coarse_keys,
    // small_parts.cuh), then its selection.
    const HeldKeys coarse =
        coarse_step_keys(a.centroids, a.centroid_norms,
                         a.coarse_keys ? a.coarse_keys + static_cast<int64_t>(q) * a.lists : nullptr, c0, c1, d,
                         a.nprobe, ip, ip ? 0.0f : *qnorm, qv, tile, keybuf, hist, scan, mk, mv, warp, lane);
    SMALL_TRACE(3);
    select_held<kQ>(coarse, keybuf, c0, a.nprobe, hist, scan, win, mk, all_k, all_v, r, C);
    SMALL_TRACE(4);
    cluster.sync();
    SMALL_TRACE(5);
    // The probes this block's entries win: their direct base distances (a
    // warp each, as exact_base), stored into every block at their rank.
    probe_winners<kQ>(all_k, all_v, C, r, a.nprobe, rank, win, nwin, a.centroids, d);
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
    // for itself, probe_offsets).
    probe_offsets(a.nprobe, scan, prefix, [&](int p) {
        const int list = plist[p];
        pcodes[p] = list >= 0 ? a.list_codes[list] : nullptr;
        pvt[p] = list >= 0 && a.list_term1 ? a.list_term1[list] : nullptr;
        pkeys[p] = list >= 0 && filtered ? a.list_keys[list] : nullptr;
        pvec[p] = list >= 0 ? a.list_vectors[list] : nullptr;
        pids[p] = list >= 0 ? a.list_ids[list] : nullptr;
        return list >= 0 ? a.list_len[list] : 0;
    });

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
    select_held<kQ>(scan_smem ? HeldKeys{i1 - i0, nullptr} : HeldKeys{held, held_labels}, keybuf, i0, a.k, hist,
                    scan, win, mk, all_k, all_v, r, C, a.trace ? a.trace + 16 : nullptr);
    if (filtered)
        add_in_range(in_range_count, cluster.map_shared_rank(matched, 0));
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
    list_winners(rank, a.k, win, nwin);
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
                keys[static_cast<int64_t>(q0 + i) * a.lists + c] = coarse_key(a.centroid_norms, ip, acc[i], ip ? 0.0f : norms[i], c);
    }
}


// How many clusters of the kQ kernel can be resident at once (see
// active_clusters in small_parts.cuh).
template <int kQ>
int active_clusters(int cluster, size_t smem)
{
    return active_clusters(reinterpret_cast<const void*>(small_search_kernel<kQ>), cluster, smem);
}

int queue_of(const SmallSearchArgs& a) { return a.k <= 32 && a.nprobe <= 32 ? 32 : kSmallSearchMaxK; }

template <int kQ>
SmallLaunch pick_launch(const SmallSearchArgs& a, int sms, int forced, bool spread)
{
    return plan_cluster_launch(reinterpret_cast<const void*>(small_search_kernel<kQ>), a.nq, sms, forced, spread,
                               [&](int c) { return layout_of(a.m, a.d, c, kQ).total; });
}

template <int kQ>
void launch_impl(const SmallSearchArgs& a, const SmallLaunch& plan, cudaStream_t st)
{
    launch_clusters(small_search_kernel<kQ>, a, a.nq, plan, st);
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
