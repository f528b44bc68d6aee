// GpuRabitqIndex (gpu_ivfpq/rabitq_index.h): the IVF search over RaBitQ
// codes. Per tile of queries: the coarse step (exact_knn_i32 over the
// centroids), P q in double (a thread per coordinate, the CPU engine's
// order), then a block per (query, probed list, 1024 rows of it) that
// computes q' = P q - P c,
// ||q - c||^2 (or <q, c>) and the list's byte tables in shared memory, as
// RabitqModel::prepare_list does, and writes every row's estimate (+inf
// outside the query's key range) into the query's row of candidates, the
// probed lists one after the other (the IVF scan's prefix of their lengths);
// a k-selection per chunk of each row, merged per row; the positions mapped
// to ids through the prefix (the IVF scan's decode). The
// block keeps nibble tables (16 entries per half byte, an eighth of the
// byte tables' 256: 2 KiB of shared memory at d = 128, 12 KiB at 768) and
// sums a byte's two entries as the CPU engine forms its byte entry. Wide
// rows (kInterleaveFromBytes) are interleaved 32 at a time in the lists
// (list_layout.cuh): a warp's 32 threads read the same word of 32
// consecutive rows in one transaction.
#include "gpu_ivfpq/rabitq_index.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "context_impl.h"
#include "cuda_check.h"
#include "engine/error.h"
#include "engine/search_limits.h"
#include "gpu_ivfpq/device_buffer.h"
#include "gpu_ivfpq/exact_search.h"
#include "gpu_ivfpq/gpu_context.h"
#include "gpu_ivfpq/k_select.h"
#include "ivf_scan.cuh"
#include "ivfpq_kernels.h"
#include "list_store.h"
#include "search_io.h"
#include "select_args.h"
#include "rabitq_encode.h"
#include "rabitq_rotate.cuh"
#include "rabitq_row.cuh"
#include "rabitq_small.h"

namespace gpuivfpq::gpu {

namespace {

constexpr int kThreads = 256;
// Rows of a probed list per block (set_rows_per_block): a long list is split
// over several blocks, each building the list's tables, so that one list
// does not hold up the search (clustered data's longest lists are 10-20
// times the mean). Tiles of up to kFewQueries take kFewRowsPerBlock: a
// block's tables cost about what its rows do there. Measured on an H100
// (gpu_bench --rabitq-data, GPU_BENCH_ROWS_PER_BLOCK, nprobe 32, ms a call
// for 1 / 8 / 16 / 64 / 10,000 queries): 768 dimensions 0.148 / 0.244 /
// 0.330 / 0.962 / 124.5 at 512 rows, 0.175 / 0.268 / 0.335 / 0.915 / 108.5
// at 1024, 0.239 / 0.302 / 0.379 / 0.931 / 110.4 at 2048; 128 dimensions
// 0.072 / 0.097 at 512 rows (1 / 8), 0.078 / 0.105 at 1024.
constexpr int kRowsPerBlock = 4 * kThreads;
constexpr int kFewRowsPerBlock = 2 * kThreads;
constexpr size_t kFewQueries = 8;
// The candidates of one tile of queries (nq x nprobe x the longest list
// floats) are kept below this many bytes, unless one query alone needs more.
constexpr size_t kTileBytes = size_t(256) << 20;
// Batches of up to this many queries search in one launch by default
// (set_small_batch_max): none. Measured on H100s (gpu_bench --rabitq-data,
// tools/gen_synthetic's 200k x 768 set in 1024 k-means lists, 4 bits, one
// query, ms per call): the one launch took 0.252 and 0.316 ms on two
// hosts, 0.737 on a third, where the staged kernels took 0.21-0.32; from
// SQL on that third host one client's p50 rose from 0.57 to 1.39 ms. At
// 128 dimensions it took 0.069-0.084 ms against the staged 0.081-0.109.
// (In one launch a query's rows are scanned by one cluster of at most 16
// blocks, whose room on a chip's processor clusters varies.)
constexpr size_t kSmallBatchMax = 0;
// Rows of at least this many bytes are kept interleaved (list_layout.cuh).
// Measured on an H100 (gpu_bench --rabitq-data: tools/gen_synthetic's sets,
// their k-means lists, k 100 by lower bounds, nprobe 32): 396-byte rows
// (768 dimensions, 4 bits) scanned 2.2x as fast from batches of 1000 on
// (127.7 ms against 277.1 for 10,000 queries; 1.08 against 2.01 ms at 64),
// the row-major scan bound by L2 (ncu: 96% of its throughput, a thread's
// load using 4 of a sector's 32 bytes); 76-byte rows (128 dimensions)
// scanned at 0.87x (17.7 against 15.3 ms), and the staged search of one
// query took longer for both (0.32 against 0.25 ms at 768 dimensions),
// where nothing but latency bounds it.
constexpr size_t kInterleaveFromBytes = kRabitqInterleaveFromBytes;
static_assert(kRabitqInterleaveRows == size_t(kInterleaveRows), "the interleaved block of the public header");

struct PairArgs {
    const float* queries;    // nq x d (unit length for Cosine)
    const double* rotated;   // nq x d: P q
    const float* centroids;  // lists x d
    const double* pc;        // lists x d: P c
    const int32_t* probe;    // nq x nprobe
    const int32_t* prefix;   // nq x (nprobe + 1): where each probed list's rows start in cand
    const uint8_t* const* list_rows;
    const int64_t* const* list_keys;
    const int32_t* list_len;
    const int64_t* key_lo;   // nq each, or null
    const int64_t* key_hi;
    unsigned long long* matched;  // nq, or null
    float* cand;             // nq x ld
    float eps0;              // > 0: rank by lower bounds (RabitqModel::scan_keys)
    int d, bits, plane_bytes, code_bytes, row_bytes, nprobe, metric;
    bool interleaved;        // the lists' rows (list_layout.cuh)
    int splits;              // blocks per probed list: rows_per_block rows each
    int rows_per_block;
    int64_t ld;
};

__global__ void __launch_bounds__(kThreads) rabitq_pairs_kernel(PairArgs a)
{
    extern __shared__ __align__(16) unsigned char smem[];
    double* rot = reinterpret_cast<double*>(smem);                        // plane_bytes * 8
    float* lut = reinterpret_cast<float*>(rot + size_t(a.plane_bytes) * 8);  // plane_bytes * 32 (nibbles)
    __shared__ double part[8];
    __shared__ RabitqListTerms terms;
    __shared__ unsigned long long in_range;

    const int q = blockIdx.y, p = blockIdx.x / a.splits;
    const int r0 = (blockIdx.x % a.splits) * a.rows_per_block;
    const int list = a.probe[size_t(q) * a.nprobe + p];
    if (list < 0)  // the coarse step found fewer lists (never expected): no rows
        return;
    const int n = min(a.list_len[list], r0 + a.rows_per_block);
    if (r0 >= n)  // uniform over the block
        return;
    float* out = a.cand + size_t(q) * a.ld + a.prefix[size_t(q) * (a.nprobe + 1) + p];
    const float inf = __int_as_float(0x7f800000);
    const int d = a.d;
    const float* qv = a.queries + size_t(q) * d;
    const float* c = a.centroids + size_t(list) * d;
    rabitq_fill_rotated(rot, a.rotated + size_t(q) * d, a.pc + size_t(list) * d, d, a.plane_bytes, threadIdx.x,
                        blockDim.x);
    if (threadIdx.x < 8)
        part[threadIdx.x] = rabitq_list_part(qv, c, d, threadIdx.x);
    if (threadIdx.x == 0)
        in_range = 0;
    __syncthreads();
    rabitq_fill_nibbles(lut, rot, a.plane_bytes, threadIdx.x, blockDim.x);
    if (threadIdx.x == 0)
        terms = rabitq_list_terms(part, a.metric);
    __syncthreads();
    const uint8_t* rows = a.list_rows[list];
    const int64_t* keys = a.key_lo ? a.list_keys[list] : nullptr;
    const int64_t lo = a.key_lo ? a.key_lo[q] : 0, hi = a.key_lo ? a.key_hi[q] : 0;
    const RabitqListTerms t = terms;
    unsigned long long mine = 0;
    for (int r = r0 + threadIdx.x; r < n; r += blockDim.x) {
        if (keys) {
            const int64_t key = keys[r];
            if (!(lo <= key && key <= hi)) {
                out[r] = inf;
                continue;
            }
            mine++;
        }
        out[r] = rabitq_row_key(list_row(rows, r, a.row_bytes, a.interleaved), list_word_stride(a.interleaved), lut,
                                a.plane_bytes, a.bits, a.code_bytes, t, a.eps0);
    }
    if (a.matched && keys) {
        if (mine)
            atomicAdd(&in_range, mine);
        __syncthreads();
        if (threadIdx.x == 0 && in_range)
            atomicAdd(a.matched + q, in_range);
    }
}

// q' (8 doubles a byte group) and the nibble tables (32 floats a group).
size_t smem_bytes(size_t plane_bytes) { return plane_bytes * 8 * sizeof(double) + plane_bytes * 32 * sizeof(float); }

}  // namespace

struct GpuRabitqIndex::Impl : ListStore, SearchIo {
    int bits = 0;
    Metric metric = Metric::L2;
    size_t plane_bytes = 0, code_len = 0;  // bytes of a plane, of a code
    DeviceBuffer centroids, centroid_norms, rotation_t, rotated;  // rotation_t: P transposed
    size_t small_batch_max = kSmallBatchMax;  // set_small_batch_max
    int rows_per_block = 0;                   // set_rows_per_block (0: by the tile's queries)
    int small_cluster = 0;       // set_small_cluster
    size_t small_launches = 0;
    // From this many queries the one-launch path's coarse keys come from a
    // kernel of their own first (each centroid row read once per 4 queries),
    // as GpuIvfPqOptions::small_shared_coarse_from's default.
    static constexpr size_t kSmallSharedCoarseFrom = 16;
    explicit Impl(GpuContext& c) : ListStore(c), SearchIo(c) {}
    cudaStream_t st() const { return ctx.impl().stream; }
    Metric coarse_metric() const { return metric == Metric::InnerProduct ? Metric::InnerProduct : Metric::L2; }

    // The shape of a tile's device work, fixed by the lists' sizes when it
    // is planned (a CUDA graph of the tile is keyed by it).
    struct TilePlan {
        size_t ld = 0;      // candidates a query's row holds
        size_t chunks = 1;  // the first selection's chunks a query
        int splits = 1;     // blocks per probed list
        int rows = kRowsPerBlock;  // rows of a list per block
        bool radix = false;
    };
    TilePlan plan_tile(size_t nt, size_t k, size_t nprobe) const
    {
        TilePlan p;
        // A query's row holds its probed lists' rows one after the other
        // (at most nprobe x the longest list; a multiple of 4 floats, which
        // the selection reads 16 bytes at a time).
        const size_t ld = (nprobe * std::max<size_t>(max_len, 1) + 3) / 4 * 4;
        require(ld < (size_t(1) << 31), "GPU RaBitQ search: too many candidates per query");
        // The first selection splits each query's candidates (its own count,
        // known on the device only) into chunks, a warp each, whose k best
        // are then merged, a block a query: about sqrt(4 e / k) chunks for
        // e candidates (a chunk's warp and the merge's block then take about
        // as long), e estimated as nprobe lists of the size of the list
        // holding a random entry (ListStore::mass_mean_len: queries fall
        // where the entries are, so clustered data's probes favour long
        // lists; on tools/gen_synthetic's 768-d set a query probes 10x the
        // mean list, and the old estimate of twice the mean left the radix
        // selection's 7 blocks 9,000 keys each, 48 us for one query), one
        // chunk where that leaves fewer than 2; no more than fill the device
        // (16 warps a multiprocessor).
        //
        // The radix selection (k up to kRadixMaxK) takes chunks of about
        // kRadixChunkKeys estimated candidates, a block each, no more than
        // the merge's block takes in one tile, and no more than about eight
        // blocks a multiprocessor over the batch.
        const size_t sms = size_t(std::max(ctx.multiprocessors(), 1));
        const double est = double(nprobe) * mass_mean_len();
        const bool radix = ctx.impl().radix_select && k <= size_t(kRadixMaxK);
        size_t chunks;
        if (radix) {
            chunks = size_t(std::ceil(std::min(est, double(ld)) / double(kRadixChunkKeys)));
            chunks = std::min({chunks, size_t(kRadixTileKeys) / k, std::max<size_t>(1, sms * 8 / nt)});
        } else {
            chunks = size_t(std::sqrt(4.0 * std::min(est, double(ld)) / double(k)));
            chunks = std::min(chunks, std::max<size_t>(1, (sms * 16 + nt - 1) / nt));
        }
        if (chunks < 2)
            chunks = 1;
        p.ld = ld;
        p.chunks = chunks;
        p.rows = rows_per_block > 0 ? rows_per_block : nt <= kFewQueries ? kFewRowsPerBlock : kRowsPerBlock;
        p.splits = int((std::max<size_t>(max_len, 1) + size_t(p.rows) - 1) / size_t(p.rows));
        p.radix = radix;
        return p;
    }

    // What a captured search graph depends on besides its staging
    // (SearchIo::host_search adds that): the tile's plan and the index's
    // device addresses (list contents and lengths are read when it runs).
    SearchGraphs::Key graph_key(const TilePlan& p, size_t nprobe, float eps0, const SmallLaunch& sl) const
    {
        uint32_t eps_bits = 0;
        std::memcpy(&eps_bits, &eps0, sizeof eps_bits);
        SearchGraphs::Key key = {nprobe,           eps_bits,          p.ld,
                                 p.chunks,         uint64_t(p.splits), uint64_t(p.rows),
                                 uint64_t(p.radix), uint64_t(sl.cluster), uint64_t(sl.smem)};
        for (const DeviceBuffer* b :
             {&centroids, &centroid_norms, &rotation_t, &rotated, &code_ptrs, &id_ptrs, &key_ptrs, &lens})
            key.push_back(reinterpret_cast<uintptr_t>(b->data()));
        return key;
    }

    // P q of nt queries (device) into rq (nt x d doubles).
    void rotate_queries(const float* dq, size_t nt, double* rq)
    {
        if (nt < 64) {
            // A coordinate's four partial sums by four warps (the same
            // doubles as a thread a coordinate, which waits on d / 16
            // rounds of loads): small batches are latency-bound.
            static_assert((kRabitqMaxDims + 128) * sizeof(double) <= 48 * 1024,
                          "the split rotation's row fits the default shared memory");
            const size_t smem = (d + 128) * sizeof(double);
            rabitq_rotate_split_kernel<float><<<dim3(unsigned((d + 31) / 32), unsigned(nt)), 128, smem, st()>>>(
                rotation_t.as<float>(), int(d), dq, int64_t(nt), rq);
        } else if (4 * d * sizeof(double) <= 48 * 1024) {
            // Four queries a block in larger tiles (P read once for the
            // four), where their doubles fit the default 48 KiB of shared
            // memory.
            rabitq_rotate_kernel<float, 4><<<dim3(unsigned((d + 127) / 128), unsigned((nt + 3) / 4)), 128,
                                             4 * d * sizeof(double), st()>>>(rotation_t.as<float>(), int(d), dq,
                                                                             int64_t(nt), rq);
        } else {
            rabitq_rotate_kernel<float, 1><<<dim3(unsigned((d + 127) / 128), unsigned(nt)), 128, d * sizeof(double),
                                             st()>>>(rotation_t.as<float>(), int(d), dq, int64_t(nt), rq);
        }
        GPU_KERNEL_CHECK();
    }

    // The one-launch path's arguments for nt queries, without the inputs
    // and answers.
    RabitqSmallArgs small_args(size_t nt, size_t k, size_t nprobe, float eps0) const
    {
        RabitqSmallArgs a;
        a.nq = int(nt);
        a.d = int(d);
        a.lists = int(lists);
        a.nprobe = int(nprobe);
        a.k = int(k);
        a.bits = bits;
        a.plane_bytes = int(plane_bytes);
        a.code_bytes = int(code_len);
        a.row_bytes = int(m);
        a.interleaved = interleaved;
        a.metric = metric;
        a.eps0 = eps0;
        a.centroids = centroids.as<float>();
        a.centroid_norms = centroid_norms.as<float>();
        a.pc = rotated.as<double>();
        a.list_rows = code_ptrs.as<const uint8_t* const>();
        a.list_len = lens.as<int32_t>();
        a.list_ids = id_ptrs.as<const int64_t* const>();
        return a;
    }
    // The one-launch plan for a tile of nt queries, or cluster 0 for the
    // staged search.
    SmallLaunch small_launch(size_t nt, size_t k, size_t nprobe, float eps0) const
    {
        // Positions (and a scan step's last thread past them) fit an int.
        if (nt == 0 || nt > small_batch_max || k > size_t(kSmallSearchMaxK) || nprobe > size_t(kSmallSearchMaxK) ||
            nprobe * std::max<size_t>(max_len, 1) >= (size_t(1) << 31) - 1024)
            return SmallLaunch{};
        return rabitq_small_plan(small_args(nt, k, nprobe, eps0), ctx.multiprocessors(), small_cluster);
    }
    // search_tile's work in one launch (after the rotation, and from
    // kSmallSharedCoarseFrom queries the batch's coarse keys).
    void search_small(float* dq, size_t nt, size_t k, size_t nprobe, const SmallLaunch& sl, const int64_t* lo,
                      const int64_t* hi, int64_t* matched, float eps0, float* dist, int64_t* labels)
    {
        const bool shared = nt >= kSmallSharedCoarseFrom;
        Carver sz;
        sz.take<double>(nt * d);
        sz.take<float>(shared ? nt * lists : 0);
        Scratch s(ctx, sz.size());
        Carver c(s.data());
        double* rq = c.take<double>(nt * d);
        float* keys = c.take<float>(shared ? nt * lists : 0);
        if (metric == Metric::Cosine)
            normalize_rows(ctx, dq, nt, d);
        rotate_queries(dq, nt, rq);
        RabitqSmallArgs a = small_args(nt, k, nprobe, eps0);
        a.queries = dq;
        a.rotated = rq;
        if (lo) {
            a.list_keys = key_ptrs.as<const int64_t* const>();
            a.key_lo = lo;
            a.key_hi = hi;
            a.key_matched = matched;
        }
        a.out_dist = dist;
        a.out_labels = labels;
        if (shared) {
            // The queries are normalised already: the keys of their L2
            // coarse step (inner product for that metric), as the kernel's own.
            SmallSearchArgs ka;
            ka.nq = int(nt);
            ka.d = int(d);
            ka.lists = int(lists);
            ka.metric = coarse_metric();
            ka.queries = dq;
            ka.centroids = centroids.as<float>();
            ka.centroid_norms = centroid_norms.as<float>();
            launch_coarse_keys(ka, keys, st());
            a.coarse_keys = keys;
        }
        launch_rabitq_small(a, sl, st());
    }

    // nt queries (device, d floats each) through nprobe lists into dist /
    // labels (device, nt x k) as p plans it, with the key range and counts
    // (device) when lo is set; Cosine queries are normalised in place.
    void search_tile(float* dq, size_t nt, size_t k, size_t nprobe, const TilePlan& p, const int64_t* lo,
                     const int64_t* hi, int64_t* matched, float eps0, float* dist, int64_t* labels)
    {
        const size_t ld = p.ld, chunks = p.chunks;
        Carver sz;
        sz.take<float>(nt * nprobe);
        sz.take<int32_t>(nt * nprobe);
        sz.take<int32_t>(nt * (nprobe + 1));
        sz.take<double>(nt * d);
        sz.take<float>(nt * ld);
        sz.take<float>(chunks > 1 ? nt * chunks * k : 0);
        sz.take<int32_t>(chunks > 1 ? nt * chunks * k : 0);
        sz.take<int32_t>(nt * k);
        Scratch s(ctx, sz.size());
        Carver c(s.data());
        float* pdist = c.take<float>(nt * nprobe);
        int32_t* probe = c.take<int32_t>(nt * nprobe);
        int32_t* prefix = c.take<int32_t>(nt * (nprobe + 1));
        double* rq = c.take<double>(nt * d);
        float* cand = c.take<float>(nt * ld);
        float* cdist = c.take<float>(chunks > 1 ? nt * chunks * k : 0);
        int32_t* cidx = c.take<int32_t>(chunks > 1 ? nt * chunks * k : 0);
        int32_t* pos = c.take<int32_t>(nt * k);
        if (metric == Metric::Cosine)
            normalize_rows(ctx, dq, nt, d);
        exact_knn_i32(ctx, dq, nt, centroids.as<float>(), lists, d, coarse_metric(), nprobe, pdist, probe,
                      centroid_norms.as<float>());
        IvfScanArgs pa;
        pa.nq = int(nt);
        pa.nprobe = int(nprobe);
        pa.probe_lists = probe;
        pa.prefix = prefix;
        pa.list_len = lens.as<int32_t>();
        launch_ivf_prefix(pa, st());
        rotate_queries(dq, nt, rq);
        if (matched)
            GPU_CUDA_CHECK(cudaMemsetAsync(matched, 0, nt * sizeof(int64_t), st()));
        PairArgs a;
        a.queries = dq;
        a.rotated = rq;
        a.centroids = centroids.as<float>();
        a.pc = rotated.as<double>();
        a.probe = probe;
        a.prefix = prefix;
        a.list_rows = code_ptrs.as<const uint8_t* const>();
        a.list_keys = has_keys ? key_ptrs.as<const int64_t* const>() : nullptr;
        a.list_len = lens.as<int32_t>();
        a.key_lo = lo;
        a.key_hi = hi;
        a.matched = reinterpret_cast<unsigned long long*>(matched);
        a.cand = cand;
        a.eps0 = eps0;
        a.d = int(d);
        a.bits = bits;
        a.plane_bytes = int(plane_bytes);
        a.code_bytes = int(code_len);
        a.row_bytes = int(m);
        a.interleaved = interleaved;
        a.nprobe = int(nprobe);
        a.metric = int(metric);
        a.ld = int64_t(ld);
        a.splits = p.splits;
        a.rows_per_block = p.rows;
        rabitq_pairs_kernel<<<dim3(unsigned(nprobe * size_t(a.splits)), unsigned(nt)), kThreads,
                              smem_bytes(plane_bytes), st()>>>(a);
        GPU_KERNEL_CHECK();
        // The candidates past a query's last probed row are never read.
        SelectArgs sel;
        sel.in = cand;
        sel.ld = int64_t(ld);
        sel.n = int64_t(ld);
        sel.row_len = prefix + nprobe;
        sel.row_len_stride = int64_t(nprobe + 1);
        sel.rows = int64_t(nt);
        sel.chunks = int(chunks);
        sel.chunks_split_len = true;
        sel.k = int(k);
        if (p.radix)
            launch_select_radix(sel, cdist, cidx, dist, pos, st());
        else
            launch_select_chunked(sel, cdist, cidx, dist, pos, std::max(ctx.multiprocessors(), 1), st());
        launch_decode_labels(pos, int64_t(nt), int(k), int(nprobe), prefix, probe,
                             id_ptrs.as<const int64_t* const>(), labels, st());
    }
};

GpuRabitqIndex::GpuRabitqIndex(GpuContext& ctx, size_t d, size_t lists, int bits, Metric metric,
                               const float* centroids, const void* model, bool filter_keys)
    : impl_(new Impl(ctx))
{
    require(d >= 1 && d <= kRabitqMaxDims, "GPU RaBitQ: d outside [1, kRabitqMaxDims]");
    require(bits >= kRabitqMinBits && bits <= kRabitqMaxBits, "GPU RaBitQ: bits outside [1, 8]");
    require(metric == Metric::L2 || metric == Metric::InnerProduct || metric == Metric::Cosine,
            "GPU RaBitQ: unknown metric");
    require(lists >= 1 && lists < (size_t(1) << 31), "GPU RaBitQ: lists must be in [1, 2^31)");
    require(centroids && model, "GPU RaBitQ: null model");
    Impl& I = *impl_;
    I.bits = bits;
    I.metric = metric;
    I.plane_bytes = rabitq_plane_words(d) * 4;
    I.code_len = rabitq_code_bytes(d, bits);
    const size_t smem = smem_bytes(I.plane_bytes);
    int dev = 0, optin = 0;
    GPU_CUDA_CHECK(cudaGetDevice(&dev));
    GPU_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (smem + 1024 > size_t(optin))
        throw Error(ErrorKind::Unsupported, "GPU RaBitQ: the byte tables of d = " + std::to_string(d) +
                                                " do not fit a block's shared memory");
    if (smem > 48 * 1024)
        GPU_CUDA_CHECK(
            cudaFuncSetAttribute(rabitq_pairs_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    const float* rotation = static_cast<const float*>(model);
    const double* pc =
        reinterpret_cast<const double*>(static_cast<const char*>(model) + rabitq_rotated_offset(d));
    for (size_t i = 0; i < d * d; i++)
        require(std::isfinite(rotation[i]), "GPU RaBitQ: the rotation holds a value that is not finite");
    for (size_t i = 0; i < lists * d; i++)
        require(std::isfinite(pc[i]) && std::isfinite(centroids[i]),
                "GPU RaBitQ: a centroid holds a value that is not finite");
    I.centroids = DeviceBuffer(ctx, lists * d * sizeof(float));
    I.centroids.upload(centroids, lists * d * sizeof(float));
    I.centroid_norms = DeviceBuffer(ctx, lists * sizeof(float));
    row_norms(ctx, I.centroids.as<float>(), lists, d, I.centroid_norms.as<float>());
    {
        std::vector<float> t(d * d);
        for (size_t i = 0; i < d; i++)
            for (size_t k = 0; k < d; k++)
                t[k * d + i] = rotation[i * d + k];
        I.rotation_t = DeviceBuffer(ctx, d * d * sizeof(float));
        I.rotation_t.upload(t.data(), d * d * sizeof(float));
    }
    I.rotated = DeviceBuffer(ctx, lists * d * sizeof(double));
    I.rotated.upload(pc, lists * d * sizeof(double));
    // No vectors, no terms; rows of kInterleaveFromBytes or more interleaved
    // (list_layout.cuh).
    const size_t rb = rabitq_row_bytes(d, bits);
    I.init_lists(d, lists, rb, false, false, filter_keys, rb >= kInterleaveFromBytes);
    ctx.synchronize();
}

GpuRabitqIndex::~GpuRabitqIndex() = default;

size_t GpuRabitqIndex::d() const { return impl_->d; }
size_t GpuRabitqIndex::lists() const { return impl_->lists; }
int GpuRabitqIndex::bits() const { return impl_->bits; }
Metric GpuRabitqIndex::metric() const { return impl_->metric; }
size_t GpuRabitqIndex::row_bytes() const { return impl_->m; }
size_t GpuRabitqIndex::ntotal() const { return impl_->ntotal; }
bool GpuRabitqIndex::has_keys() const { return impl_->has_keys; }

size_t GpuRabitqIndex::list_size(size_t list) const
{
    require(list < impl_->lists, "list index out of range");
    return impl_->lst[list].size;
}

GpuMemoryUse GpuRabitqIndex::memory_use() const
{
    const Impl& I = *impl_;
    GpuMemoryUse u;
    u.centroids = I.centroids.bytes() + I.centroid_norms.bytes();
    u.codebooks = I.rotation_t.bytes() + I.rotated.bytes();
    u.codes = I.code_bytes();
    u.ids = I.id_bytes();
    u.keys = I.key_bytes();
    u.list_meta = I.meta_bytes();
    return u;
}

void GpuRabitqIndex::add(size_t n, const int32_t* list_ids, const uint8_t* rows, const int64_t* ids,
                         const int64_t* keys)
{
    Impl& I = *impl_;
    I.append("GPU RaBitQ add", n, list_ids, rows, ids, nullptr, keys, nullptr);
}

size_t GpuRabitqIndex::remove_ids(const int64_t* ids, size_t n) { return impl_->remove(ids, n); }

void GpuRabitqIndex::search(const float* queries, size_t nq, size_t k, size_t nprobe, float* dist,
                            int64_t* labels, const KeyRange* ranges, float eps0) const
{
    Impl& I = *impl_;
    if (!(eps0 >= 0.0f) || std::isinf(eps0))
        throw Error(ErrorKind::InvalidArgument, "GPU RaBitQ search: eps0 must be a number >= 0");
    if (k < 1 || k > kMaxSelectK)
        throw Error(ErrorKind::InvalidArgument,
                    "GPU RaBitQ search: k must be in [1, " + std::to_string(kMaxSelectK) + "]");
    nprobe = std::min(std::max<size_t>(nprobe, 1), I.lists);
    if (nprobe > kMaxSelectK)
        throw Error(ErrorKind::InvalidArgument,
                    "GPU RaBitQ search: nprobe above " + std::to_string(kMaxSelectK));
    if (ranges && !I.has_keys)
        throw Error(ErrorKind::InvalidArgument, "GPU RaBitQ search: key ranges given to an index without filter_keys");
    if (ranges && (!ranges->lo || !ranges->hi))
        throw Error(ErrorKind::InvalidArgument, "GPU RaBitQ search: key range without lo or hi");
    if (nq == 0)
        return;
    require(queries && dist && labels, "GPU RaBitQ search: null pointer");
    const size_t ld = nprobe * std::max<size_t>(I.max_len, 1);
    const size_t tile = std::max<size_t>(1, std::min<size_t>({nq, kTileBytes / (ld * sizeof(float)), 65535}));
    // A handover (GpuContext::WaitHandover) lets go of the context for good
    // at its call's wait: only the last tile's call may use it.
    const GpuContext::WaitHandover handover = I.io_ctx.wait_handover();
    struct Restore {
        GpuContext& c;
        GpuContext::WaitHandover h;
        bool armed = true;
        ~Restore()
        {
            if (armed)
                c.set_wait_handover(h);
        }
    } restore{I.io_ctx, handover};
    for (size_t t0 = 0; t0 < nq; t0 += tile) {
        const size_t nt = std::min(tile, nq - t0);
        const bool last = t0 + nt >= nq;
        I.io_ctx.set_wait_handover(last ? handover : GpuContext::WaitHandover{});
        restore.armed = !last;  // the last call's handover is its own to use
        KeyRange r;
        if (ranges) {
            r.lo = ranges->lo + t0;
            r.hi = ranges->hi + t0;
            r.matched = ranges->matched ? ranges->matched + t0 : nullptr;
        }
        const Impl::TilePlan p = I.plan_tile(nt, k, nprobe);
        const SmallLaunch sl = I.small_launch(nt, k, nprobe, eps0);
        I.small_launches += sl.cluster > 0;  // per call, whether a graph replays it or not
        I.host_search(I.d, queries + t0 * I.d, nt, k, ranges ? &r : nullptr, dist + t0 * k, labels + t0 * k,
                      false, [&] { return I.graph_key(p, nprobe, eps0, sl); },
                      [&](float* dq, float* dd, int64_t* dl, const KeyRange* dr) {
                          // The staged queries are the call's own (Cosine normalises them in place).
                          if (sl.cluster)
                              I.search_small(dq, nt, k, nprobe, sl, dr ? dr->lo : nullptr, dr ? dr->hi : nullptr,
                                             dr ? dr->matched : nullptr, eps0, dd, dl);
                          else
                              I.search_tile(dq, nt, k, nprobe, p, dr ? dr->lo : nullptr,
                                            dr ? dr->hi : nullptr, dr ? dr->matched : nullptr, eps0, dd, dl);
                      });
    }
}

void GpuRabitqIndex::set_search_graphs(bool on) { impl_->graphs.set_enabled(on); }

void GpuRabitqIndex::set_small_batch_max(size_t queries) { impl_->small_batch_max = queries; }

void GpuRabitqIndex::set_rows_per_block(int rows)
{
    require(rows == 0 || (rows >= kThreads && rows <= 64 * kThreads && rows % kThreads == 0),
            "GPU RaBitQ: rows per block must be 0 or a multiple of 256 in [256, 16384]");
    impl_->rows_per_block = rows;
}

void GpuRabitqIndex::set_small_cluster(int blocks)
{
    require(blocks >= 0 && blocks <= 16, "GPU RaBitQ: blocks per query outside [0, 16]");
    impl_->small_cluster = blocks;
}

size_t GpuRabitqIndex::small_search_launches() const { return impl_->small_launches; }

size_t GpuRabitqIndex::search_graph_launches() const { return impl_->graphs.launches(); }

namespace {

// The nprobe nearest lists of each of n rows (host in / out) by `coarse`,
// Cosine rows normalised first; 65536 rows at a time, so that the device's
// scratch stays bounded for a build's batches.
void nearest_lists(GpuRabitqIndex::Impl& I, const float* x, size_t n, size_t nprobe, Metric coarse, int32_t* out)
{
    const size_t tile = 65536;
    for (size_t r0 = 0; r0 < n; r0 += tile) {
        const size_t nr = std::min(tile, n - r0);
        Carver sz;
        sz.take<float>(nr * I.d);
        sz.take<float>(nr * nprobe);
        sz.take<int32_t>(nr * nprobe);
        Scratch s(I.ctx, sz.size());
        Carver c(s.data());
        float* dq = c.take<float>(nr * I.d);
        float* pd = c.take<float>(nr * nprobe);
        int32_t* pl = c.take<int32_t>(nr * nprobe);
        copy_to_device(I.ctx, dq, x + r0 * I.d, nr * I.d * sizeof(float));
        if (I.metric == Metric::Cosine)
            normalize_rows(I.ctx, dq, nr, I.d);
        exact_knn_i32(I.ctx, dq, nr, I.centroids.as<float>(), I.lists, I.d, coarse, nprobe, pd, pl,
                      I.centroid_norms.as<float>());
        copy_to_host(I.ctx, out + r0 * nprobe, pl, nr * nprobe * sizeof(int32_t));
    }
}

}  // namespace

void GpuRabitqIndex::probe_lists(const float* queries, size_t nq, size_t nprobe, int32_t* out) const
{
    Impl& I = *impl_;
    nprobe = std::min(std::max<size_t>(nprobe, 1), I.lists);
    require(nprobe <= kMaxSelectK, "GPU RaBitQ: nprobe above kMaxSelectK");
    nearest_lists(I, queries, nq, nprobe, I.coarse_metric(), out);
}

void GpuRabitqIndex::assign(const float* x, size_t n, int32_t* list_ids) const
{
    require(n == 0 || (x && list_ids), "GPU RaBitQ: null pointer in assign");
    nearest_lists(*impl_, x, n, 1, Metric::L2, list_ids);
}

void GpuRabitqIndex::encode(const float* x, size_t n, const int32_t* list_ids, uint8_t* rows) const
{
    const Impl& I = *impl_;
    rabitq_encode_rows(I.ctx, I.centroids.as<float>(), I.rotation_t.as<float>(), I.d, I.lists, I.bits, I.metric, x, n,
                       list_ids, rows);
}

}  // namespace gpuivfpq::gpu
