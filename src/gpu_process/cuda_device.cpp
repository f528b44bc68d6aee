// The service's compute device on a CUDA GPU: mirrors are GpuIvfPqIndex
// objects (GpuRabitqIndex for indexes with RaBitQ codes), builds train with the GPU k-means and encode on the GPU. Built
// only when the extension is linked with the kernels (no postgres.h here).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "gpu_process/cuda_device.h"
#include "engine/error.h"
#include "gpu_ivfpq/device_buffer.h"
#include "gpu_ivfpq/exact_search.h"
#include "gpu_ivfpq/gpu_context.h"
#include "gpu_ivfpq/ivfpq_index.h"
#include "gpu_ivfpq/metric_index.h"
#include "gpu_ivfpq/rabitq_index.h"

namespace gpuivfpq {
namespace {

using gpu::GpuContext;
using gpu::GpuIvfPqIndex;
using gpu::GpuIvfPqOptions;
using gpu::KeyRange;

GpuIvfPqOptions MirrorOptions(bool vectors = false, bool filter_keys = false)
{
    GpuIvfPqOptions opt;
    // Exact vectors beside the codes: searches re-rank on the device.
    opt.store_vectors = vectors;
    // Filter keys beside the codes: the list scan skips out-of-range entries.
    opt.filter_keys = filter_keys;
    // Term 1 folded into one float per stored vector: no per-list tables to
    // hold, and the scan's table depends on the query only (gpu/NOTES.md).
    opt.term1_per_vector = true;
    opt.precompute_term1 = false;
    return opt;
}

// The service's ranges as an index takes them (host pointers all); the
// index refuses them without keys.
KeyRange to_gpu(const KeyRanges* ranges)
{
    KeyRange r;
    if (ranges) {
        r.lo = ranges->lo;
        r.hi = ranges->hi;
        r.matched = ranges->matched;
    }
    return r;
}

// What the CUDA mirrors share: the device made current before the index is
// built (current_) and before every call (this process may serve several
// GPUs), removals and sizes.
template <typename Index>
class CudaMirrorOf : public Mirror {
public:
    template <typename... Args>
    explicit CudaMirrorOf(GpuContext& ctx, Args&&... args)
        : ctx_(ctx), current_(ctx), index_(ctx, std::forward<Args>(args)...)
    {
    }
    ~CudaMirrorOf() override
    {
        // The index frees its memory next, on this device.
        try {
            ctx_.make_current();
        } catch (const Error&) {
        }
    }
    size_t remove(size_t n, const int64_t* labels) override
    {
        ctx_.make_current();
        return index_.remove_ids(labels, n);
    }
    size_t entries() const override { return index_.ntotal(); }
    size_t bytes() const override { return index_.memory_use().total(); }

protected:
    struct Current {
        explicit Current(GpuContext& c) { c.make_current(); }
    };
    GpuContext& ctx_;
    Current current_;
    Index index_;
};

class CudaMirror final : public CudaMirrorOf<GpuIvfPqIndex> {
public:
    CudaMirror(GpuContext& ctx, const MirrorSpec& s)
        : CudaMirrorOf(ctx, s.d, s.lists, s.m, s.metric, s.centroids, s.codebooks,
                       MirrorOptions(s.vectors, s.filter_keys)),
          vectors_(s.vectors),
          keys_(s.filter_keys)
    {
    }
    void add(size_t n, const int32_t* list_ids, const uint8_t* codes, const int64_t* labels,
             const float* vectors, const int64_t* keys) override
    {
        ctx_.make_current();
        index_.add_encoded(n, list_ids, codes, labels, vectors, keys);
    }
    bool has_vectors() const override { return vectors_; }
    bool has_keys() const override { return keys_; }
    void search_exact(const float* queries, size_t nq, size_t k, size_t nprobe, double* dist,
                      int64_t* labels, const KeyRanges* ranges) override
    {
        ctx_.make_current();
        const KeyRange r = to_gpu(ranges);
        index_.search_exact(queries, nq, k, nprobe, dist, labels, ranges ? &r : nullptr);
    }
    void search(const float* queries, size_t nq, size_t k, size_t nprobe, float* dist,
                int64_t* labels, const KeyRanges* ranges) override
    {
        ctx_.make_current();
        const KeyRange r = to_gpu(ranges);
        index_.search(queries, nq, k, nprobe, dist, labels, gpu::LabelKind::Ids, ranges ? &r : nullptr);
    }
    void brute_force(const float* queries, size_t nq, size_t k, double* dist, int64_t* labels) override
    {
        ctx_.make_current();
        index_.search_brute_force(queries, nq, k, dist, labels);
    }

private:
    bool vectors_, keys_;
};

// The mirror of an index with RaBitQ codes: the codes' estimates rank the
// candidates; no vectors, so the backends re-rank from the heap.
class CudaRabitqMirror final : public CudaMirrorOf<gpu::GpuRabitqIndex> {
public:
    CudaRabitqMirror(GpuContext& ctx, const MirrorSpec& s)
        : CudaMirrorOf(ctx, (require_rabitq_spec(s), s.d), s.lists, s.rabitq_bits, s.metric, s.centroids,
                       s.rabitq_model, s.filter_keys)
    {
        // Measurement aid: GPU_IVFPQ_RABITQ_ONE_LAUNCH=N in the server's
        // environment searches batches of up to N queries (at most 256) in
        // one launch (GpuRabitqIndex::set_small_batch_max; none by default).
        if (const char* v = std::getenv("GPU_IVFPQ_RABITQ_ONE_LAUNCH")) {
            char* end = nullptr;
            const unsigned long n = std::strtoul(v, &end, 10);
            if (end != v && *end == '\0')
                index_.set_small_batch_max(std::min<unsigned long>(n, 256));
        }
    }
    void add(size_t n, const int32_t* list_ids, const uint8_t* codes, const int64_t* labels,
             const float* vectors, const int64_t* keys) override
    {
        if (vectors && n)
            throw Error(ErrorKind::InvalidArgument, "vectors given to a mirror with RaBitQ codes");
        ctx_.make_current();
        index_.add(n, list_ids, codes, labels, keys);
    }
    bool has_vectors() const override { return false; }
    bool has_keys() const override { return index_.has_keys(); }
    bool lower_bounds() const override { return true; }
    void search(const float* queries, size_t nq, size_t k, size_t nprobe, float* dist, int64_t* labels,
                const KeyRanges* ranges) override
    {
        ctx_.make_current();
        const KeyRange r = to_gpu(ranges);
        // Ranked by lower bounds: the backends re-rank in that order (compute_device.h).
        index_.search(queries, nq, k, nprobe, dist, labels, ranges ? &r : nullptr, kRabitqLowerEps0);
    }
    void search_exact(const float*, size_t, size_t, size_t, double*, int64_t*, const KeyRanges*) override
    {
        throw Error(ErrorKind::Unsupported, "a mirror with RaBitQ codes keeps no vectors to re-rank with");
    }
    void brute_force(const float*, size_t, size_t, double*, int64_t*) override
    {
        throw Error(ErrorKind::Unsupported, "a mirror with RaBitQ codes keeps no vectors for an exact search");
    }
};

// A metric index's mirror on the GPU: MetricMirror's labels, ids and
// checks over a gpu::GpuMetricIndex (metric_search.h's kernels).
class CudaMetricMirror final : public MetricMirror {
public:
    CudaMetricMirror(GpuContext& ctx, const MetricSpec& s) : MetricMirror(s), ctx_(ctx)
    {
        ctx_.make_current();
        const WordList words = to_word_list(s.words);
        const size_t n = s.words.n;
        if (method() == MetricMethod::ListOfClusters)
            index_ = gpu::GpuMetricIndex::list_of_clusters(
                ctx_, words, s.removed, std::vector<uint32_t>(s.centres, s.centres + s.clusters),
                std::vector<uint32_t>(s.radii, s.radii + s.clusters),
                std::vector<uint32_t>(s.cluster_of, s.cluster_of + n));
        else
            index_ = gpu::GpuMetricIndex::sparse_spatial_selection(
                ctx_, words, s.removed,
                std::vector<uint32_t>(s.pivot_ids, s.pivot_ids + s.pivots), s.table);
    }
    ~CudaMetricMirror() override
    {
        // The index frees its memory next, on this device.
        try {
            ctx_.make_current();
        } catch (const Error&) {
        }
    }
    size_t bytes() const override { return index_->bytes(); }

protected:
    void append(const WordList& words, const int64_t*, const MetricPlacements& placements) override
    {
        ctx_.make_current();
        if (method() == MetricMethod::ListOfClusters)
            index_->add(words, placements.clusters);
        else
            index_->add(words, placements.table_rows);
    }
    void mark_removed(const std::vector<uint32_t>& positions) override
    {
        ctx_.make_current();
        index_->remove(positions);
    }
    MetricBatchResult search_range(const WordList& queries,
                                   const std::vector<uint32_t>& radii) override
    {
        ctx_.make_current();
        return index_->range(queries, radii);
    }
    MetricBatchResult search_knn(const WordList& queries, size_t k) override
    {
        ctx_.make_current();
        return index_->knn(queries, k);
    }

private:
    GpuContext& ctx_;
    std::unique_ptr<gpu::GpuMetricIndex> index_;
};

class CudaDevice final : public ComputeDevice {
public:
    CudaDevice(int device, size_t budget) : ctx_(device, budget), device_(device) {}
    ~CudaDevice() override
    {
        // The encoder frees its memory first, on this device.
        try {
            ctx_.make_current();
        } catch (const Error&) {
        }
    }

    std::string description() const override { return gpu::device_description(device_); }
    void set_wait_handover(void (*yield)(void*), void (*reclaim)(void*), void* arg) override
    {
        ctx_.set_wait_handover(GpuContext::WaitHandover{yield, reclaim, arg});
    }
    size_t memory_capacity() const override { return ctx_.budget(); }
    size_t mirror_bytes(const MirrorSpec& s, size_t n) const override
    {
        if (s.rabitq_bits) {
            // Rows (code and factors), ids, keys; a quarter more for the
            // lists' growth; centroids and norms, rotation, P c; per list.
            // Wide rows are interleaved: each list that holds any takes
            // whole blocks of kRabitqInterleaveRows rows.
            const size_t row = s.m + sizeof(int64_t) + (s.filter_keys ? sizeof(int64_t) : 0);
            const size_t lists = n * row;
            const size_t blocks = s.m >= gpu::kRabitqInterleaveFromBytes
                                      ? std::min(n, s.lists) * (gpu::kRabitqInterleaveRows - 1) * row
                                      : 0;
            return lists + lists / 4 + blocks + s.lists * (s.d + 1) * sizeof(float) +
                   rabitq_model_bytes(s.d, s.lists) + s.lists * 64;
        }
        // codes, ids and the per-vector term 1 (and the vectors, the filter
        // keys when kept); centroids, norms, codebooks; a list's capacity
        // grows by half when full, so allow a quarter more; per list, its
        // pointers and length (and allocation rounding).
        size_t lists = n * (s.m + sizeof(int64_t) + sizeof(float) + (s.vectors ? s.d * sizeof(float) : 0) +
                            (s.filter_keys ? sizeof(int64_t) : 0));
        return lists + lists / 4 + s.lists * (s.d + 1) * sizeof(float) +
               kPqCentroids * s.d * sizeof(float) + s.lists * 64;
    }
    std::unique_ptr<Mirror> create_mirror(const MirrorSpec& spec) override
    {
        if (spec.rabitq_bits)
            return std::make_unique<CudaRabitqMirror>(ctx_, spec);
        return std::make_unique<CudaMirror>(ctx_, spec);
    }
    void train(const float* x, size_t n, size_t d, size_t lists, size_t m, Metric metric,
               const IvfPqTrainParams& params, float* centroids, float* codebooks) override
    {
        // The CPU engine's draws for the same seed (gpu/ train_ivfpq_gpu).
        ctx_.make_current();
        gpu::train_ivfpq_gpu(ctx_, x, n, d, lists, m, metric, params, centroids, codebooks);
    }
    void exact_knn(const float* queries, size_t nq, const float* base, size_t n, size_t d,
                   Metric metric, size_t k, float* dist, int64_t* labels) override
    {
        // The fused cuBLAS GEMM + k-selection kernel (gpu/NOTES.md).
        ctx_.make_current();
        gpu::DeviceBuffer dq(ctx_, nq * d * sizeof(float)), db(ctx_, n * d * sizeof(float));
        gpu::DeviceBuffer dd(ctx_, nq * k * sizeof(float)), dl(ctx_, nq * k * sizeof(int64_t));
        dq.upload(queries, nq * d * sizeof(float));
        db.upload(base, n * d * sizeof(float));
        gpu::exact_knn(ctx_, dq.as<float>(), nq, db.as<float>(), n, d, metric, k, dd.as<float>(),
                       dl.as<int64_t>());
        dd.download(dist, nq * k * sizeof(float));
        dl.download(labels, nq * k * sizeof(int64_t));
    }
    void encode(const MirrorSpec& s, const float* x, size_t n, int32_t* list_ids,
                uint8_t* codes) override
    {
        // One encoder per model: a build sends many batches with the same one.
        ctx_.make_current();
        if (!encoder_model_.same(s)) {
            encoder_.reset();
            assigner_.reset();
            encoder_model_ = EncoderModel();
            if (s.rabitq_bits)
                assigner_ = std::make_unique<gpu::GpuRabitqIndex>(ctx_, s.d, s.lists, s.rabitq_bits, s.metric,
                                                                  s.centroids, s.rabitq_model);
            else
                encoder_ = std::make_unique<GpuIvfPqIndex>(ctx_, s.d, s.lists, s.m, s.metric, s.centroids,
                                                           s.codebooks, MirrorOptions());
            encoder_model_.keep(s);
        }
        // RaBitQ codes: the lists, then each row against its list (the CPU
        // engine's rows, bit for bit).
        if (assigner_) {
            assigner_->assign(x, n, list_ids);
            assigner_->encode(x, n, list_ids, codes);
        } else
            encoder_->encode(x, n, list_ids, codes);
    }
    std::unique_ptr<MetricMirror> create_metric_mirror(const MetricSpec& spec) override
    {
        return std::make_unique<CudaMetricMirror>(ctx_, spec);
    }
    bool pin_host(void* p, size_t bytes) override { return gpu::pin_host(p, bytes); }
    void unpin_host(void* p) override { gpu::unpin_host(p); }
    bool healthy() override
    {
        // A plain error is reported once; a sticky one by every later call.
        try {
            ctx_.make_current();
            ctx_.synchronize();
        } catch (const Error&) {
        }
        try {
            ctx_.synchronize();
            return true;
        } catch (const Error&) {
            return false;
        }
    }

private:
    GpuContext ctx_;
    int device_;
    // The model of the last encode: a copy of its shape and bytes (the
    // centroids, then the PQ codebooks or the RaBitQ blob).
    struct EncoderModel {
        size_t d = 0, lists = 0, m = 0;
        int bits = 0;
        Metric metric = Metric::L2;
        std::vector<uint8_t> centroids, model;
        static size_t model_bytes(const MirrorSpec& s)
        {
            return s.rabitq_bits ? rabitq_model_bytes(s.d, s.lists) : s.d * kPqCentroids * sizeof(float);
        }
        static const void* model_of(const MirrorSpec& s)
        {
            return s.rabitq_bits ? s.rabitq_model : static_cast<const void*>(s.codebooks);
        }
        bool same(const MirrorSpec& s) const
        {
            return !centroids.empty() && d == s.d && lists == s.lists && m == s.m && bits == s.rabitq_bits &&
                   metric == s.metric && std::memcmp(centroids.data(), s.centroids, centroids.size()) == 0 &&
                   model.size() == model_bytes(s) && std::memcmp(model.data(), model_of(s), model.size()) == 0;
        }
        void keep(const MirrorSpec& s)
        {
            d = s.d;
            lists = s.lists;
            m = s.m;
            bits = s.rabitq_bits;
            metric = s.metric;
            const auto* c = reinterpret_cast<const uint8_t*>(s.centroids);
            centroids.assign(c, c + s.lists * s.d * sizeof(float));
            const auto* b = static_cast<const uint8_t*>(model_of(s));
            model.assign(b, b + model_bytes(s));
        }
    };
    // The encoder of that model: PQ codes, or a RaBitQ build's assignment.
    std::unique_ptr<GpuIvfPqIndex> encoder_;
    std::unique_ptr<gpu::GpuRabitqIndex> assigner_;
    EncoderModel encoder_model_;
};

}  // namespace

int cuda_device_count() { return gpu::device_count(); }

bool cuda_set_host_wait(int device, const char* mode)
{
    static const struct {
        const char* name;
        gpu::HostWait wait;
    } kModes[] = {{"auto", gpu::HostWait::Auto},
                  {"spin", gpu::HostWait::Spin},
                  {"yield", gpu::HostWait::Yield},
                  {"block", gpu::HostWait::Block}};
    for (const auto& m : kModes)
        if (std::strcmp(mode, m.name) == 0) {
            gpu::set_host_wait(device, m.wait);
            return true;
        }
    return false;
}

std::unique_ptr<ComputeDevice> make_cuda_device(int device, size_t budget)
{
    return std::make_unique<CudaDevice>(device, budget);
}

}  // namespace gpuivfpq
