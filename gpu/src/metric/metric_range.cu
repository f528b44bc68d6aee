// Range and k-NN search with SSS and List of Clusters on the GPU (the
// paper's scheme): per tile of queries, the distances to every pivot or
// centre in one kernel; the pruning rules on them, which emit hits (pivots,
// centres) and candidates (objects left by the pivot table, members of the
// buckets to scan); the candidates' bounded distances; the hits sorted by
// (query, distance, id) with one radix sort of packed keys. k-NN repeats
// the rules and candidates at growing radii over the same distances.
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <vector>

#include "engine/error.h"
#include "engine/metric/sss_index.h"
#include "../context_impl.h"
#include "../cuda_check.h"
#include "gpu_ivfpq/gpu_context.h"
#include "gpu_ivfpq/metric_search.h"
#include "metric_kernels.h"

namespace gpuivfpq::gpu {

namespace metric {

namespace {

constexpr uint32_t kTableMax = SparseSpatialSelection::kTableMax;

// Bytes of the per-tile distance matrix (queries x pivots or centres): the
// tile of queries shrinks to keep it within this.
constexpr uint64_t kMatrixBytes = uint64_t(256) << 20;
// Most queries in one tile (its hits and candidates grow with it).
constexpr uint32_t kMaxTileQueries = 1u << 16;
// First capacity of the candidate and hit buffers; a search that overflows
// one grows it to what it needed plus a quarter and runs the step again.
constexpr uint64_t kFirstCapacity = uint64_t(1) << 16;

// set_metric_tile_queries's limit (0: none).
std::atomic<size_t> tile_query_limit{0};

// The tile-local query of work item i: active[i], or i for every query.
__device__ __forceinline__ uint32_t active_query(const uint32_t* active, uint32_t i)
{
    return active ? active[i] : i;
}

__device__ __forceinline__ void push_pair(const PairSink& s, uint32_t q, uint32_t x)
{
    const unsigned long long at = atomicAdd(s.count, 1ull);
    if (at < s.capacity)
        s.pairs[at] = MetricPair{q, x};
}

// SSS: a pivot within the query's radius is a hit (unless removed).
__global__ void __launch_bounds__(kMetricThreads)
    sss_pivot_hits_kernel(const uint32_t* dq, uint32_t pivots, const uint32_t* active,
                          uint32_t nactive, const uint32_t* pivot_ids, const uint8_t* removed,
                          const uint32_t* radius, HitSink hits)
{
    const uint64_t threads = uint64_t(gridDim.x) * blockDim.x;
    const uint64_t total = uint64_t(nactive) * pivots;
    for (uint64_t t = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += threads) {
        const uint32_t q = active_query(active, uint32_t(t / pivots));
        const uint32_t p = uint32_t(t % pivots);
        const uint32_t d = dq[uint64_t(q) * pivots + p];
        if (d <= radius[q] && !removed[pivot_ids[p]])
            push_hit(hits, q, pivot_ids[p], d);
    }
}

// SSS: a live object that is no pivot is a candidate unless a pivot proves
// it farther than r: |table byte - min(d(q, p), 255)| > r, the engine's
// byte bound (sss_index.cpp), never applied at r >= 255 where it cannot
// bite. Consecutive threads take consecutive objects of one tile, so each
// column read is coalesced.
__global__ void __launch_bounds__(kMetricThreads)
    sss_filter_kernel(const uint32_t* dq, uint32_t pivots, const uint32_t* active,
                      uint32_t nactive, const uint8_t* table, uint32_t n, const uint8_t* removed,
                      const uint8_t* is_pivot, const uint32_t* radius, PairSink pairs)
{
    const uint64_t threads = uint64_t(gridDim.x) * blockDim.x;
    const uint64_t total = uint64_t(nactive) * n;
    for (uint64_t t = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += threads) {
        const uint32_t q = active_query(active, uint32_t(t / n));
        const uint32_t x = uint32_t(t % n);
        if (removed[x] || is_pivot[x])
            continue;
        const uint32_t r = radius[q];
        bool kept = true;
        if (r < kTableMax) {
            const uint8_t* column = table + table_at(x, 0, pivots);
            const uint32_t* dqq = dq + uint64_t(q) * pivots;
            for (uint32_t p = 0; p < pivots && kept; p++) {
                const uint32_t stored = column[uint64_t(p) * kTableTile];
                const uint32_t clamped = min(dqq[p], kTableMax);
                const uint32_t gap = stored > clamped ? stored - clamped : clamped - stored;
                kept = gap <= r;
            }
        }
        if (kept)
            push_pair(pairs, q, x);
    }
}

// LC: stop[q] = the first cluster whose centre has d(q, c) < r_c - r (the
// query's ball strictly inside the cluster's, so no later object is within
// r: lc_index.cpp's stop rule); stop starts at UINT32_MAX (no stop).
__global__ void __launch_bounds__(kMetricThreads)
    lc_stop_kernel(const uint32_t* dc, uint32_t clusters, const uint32_t* active, uint32_t nactive,
                   const uint32_t* radii, const uint32_t* radius, uint32_t* stop)
{
    const uint64_t threads = uint64_t(gridDim.x) * blockDim.x;
    const uint64_t total = uint64_t(nactive) * clusters;
    for (uint64_t t = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += threads) {
        const uint32_t q = active_query(active, uint32_t(t / clusters));
        const uint32_t c = uint32_t(t % clusters);
        if (uint64_t(dc[uint64_t(q) * clusters + c]) + radius[q] < radii[c])
            atomicMin(stop + q, c);
    }
}

// LC: the clusters up to the stop, as the engine's scan takes them: the
// centre is a hit when within r (and live), the bucket's members are
// candidates when d(q, c) <= r_c + r (else the triangle inequality puts
// every one farther than r). A thread reserves its bucket's slots at once.
__global__ void __launch_bounds__(kMetricThreads)
    lc_select_kernel(const uint32_t* dc, uint32_t clusters, const uint32_t* active,
                     uint32_t nactive, const uint32_t* centres, const uint32_t* radii,
                     const uint32_t* member_offsets, const uint32_t* members,
                     const uint8_t* removed, const uint32_t* radius, const uint32_t* stop,
                     HitSink hits, PairSink pairs)
{
    const uint64_t threads = uint64_t(gridDim.x) * blockDim.x;
    const uint64_t total = uint64_t(nactive) * clusters;
    for (uint64_t t = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += threads) {
        const uint32_t q = active_query(active, uint32_t(t / clusters));
        const uint32_t c = uint32_t(t % clusters);
        if (c > stop[q])
            continue;
        const uint32_t d = dc[uint64_t(q) * clusters + c], r = radius[q];
        if (d <= r && !removed[centres[c]])
            push_hit(hits, q, centres[c], d);
        if (d > saturating_add(radii[c], r))
            continue;
        const uint32_t begin = member_offsets[c], size = member_offsets[c + 1] - begin;
        if (size == 0)
            continue;
        const unsigned long long at = atomicAdd(pairs.count, (unsigned long long)size);
        for (uint32_t j = 0; j < size; j++)
            if (at + j < pairs.capacity)
                pairs.pairs[at + j] = MetricPair{q, members[begin + j]};
    }
}

// counts[q] += the candidates of tile query q among pairs[0, n) whose
// object is live: the distances its bucket scans or table filter left to
// compute (launch_pair_hits skips removed objects). A thread
// takes kCountRun consecutive pairs and adds once per run of one query
// (the rules emit a query's candidates together), which keeps the atomics
// on one query's counter few.
constexpr uint32_t kCountRun = 32;
__global__ void __launch_bounds__(kMetricThreads)
    count_pairs_kernel(const MetricPair* pairs, uint64_t n, const uint8_t* removed,
                       unsigned long long* counts)
{
    const uint64_t threads = uint64_t(gridDim.x) * blockDim.x;
    for (uint64_t t = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; t * kCountRun < n;
         t += threads) {
        const uint64_t end = min(n, (t + 1) * kCountRun);
        uint32_t q = pairs[t * kCountRun].q;
        unsigned long long run = 0;
        for (uint64_t i = t * kCountRun; i < end; i++) {
            const uint32_t qi = pairs[i].q;
            if (qi != q) {
                if (run > 0)
                    atomicAdd(counts + q, run);
                q = qi;
                run = 0;
            }
            run += removed[pairs[i].x] ? 0 : 1;
        }
        if (run > 0)
            atomicAdd(counts + q, run);
    }
}

// Buffers of one search call, reused by its tiles and rounds and grown on
// demand (device memory from the context, within its budget).
struct SearchBuffers {
    explicit SearchBuffers(GpuContext& ctx) : ctx(ctx) {}

    GpuContext& ctx;
    DeviceBuffer matrix;     // tile queries x pivots or centres
    DeviceBuffer unbounded;  // tile queries x UINT32_MAX: exact distances
    DeviceBuffer stop;       // LC: per tile query
    DeviceBuffer radius;     // k-NN: per tile query, the round's radius
    DeviceBuffer active;     // k-NN: the round's queries
    DeviceBuffer counters;   // candidates, hits
    DeviceBuffer evaluated;  // per tile query: candidates' distances computed
    DeviceBuffer pairs, keys, sorted, sort_temp, long_scratch;
    uint64_t pair_capacity = kFirstCapacity, hit_capacity = kFirstCapacity;

    unsigned long long* pair_count() { return counters.as<unsigned long long>(); }
    unsigned long long* hit_count() { return counters.as<unsigned long long>() + 1; }
};

// The two counters, read back (waits for the stream).
void read_counters(SearchBuffers& b, uint64_t* out)
{
    copy_to_host(b.ctx, out, b.counters.data(), 2 * sizeof(uint64_t));
}

// Makes buf hold at least bytes (its contents are not kept).
void reserve(GpuContext& ctx, DeviceBuffer& buf, size_t bytes)
{
    if (buf.bytes() < bytes) {
        buf.reset();
        buf = DeviceBuffer(ctx, bytes);
    }
}

uint64_t grown(uint64_t needed) { return needed + needed / 4 + 1024; }

// Runs emit(hits, pairs) (a method's rule kernels for the current queries),
// then the candidates' bounded distances, until neither buffer overflowed
// (each overflow grows the buffer to what it needed and runs both again);
// adds each query's candidates to b.evaluated and returns the number of
// hits left in b.keys.
template <class Emit>
uint64_t collect_hits(SearchBuffers& b, const DevPatterns& pats, const DevWords& words,
                      const uint8_t* removed, const uint32_t* radius, uint32_t key_shift,
                      uint32_t max_blocks, const Emit& emit)
{
    const cudaStream_t st = stream_of(b.ctx);
    reserve(b.ctx, b.counters, 2 * sizeof(uint64_t));
    for (;;) {
        reserve(b.ctx, b.pairs, size_t(b.pair_capacity * sizeof(MetricPair)));
        reserve(b.ctx, b.keys, size_t(b.hit_capacity * sizeof(uint64_t)));
        GPU_CUDA_CHECK(cudaMemsetAsync(b.counters.data(), 0, 2 * sizeof(uint64_t), st));
        const HitSink hits{b.keys.as<uint64_t>(), b.hit_count(), b.hit_capacity, key_shift};
        const PairSink pairs{b.pairs.as<MetricPair>(), b.pair_count(), b.pair_capacity};
        emit(hits, pairs);
        uint64_t count[2];
        read_counters(b, count);
        if (count[0] > b.pair_capacity) {
            b.pair_capacity = grown(count[0]);
            b.hit_capacity = std::max(b.hit_capacity, count[1]);
            continue;
        }
        const Grid grid = distance_grid(b.ctx, count[0], max_blocks, b.long_scratch);
        launch_pair_hits(pats, words, removed, b.pairs.as<MetricPair>(), count[0], radius, hits,
                         grid, st);
        read_counters(b, count);
        if (count[1] > b.hit_capacity) {
            b.hit_capacity = grown(count[1]);
            continue;
        }
        if (count[0] > 0) {
            count_pairs_kernel<<<plain_grid(b.ctx, (count[0] + kCountRun - 1) / kCountRun),
                                 kMetricThreads, 0, st>>>(
                b.pairs.as<MetricPair>(), count[0], removed, b.evaluated.as<unsigned long long>());
            GPU_KERNEL_CHECK();
        }
        return count[1];
    }
}

// The first count keys of b.keys sorted (bits [0, end_bit) of each), on the host.
std::vector<uint64_t> sorted_keys(SearchBuffers& b, uint64_t count, int end_bit)
{
    std::vector<uint64_t> out(size_t(count), 0);
    if (count == 0)
        return out;
    const cudaStream_t st = stream_of(b.ctx);
    reserve(b.ctx, b.sorted, size_t(count * sizeof(uint64_t)));
    size_t temp = 0;
    GPU_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(nullptr, temp, b.keys.as<uint64_t>(),
                                                  b.sorted.as<uint64_t>(), count, 0, end_bit, st));
    reserve(b.ctx, b.sort_temp, std::max<size_t>(temp, 1));
    GPU_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(b.sort_temp.data(), temp, b.keys.as<uint64_t>(),
                                                  b.sorted.as<uint64_t>(), count, 0, end_bit, st));
    copy_to_host(b.ctx, out.data(), b.sorted.data(), size_t(count * sizeof(uint64_t)));
    return out;
}

// How hits are packed: q << shift | distance << 32 | id, distances taking
// dbits bits; a tile has at most 2^(32 - dbits) queries so all fit 64 bits.
struct KeyLayout {
    uint32_t dbits = 0;
    uint32_t shift() const { return 32 + dbits; }
    uint32_t query(uint64_t key) const { return uint32_t(key >> shift()); }
    MetricHit hit(uint64_t key) const
    {
        const uint64_t mask = (uint64_t(1) << dbits) - 1;
        return MetricHit{uint32_t(key), uint32_t((key >> 32) & mask)};
    }
    // Bits a sort of a tile of tile_queries must look at.
    int end_bit(uint32_t tile_queries) const
    {
        uint32_t qbits = 0;
        while (qbits < 32 && (uint64_t(1) << qbits) < tile_queries)
            qbits++;
        return int(std::min<uint32_t>(64, shift() + qbits));
    }
};

// Bits of the largest distance a hit can carry.
KeyLayout key_layout(uint32_t max_distance)
{
    KeyLayout k;
    while (k.dbits < 32 && (uint64_t(1) << k.dbits) <= max_distance)
        k.dbits++;
    return k;
}

// Queries per tile: the matrix within kMatrixBytes, the keys within 64 bits.
uint32_t tile_queries(size_t nq, const KeyLayout& keys, size_t targets)
{
    uint64_t t = std::min<uint64_t>(nq, kMaxTileQueries);
    t = std::min<uint64_t>(t, uint64_t(1) << (32 - std::min<uint32_t>(keys.dbits, 31)));
    t = std::min<uint64_t>(t, std::max<uint64_t>(1, kMatrixBytes / (4 * std::max<size_t>(1, targets))));
    if (const size_t limit = tile_query_limit.load())
        t = std::min<uint64_t>(t, limit);
    return uint32_t(std::max<uint64_t>(1, t));
}

// One radius per query (radii: one per query, or one for all).
std::vector<uint32_t> per_query_radii(const std::vector<uint32_t>& radii, size_t nq)
{
    if (radii.size() != nq && radii.size() != 1) {
        char msg[160];
        std::snprintf(msg, sizeof msg,
                      "metric range search: %zu radii for %zu queries; give one radius per "
                      "query, or one for all",
                      radii.size(), nq);
        throw Error(ErrorKind::InvalidArgument, msg);
    }
    return radii.size() == nq ? radii : std::vector<uint32_t>(nq, nq ? radii[0] : 0);
}

// SSS as the drivers below use it: targets are the pivots (their exact
// distances), the rules the pivot hits and the table filter.
struct SssMethod {
    const SssDeviceView& v;

    size_t objects() const { return v.words.n; }
    size_t targets() const { return v.pivot_count; }
    DevWords words() const { return DevWords{v.words.code_points, v.words.offsets}; }
    const uint8_t* removed() const { return v.removed; }
    uint32_t max_word_length() const { return v.max_word_length; }

    void distances(SearchBuffers& b, const DevPatterns& pats, uint32_t nq, const uint32_t*,
                   const Grid& grid) const
    {
        launch_distance_matrix(pats, words(), nq, v.pivots, uint32_t(v.pivot_count), nullptr,
                               b.unbounded.as<uint32_t>(), b.matrix.as<uint32_t>(), grid,
                               stream_of(b.ctx));
    }
    void emit(SearchBuffers& b, const uint32_t* active, uint32_t nactive, const uint32_t* radius,
              const HitSink& hits, const PairSink& pairs) const
    {
        const cudaStream_t st = stream_of(b.ctx);
        const uint32_t np = uint32_t(v.pivot_count), n = uint32_t(v.words.n);
        const uint32_t* dq = b.matrix.as<uint32_t>();
        if (np > 0) {
            sss_pivot_hits_kernel<<<plain_grid(b.ctx, uint64_t(nactive) * np), kMetricThreads, 0,
                                    st>>>(dq, np, active, nactive, v.pivots, v.removed, radius,
                                          hits);
            GPU_KERNEL_CHECK();
        }
        sss_filter_kernel<<<plain_grid(b.ctx, uint64_t(nactive) * n), kMetricThreads, 0, st>>>(
            dq, np, active, nactive, v.table, n, v.removed, v.is_pivot, radius, pairs);
        GPU_KERNEL_CHECK();
    }
};

// List of Clusters: targets are the centres (distances bounded by r_c + r
// for a range search, exact for k-NN's rounds: the rules give the same
// answers on either), the rules the stop, centre hits and bucket scans.
struct LcMethod {
    const LcDeviceView& v;

    size_t objects() const { return v.words.n; }
    size_t targets() const { return v.clusters; }
    DevWords words() const { return DevWords{v.words.code_points, v.words.offsets}; }
    const uint8_t* removed() const { return v.removed; }
    uint32_t max_word_length() const { return v.max_word_length; }

    // range_radius: the tile's radii (range search), or null (exact).
    void distances(SearchBuffers& b, const DevPatterns& pats, uint32_t nq,
                   const uint32_t* range_radius, const Grid& grid) const
    {
        launch_distance_matrix(pats, words(), nq, v.centres, uint32_t(v.clusters), v.radii,
                               range_radius ? range_radius : b.unbounded.as<uint32_t>(),
                               b.matrix.as<uint32_t>(), grid, stream_of(b.ctx));
    }
    void emit(SearchBuffers& b, const uint32_t* active, uint32_t nactive, const uint32_t* radius,
              const HitSink& hits, const PairSink& pairs) const
    {
        const cudaStream_t st = stream_of(b.ctx);
        const uint32_t nc = uint32_t(v.clusters);
        if (nc == 0)
            return;
        const unsigned grid = plain_grid(b.ctx, uint64_t(nactive) * nc);
        // Every query of the tile starts without a stop (0xFF bytes: UINT32_MAX).
        GPU_CUDA_CHECK(cudaMemsetAsync(b.stop.data(), 0xFF, b.stop.bytes(), st));
        lc_stop_kernel<<<grid, kMetricThreads, 0, st>>>(b.matrix.as<uint32_t>(), nc, active,
                                                        nactive, v.radii, radius,
                                                        b.stop.as<uint32_t>());
        GPU_KERNEL_CHECK();
        lc_select_kernel<<<grid, kMetricThreads, 0, st>>>(
            b.matrix.as<uint32_t>(), nc, active, nactive, v.centres, v.radii, v.member_offsets,
            v.members, v.removed, radius, b.stop.as<uint32_t>(), hits, pairs);
        GPU_KERNEL_CHECK();
    }
};

// The device state a tile of tq queries needs: its matrix, the exact
// bounds, its stops; queries past those of the previous tiles reuse them.
void prepare_tile_buffers(SearchBuffers& b, uint32_t tq, size_t targets)
{
    reserve(b.ctx, b.matrix, std::max<size_t>(1, size_t(tq) * targets) * sizeof(uint32_t));
    reserve(b.ctx, b.unbounded, size_t(tq) * sizeof(uint32_t));
    GPU_CUDA_CHECK(cudaMemsetAsync(b.unbounded.data(), 0xFF, b.unbounded.bytes(), stream_of(b.ctx)));
    reserve(b.ctx, b.stop, size_t(tq) * sizeof(uint32_t));
    reserve(b.ctx, b.evaluated, size_t(tq) * sizeof(uint64_t));
}

// Starts a tile's evaluation counts at zero.
void clear_evaluated(SearchBuffers& b)
{
    GPU_CUDA_CHECK(cudaMemsetAsync(b.evaluated.data(), 0, b.evaluated.bytes(), stream_of(b.ctx)));
}

// The distance evaluations of a tile's count queries from `first` on: the
// distances to every pivot or centre (the GPU computes them all, where the
// engine's List of Clusters stops at its stop cluster) and the candidates'.
void add_tile_stats(SearchBuffers& b, size_t targets, size_t first, uint32_t count,
                    MetricBatchResult& out)
{
    std::vector<uint64_t> candidates(count, 0);
    copy_to_host(b.ctx, candidates.data(), b.evaluated.data(), count * sizeof(uint64_t));
    for (uint32_t q = 0; q < count; q++)
        out.stats[first + q].distance_evaluations = targets + candidates[q];
}

// Empty answers for nq queries.
MetricBatchResult no_hits(size_t nq)
{
    MetricBatchResult out;
    out.offsets.assign(nq + 1, 0);
    out.stats.resize(nq);
    return out;
}

template <class Method>
MetricBatchResult range_search(GpuContext& ctx, const Method& method, const WordList& queries,
                               const std::vector<uint32_t>& radii)
{
    const size_t nq = queries.size();
    const std::vector<uint32_t> rq = per_query_radii(radii, nq);
    check_metric_sizes(nq, method.objects(), "metric range search");
    if (nq == 0 || method.objects() == 0)
        return no_hits(nq);
    const QueryPatterns patterns(ctx, queries);
    // A hit's distance is at most its radius and at most the longer word.
    const uint32_t longest = std::max(patterns.max_length(), method.max_word_length());
    const KeyLayout keys = key_layout(std::min(*std::max_element(rq.begin(), rq.end()), longest));
    const uint32_t tq = tile_queries(nq, keys, method.targets());
    SearchBuffers b(ctx);
    prepare_tile_buffers(b, tq, method.targets());
    DeviceBuffer radius(ctx, nq * sizeof(uint32_t));
    radius.upload(rq.data(), nq * sizeof(uint32_t));

    MetricBatchResult out;
    out.offsets.reserve(nq + 1);
    out.offsets.push_back(0);
    out.stats.resize(nq);
    for (size_t first = 0; first < nq; first += tq) {
        const uint32_t count = uint32_t(std::min<size_t>(tq, nq - first));
        const DevPatterns pats = dev_patterns(patterns, first);
        const uint32_t* tile_radius = radius.as<uint32_t>() + first;
        clear_evaluated(b);
        const Grid grid = distance_grid(ctx, uint64_t(count) * method.targets(),
                                        patterns.max_blocks(), b.long_scratch);
        method.distances(b, pats, count, tile_radius, grid);
        const uint64_t found = collect_hits(
            b, pats, method.words(), method.removed(), tile_radius, keys.shift(),
            patterns.max_blocks(), [&](const HitSink& hits, const PairSink& pairs) {
                method.emit(b, nullptr, count, tile_radius, hits, pairs);
            });
        const std::vector<uint64_t> sorted = sorted_keys(b, found, keys.end_bit(count));
        size_t at = 0;
        for (uint32_t q = 0; q < count; q++) {
            for (; at < sorted.size() && keys.query(sorted[at]) == q; at++)
                out.hits.push_back(keys.hit(sorted[at]));
            out.offsets.push_back(out.hits.size());
        }
        add_tile_stats(b, method.targets(), first, count, out);
    }
    return out;
}

// A k-NN round's next radius: half again, at least one more, at most the
// radius that holds every word.
uint32_t next_radius(uint32_t r, uint32_t last)
{
    const uint64_t next = uint64_t(r) + std::max<uint32_t>(1, r / 2);
    return uint32_t(std::min<uint64_t>(next, last));
}

template <class Method>
MetricBatchResult knn_search(GpuContext& ctx, const Method& method, const WordList& queries,
                             size_t k)
{
    const size_t nq = queries.size();
    check_metric_sizes(nq, method.objects(), "metric k-NN search");
    if (nq == 0 || k == 0 || method.objects() == 0)
        return no_hits(nq);
    const QueryPatterns patterns(ctx, queries);
    const uint32_t longest = std::max(patterns.max_length(), method.max_word_length());
    const KeyLayout keys = key_layout(longest);
    const uint32_t tq = tile_queries(nq, keys, method.targets());
    SearchBuffers b(ctx);
    prepare_tile_buffers(b, tq, method.targets());
    reserve(ctx, b.radius, size_t(tq) * sizeof(uint32_t));
    reserve(ctx, b.active, size_t(tq) * sizeof(uint32_t));

    MetricBatchResult out;
    out.offsets.reserve(nq + 1);
    out.offsets.push_back(0);
    out.stats.resize(nq);
    std::vector<std::vector<MetricHit>> answer(tq);
    std::vector<uint32_t> radius(tq), last(tq), active, still;
    for (size_t first = 0; first < nq; first += tq) {
        const uint32_t count = uint32_t(std::min<size_t>(tq, nq - first));
        const DevPatterns pats = dev_patterns(patterns, first);
        // The exact distances to every pivot or centre, once for all rounds.
        const Grid grid = distance_grid(ctx, uint64_t(count) * method.targets(),
                                        patterns.max_blocks(), b.long_scratch);
        method.distances(b, pats, count, nullptr, grid);
        clear_evaluated(b);
        active.clear();
        for (uint32_t q = 0; q < count; q++) {
            // No distance exceeds the longer word's length: at that radius
            // every live object is a hit.
            last[q] = std::max(patterns.length(first + q), method.max_word_length());
            radius[q] = std::min<uint32_t>(1, last[q]);
            answer[q].clear();
            active.push_back(q);
        }
        while (!active.empty()) {
            copy_to_device(ctx, b.radius.data(), radius.data(), count * sizeof(uint32_t));
            copy_to_device(ctx, b.active.data(), active.data(), active.size() * sizeof(uint32_t));
            const uint32_t* dradius = b.radius.as<uint32_t>();
            const uint32_t nactive = uint32_t(active.size());
            const uint64_t found = collect_hits(
                b, pats, method.words(), method.removed(), dradius, keys.shift(),
                patterns.max_blocks(), [&](const HitSink& hits, const PairSink& pairs) {
                    method.emit(b, b.active.as<uint32_t>(), nactive, dradius, hits, pairs);
                });
            const std::vector<uint64_t> sorted = sorted_keys(b, found, keys.end_bit(count));
            // Active queries ascend, and so do the sorted keys' queries.
            size_t at = 0;
            still.clear();
            for (uint32_t q : active) {
                const size_t begin = at;
                while (at < sorted.size() && keys.query(sorted[at]) == q)
                    at++;
                const size_t held = at - begin;
                if (held < k && radius[q] < last[q]) {
                    radius[q] = next_radius(radius[q], last[q]);
                    still.push_back(q);
                    continue;
                }
                // Every object within radius[q] is held, sorted by (distance,
                // id): its first k are the k nearest, ties by the smaller id.
                for (size_t i = begin; i < begin + std::min(held, k); i++)
                    answer[q].push_back(keys.hit(sorted[i]));
            }
            active.swap(still);
        }
        for (uint32_t q = 0; q < count; q++) {
            out.hits.insert(out.hits.end(), answer[q].begin(), answer[q].end());
            out.offsets.push_back(out.hits.size());
        }
        add_tile_stats(b, method.targets(), first, count, out);
    }
    return out;
}

}  // namespace

}  // namespace metric

void set_metric_tile_queries(size_t max_queries) { metric::tile_query_limit = max_queries; }

MetricBatchResult sss_range(GpuContext& ctx, const SssDeviceView& index, const WordList& queries,
                            const std::vector<uint32_t>& radii)
{
    return metric::range_search(ctx, metric::SssMethod{index}, queries, radii);
}

MetricBatchResult lc_range(GpuContext& ctx, const LcDeviceView& index, const WordList& queries,
                           const std::vector<uint32_t>& radii)
{
    return metric::range_search(ctx, metric::LcMethod{index}, queries, radii);
}

MetricBatchResult sss_knn(GpuContext& ctx, const SssDeviceView& index, const WordList& queries,
                          size_t k)
{
    return metric::knn_search(ctx, metric::SssMethod{index}, queries, k);
}

MetricBatchResult lc_knn(GpuContext& ctx, const LcDeviceView& index, const WordList& queries,
                         size_t k)
{
    return metric::knn_search(ctx, metric::LcMethod{index}, queries, k);
}

}  // namespace gpuivfpq::gpu
