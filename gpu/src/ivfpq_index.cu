// GpuIvfPqIndex: the device mirror (centroids, codebooks, term-1 tables,
// per-list code, id and optionally vector and filter-key buffers) and the
// IVFADC search pipeline (coarse k-NN -> term 3 GEMM -> list scan with
// k-selection, optionally within per-query key ranges -> labels, or -> exact
// re-rank of the candidates), and the exact brute force over the stored
// vectors (gather -> fp32 GEMM k-NN -> exact re-rank).
#include "gpu_ivfpq/ivfpq_index.h"

#include <algorithm>
#include <exception>
#include <optional>
#include <chrono>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>

#include "context_impl.h"
#include "cuda_check.h"
#include "exact_rerank.h"
#include "gpu_ivfpq/device_buffer.h"
#include "gpu_ivfpq/exact_search.h"
#include "gpu_ivfpq/gpu_context.h"
#include "gpu_ivfpq/k_select.h"
#include "gpu_ivfpq/kmeans_gpu.h"
#include "ivf_scan.cuh"
#include "ivfpq_kernels.h"
#include "list_store.h"
#include "search_graphs.h"
#include "search_io.h"
#include "select_args.h"
#include "small_search.h"

namespace gpuivfpq::gpu {

namespace {

// Throws Unsupported unless 1 <= m <= kMaxGpuSubQuantizers and m divides d.
void check_subquantizers(const char* who, size_t d, size_t m)
{
    if (m < 1 || m > kMaxGpuSubQuantizers || d == 0 || d % m != 0) {
        std::ostringstream os;
        os << who << ": m = " << m << " not supported for d = " << d << " (needs 1 <= m <= "
           << kMaxGpuSubQuantizers << " and d a multiple of m)";
        throw Error(ErrorKind::Unsupported, os.str());
    }
}

}  // namespace

struct GpuIvfPqIndex::Impl : ListStore, SearchIo {
    size_t dsub = 0;
    Metric metric = Metric::L2;
    GpuIvfPqOptions opt;
    DeviceBuffer centroids, centroid_norms, codebooks, term1;
    bool precomputed = false;
    bool term1_half = false;

    // Bench aid (set_small_batch_trace): the one-launch kernel's phase clocks.
    DeviceBuffer small_trace;
    // The trace's words after the last call (empty without a trace).
    std::vector<unsigned long long> trace_words() const
    {
        if (!small_trace.data())
            return {};
        std::vector<unsigned long long> t(kSmallTraceWords);
        ctx.synchronize();
        small_trace.download(t.data(), t.size() * sizeof(unsigned long long));
        return t;
    }

    Impl(GpuContext& c) : ListStore(c), SearchIo(c) {}

    cudaStream_t st() const { return ctx.impl().stream; }
    Metric coarse_metric() const { return metric == Metric::InnerProduct ? Metric::InnerProduct : Metric::L2; }
    bool per_vector() const { return metric != Metric::InnerProduct && opt.term1_per_vector; }
    // The scan's decomposition.
    int table_mode() const
    {
        if (metric == Metric::InnerProduct || per_vector())
            return kTableQuery;
        return precomputed ? kTablePrecomputed : kTableDirect;
    }
    // compute_tables() materialises per-(query, list) tables: the per-list
    // form (with term 1 tables if held), never the per-vector fold.
    int list_table_mode() const
    {
        if (metric == Metric::InnerProduct)
            return kTableTerm3;
        return precomputed ? kTablePrecomputed : kTableDirect;
    }

    // Bench layout (term1_per_vector off): the paper's per-list term-1 tables.
    void build_term1()
    {
        term1.reset();
        precomputed = false;
        if (metric == Metric::InnerProduct || !opt.precompute_term1 || per_vector())
            return;
        const size_t bytes = lists * m * 256 * (opt.float16_tables ? 2 : 4);
        if (bytes > opt.precompute_max_bytes)
            return;
        term1 = DeviceBuffer(ctx, bytes);
        launch_term1(centroids.as<float>(), static_cast<int64_t>(lists), codebooks.as<float>(),
                     static_cast<int>(d), static_cast<int>(m), term1.data(), opt.float16_tables, st());
        precomputed = true;
        term1_half = opt.float16_tables;
    }

    // Queries to use on the device (normalised copy for Cosine).
    const float* prepare_queries(const float* q, size_t nq, float* copy)
    {
        if (metric != Metric::Cosine)
            return q;
        GPU_CUDA_CHECK(cudaMemcpyAsync(copy, q, nq * d * sizeof(float), cudaMemcpyDeviceToDevice, st()));
        normalize_rows(ctx, copy, nq, d);
        return copy;
    }

    void coarse_and_term3(const float* q, size_t nq, size_t nprobe, float* probe_dist,
                          int32_t* probe_lists, float* term3)
    {
        exact_knn_i32(ctx, q, nq, centroids.as<float>(), lists, d, coarse_metric(), nprobe,
                      probe_dist, probe_lists, centroid_norms.as<float>());
        // The probed lists' base distances recomputed directly: the GEMM
        // form cancels badly near a centroid (the CPU engine does the same).
        launch_exact_base(q, static_cast<int64_t>(nq), static_cast<int>(nprobe), static_cast<int>(d),
                          centroids.as<float>(), probe_lists, metric == Metric::InnerProduct,
                          probe_dist, st());
        if (table_mode() != kTableDirect || list_table_mode() != kTableDirect)
            compute_term3(ctx, q, static_cast<int64_t>(nq), codebooks.as<float>(), static_cast<int>(d),
                          static_cast<int>(m), metric == Metric::InnerProduct ? -1.0f : -2.0f, term3);
    }

    // key_lo / key_hi: the tile's key ranges (device, nq each), or null.
    IvfScanArgs scan_args(const float* q, size_t nq, size_t nprobe, size_t k, const float* probe_dist,
                          const int32_t* probe_lists, const int32_t* prefix, const float* term3,
                          const int64_t* key_lo = nullptr, const int64_t* key_hi = nullptr,
                          int64_t* key_matched = nullptr) const
    {
        IvfScanArgs a;
        a.nq = static_cast<int>(nq);
        a.nprobe = static_cast<int>(nprobe);
        a.m = static_cast<int>(m);
        a.dsub = static_cast<int>(dsub);
        a.d = static_cast<int>(d);
        a.k = static_cast<int>(k);
        a.mode = table_mode();
        a.probe_lists = probe_lists;
        a.probe_dist = probe_dist;
        a.prefix = prefix;
        a.list_codes = code_ptrs.as<const uint8_t* const>();
        a.list_len = lens.as<int32_t>();
        a.list_term1 = per_vector() ? vt_ptrs.as<const float* const>() : nullptr;
        a.term1 = term1.data();
        a.term3 = term3;
        a.queries = q;
        a.centroids = centroids.as<float>();
        a.codebooks = codebooks.as<float>();
        if (key_lo) {
            a.list_keys = key_ptrs.as<const int64_t* const>();
            a.key_lo = key_lo;
            a.key_hi = key_hi;
            a.key_matched = reinterpret_cast<unsigned long long*>(key_matched);
        }
        return a;
    }

    // search_device's checks and query tiling (shared by search_exact_device,
    // whose candidates must be search's: the same tiles split the probes
    // over the same fused-scan blocks, so even ties resolve alike).
    struct Plan {
        size_t nprobe, tile;
        ScanAlgo algo;
    };
    Plan plan_search(size_t nq, size_t k, size_t nprobe) const;

    // Throws InvalidArgument for ranges on an index without keys, or with
    // lo or hi missing (who: the caller, for the message).
    void check_ranges(const char* who, const KeyRange* ranges) const
    {
        if (!ranges)
            return;
        if (!opt.filter_keys)
            throw Error(ErrorKind::InvalidArgument,
                        std::string(who) + ": key ranges given to an index without filter_keys");
        if (!ranges->lo || !ranges->hi)
            throw Error(ErrorKind::InvalidArgument, std::string(who) + ": key range without lo or hi");
    }

    // What a captured search graph of this index depends on besides its
    // staging (SearchIo::host_search adds that): its shape and every device
    // address it reads that a later change may move (buffers reallocated
    // give a new key; list contents and lengths are read when it runs).
    SearchGraphs::Key graph_key(size_t nq, size_t k, size_t nprobe, int variant) const
    {
        SearchGraphs::Key key = {nq, k, nprobe, static_cast<uint64_t>(static_cast<int64_t>(variant)),
                                 static_cast<uint64_t>(table_mode()), opt.float16_tables, term1_half,
                                 static_cast<uint64_t>(opt.scan), static_cast<uint64_t>(opt.fused_blocks_per_sm),
                                 // Only the two-pass scan sizes its buffers by the longest list.
                                 opt.scan == ScanAlgo::TwoPass || table_mode() != kTableQuery ? max_len : 0,
                                 opt.small_batch_max, static_cast<uint64_t>(opt.small_cluster),
                                 opt.small_spread, opt.small_shared_coarse_from,
                                 static_cast<uint64_t>(opt.small_scan_prefetch),
                                 static_cast<uint64_t>(opt.small_zero_copy)};
        for (const DeviceBuffer* b : {&centroids, &centroid_norms, &codebooks, &term1, &code_ptrs, &id_ptrs,
                                      &vt_ptrs, &vec_ptrs, &key_ptrs, &lens, &small_trace})
            key.push_back(reinterpret_cast<uintptr_t>(b->data()));
        return key;
    }

    // The one-launch path's arguments for nq queries (nprobe clamped, as
    // plan_search gives it), without the inputs and answers.
    SmallSearchArgs small_args(size_t nq, size_t k, size_t nprobe) const
    {
        SmallSearchArgs a;
        a.nq = static_cast<int>(nq);
        a.d = static_cast<int>(d);
        a.m = static_cast<int>(m);
        a.lists = static_cast<int>(lists);
        a.nprobe = static_cast<int>(nprobe);
        a.k = static_cast<int>(k);
        a.metric = metric;
        a.centroids = centroids.as<float>();
        a.centroid_norms = centroid_norms.as<float>();
        a.codebooks = codebooks.as<float>();
        a.list_codes = code_ptrs.as<const uint8_t* const>();
        a.list_len = lens.as<int32_t>();
        a.list_term1 = per_vector() ? vt_ptrs.as<const float* const>() : nullptr;
        a.list_vectors = vec_ptrs.as<const float* const>();
        a.list_ids = id_ptrs.as<const int64_t* const>();
        a.scan_prefetch = opt.small_scan_prefetch;
        return a;
    }
    // Blocks per query of the one-launch path for a search_exact of nq
    // queries, or 0 for the staged pipeline: batches up to
    // small_batch_max, the default layout (query-only fp32 tables, not the
    // two-pass scan), k and nprobe (clamped) up to kSmallSearchMaxK.
    SmallLaunch small_launch(size_t nq, size_t k, size_t nprobe) const
    {
        if (nq == 0 || nq > opt.small_batch_max || !opt.store_vectors || table_mode() != kTableQuery ||
            opt.float16_tables || opt.scan == ScanAlgo::TwoPass || k > static_cast<size_t>(kSmallSearchMaxK) ||
            nprobe > static_cast<size_t>(kSmallSearchMaxK) || nprobe * max_len >= (size_t(1) << 31))
            return SmallLaunch{};
        return small_search_plan(small_args(nq, k, nprobe), ctx.multiprocessors(), opt.small_cluster,
                                 opt.small_spread);
    }
    // The one-launch path computes the batch's coarse keys first
    // (GpuIvfPqOptions::small_shared_coarse_from).
    bool shared_keys(size_t nq) const
    {
        return opt.small_shared_coarse_from > 0 && nq >= opt.small_shared_coarse_from;
    }
    void exact_on_device(const float* queries, size_t nq, size_t k, const Plan& p, const SmallLaunch& plan,
                         double* dist, int64_t* labels, const KeyRange* ranges);

    // key_lo / key_hi: device, nq each (the tile's), or null: no filter;
    // key_matched (device, nq, or null) receives the in-range counts.
    void search_tile(const float* queries, size_t nq, size_t k, size_t nprobe, float* out_dist,
                     int64_t* out_labels, LabelKind kind, ScanAlgo algo, const int64_t* key_lo,
                     const int64_t* key_hi, int64_t* key_matched);
};

GpuIvfPqIndex::GpuIvfPqIndex(GpuContext& ctx, size_t d, size_t lists, size_t m, Metric metric,
                             const float* centroids, const float* codebooks,
                             const GpuIvfPqOptions& opt)
    : impl_(new Impl(ctx))
{
    check_subquantizers("GPU IVFPQ", d, m);
    require(metric == Metric::L2 || metric == Metric::InnerProduct || metric == Metric::Cosine,
            "GPU IVFPQ: unknown metric");
    require(lists >= 1 && lists < (size_t(1) << 31), "GPU IVFPQ: lists must be in [1, 2^31)");
    Impl& I = *impl_;
    I.d = d;  // init_lists sets them again, after the model's buffers
    I.lists = lists;
    I.m = m;
    I.dsub = d / m;
    I.metric = metric;
    I.opt = opt;
    I.centroids = DeviceBuffer(ctx, lists * d * sizeof(float));
    I.centroids.upload(centroids, lists * d * sizeof(float));
    I.centroid_norms = DeviceBuffer(ctx, lists * sizeof(float));
    row_norms(ctx, I.centroids.as<float>(), lists, d, I.centroid_norms.as<float>());
    I.codebooks = DeviceBuffer(ctx, m * 256 * I.dsub * sizeof(float));
    I.codebooks.upload(codebooks, m * 256 * I.dsub * sizeof(float));
    I.build_term1();
    I.init_lists(d, lists, m, I.per_vector(), opt.store_vectors, opt.filter_keys);
    ctx.synchronize();
}

GpuIvfPqIndex::~GpuIvfPqIndex() = default;

size_t GpuIvfPqIndex::d() const { return impl_->d; }
size_t GpuIvfPqIndex::lists() const { return impl_->lists; }
size_t GpuIvfPqIndex::m() const { return impl_->m; }
Metric GpuIvfPqIndex::metric() const { return impl_->metric; }
size_t GpuIvfPqIndex::ntotal() const { return impl_->ntotal; }
bool GpuIvfPqIndex::has_precomputed() const { return impl_->precomputed; }

size_t GpuIvfPqIndex::list_size(size_t list) const
{
    require(list < impl_->lists, "list index out of range");
    return impl_->lst[list].size;
}

GpuMemoryUse GpuIvfPqIndex::memory_use() const
{
    const Impl& I = *impl_;
    GpuMemoryUse u;
    u.centroids = I.centroids.bytes() + I.centroid_norms.bytes();
    u.codebooks = I.codebooks.bytes();
    u.term1 = I.term1.bytes();
    u.codes = I.code_bytes();
    u.ids = I.id_bytes();
    u.vector_terms = I.vt_bytes();
    u.vectors = I.vector_bytes();
    u.keys = I.key_bytes();
    u.list_meta = I.meta_bytes();
    return u;
}

void GpuIvfPqIndex::set_float16_tables(bool on)
{
    impl_->opt.float16_tables = on;
    impl_->build_term1();
}

void GpuIvfPqIndex::set_scan_algo(ScanAlgo algo) { impl_->opt.scan = algo; }

void GpuIvfPqIndex::set_fused_blocks_per_sm(int blocks)
{
    require(blocks >= 1, "GPU IVFPQ: fused_blocks_per_sm must be >= 1");
    impl_->opt.fused_blocks_per_sm = blocks;
}

void GpuIvfPqIndex::set_small_batch_max(size_t queries) { impl_->opt.small_batch_max = queries; }

void GpuIvfPqIndex::set_small_cluster(int blocks)
{
    require(blocks >= 0 && blocks <= 16, "GPU IVFPQ: small_cluster must be 0 (chosen) or 1 .. 16");
    impl_->opt.small_cluster = blocks;
}

void GpuIvfPqIndex::set_small_spread(bool on) { impl_->opt.small_spread = on; }

void GpuIvfPqIndex::set_small_shared_coarse_from(size_t queries) { impl_->opt.small_shared_coarse_from = queries; }
void GpuIvfPqIndex::set_small_scan_prefetch(int mode) { impl_->opt.small_scan_prefetch = mode; }
void GpuIvfPqIndex::set_small_zero_copy(int mode) { impl_->opt.small_zero_copy = mode; }

bool GpuIvfPqIndex::small_batch_path(size_t nq, size_t k, size_t nprobe) const
{
    const Impl& I = *impl_;
    if (k == 0 || k > kMaxSelectK)
        return false;
    nprobe = std::min(std::max<size_t>(nprobe, 1), I.lists);
    return I.small_launch(nq, k, nprobe).cluster != 0;
}

void GpuIvfPqIndex::set_small_batch_trace(bool on)
{
    Impl& I = *impl_;
    I.small_trace = on ? DeviceBuffer(I.ctx, kSmallTraceWords * sizeof(unsigned long long)) : DeviceBuffer();
    if (on)
        GPU_CUDA_CHECK(cudaMemsetAsync(I.small_trace.data(), 0, kSmallTraceWords * sizeof(unsigned long long), I.st()));
}

std::vector<GpuIvfPqIndex::SmallOccupancyRow> GpuIvfPqIndex::small_batch_occupancy(size_t k, size_t nprobe) const
{
    const Impl& I = *impl_;
    std::vector<SmallOccupancyRow> out;
    const SmallSearchArgs a = I.small_args(1, k, std::min(std::max<size_t>(nprobe, 1), I.lists));
    for (int c = 1; c <= 16; ++c) {
        SmallOccupancyRow row;
        row.cluster = c;
        const SmallOccupancy o = small_search_occupancy(a, c, 0);
        row.smem = o.smem;
        row.active = o.clusters;
        row.registers = o.registers;
        row.active_less_32k = o.smem > (32u << 10) ? small_search_occupancy(a, c, o.smem - (32u << 10)).clusters : 0;
        row.active_half = small_search_occupancy(a, c, o.smem / 2).clusters;
        out.push_back(row);
    }
    return out;
}

std::vector<unsigned long long> GpuIvfPqIndex::small_batch_blocks() const
{
    const std::vector<unsigned long long> t = impl_->trace_words();
    if (t.empty())
        return {};
    std::vector<unsigned long long> out;
    for (int b = 0; b < kSmallTraceBlocks; ++b) {
        const unsigned long long* w = t.data() + kSmallTracePoints + 3 * b;
        if (w[0] == 0)
            break;
        out.insert(out.end(), w, w + 3);
    }
    return out;
}

std::vector<double> GpuIvfPqIndex::small_batch_trace() const
{
    const std::vector<unsigned long long> t = impl_->trace_words();
    if (t.empty() || t[15] == 0)
        return {};
    std::vector<double> out;
    for (int i = 1; i < 16; ++i)
        out.push_back(double(t[i] - t[i - 1]));
    // Inside the scan's selection (from its start, point 9) and the
    // re-rank's staging (from point 12); -1 where not recorded.
    const bool radix = t[16] != 0;
    out.push_back(radix ? double(t[16] - t[9]) : -1.0);
    for (int i = 17; i < 20; ++i)
        out.push_back(radix ? double(t[i] - t[i - 1]) : -1.0);
    out.push_back(double(t[21] - t[12]));
    out.push_back(double(t[20] - t[21]));
    out.push_back(double(t[13] - t[20]));
    // Block 0's clock: cycles from point 0 to 15 per global-timer ns (GHz).
    out.push_back(t[23] > t[22] ? double(t[15] - t[0]) / double(t[23] - t[22]) : -1.0);
    return out;
}

void GpuIvfPqIndex::add_encoded(size_t n, const int32_t* list_ids, const uint8_t* codes,
                                const int64_t* ids, const float* vectors, const int64_t* keys)
{
    Impl& I = *impl_;
    I.append("add_encoded", n, list_ids, codes, ids, vectors, keys,
             [&I](const uint8_t* dcodes, const int32_t* dl, size_t nn, float* dvt) {
                 launch_vector_term1(dcodes, dl, static_cast<int64_t>(nn), I.centroids.as<float>(),
                                     I.codebooks.as<float>(), static_cast<int>(I.d), static_cast<int>(I.m), dvt,
                                     I.st());
             });
}

size_t GpuIvfPqIndex::remove_ids(const int64_t* ids, size_t n) { return impl_->remove(ids, n); }

void GpuIvfPqIndex::encode(const float* x, size_t n, int32_t* list_ids, uint8_t* codes) const
{
    Impl& I = *impl_;
    const size_t batch = 65536;
    for (size_t i0 = 0; i0 < n; i0 += batch) {
        const size_t b = std::min(batch, n - i0);
        Carver sz;
        sz.take<float>(b * I.d);
        sz.take<float>(b * I.d);
        sz.take<float>(b);
        sz.take<int32_t>(b);
        sz.take<uint8_t>(b * I.m);
        Scratch s(I.ctx, sz.size());
        Carver c(s.data());
        float* dx = c.take<float>(b * I.d);
        float* res = c.take<float>(b * I.d);
        float* dist = c.take<float>(b);
        int32_t* asg = c.take<int32_t>(b);
        uint8_t* dcodes = c.take<uint8_t>(b * I.m);
        copy_to_device(I.ctx, dx, x + i0 * I.d, b * I.d * sizeof(float));
        if (I.metric == Metric::Cosine)
            normalize_rows(I.ctx, dx, b, I.d);
        // Vectors go to their L2-nearest centroid for every metric, as
        // IvfPqModel::encode does (the residual is what PQ must encode well).
        exact_knn_i32(I.ctx, dx, b, I.centroids.as<float>(), I.lists, I.d, Metric::L2, 1, dist,
                      asg, I.centroid_norms.as<float>());
        launch_residuals(dx, static_cast<int64_t>(b), static_cast<int>(I.d), I.centroids.as<float>(),
                         asg, res, I.st());
        launch_pq_encode(res, static_cast<int64_t>(b), static_cast<int>(I.d), static_cast<int>(I.m),
                         I.codebooks.as<float>(), dcodes, I.st());
        copy_to_host(I.ctx, codes + i0 * I.m, dcodes, b * I.m);
        copy_to_host(I.ctx, list_ids + i0, asg, b * sizeof(int32_t));
    }
}

void GpuIvfPqIndex::add(size_t n, const float* x, const int64_t* ids, const int64_t* keys)
{
    // add_encoded's key check, before the encoding work.
    if (n && impl_->opt.filter_keys != (keys != nullptr))
        throw Error(ErrorKind::InvalidArgument,
                    impl_->opt.filter_keys ? "add: the index keeps filter keys (filter_keys) but none were given"
                                           : "add: filter keys given to an index without filter_keys");
    std::vector<int32_t> l(n);
    std::vector<uint8_t> c(n * impl_->m);
    encode(x, n, l.data(), c.data());
    add_encoded(n, l.data(), c.data(), ids, impl_->opt.store_vectors ? x : nullptr, keys);
}

void GpuIvfPqIndex::Impl::search_tile(const float* queries, size_t nq, size_t k, size_t nprobe,
                                      float* out_dist, int64_t* out_labels, LabelKind kind,
                                      ScanAlgo algo, const int64_t* key_lo, const int64_t* key_hi,
                                      int64_t* key_matched)
{
    if (key_lo && key_matched)
        GPU_CUDA_CHECK(cudaMemsetAsync(key_matched, 0, nq * sizeof(int64_t), st()));
    const bool half = term1_half && precomputed ? true : opt.float16_tables;
    // Bench: the two-pass scan (forced, or Auto with the per-list layouts).
    const bool two_pass = algo == ScanAlgo::TwoPass;
    const int sms = ctx.multiprocessors();
    const int mode = table_mode();
    // Fused: enough (query, probe-chunk) blocks to fill the device.
    size_t chunks = 1, ppc = nprobe;
    if (!two_pass) {
        const size_t per_sm = static_cast<size_t>(std::max(opt.fused_blocks_per_sm, 1));
        chunks = std::min<size_t>(nprobe, std::max<size_t>(1, (static_cast<size_t>(sms) * per_sm + nq - 1) / nq));
        ppc = (nprobe + chunks - 1) / chunks;
        chunks = (nprobe + ppc - 1) / ppc;
    }
    // Row stride a multiple of 4 floats: the selection pass reads 16 bytes at a time.
    const size_t all_ld = two_pass ? std::max<size_t>((nprobe * max_len + 3) / 4 * 4, 4) : 0;
    require(nprobe * max_len < (size_t(1) << 31), "GPU IVFPQ: too many candidates per query");
    size_t p1_chunks = 1;
    int64_t p1_len = static_cast<int64_t>(all_ld);
    if (two_pass) {
        p1_chunks = std::max<size_t>(1, (static_cast<size_t>(sms) * 16 + nq - 1) / nq);
        p1_chunks = std::min<size_t>(p1_chunks, (all_ld + 1023) / 1024);
        p1_chunks = std::max<size_t>(p1_chunks, 1);
        p1_len = static_cast<int64_t>((all_ld + p1_chunks - 1) / p1_chunks + 127) / 128 * 128;
        p1_chunks = (all_ld + p1_len - 1) / p1_len;
        chunks = p1_chunks;
    }
    Carver sz;
    sz.take<float>(metric == Metric::Cosine ? nq * d : 0);
    sz.take<float>(nq * nprobe);
    sz.take<int32_t>(nq * nprobe);
    sz.take<int32_t>(nq * (nprobe + 1));
    sz.take<float>(mode != kTableDirect ? nq * m * 256 : 0);
    sz.take<float>(chunks > 1 ? nq * chunks * k : 0);
    sz.take<int32_t>(chunks > 1 ? nq * chunks * k : 0);
    sz.take<int32_t>(nq * k);
    sz.take<float>(nq * all_ld);
    Scratch s(ctx, sz.size());
    Carver c(s.data());
    float* qcopy = c.take<float>(metric == Metric::Cosine ? nq * d : 0);
    float* probe_dist = c.take<float>(nq * nprobe);
    int32_t* probe_lists = c.take<int32_t>(nq * nprobe);
    int32_t* prefix = c.take<int32_t>(nq * (nprobe + 1));
    float* term3 = c.take<float>(mode != kTableDirect ? nq * m * 256 : 0);
    float* cdist = c.take<float>(chunks > 1 ? nq * chunks * k : 0);
    int32_t* cidx = c.take<int32_t>(chunks > 1 ? nq * chunks * k : 0);
    int32_t* pos = c.take<int32_t>(nq * k);
    float* all = c.take<float>(nq * all_ld);

    const float* q = prepare_queries(queries, nq, qcopy);
    coarse_and_term3(q, nq, nprobe, probe_dist, probe_lists, term3);
    mark(kEvCoarse);
    // Out-of-range entries keep their candidate positions (prefix counts
    // them) but are keyed +inf, so no selection below returns them: the
    // positions selected are in-range entries or -1, decoded to padding.
    IvfScanArgs a = scan_args(q, nq, nprobe, k, probe_dist, probe_lists, prefix, term3, key_lo, key_hi,
                              key_matched);
    launch_ivf_prefix(a, st());
    mark(kEvPrefix);
    if (!two_pass) {
        a.chunks = static_cast<int>(chunks);
        a.probes_per_chunk = static_cast<int>(ppc);
        a.out_dist = chunks > 1 ? cdist : out_dist;
        a.out_idx = chunks > 1 ? cidx : pos;
        launch_ivf_fused(a, half, st());
    } else {
        a.all_dist = all;
        a.all_ld = static_cast<int64_t>(all_ld);
        launch_ivf_distances(a, half, st());
        SelectArgs p1;
        p1.in = all;
        p1.ld = static_cast<int64_t>(all_ld);
        p1.n = static_cast<int64_t>(all_ld);
        p1.row_len = prefix + nprobe;
        p1.row_len_stride = static_cast<int64_t>(nprobe + 1);
        p1.rows = static_cast<int64_t>(nq);
        p1.chunks = static_cast<int>(p1_chunks);
        p1.chunk_len = p1_len;
        p1.k = static_cast<int>(k);
        p1.out_dist = chunks > 1 ? cdist : out_dist;
        p1.out_idx = chunks > 1 ? cidx : pos;
        launch_select(p1, false, st());
    }
    mark(kEvScan);
    if (chunks > 1)
        launch_select_merge(static_cast<int64_t>(nq), static_cast<int>(chunks), static_cast<int>(k), cdist, cidx,
                            out_dist, pos, sms, st());
    mark(kEvMerge);
    launch_decode_labels(pos, static_cast<int64_t>(nq), static_cast<int>(k), static_cast<int>(nprobe),
                         prefix, probe_lists,
                         kind == LabelKind::Ids ? id_ptrs.as<const int64_t* const>() : nullptr,
                         out_labels, st());
    mark(kEvDecode);
}

GpuIvfPqIndex::Impl::Plan GpuIvfPqIndex::Impl::plan_search(size_t nq, size_t k, size_t nprobe) const
{
    if (k == 0 || k > kMaxSelectK) {
        std::ostringstream os;
        os << "GPU IVFPQ search: k = " << k << " outside [1, " << kMaxSelectK << "]";
        throw Error(ErrorKind::InvalidArgument, os.str());
    }
    nprobe = std::min(std::max<size_t>(nprobe, 1), lists);
    if (nprobe > kMaxSelectK) {
        std::ostringstream os;
        os << "GPU IVFPQ search: nprobe = " << nprobe << " above " << kMaxSelectK;
        throw Error(ErrorKind::InvalidArgument, os.str());
    }
    // Auto (measured, bench/gpu/results): with a query-only table the fused
    // scan wins by 2-6x (one table per block, no per-probe barrier); with
    // per-(query, list) tables the two-pass scan's block per (query, probe)
    // wins by 10-15% over the fused kernel's serial table rebuilds.
    ScanAlgo algo = opt.scan;
    if (algo == ScanAlgo::Auto)
        algo = table_mode() == kTableQuery ? ScanAlgo::Fused : ScanAlgo::TwoPass;
    // Query tiles sized so the per-query scratch stays within a quarter of
    // the free budget (at most 2 GiB).
    size_t per_q = (metric == Metric::Cosine ? d * 4 : 0) + nprobe * 12 + 4 + m * 256 * 4 +
                   nprobe * k * 8 + k * 4;
    if (algo == ScanAlgo::TwoPass)
        per_q += nprobe * max_len * 4;
    const size_t free_b = ctx.budget() > ctx.bytes_in_use() ? ctx.budget() - ctx.bytes_in_use() : 0;
    const size_t avail = std::min<size_t>(size_t(2) << 30, free_b / 4);
    size_t tq = std::max<size_t>(1, std::min(nq, avail / per_q));
    tq = std::min<size_t>(tq, 65536);
    return Plan{nprobe, tq, algo};
}

void GpuIvfPqIndex::search_device(const float* queries, size_t nq, size_t k, size_t nprobe,
                                  float* dist, int64_t* labels, LabelKind kind,
                                  const KeyRange* ranges) const
{
    Impl& I = *impl_;
    I.check_ranges("GPU IVFPQ search", ranges);
    const Impl::Plan p = I.plan_search(nq, k, nprobe);
    for (size_t q0 = 0; q0 < nq; q0 += p.tile) {
        const size_t b = std::min(p.tile, nq - q0);
        I.search_tile(queries + q0 * I.d, b, k, p.nprobe, dist + q0 * k, labels + q0 * k, kind, p.algo,
                      ranges ? ranges->lo + q0 : nullptr, ranges ? ranges->hi + q0 : nullptr,
                      ranges && ranges->matched ? ranges->matched + q0 : nullptr);
    }
}

void GpuIvfPqIndex::search(const float* queries, size_t nq, size_t k, size_t nprobe, float* dist,
                           int64_t* labels, LabelKind kind, const KeyRange* ranges) const
{
    Impl& I = *impl_;
    I.check_ranges("GPU IVFPQ search", ranges);
    if (!nq)
        return;
    require(k >= 1, "GPU IVFPQ search: k must be >= 1");
    I.host_search(I.d, queries, nq, k, ranges, dist, labels, false,
                  [&] { return I.graph_key(nq, k, nprobe, static_cast<int>(kind)); },
                  [&](const float* dq, float* dd, int64_t* dl, const KeyRange* dr) {
                      search_device(dq, nq, k, nprobe, dd, dl, kind, dr);
                  });
}

// search_exact's device work for a call of plan p and one-launch plan
// (cluster 0: the staged pipeline), both decided once by the caller.
void GpuIvfPqIndex::Impl::exact_on_device(const float* queries, size_t nq, size_t k, const Plan& p,
                                          const SmallLaunch& plan, double* dist, int64_t* labels,
                                          const KeyRange* ranges)
{
    Impl& I = *this;
    if (plan.cluster) {
        // One launch; the stage timer sees it as the scan.
        SmallSearchArgs a = I.small_args(nq, k, p.nprobe);
        a.queries = queries;
        if (ranges) {
            a.list_keys = I.key_ptrs.as<const int64_t* const>();
            a.key_lo = ranges->lo;
            a.key_hi = ranges->hi;
            a.key_matched = ranges->matched;
        }
        a.out_dist = dist;
        a.out_labels = labels;
        a.trace = I.small_trace.as<unsigned long long>();
        // From small_shared_coarse_from queries on, the batch's coarse keys
        // first, each centroid row read once per 4 queries (each query's
        // blocks read all of them: 64 MB from L2 at batch 32).
        std::optional<Scratch> keys;
        if (I.shared_keys(nq)) {
            keys.emplace(I.ctx, nq * I.lists * sizeof(float));
            a.coarse_keys = static_cast<const float*>(keys->data());
            launch_coarse_keys(a, static_cast<float*>(keys->data()), I.st());
        }
        I.mark(Impl::kEvCoarse);
        I.mark(Impl::kEvPrefix);
        launch_small_search(a, plan, I.st());
        for (int e : {Impl::kEvScan, Impl::kEvMerge, Impl::kEvDecode, Impl::kEvRerank})
            I.mark(e);
        return;
    }
    for (size_t q0 = 0; q0 < nq; q0 += p.tile) {
        const size_t b = std::min(p.tile, nq - q0);
        const float* q = queries + q0 * I.d;
        // The tile's ADC candidates as (list, offset), then re-ranked against
        // the queries as given (the scan normalises its own copy for Cosine).
        Carver sz;
        sz.take<float>(b * k);
        Scratch s(I.ctx, sz.size());
        Carver c(s.data());
        float* adc = c.take<float>(b * k);
        int64_t* cand = labels + q0 * k;  // re-ranked in place
        I.search_tile(q, b, k, p.nprobe, adc, cand, LabelKind::ListOffset, p.algo,
                      ranges ? ranges->lo + q0 : nullptr, ranges ? ranges->hi + q0 : nullptr,
                      ranges && ranges->matched ? ranges->matched + q0 : nullptr);
        launch_exact_rerank(q, static_cast<int64_t>(b), static_cast<int>(I.d), static_cast<int>(k),
                            I.metric, cand, I.vec_ptrs.as<const float* const>(),
                            I.id_ptrs.as<const int64_t* const>(), dist + q0 * k, cand, I.st());
        I.mark(Impl::kEvRerank);
    }
}

void GpuIvfPqIndex::search_exact_device(const float* queries, size_t nq, size_t k, size_t nprobe,
                                        double* dist, int64_t* labels, const KeyRange* ranges) const
{
    Impl& I = *impl_;
    if (!I.opt.store_vectors)
        throw Error(ErrorKind::Unsupported,
                    "GPU IVFPQ search_exact: the index keeps no vectors (store_vectors is off)");
    I.check_ranges("GPU IVFPQ search_exact", ranges);
    const Impl::Plan p = I.plan_search(nq, k, nprobe);
    I.exact_on_device(queries, nq, k, p, I.small_launch(nq, k, p.nprobe), dist, labels, ranges);
}

void GpuIvfPqIndex::search_exact(const float* queries, size_t nq, size_t k, size_t nprobe, double* dist,
                                 int64_t* labels, const KeyRange* ranges) const
{
    Impl& I = *impl_;
    if (!I.opt.store_vectors)
        throw Error(ErrorKind::Unsupported,
                    "GPU IVFPQ search_exact: the index keeps no vectors (store_vectors is off)");
    I.check_ranges("GPU IVFPQ search_exact", ranges);
    if (!nq)
        return;
    require(k >= 1, "GPU IVFPQ search_exact: k must be >= 1");
    const Impl::Plan p = I.plan_search(nq, k, nprobe);
    const SmallLaunch plan = I.small_launch(nq, k, p.nprobe);
    // The one-launch kernel may read and write the call's staging in place
    // (GpuIvfPqOptions::small_zero_copy); the batch's coarse-keys kernel
    // reads the queries once per block, so they are copied for it.
    int zero_copy = 0;
    if (I.opt.small_zero_copy > 0 && plan.cluster) {
        zero_copy = Impl::kZeroCopyOut;
        if (I.opt.small_zero_copy > 1 && I.d <= Impl::kZeroCopyInMaxDim && !I.shared_keys(nq))
            zero_copy |= Impl::kZeroCopyIn;
    }
    I.host_search(I.d, queries, nq, k, ranges, dist, labels, true,
                  [&] { return I.graph_key(nq, k, nprobe, -1); },
                  [&](const float* dq, double* dd, int64_t* dl, const KeyRange* dr) {
                      I.exact_on_device(dq, nq, k, p, plan, dd, dl, dr);
                  },
                  zero_copy);
}

void GpuIvfPqIndex::set_stage_timing(SearchStages* stages) { impl_->set_stage_timing(stages); }

void GpuIvfPqIndex::set_search_graphs(bool on) { impl_->graphs.set_enabled(on); }

size_t GpuIvfPqIndex::search_graph_launches() const { return impl_->graphs.launches(); }

size_t GpuIvfPqIndex::zero_copy_calls() const { return impl_->zero_copy_calls; }

void GpuIvfPqIndex::search_brute_force(const float* queries, size_t nq, size_t k, double* dist,
                                       int64_t* labels) const
{
    Impl& I = *impl_;
    if (!I.opt.store_vectors)
        throw Error(ErrorKind::Unsupported,
                    "GPU IVFPQ search_brute_force: the index keeps no vectors (store_vectors is off)");
    if (k == 0 || k > kMaxSelectK) {
        std::ostringstream os;
        os << "GPU IVFPQ search_brute_force: k = " << k << " outside [1, " << kMaxSelectK << "]";
        throw Error(ErrorKind::InvalidArgument, os.str());
    }
    if (!nq)
        return;
    const size_t n = I.ntotal, d = I.d;
    if (!n) {
        std::fill(dist, dist + nq * k, std::numeric_limits<double>::infinity());
        std::fill(labels, labels + nq * k, int64_t(-1));
        return;
    }
    // Preselected candidates per query: k and a margin (2k, at least 32
    // more), so that fp32 rounding in the GEMM distances cannot push a true
    // neighbour out of the candidates unless it lies that many ranks off;
    // no more than there are vectors (then every vector is a candidate).
    const size_t kc = std::min(kMaxSelectK, std::max(k, std::min(n, std::max(2 * k, k + 32))));
    const bool norms = I.metric == Metric::L2 || I.metric == Metric::Cosine;
    // The stored vectors and their ids in one contiguous copy for the call,
    // list after list (a DeviceBuffer, not scratch: the arena would keep its
    // size). Throws OutOfMemory past the budget, before anything ran.
    Carver bsz;
    bsz.take<float>(n * d);
    bsz.take<int64_t>(n);
    bsz.take<float>(norms ? n : 0);
    bsz.take<int64_t>(I.lists + 1);
    DeviceBuffer gathered(I.ctx, bsz.size());
    Carver bc(gathered.data());
    float* base = bc.take<float>(n * d);
    int64_t* base_ids = bc.take<int64_t>(n);
    float* base_norms = bc.take<float>(norms ? n : 0);
    int64_t* offsets = bc.take<int64_t>(I.lists + 1);
    {
        std::vector<int64_t> off(I.lists + 1, 0);
        for (size_t l = 0; l < I.lists; ++l)
            off[l + 1] = off[l] + static_cast<int64_t>(I.lst[l].size);
        require(static_cast<size_t>(off[I.lists]) == n, "GPU IVFPQ search_brute_force: list sizes disagree");
        copy_to_device(I.ctx, offsets, off.data(), off.size() * sizeof(int64_t));
    }
    launch_gather_lists(I.vec_ptrs.as<const float* const>(), I.id_ptrs.as<const int64_t* const>(), offsets,
                        static_cast<int64_t>(I.lists), static_cast<int64_t>(n), static_cast<int>(d), base,
                        base_ids, I.st());
    if (norms)
        row_norms(I.ctx, base, n, d, base_norms);
    // Query tiles: the per-query scratch (query, candidates, results) within
    // a quarter of the free budget, at most 4096 queries. exact_knn tiles
    // its distance matrix itself.
    const size_t per_q = d * sizeof(float) + kc * (sizeof(float) + sizeof(int64_t)) +
                         k * (sizeof(double) + sizeof(int64_t)) + 64;
    const size_t free_b = I.ctx.budget() > I.ctx.bytes_in_use() ? I.ctx.budget() - I.ctx.bytes_in_use() : 0;
    const size_t tile = std::max<size_t>(1, std::min<size_t>({nq, 4096, free_b / 4 / per_q}));
    Carver sz;
    sz.take<float>(tile * d);
    sz.take<float>(tile * kc);
    sz.take<int64_t>(tile * kc);
    sz.take<double>(tile * k);
    sz.take<int64_t>(tile * k);
    Scratch s(I.ctx, sz.size());
    Carver c(s.data());
    float* dq = c.take<float>(tile * d);
    float* cand_dist = c.take<float>(tile * kc);
    int64_t* cand = c.take<int64_t>(tile * kc);
    double* od = c.take<double>(tile * k);
    int64_t* ol = c.take<int64_t>(tile * k);
    for (size_t q0 = 0; q0 < nq; q0 += tile) {
        const size_t b = std::min(tile, nq - q0);
        copy_to_device(I.ctx, dq, queries + q0 * d, b * d * sizeof(float));
        // fp32 preselection by the metric's ranking distance (Cosine: the
        // selection divides by both norms, so the raw stored vectors and the
        // query as given rank by cosine distance); labels are base rows.
        exact_knn(I.ctx, dq, b, base, n, d, I.metric, kc, cand_dist, cand, norms ? base_norms : nullptr);
        launch_exact_rerank_rows(dq, static_cast<int64_t>(b), static_cast<int>(d), static_cast<int>(kc),
                                 static_cast<int>(k), I.metric, cand, base, base_ids, od, ol, I.st());
        copy_to_host(I.ctx, dist + q0 * k, od, b * k * sizeof(double));
        copy_to_host(I.ctx, labels + q0 * k, ol, b * k * sizeof(int64_t));
    }
}

void GpuIvfPqIndex::compute_tables(const float* queries, size_t nq, size_t nprobe, int32_t* lists,
                                   float* base, float* tables) const
{
    Impl& I = *impl_;
    nprobe = std::min(std::max<size_t>(nprobe, 1), I.lists);
    require(nprobe <= kMaxSelectK, "compute_tables: nprobe above " + std::to_string(kMaxSelectK));
    if (!nq)
        return;
    const size_t tsz = I.m * 256;
    Carver sz;
    sz.take<float>(nq * I.d);
    sz.take<float>(nq * I.d);
    sz.take<float>(nq * nprobe);
    sz.take<int32_t>(nq * nprobe);
    sz.take<float>(nq * tsz);
    sz.take<float>(nq * nprobe * tsz);
    sz.take<float>(nq * nprobe);
    Scratch s(I.ctx, sz.size());
    Carver c(s.data());
    float* dq = c.take<float>(nq * I.d);
    float* qcopy = c.take<float>(nq * I.d);
    float* pd = c.take<float>(nq * nprobe);
    int32_t* pl = c.take<int32_t>(nq * nprobe);
    float* t3 = c.take<float>(nq * tsz);
    float* tout = c.take<float>(nq * nprobe * tsz);
    float* bout = c.take<float>(nq * nprobe);
    copy_to_device(I.ctx, dq, queries, nq * I.d * sizeof(float));
    const float* q = I.prepare_queries(dq, nq, qcopy);
    I.coarse_and_term3(q, nq, nprobe, pd, pl, t3);
    IvfScanArgs a = I.scan_args(q, nq, nprobe, 1, pd, pl, nullptr, t3);
    a.mode = I.list_table_mode();
    a.list_term1 = nullptr;
    a.tables_out = tout;
    a.base_out = bout;
    const bool half = I.precomputed ? I.term1_half : I.opt.float16_tables;
    launch_ivf_tables(a, half, I.st());
    copy_to_host(I.ctx, lists, pl, nq * nprobe * sizeof(int32_t));
    copy_to_host(I.ctx, base, bout, nq * nprobe * sizeof(float));
    copy_to_host(I.ctx, tables, tout, nq * nprobe * tsz * sizeof(float));
}

void train_ivfpq_gpu(GpuContext& ctx, const float* x, size_t n, size_t d, size_t lists, size_t m,
                     Metric metric, const KMeansParams& coarse, const KMeansParams& pq,
                     size_t pq_max_training, float* centroids, float* codebooks)
{
    check_subquantizers("train_ivfpq_gpu", d, m);
    require(metric == Metric::L2 || metric == Metric::InnerProduct || metric == Metric::Cosine,
            "train_ivfpq_gpu: unknown metric");
    require(n >= 1 && lists >= 1, "train_ivfpq_gpu: needs n >= 1 and lists >= 1");
    cudaStream_t st = stream_of(ctx);
    const size_t dsub = d / m;
    // The CPU engine's draws (IvfPqModel::train): the coarse rows, then the
    // PQ rows, from one Rng seeded with the coarse seed.
    const IvfPqTrainingRows rows = ivfpq_training_rows(
        n, lists, coarse.seed, coarse.max_points_per_centroid, pq_max_training ? pq_max_training : n);
    DeviceBuffer dx(ctx, n * d * sizeof(float));
    dx.upload(x, n * d * sizeof(float));
    if (metric == Metric::Cosine)
        normalize_rows(ctx, dx.as<float>(), n, d);
    const size_t nc = rows.coarse.size(), nt = rows.pq.size();
    DeviceBuffer dc(ctx, lists * d * sizeof(float));
    {
        DeviceBuffer sample(ctx, nc * d * sizeof(float));
        std::vector<int64_t> idx(rows.coarse.begin(), rows.coarse.end());
        DeviceBuffer didx(ctx, nc * sizeof(int64_t));
        didx.upload(idx.data(), nc * sizeof(int64_t));
        launch_gather_rows(dx.as<float>(), didx.as<int64_t>(), static_cast<int64_t>(nc),
                           static_cast<int>(d), sample.as<float>(), st);
        kmeans_train_gpu(ctx, sample.as<float>(), nc, d, lists, coarse, dc.as<float>());
    }
    // PQ on the residuals of the PQ rows, each against its nearest centroid.
    DeviceBuffer sub(ctx, nt * d * sizeof(float));
    {
        std::vector<int64_t> idx(rows.pq.begin(), rows.pq.end());
        DeviceBuffer didx(ctx, nt * sizeof(int64_t));
        didx.upload(idx.data(), nt * sizeof(int64_t));
        launch_gather_rows(dx.as<float>(), didx.as<int64_t>(), static_cast<int64_t>(nt),
                           static_cast<int>(d), sub.as<float>(), st);
        ctx.synchronize();
    }
    dx.reset();
    DeviceBuffer dist(ctx, nt * sizeof(float)), asg(ctx, nt * sizeof(int32_t));
    DeviceBuffer norms(ctx, lists * sizeof(float));
    row_norms(ctx, dc.as<float>(), lists, d, norms.as<float>());
    exact_knn_i32(ctx, sub.as<float>(), nt, dc.as<float>(), lists, d, Metric::L2, 1,
                  dist.as<float>(), asg.as<int32_t>(), norms.as<float>());
    DeviceBuffer res(ctx, nt * d * sizeof(float)), slice(ctx, nt * dsub * sizeof(float));
    launch_residuals(sub.as<float>(), static_cast<int64_t>(nt), static_cast<int>(d), dc.as<float>(),
                     asg.as<int32_t>(), res.as<float>(), st);
    DeviceBuffer dcb(ctx, m * kPqCentroids * dsub * sizeof(float));
    KMeansParams sq = pq;
    sq.max_points_per_centroid = nt;  // the PQ rows are the sample already, as on the CPU
    for (size_t j = 0; j < m; ++j) {
        launch_column_slice(res.as<float>(), static_cast<int64_t>(nt), static_cast<int>(d),
                            static_cast<int>(j * dsub), static_cast<int>(dsub), slice.as<float>(), st);
        sq.seed = pq_subquantizer_seed(pq.seed, j);
        kmeans_train_gpu(ctx, slice.as<float>(), nt, dsub, kPqCentroids, sq,
                         dcb.as<float>() + j * kPqCentroids * dsub);
    }
    dc.download(centroids, lists * d * sizeof(float));
    dcb.download(codebooks, m * kPqCentroids * dsub * sizeof(float));
}

void train_ivfpq_gpu(GpuContext& ctx, const float* x, size_t n, size_t d, size_t lists, size_t m,
                     Metric metric, const IvfPqTrainParams& params, float* centroids,
                     float* codebooks)
{
    require(params.pq_max_training >= 1, "train_ivfpq_gpu: pq_max_training must be >= 1");
    const size_t np = std::min(n, params.pq_max_training);
    train_ivfpq_gpu(ctx, x, n, d, lists, m, metric, ivfpq_coarse_params(params),
                    ivfpq_pq_params(params, np), params.pq_max_training, centroids, codebooks);
}

}  // namespace gpuivfpq::gpu
