// Device-resident IVF index with RaBitQ codes (src/engine/rabitq.h,
// docs/rabitq-codes.md): the list centroids, the rotation P and each list's
// P c, and inverted lists of rows (a code's bit planes, then its
// RabitqFactors, as the index pages hold them; rows of
// kRabitqInterleaveFromBytes or more interleaved word by word) with ids and optionally
// filter keys. A search ranks each query's probed lists by the codes'
// distance estimates: per (query, list) pair one block builds the nibble
// tables from q' = P q - P c in shared memory and scans the list; then a
// k-selection per query. The estimates are RabitqModel::scan's bit for bit
// (the same sums in the same order, no fused multiply-add).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "engine/distances.h"
#include "engine/rabitq.h"
#include "gpu_ivfpq/ivfpq_index.h"

namespace gpuivfpq::gpu {

class GpuContext;

// Rows of at least this many bytes are kept interleaved on the device,
// kRabitqInterleaveRows at a time (gpu/src/list_layout.cuh): a list's
// capacity is then a whole number of such blocks.
constexpr size_t kRabitqInterleaveFromBytes = 256;
constexpr size_t kRabitqInterleaveRows = 32;

class GpuRabitqIndex {
public:
    // centroids: lists x d floats (normalised rows' centroids for Cosine);
    // model: rabitq_model_bytes(d, lists) bytes, the rotation then P c
    // (engine/rabitq.h); host pointers. With filter_keys each entry keeps
    // an int64 key (KeyRange). Throws InvalidArgument for d outside 1 ..
    // kRabitqMaxDims, bits outside 1..8 or non-finite model values,
    // Unsupported when a list's tables (d / 8 * 32 floats and d doubles, 48
    // KiB at d = 2000) do not fit a block's shared memory, OutOfMemory
    // beyond the budget.
    GpuRabitqIndex(GpuContext& ctx, size_t d, size_t lists, int bits, Metric metric, const float* centroids,
                   const void* model, bool filter_keys = false);
    ~GpuRabitqIndex();
    GpuRabitqIndex(const GpuRabitqIndex&) = delete;
    GpuRabitqIndex& operator=(const GpuRabitqIndex&) = delete;

    size_t d() const;
    size_t lists() const;
    int bits() const;
    Metric metric() const;
    // Bytes of an entry's row: rabitq_row_bytes(d, bits).
    size_t row_bytes() const;
    size_t ntotal() const;
    size_t list_size(size_t list) const;
    bool has_keys() const;
    GpuMemoryUse memory_use() const;

    // Appends n entries (host): list_ids[i], rows[i * row_bytes() ..],
    // ids[i] and, exactly with filter_keys, keys[i] (else
    // Error(InvalidArgument), the index unchanged).
    void add(size_t n, const int32_t* list_ids, const uint8_t* rows, const int64_t* ids,
             const int64_t* keys = nullptr);
    // Removes every entry whose id is in ids[0..n) (duplicates and unknown
    // ids allowed); returns how many went.
    size_t remove_ids(const int64_t* ids, size_t n);

    // The k entries with the smallest rank keys among each query's nprobe
    // nearest lists (L2 to the centroids; inner product for InnerProduct),
    // ascending, padded with (+inf, -1): dist the keys, labels the ids. The
    // keys are RabitqModel::scan_keys's, bit for bit: the estimates (eps0 =
    // 0), or the lower bounds estimate - bound at eps0 (> 0).
    // With ranges (filter_keys only, else Error(InvalidArgument)), only the
    // entries within each query's key range, and matched (when set) counts
    // them over its probed lists. Host pointers: queries nq x d, dist and
    // labels nq x k. Throws InvalidArgument for k outside 1..kMaxSelectK or
    // nprobe (clamped to the lists) above kMaxSelectK.
    void search(const float* queries, size_t nq, size_t k, size_t nprobe, float* dist, int64_t* labels,
                const KeyRange* ranges = nullptr, float eps0 = 0.0f) const;
    // Small batches (up to 128 queries) replay a CUDA graph of a call's
    // device work from the second call of the same shape on (the third when
    // the first grew the context's scratch), and stage their queries and
    // answers in page-locked memory, as GpuIvfPqIndex's do (on by default).
    // So a search, const as it is, changes the index's staging and graphs:
    // like every call on a GpuContext, one thread at a time. Bench and test
    // aids: switch the graphs, count the calls a graph served.
    void set_search_graphs(bool on);
    size_t search_graph_launches() const;

    // Batches of at most `queries` (0, the default: none, as measured on
    // H100s: rabitq_index.cu) search in one kernel launch after the
    // rotation (rabitq_small.h: a thread-block cluster per query, the
    // selections in shared memory) instead of the staged kernels, where k
    // and nprobe are at most 128 and the shape fits a block's shared
    // memory; the same keys and labels. set_small_cluster forces the
    // blocks per query (1 .. 16; 0 chooses); small_search_launches counts
    // the tiles of queries that took that path (a replayed graph's too).
    // Bench and test aids.
    void set_small_batch_max(size_t queries);
    void set_small_cluster(int blocks);
    size_t small_search_launches() const;
    // Rows of a probed list that one block of the staged search scores
    // (a multiple of 256 in [256, 16384]; 0, the default: 512 for tiles of
    // up to 8 queries, else 1024): a bench aid.
    void set_rows_per_block(int rows);

    // Test aid: the probed lists of each query as the search picks them
    // (nq x nprobe, nearest first; host).
    void probe_lists(const float* queries, size_t nq, size_t nprobe, int32_t* lists) const;
    // A build's assignment (host in / out): each of n rows' L2-nearest list,
    // Cosine rows normalised first, for every metric, as RabitqModel::assign
    // does on the CPU (float sums in another order: a row about equally near
    // two centroids may go to the other one; either is a valid index).
    void assign(const float* x, size_t n, int32_t* list_ids) const;
    // A build's rows (host in / out): each of n rows' code and factors
    // (row_bytes() bytes: its bit planes, then RabitqFactors) against its
    // list list_ids[i] (below lists(), else Error(InvalidArgument)), as
    // RabitqModel::encode writes them, bit for bit: the same residual,
    // rotation order, grid point and factors (engine/rabitq_row.h).
    void encode(const float* x, size_t n, const int32_t* list_ids, uint8_t* rows) const;

    struct Impl;

private:
    std::unique_ptr<Impl> impl_;
};

// Test aid: rabitq_best_grid_point of n vectors o (host, n x d doubles, unit
// length or zero) as the GPU's build encoder computes it (the sweep of
// engine/rabitq_row.h, a thread a vector): x (n x d values) and out (n).
void rabitq_grid_points_gpu(GpuContext& ctx, const double* o, size_t n, size_t d, int bits, uint8_t* x,
                            RabitqGridPoint* out);

}  // namespace gpuivfpq::gpu
