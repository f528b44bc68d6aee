// Device-resident IVFPQ index: the mirror of a trained IvfPqModel (coarse
// centroids, PQ codebooks, precomputed term-1 tables) plus inverted lists of
// codes and ids, with IVFADC search.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/distances.h"
#include "engine/ivfpq.h"
#include "engine/kmeans.h"
#include "engine/search_limits.h"

namespace gpuivfpq::gpu {

class GpuContext;

// How the list scan meets k-selection: Fused scans and selects in one
// kernel (tables in shared memory, BlockSelect in registers); TwoPass writes
// every candidate distance to device memory and k-selects it afterwards (the
// paper's scheme). Auto picks Fused for query-only tables (the default
// term-1-per-vector layout, and inner product), TwoPass for per-list tables.
// Only Auto is used by the service; Fused / TwoPass are forced by the
// benchmark and the tests (bench option, see GpuIvfPqOptions).
enum class ScanAlgo { Auto, Fused, TwoPass };

// What search returns as labels: the stored ids, or list << 32 | offset.
enum class LabelKind { Ids, ListOffset };

struct GpuIvfPqOptions {
    // fp16 lookup tables (and fp16 per-list term 1), accumulation in float:
    // 1.3-1.45x at PQ64, recall unchanged in the benchmark (gpu/NOTES.md).
    bool float16_tables = false;
    // Keep each entry's float32 vector (d floats, as given to add_encoded /
    // add, never normalised) on the device beside its code, so search_exact
    // can re-rank the ADC candidates by the SQL operators' exact distance
    // without a trip to the heap. Costs d * 4 bytes per entry.
    bool store_vectors = false;
    // Keep one int64 filter key per entry on the device (given to
    // add_encoded / add, moved with its entry by remove_ids), so that a
    // search can restrict each query to a key range (KeyRange). Costs 8
    // bytes per entry.
    bool filter_keys = false;

    // ---- Bench options: the paper's layouts, kept to measure the default
    // against them (gpu/bench/gpu_bench.cpp) and tested against the CPU
    // engine (gpu/tests). The service uses the defaults. ----

    // L2 / Cosine: fold term 1 into one float per stored vector (||r||^2 +
    // 2<c, r>, computed when it is added), so the scan's table depends on the
    // query alone and is built once per query instead of once per (query,
    // list); 7x faster than per-list tables at PQ64. Off (bench): the paper's
    // per-list term-1 tables (below), or direct tables when they do not fit.
    bool term1_per_vector = true;
    // Bench, with term1_per_vector off: per-list term-1 tables if they take
    // <= precompute_max_bytes (else direct tables).
    bool precompute_term1 = true;
    size_t precompute_max_bytes = size_t(1) << 30;
    // Bench: force the fused or the two-pass scan (Auto: see ScanAlgo).
    ScanAlgo scan = ScanAlgo::Auto;
    // Fused scan: the blocks per SM it aims for when it splits each query's
    // probes into chunks (one block per query and chunk; at least one probe
    // per chunk). More blocks fill the device at small batches; fewer
    // chunks load each query's table fewer times and leave less to merge.
    // 4 (H100, IVF4096,PQ32, nprobe 32, 100 candidates): 8% less time per
    // call than 8 at batches 32 and 128, the same at 1 and 8 (gpu_bench
    // --stages); 1 is 5-7% slower than 8.
    int fused_blocks_per_sm = 4;
    // search_exact / search_exact_device batches of up to this many queries
    // run as one kernel launch (a thread-block cluster per query: coarse
    // step, table, scan, re-rank and order; gpu/NOTES.md), when the shape
    // allows (per-vector or inner-product tables in fp32, not the two-pass
    // scan, k and nprobe up to 128, the table in shared memory); larger
    // batches and other shapes run the staged pipeline. Same answers either
    // way (up to ties at the k-th ADC candidate). 256 (the service's
    // largest batch): on an H200 (IVF4096,PQ32, nprobe 32, 100 candidates)
    // the one launch takes 0.43x the staged pipeline's device time at batch
    // 1, 0.61x at 16, 0.68x at 32, 0.78x at 64, 0.78x at 128 and 0.93x at
    // 256 (gpu_bench --stages, one run: bench/gpu/results/kernel-stages).
    // 0 turns the path off.
    size_t small_batch_max = 256;
    // One-launch path: blocks per query. 0 chooses them from the batch and
    // the device (see small_search_plan); any size from 1 to 16 forces it
    // (bench and test aid: the answers are the same for every value).
    int small_cluster = 0;
    // One-launch path: when the batch's blocks are fewer than the
    // multiprocessors, give each block a multiprocessor of its own (the
    // blocks of a cluster may otherwise share one). Same answers either
    // way. Off: on an H200 (IVF4096,PQ32, nprobe 32, 100 candidates) it
    // gained nothing at batch 1 and cost 50% at batch 8, where 16-block
    // clusters of one block per multiprocessor no longer all fit at once
    // (gpu_bench --stages, bench/gpu/results/kernel-stages).
    bool small_spread = false;
    // One-launch path, batches of this many queries or more: the batch's
    // coarse keys computed first by a kernel of their own (each centroid
    // row read once per 4 queries) instead of by each query's blocks; 0:
    // never. Same answers either way. 16: on an H200 (IVF4096,PQ32, 100
    // candidates; wall us per call, the batch's kernel / each query's
    // blocks, nprobe 80) 8: 82.1 / 80.3, 14: 90.3 / 89.9, 16: 103.2 /
    // 106.1, 24: 110.5 / 112.3, 32: 123.3 / 126.6, 64: 222.1 / 230.6
    // (nprobe 32 alike; gpu_bench --small-ab, its table "coarse keys").
    size_t small_shared_coarse_from = 16;
    // One-launch path, bench aid: how a block's codes are asked for ahead
    // of its list scan: 0 (or any other value) every line of the block's
    // share into L1 before the scan, 1 none, 2 every line into L2, 3 into
    // L1 2048 entries ahead of each scan step (the first 2048 before the
    // scan). Same answers either way. 1:
    // on an H200 (IVF4096,PQ32, 100 candidates, nprobe 80 and 32) none was
    // the fastest at every batch from 1 to 64, by 1-4% (gpu_bench
    // --small-ab): a block's share of the codes (up to 285 KB at nprobe
    // 80) does not fit its L1, and finding each line's probe costs a
    // binary search.
    int small_scan_prefetch = 1;
    // One-launch path, calls from host memory: the kernel reads the
    // queries (and key ranges) from, and writes its answers into, the
    // call's page-locked staging itself instead of copies to and from
    // device memory: 0 copies both ways, 1 answers written in place, 2
    // both (inputs only below small_shared_coarse_from queries, and
    // dimensions up to 256: every block reads its query over the bus). Same
    // answers either way. 2: on an H200 (IVF4096,PQ32, 100 candidates) it
    // took 4-7% off each call from batch 1 to 64 at nprobe 80 and 32
    // (batch 1, nprobe 32: 57.3 -> 53.2 us; gpu_bench --small-ab).
    int small_zero_copy = 2;
};

struct GpuMemoryUse {
    size_t centroids = 0, codebooks = 0, term1 = 0, codes = 0, ids = 0, vector_terms = 0, vectors = 0,
           keys = 0, list_meta = 0;
    size_t total() const
    {
        return centroids + codebooks + term1 + codes + ids + vector_terms + vectors + keys + list_meta;
    }
};

// Per-query inclusive ranges on the entries' filter keys (filter_keys):
// query q considers only the entries with lo[q] <= key <= hi[q]; the others
// behave as if absent from the lists (never candidates, so a row with fewer
// than k entries in range is padded with (+inf, -1)). lo > hi passes none.
// nq entries each; host pointers for search / search_exact, device
// pointers for search_device / search_exact_device. matched, when set
// (nq, out), receives how many entries of each query's probed lists lie in
// its range: the caller's estimate of the filter's selectivity.
struct KeyRange {
    const int64_t* lo = nullptr;
    const int64_t* hi = nullptr;
    int64_t* matched = nullptr;
};

// Bench aid: where one search_exact call's time goes (milliseconds, summed
// over the calls timed). Device stages are measured with CUDA events on the
// index's stream (when a call needs several query tiles, the last tile's);
// wall is the host's time for the whole call, so wall minus the stages is
// what the host spends launching and waiting.
struct SearchStages {
    double upload = 0, coarse = 0, prefix = 0, scan = 0, merge = 0, decode = 0, rerank = 0,
           download = 0, wall = 0;
    size_t calls = 0;
};

class GpuIvfPqIndex {
public:
    // centroids: lists x d, codebooks: m x 256 x (d/m), host pointers (as
    // IvfPqModel holds them). Throws Unsupported for m outside
    // 1..kMaxGpuSubQuantizers (src/engine/limits.h) or d not a multiple of m,
    // OutOfMemory when the mirror exceeds the budget.
    GpuIvfPqIndex(GpuContext& ctx, size_t d, size_t lists, size_t m, Metric metric,
                  const float* centroids, const float* codebooks, const GpuIvfPqOptions& opt = {});
    ~GpuIvfPqIndex();
    GpuIvfPqIndex(const GpuIvfPqIndex&) = delete;
    GpuIvfPqIndex& operator=(const GpuIvfPqIndex&) = delete;

    size_t d() const;
    size_t lists() const;
    size_t m() const;
    Metric metric() const;
    size_t ntotal() const;
    size_t list_size(size_t list) const;
    bool has_precomputed() const;
    GpuMemoryUse memory_use() const;

    // Bench aid: with stages set, each search_exact call records CUDA
    // events between its stages and adds their times to *stages (null:
    // off, the default; the events then cost nothing).
    void set_stage_timing(SearchStages* stages);

    // Small batches (up to 128 queries) replay a CUDA graph of a call's
    // device work (between its copies) from the third call of the same
    // shape on (on by default; off drops the graphs). Bench and test aids:
    // switch them, and count the calls a graph served.
    void set_search_graphs(bool on);
    size_t search_graph_launches() const;
    // Test aid: host calls whose kernel read its inputs from, or wrote its
    // answers into, the page-locked staging in place (small_zero_copy).
    size_t zero_copy_calls() const;

    // Bench aids (gpu/bench): switch the table precision (rebuilding any
    // per-list term 1) or the scan between timings on one index.
    void set_float16_tables(bool on);
    void set_scan_algo(ScanAlgo algo);
    void set_fused_blocks_per_sm(int blocks);  // GpuIvfPqOptions::fused_blocks_per_sm, >= 1
    void set_small_batch_max(size_t queries);  // GpuIvfPqOptions::small_batch_max
    void set_small_cluster(int blocks);        // GpuIvfPqOptions::small_cluster: 0, or 1 .. 16
    void set_small_spread(bool on);            // GpuIvfPqOptions::small_spread
    void set_small_shared_coarse_from(size_t queries);  // GpuIvfPqOptions::small_shared_coarse_from
    void set_small_scan_prefetch(int mode);             // GpuIvfPqOptions::small_scan_prefetch
    void set_small_zero_copy(int mode);                 // GpuIvfPqOptions::small_zero_copy
    // Whether a search_exact of nq queries with this k and nprobe would run
    // as one launch (test and bench aid).
    bool small_batch_path(size_t nq, size_t k, size_t nprobe) const;
    // Bench aid: with on, each one-launch search_exact records block 0's
    // clock (cycles) at the end of each of its phases; small_batch_trace()
    // gives the last call's cycles per phase (empty before one ran): the 15
    // phases, then the scan selection's radix, pick, rank and broadcast (-1
    // when it streamed through WarpSelect), then the re-rank's exchange of
    // positions, staging and distances, then block 0's clock in GHz (its
    // cycles per global-timer nanosecond; not cycles).
    void set_small_batch_trace(bool on);
    std::vector<double> small_batch_trace() const;
    // Bench aid, with the trace on: for each block of the last one-launch
    // call (at most 4096), three values: its global timer (ns) at its start
    // and at its end, and the multiprocessor it ran on.
    std::vector<unsigned long long> small_batch_blocks() const;
    // Bench aid: for clusters of 1 to 16 blocks, the one-launch
    // kernel's shared memory per block for this k and nprobe, and how many
    // clusters can be resident at once with it, with 32 KiB less, and with
    // half of it; and the kernel's registers per thread.
    struct SmallOccupancyRow {
        int cluster = 0;
        size_t smem = 0;
        int active = 0, active_less_32k = 0, active_half = 0, registers = 0;
    };
    std::vector<SmallOccupancyRow> small_batch_occupancy(size_t k, size_t nprobe) const;

    // Appends n encoded vectors (host): list_ids[i], codes[i*m..], ids[i],
    // with store_vectors their vectors[i*d..] (host, n x d) and with
    // filter_keys their keys[i] (host, n). Each of vectors and keys is
    // required when the option is on and refused when it is off
    // (Error(InvalidArgument), the index unchanged).
    void add_encoded(size_t n, const int32_t* list_ids, const uint8_t* codes, const int64_t* ids,
                     const float* vectors = nullptr, const int64_t* keys = nullptr);
    // Encodes n raw vectors (host, n x d) on the GPU and appends them (and
    // x itself as their vectors with store_vectors), with keys[i] as
    // add_encoded takes them (required exactly with filter_keys).
    void add(size_t n, const float* x, const int64_t* ids, const int64_t* keys = nullptr);
    // Removes every stored vector whose id is in ids[0..n) (duplicates and
    // unknown ids allowed); returns how many stored vectors went. The ids are
    // found on the device and each list is compacted in place, order kept
    // (codes, ids, per-vector terms, stored vectors and keys alike).
    size_t remove_ids(const int64_t* ids, size_t n);

    // GPU encoding (host in/out), as IvfPqModel::encode does on the CPU.
    void encode(const float* x, size_t n, int32_t* list_ids, uint8_t* codes) const;

    // k nearest for nq queries through nprobe lists. Host pointers: queries
    // nq x d, dist / labels nq x k; padded with (+inf, -1). With ranges
    // (filter_keys only, else Error(InvalidArgument); lo and hi both set),
    // each query among the entries of its probed lists within its key range.
    void search(const float* queries, size_t nq, size_t k, size_t nprobe, float* dist,
                int64_t* labels, LabelKind kind = LabelKind::Ids,
                const KeyRange* ranges = nullptr) const;
    // Same with device pointers (ranges->lo / hi too; the struct itself on
    // the host), results left on the device (no host sync).
    void search_device(const float* queries, size_t nq, size_t k, size_t nprobe, float* dist,
                       int64_t* labels, LabelKind kind = LabelKind::Ids,
                       const KeyRange* ranges = nullptr) const;

    // search()'s candidates (the same k by ADC over the same nprobe lists,
    // ties included) re-ranked by exact_distance (src/engine/exact_distance.h)
    // between the query as given and each candidate's stored vector: per
    // query sorted by exact_less (distance, NaN last, then id), padded with
    // (+inf, -1) where fewer than k candidates exist. The distances are bit
    // for bit those of the SQL operators. Requires store_vectors (else
    // Error(Unsupported)). Host pointers: queries nq x d, dist / labels nq x k.
    // ranges as search() takes them: the candidates are search()'s with them.
    void search_exact(const float* queries, size_t nq, size_t k, size_t nprobe, double* dist,
                      int64_t* labels, const KeyRange* ranges = nullptr) const;
    // Same with device pointers (ranges->lo / hi too), results left on the
    // device (no host sync).
    void search_exact_device(const float* queries, size_t nq, size_t k, size_t nprobe, double* dist,
                             int64_t* labels, const KeyRange* ranges = nullptr) const;

    // k nearest stored vectors of each query by exact distance: every stored
    // vector is a candidate (no list probing). Candidates are preselected with
    // the fused fp32 GEMM + k-selection (gpu::exact_knn, over a copy of the
    // stored vectors gathered into one contiguous buffer for the call), with
    // a margin (min(kMaxSelectK, max(2k, k + 32)) candidates, so that fp32
    // rounding near the k-th distance cannot push a true neighbour out), and
    // then given their exact distance (gpuivfpq::exact_distance,
    // src/engine/exact_distance.h: the SQL operators' bit-exact double
    // computation, on the query as given and the stored vector, the index's
    // metric); per query the first k by exact_less (distance, NaN last, then
    // id), padded with (+inf, -1). Requires store_vectors (else
    // Error(Unsupported)); k in 1..kMaxSelectK (else InvalidArgument). The
    // gathered copy takes ntotal * (d * 4 + 12) bytes for the call: beyond
    // the budget, Error(OutOfMemory) (the index unchanged). Host pointers:
    // queries nq x d, dist / labels nq x k.
    void search_brute_force(const float* queries, size_t nq, size_t k, double* dist,
                            int64_t* labels) const;

    // Test aid (gpu/tests): the lookup tables the scan uses, materialised in
    // the per-list form the CPU engine's list_table gives (host outputs): for
    // each query and probe, lists (nq x nprobe), base (nq x nprobe) and
    // tables (nq x nprobe x m x 256) with distance = base + sum_j table[j][code_j].
    void compute_tables(const float* queries, size_t nq, size_t nprobe, int32_t* lists,
                        float* base, float* tables) const;

    struct Impl;

private:
    std::unique_ptr<Impl> impl_;
};

// Trains an IVFPQ model on the GPU (host data n x d) as IvfPqModel::train
// does on the CPU, with the same random draws for one seed (the engine's
// ivfpq_training_rows, k-means subsample and initial rows): coarse k-means
// into lists centroids on the coarse rows, then PQ k-means on the residuals
// of the PQ rows. The results differ from the CPU's only by float rounding
// in the iterations. Outputs (host): centroids lists x d, codebooks
// m x 256 x (d/m), as IvfPqModel::set_* take them. For Cosine the data are
// normalised first.
void train_ivfpq_gpu(GpuContext& ctx, const float* x, size_t n, size_t d, size_t lists, size_t m,
                     Metric metric, const IvfPqTrainParams& params, float* centroids,
                     float* codebooks);

// The same with the k-means parameters given apart: the rows are drawn with
// coarse.seed and coarse.max_points_per_centroid, at most pq_max_training
// PQ rows (0: all n); sub-quantizer j trains with
// pq_subquantizer_seed(pq.seed, j) on all the PQ rows
// (pq.max_points_per_centroid is not used). The overload above passes
// ivfpq_coarse_params and ivfpq_pq_params.
void train_ivfpq_gpu(GpuContext& ctx, const float* x, size_t n, size_t d, size_t lists, size_t m,
                     Metric metric, const KMeansParams& coarse, const KMeansParams& pq,
                     size_t pq_max_training, float* centroids, float* codebooks);

}  // namespace gpuivfpq::gpu
