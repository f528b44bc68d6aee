// One-launch RaBitQ search for small batches (see rabitq_small.h): a
// cluster of C blocks per query. Each block takes 1/C of the work of every
// stage and the blocks exchange what the next stage needs through
// distributed shared memory:
//   1. the coarse step: each block ranks 1/C of the centroids and the
//      cluster merges the C sorted lists (the IVFPQ one-launch search's
//      code, small_parts.cuh);
//   2. the probes: each block computes the terms (rabitq_list_terms) of
//      the probes it won and stores them, with the list, into every block
//      at the probe's rank;
//   3. the list scan: each block scans 1/C of the probed lists' rows
//      (concatenated, so uneven lists split evenly), list by list: the
//      list's nibble tables built in shared memory from P q - P c, then a
//      thread a row (rabitq_row_key); the keys selected in shared memory
//      and ranked across the cluster;
//   4. the answers: each block writes the winners it holds at their rank,
//      their positions decoded to ids.
// Four cluster barriers (every block started; the coarse lists; the
// probes; the scan's lists); nothing goes through device memory but the
// inputs and the answers. P q comes from a kernel of rabitq_rotate.cuh
// before the launch (the same doubles as the staged search's).
#include "rabitq_small.h"

#include <cooperative_groups.h>

#include "cuda_check.h"
#include "engine/error.h"
#include "rabitq_row.cuh"
#include "small_parts.cuh"

namespace gpuivfpq::gpu {

namespace {

// The dynamic shared memory of a block, the same in every block of a
// cluster (remote accesses use local offsets); the C sorted lists kQ + 1
// entries apart, as in the IVFPQ kernel.
struct RLayout {
    size_t qv, pq, rot, lut, ctile, keys, hist, scan, merge_k, merge_v, all_k, all_v, rank, win, plist, pterms,
        prefix, prows, pkeys, pids, misc, total;
};

__host__ __device__ inline RLayout rlayout_of(int d, int plane_bytes, int cluster, int kq)
{
    RLayout L;
    Bump b;
    const size_t lists = static_cast<size_t>(cluster) * (kq + 1);
    L.qv = b.take(static_cast<size_t>(d) * sizeof(float));
    L.pq = b.take(static_cast<size_t>(d) * sizeof(double));
    L.rot = b.take(static_cast<size_t>(plane_bytes) * 8 * sizeof(double));
    L.lut = b.take(static_cast<size_t>(plane_bytes) * 32 * sizeof(float));
    L.ctile = b.take(static_cast<size_t>(kWarps) * 32 * 32 * sizeof(float));
    L.keys = b.take(kKeyCap * sizeof(float));
    L.hist = b.take(256 * sizeof(int));
    L.scan = b.take(64 * sizeof(int));
    L.merge_k = b.take(static_cast<size_t>(kq) * sizeof(float));
    L.merge_v = b.take(static_cast<size_t>(kq) * sizeof(int));
    L.all_k = b.take(lists * sizeof(float));
    L.all_v = b.take(lists * sizeof(int));
    L.rank = b.take(kq * sizeof(int));
    L.win = b.take(kq * sizeof(int));
    L.plist = b.take(kq * sizeof(int));
    L.pterms = b.take(kq * sizeof(RabitqListTerms));
    L.prefix = b.take((kq + 1) * sizeof(int));
    L.prows = b.take(kq * sizeof(void*));
    L.pkeys = b.take(kq * sizeof(void*));
    L.pids = b.take(kq * sizeof(void*));
    L.misc = b.take(32);  // winners (int), in-range count (u64 at +8), query norm (float at +16)
    L.total = b.off;
    return L;
}

template <int kQ>
__global__ void __launch_bounds__(kThreads, 2) rabitq_small_kernel(RabitqSmallArgs a)
{
    extern __shared__ __align__(16) unsigned char smem[];
    constexpr int kS = kQ + 1;  // list stride
    cg::cluster_group cluster = cg::this_cluster();
    const int C = static_cast<int>(cluster.num_blocks());
    const int r = static_cast<int>(cluster.block_rank());
    const int q = static_cast<int>(blockIdx.x) / C;
    const RLayout L = rlayout_of(a.d, a.plane_bytes, C, kQ);
    float* qv = reinterpret_cast<float*>(smem + L.qv);
    double* pq = reinterpret_cast<double*>(smem + L.pq);
    double* rot = reinterpret_cast<double*>(smem + L.rot);
    float* lut = reinterpret_cast<float*>(smem + L.lut);
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
    RabitqListTerms* pterms = reinterpret_cast<RabitqListTerms*>(smem + L.pterms);
    int* prefix = reinterpret_cast<int*>(smem + L.prefix);
    const uint8_t** prows = reinterpret_cast<const uint8_t**>(smem + L.prows);
    const int64_t** pkeys = reinterpret_cast<const int64_t**>(smem + L.pkeys);
    const int64_t** pids = reinterpret_cast<const int64_t**>(smem + L.pids);
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
    const int d = a.d;
    const bool filtered = a.key_lo != nullptr;  // uniform: a kernel argument
    // This block's centroid rows (or their keys) on their way to L1 while the query loads.
    const int c0 = static_cast<int>(static_cast<int64_t>(a.lists) * r / C);
    const int c1 = static_cast<int>(static_cast<int64_t>(a.lists) * (r + 1) / C);
    if (a.coarse_keys)
        prefetch_span(a.coarse_keys + static_cast<int64_t>(q) * a.lists + c0,
                      static_cast<size_t>(c1 - c0) * sizeof(float), tid, kThreads);
    else
        prefetch_span(a.centroids + static_cast<int64_t>(c0) * d, static_cast<size_t>(c1 - c0) * d * sizeof(float),
                      tid, kThreads);

    // The query (normalised already for Cosine) and its squared norm, and P q.
    for (int j = tid; j < d; j += kThreads) {
        qv[j] = a.queries[static_cast<int64_t>(q) * d + j];
        pq[j] = a.rotated[static_cast<int64_t>(q) * d + j];
    }
    if (tid == 0) {
        *nwin = 0;
        *matched = 0;
    }
    __syncthreads();
    if (warp == 0) {
        const float s = warp_sqr_norm(qv, d, lane);
        if (lane == 0)
            *qnorm = s;
    }
    // Every block of the cluster runs (and has its shared memory) before
    // any block writes into another's.
    cluster.sync();

    // 1. The coarse step over this block's share of the centroids, as the
    // IVFPQ kernel's (the same keys, in the same order), and its selection.
    const HeldKeys coarse =
        coarse_step_keys(a.centroids, a.centroid_norms,
                         a.coarse_keys ? a.coarse_keys + static_cast<int64_t>(q) * a.lists : nullptr, c0, c1, d,
                         a.nprobe, ip, ip ? 0.0f : *qnorm, qv, tile, keybuf, hist, scan, mk, mv, warp, lane);
    select_held<kQ>(coarse, keybuf, c0, a.nprobe, hist, scan, win, mk, all_k, all_v, r, C);
    cluster.sync();

    // 2. The probes this block's entries win: their lists' terms (a warp
    // each, eight lanes summing), stored into every block at their rank.
    probe_winners<kQ>(all_k, all_v, C, r, a.nprobe, rank, win, nwin, a.centroids, d);
    for (int w = warp; w < *nwin; w += kWarps) {
        const int i = win[w];
        const int list = all_v[r * kS + i];
        const int slot = rank[i];
        double s = 0.0;
        if (list >= 0 && lane < 8)
            s = rabitq_list_part(qv, a.centroids + static_cast<int64_t>(list) * d, d, lane);
        double part[8];
#pragma unroll
        for (int j = 0; j < 8; ++j)
            part[j] = __shfl_sync(kFullMask, s, j);
        const RabitqListTerms t = rabitq_list_terms(part, static_cast<int>(a.metric));
        if (lane < C) {
            cluster.map_shared_rank(plist, lane)[slot] = list;
            cluster.map_shared_rank(pterms, lane)[slot] = t;
        }
    }
    cluster.sync();  // probes complete in every block

    // 3. The probed lists: row offsets and list pointers (each block for
    // itself), a thread a probe.
    probe_offsets(a.nprobe, scan, prefix, [&](int p) {
        const int list = plist[p];
        prows[p] = list >= 0 ? a.list_rows[list] : nullptr;
        pkeys[p] = list >= 0 && filtered ? a.list_keys[list] : nullptr;
        pids[p] = list >= 0 ? a.list_ids[list] : nullptr;
        return list >= 0 ? a.list_len[list] : 0;
    });

    // This block's share [i0, i1) of the concatenated rows (labels:
    // positions), list by list: the list's tables, then a thread a row.
    // Keys into shared memory and radix selected when they fit, else only
    // those below a running bar kept (FilterSink) and selected from there.
    const int total = prefix[a.nprobe];
    const int i0 = static_cast<int>(static_cast<int64_t>(total) * r / C);
    const int i1 = static_cast<int>(static_cast<int64_t>(total) * (r + 1) / C);
    const bool scan_smem = i1 - i0 <= kKeyCap;  // uniform
    const KeyWindow kw = filtered ? KeyWindow{a.key_lo[q], a.key_hi[q]} : KeyWindow{0, 0};
    const bool none = filtered && kw.empty();  // an empty key range passes nothing
    unsigned in_range_count = 0;
    FilterSink sink{keybuf, held_labels, a.k, hist, scan, mk, mv, kKeyCap};
    if (none) {
        if (scan_smem)
            for (int i = tid; i < i1 - i0; i += kThreads)
                keybuf[i] = INFINITY;
    } else if (i0 < i1) {  // uniform
        for (int p = probe_of(prefix, a.nprobe, i0); p < a.nprobe && prefix[p] < i1; ++p) {  // uniform
            const int s0 = max(i0, prefix[p]), s1 = min(i1, prefix[p + 1]);
            if (s0 >= s1)  // an empty list
                continue;
            __syncthreads();  // the previous list's tables read
            rabitq_fill_rotated(rot, pq, a.pc + static_cast<int64_t>(plist[p]) * d, d, a.plane_bytes, tid, kThreads);
            __syncthreads();
            rabitq_fill_nibbles(lut, rot, a.plane_bytes, tid, kThreads);
            __syncthreads();
            const RabitqListTerms t = pterms[p];
            const uint8_t* rows = prows[p];
            const int64_t* keys = pkeys[p];
            for (int b0 = s0; b0 < s1; b0 += kThreads) {  // uniform over the block
                const int i = b0 + tid;
                float key = INFINITY;
                if (i < s1) {
                    const int off = i - prefix[p];
                    const bool in_range = !keys || kw.passes(keys, off);
                    in_range_count += keys && in_range;
                    if (in_range)
                        key = rabitq_row_key(list_row(rows, off, a.row_bytes, a.interleaved),
                                             list_word_stride(a.interleaved), lut, a.plane_bytes, a.bits,
                                             a.code_bytes, t, a.eps0);
                }
                if (scan_smem) {
                    if (i < s1)
                        keybuf[i - i0] = key;
                } else {
                    sink.step<1>(b0, &key);  // label b0 + tid: i
                }
            }
        }
    }
    select_held<kQ>(scan_smem ? HeldKeys{i1 - i0, nullptr} : HeldKeys{sink.n, held_labels}, keybuf, i0, a.k, hist,
                    scan, win, mk, all_k, all_v, r, C);
    if (filtered)
        add_in_range(in_range_count, cluster.map_shared_rank(matched, 0));
    cluster.sync();  // the last remote access: no block reads another's memory after this

    // 4. The k winners: each block writes those it holds at their rank
    // (padding, key +inf and position -1, after every row), a position
    // decoded to its id through the probes' offsets.
    rank_entries<kQ>(all_k, C, r, a.k, rank);
    const int64_t out = static_cast<int64_t>(q) * a.k;
    for (int i = tid; i < a.k; i += kThreads) {
        const int at = rank[i];
        if (at >= a.k)
            continue;
        const int pos = all_v[r * kS + i];
        int64_t id = -1;
        if (pos >= 0 && pos < total) {
            const int p = probe_of(prefix, a.nprobe, pos);
            id = __ldg(reinterpret_cast<const long long*>(pids[p]) + (pos - prefix[p]));
        }
        a.out_dist[out + at] = all_k[r * kS + i];
        a.out_labels[out + at] = id;
    }
    if (filtered && a.key_matched && r == 0 && tid == 0)
        a.key_matched[q] = static_cast<int64_t>(*matched);
}

int queue_of(const RabitqSmallArgs& a) { return a.k <= 32 && a.nprobe <= 32 ? 32 : kSmallSearchMaxK; }

template <int kQ>
SmallLaunch pick(const RabitqSmallArgs& a, int sms, int forced)
{
    return plan_cluster_launch(reinterpret_cast<const void*>(rabitq_small_kernel<kQ>), a.nq, sms, forced, false,
                               [&](int c) { return rlayout_of(a.d, a.plane_bytes, c, kQ).total; });
}

template <int kQ>
void launch_impl(const RabitqSmallArgs& a, const SmallLaunch& plan, cudaStream_t st)
{
    launch_clusters(rabitq_small_kernel<kQ>, a, a.nq, plan, st);
}

}  // namespace

SmallLaunch rabitq_small_plan(const RabitqSmallArgs& a, int sms, int forced_cluster)
{
    if (a.nq < 1 || a.k < 1 || a.k > kSmallSearchMaxK || a.nprobe < 1 || a.nprobe > kSmallSearchMaxK ||
        a.nprobe > a.lists || a.d < 1 || a.plane_bytes < 4 || a.bits < 1)
        return SmallLaunch{};
    return queue_of(a) == 32 ? pick<32>(a, sms, forced_cluster) : pick<kSmallSearchMaxK>(a, sms, forced_cluster);
}

void launch_rabitq_small(const RabitqSmallArgs& a, const SmallLaunch& plan, cudaStream_t st)
{
    if (a.nq < 1)
        return;
    if (plan.cluster < 1)
        throw Error(ErrorKind::InvalidArgument, "GPU RaBitQ one-launch search: the shape has no launch plan");
    if (queue_of(a) == 32)
        launch_impl<32>(a, plan, st);
    else
        launch_impl<kSmallSearchMaxK>(a, plan, st);
}

}  // namespace gpuivfpq::gpu
