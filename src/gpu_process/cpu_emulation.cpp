// The CPU emulation of the service's compute device: mirrors are per-list
// arrays in process memory, searched with the CPU engine's IVFADC (or its
// RaBitQ estimates) and re-ranked with the exact distance the GPU kernel
// computes. Tests use it to exercise the service without a GPU.
#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "engine/error.h"
#include "engine/exact_distance.h"
#include "engine/rabitq.h"
#include "engine/search_limits.h"
#include "engine/topk.h"
#include "gpu_process/compute_device.h"

namespace gpuivfpq {
namespace {

// The GPU's limits, enforced here too so that both devices refuse alike.
void require_select_k(size_t k, const char* who)
{
    if (k == 0 || k > kMaxSelectK)
        throw Error(ErrorKind::InvalidArgument, std::string(who) + ": k = " + std::to_string(k) +
                                                    " outside [1, " + std::to_string(kMaxSelectK) + "]");
}

void require_gpu_m(size_t d, size_t m)
{
    if (m < 1 || m > kMaxGpuSubQuantizers || d == 0 || d % m != 0)
        throw Error(ErrorKind::Unsupported,
                    "GPU IVFPQ: m = " + std::to_string(m) + " not supported for d = " + std::to_string(d) +
                        " (needs 1 <= m <= " + std::to_string(kMaxGpuSubQuantizers) +
                        " and d a multiple of m)");
}

// The CPU engine's model of a RaBitQ spec (its blob: the rotation, then P c).
std::unique_ptr<RabitqModel> rabitq_model_of(const MirrorSpec& spec)
{
    const auto* blob = static_cast<const uint8_t*>(spec.rabitq_model);
    auto model = std::make_unique<RabitqModel>(spec.d, spec.lists, spec.rabitq_bits, spec.metric,
                                               reinterpret_cast<const float*>(blob));
    model->set_centroids(spec.centroids, reinterpret_cast<const double*>(blob + rabitq_rotated_offset(spec.d)));
    return model;
}

// A mirror of either kind of codes: PQ codes ranked by ADC distance, or
// RaBitQ codes (each entry's bit planes, then its RabitqFactors, as the
// index pages hold them) ranked by their distances' lower bounds.
class CpuMirror final : public Mirror {
public:
    explicit CpuMirror(const MirrorSpec& spec)
        : d_(spec.d), m_(spec.m), lists_(spec.lists), codes_(spec.lists), labels_(spec.lists),
          vectors_(spec.vectors ? spec.lists : 0), keys_(spec.filter_keys ? spec.lists : 0),
          metric_(spec.metric)
    {
        if (spec.rabitq_bits != 0) {
            rabitq_ = rabitq_model_of(spec);
        } else {
            pq_ = std::make_unique<IvfPqModel>(spec.d, spec.lists, spec.m, spec.metric);
            pq_->set_centroids(spec.centroids);
            pq_->set_codebooks(spec.codebooks);
        }
    }

    void add(size_t n, const int32_t* list_ids, const uint8_t* codes, const int64_t* labels,
             const float* vectors, const int64_t* keys) override
    {
        const size_t m = m_, d = d_;
        // Nothing to add takes any pointers (as the GPU index does).
        require(n == 0 || (vectors != nullptr) == has_vectors(),
                has_vectors() ? "mirror: entries need their vectors" : "mirror: keeps no vectors");
        require(n == 0 || (keys != nullptr) == has_keys(),
                has_keys() ? "mirror: entries need their filter keys" : "mirror: keeps no filter keys");
        for (size_t i = 0; i < n; i++)
            require(list_ids[i] >= 0 && size_t(list_ids[i]) < lists_, "mirror: list out of range");
        for (size_t i = 0; i < n; i++) {
            auto& c = codes_[list_ids[i]];
            c.insert(c.end(), codes + i * m, codes + (i + 1) * m);
            labels_[list_ids[i]].push_back(labels[i]);
            if (vectors != nullptr) {
                auto& v = vectors_[list_ids[i]];
                v.insert(v.end(), vectors + i * d, vectors + (i + 1) * d);
            }
            if (keys != nullptr)
                keys_[list_ids[i]].push_back(keys[i]);
        }
        entries_ += n;
    }

    bool has_vectors() const override { return !vectors_.empty(); }
    bool has_keys() const override { return !keys_.empty(); }
    bool lower_bounds() const override { return rabitq_ != nullptr; }

    void search(const float* queries, size_t nq, size_t k, size_t nprobe, float* dist,
                int64_t* labels, const KeyRanges* ranges) override
    {
        scan(queries, nq, k, nprobe, dist, labels, nullptr, ranges);
    }

    void search_exact(const float* queries, size_t nq, size_t k, size_t nprobe, double* dist,
                      int64_t* labels, const KeyRanges* ranges) override
    {
        if (!has_vectors())
            throw Error(ErrorKind::Unsupported, "GPU IVFPQ search_exact: the mirror keeps no vectors");
        std::vector<float> adc(nq * k);
        scan(queries, nq, k, nprobe, adc.data(), labels, dist, ranges);
    }

private:
    // A candidate the k-selection took, and where its vector lies.
    struct Taken {
        int64_t label;
        size_t seq;
        const float* vector;
        float adc;
    };

    // The ADC search; with exact, also the re-rank of search_exact; with
    // ranges, only over the entries whose filter key lies in the query's.
    void scan(const float* queries, size_t nq, size_t k, size_t nprobe, float* dist,
              int64_t* labels, double* exact, const KeyRanges* ranges)
    {
        require_select_k(k, "GPU IVFPQ search");
        if (ranges != nullptr && !has_keys())
            throw Error(ErrorKind::InvalidArgument, "GPU IVFPQ search: key ranges for a mirror without filter keys");
        const size_t probes = std::min(std::max<size_t>(nprobe, 1), lists_);
        if (probes > kMaxSelectK)
            throw Error(ErrorKind::InvalidArgument, "GPU IVFPQ search: nprobe = " +
                                                        std::to_string(probes) + " above " +
                                                        std::to_string(kMaxSelectK));
        std::vector<float> d;
        ListScanner scanner(*this);

        for (size_t q = 0; q < nq; q++) {
            TopK topk(k);
            const std::vector<int32_t>& probed = scanner.prepare(queries + q * d_, probes);
            std::vector<Taken> taken;
            size_t seq = 0;
            int64_t matched = 0;
            for (size_t p = 0; p < probed.size(); p++) {
                int32_t list = probed[p];
                const auto& lab = labels_[list];
                d.resize(lab.size());
                scanner.distances(p, list, d.data());
                for (size_t i = 0; i < lab.size(); i++) {
                    if (ranges != nullptr &&
                        (keys_[list][i] < ranges->lo[q] || keys_[list][i] > ranges->hi[q]))
                        continue;
                    matched++;
                    if (d[i] < topk.threshold()) {
                        topk.push(d[i], lab[i]);
                        if (exact == nullptr)
                            continue;
                        // Candidates pushed out since cannot come back: keep the
                        // list near k whatever the order of the lists.
                        if (taken.size() >= 4 * k) {
                            const float t = topk.threshold();
                            taken.erase(std::remove_if(taken.begin(), taken.end(),
                                                       [t](const Taken& x) { return x.adc > t; }),
                                        taken.end());
                        }
                        taken.push_back({lab[i], seq++, &vectors_[list][i * d_], d[i]});
                    }
                }
            }
            if (ranges != nullptr && ranges->matched != nullptr)
                ranges->matched[q] = matched;
            std::vector<Neighbor> best = topk.take_sorted();
            for (size_t i = 0; i < k; i++) {
                dist[q * k + i] = i < best.size() ? best[i].dist : std::numeric_limits<float>::infinity();
                labels[q * k + i] = i < best.size() ? best[i].label : -1;
            }
            if (exact != nullptr)
                rerank(queries + q * d_, best, taken, k, exact + q * k, labels + q * k);
        }
    }

    // Exact distances of the selected candidates (the latest vector taken
    // under each label), sorted as the GPU's re-rank sorts them.
    void rerank(const float* query, const std::vector<Neighbor>& best, std::vector<Taken>& taken,
                size_t k, double* exact, int64_t* labels) const
    {
        auto by_label = [](const Taken& a, const Taken& b) {
            return a.label != b.label ? a.label < b.label : a.seq < b.seq;
        };
        std::sort(taken.begin(), taken.end(), by_label);
        std::vector<std::pair<double, int64_t>> out;
        for (const Neighbor& nb : best) {
            auto at = std::upper_bound(taken.begin(), taken.end(), Taken{nb.label, SIZE_MAX, nullptr, 0.0f},
                                       by_label);
            require(at != taken.begin() && (at - 1)->label == nb.label, "mirror: lost a candidate's vector");
            out.emplace_back(exact_distance(metric_, query, (at - 1)->vector, d_), nb.label);
        }
        std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
            return exact_less(a.first, a.second, b.first, b.second);
        });
        for (size_t i = 0; i < k; i++) {
            exact[i] = i < out.size() ? out[i].first : std::numeric_limits<double>::infinity();
            labels[i] = i < out.size() ? out[i].second : -1;
        }
    }

public:

    void brute_force(const float* queries, size_t nq, size_t k, double* dist, int64_t* labels) override
    {
        require_select_k(k, "GPU IVFPQ brute force");
        if (!has_vectors())
            throw Error(ErrorKind::Unsupported, "GPU IVFPQ brute force: the mirror keeps no vectors");
        const size_t d = d_;
        std::vector<std::pair<double, int64_t>> all;
        for (size_t q = 0; q < nq; q++) {
            all.clear();
            for (size_t l = 0; l < labels_.size(); l++)
                for (size_t i = 0; i < labels_[l].size(); i++)
                    all.emplace_back(exact_distance(metric_, queries + q * d, &vectors_[l][i * d], d),
                                     labels_[l][i]);
            const size_t kk = std::min(k, all.size());
            auto less = [](const auto& a, const auto& b) { return exact_less(a.first, a.second, b.first, b.second); };
            std::partial_sort(all.begin(), all.begin() + kk, all.end(), less);
            for (size_t i = 0; i < k; i++) {
                dist[q * k + i] = i < kk ? all[i].first : std::numeric_limits<double>::infinity();
                labels[q * k + i] = i < kk ? all[i].second : -1;
            }
        }
    }

    size_t remove(size_t n, const int64_t* labels) override
    {
        std::vector<int64_t> gone(labels, labels + n);
        std::sort(gone.begin(), gone.end());
        const size_t m = m_, d = d_;
        size_t removed = 0;
        for (size_t l = 0; l < labels_.size(); l++) {
            auto& lab = labels_[l];
            auto& codes = codes_[l];
            size_t kept = 0;
            for (size_t i = 0; i < lab.size(); i++) {
                if (std::binary_search(gone.begin(), gone.end(), lab[i]))
                    continue;
                // Compacted in place, order kept, as the GPU's remove_ids does.
                lab[kept] = lab[i];
                std::memmove(&codes[kept * m], &codes[i * m], m);
                if (has_vectors())
                    std::memmove(&vectors_[l][kept * d], &vectors_[l][i * d], d * sizeof(float));
                if (has_keys())
                    keys_[l][kept] = keys_[l][i];
                kept++;
            }
            removed += lab.size() - kept;
            lab.resize(kept);
            codes.resize(kept * m);
            if (has_vectors())
                vectors_[l].resize(kept * d);
            if (has_keys())
                keys_[l].resize(kept);
        }
        entries_ -= removed;
        return removed;
    }

    size_t entries() const override { return entries_; }
    size_t bytes() const override
    {
        return entries_ * (m_ + sizeof(int64_t) + (has_vectors() ? d_ * sizeof(float) : 0) +
                           (has_keys() ? sizeof(int64_t) : 0));
    }

private:
    // One query's probed lists and each list's distances, for either kind
    // of codes: the engine's own routines (IVFADC tables, or RaBitQ's
    // prepare_list and scan), as the CPU path ranks the pages' entries.
    class ListScanner {
    public:
        explicit ListScanner(const CpuMirror& mirror) : mirror_(mirror)
        {
            if (mirror_.pq_)
                table_.resize(mirror_.m_ * kPqCentroids);
        }

        // Prepares the query; returns its probes lists, nearest first.
        const std::vector<int32_t>& prepare(const float* query, size_t probes)
        {
            if (mirror_.pq_) {
                mirror_.pq_->prepare_query(query, probes, prepared_);
                return prepared_.lists;
            }
            mirror_.rabitq_->prepare_query(query, rabitq_query_);
            probed_ = mirror_.rabitq_->probe_lists(rabitq_query_, probes);
            return probed_;
        }

        // Distances (ADC, or RaBitQ lower bounds) of every entry of the p-th
        // probed list, list.
        void distances(size_t p, int32_t list, float* out)
        {
            const size_t n = mirror_.labels_[list].size(), m = mirror_.m_;
            const uint8_t* codes = mirror_.codes_[list].data();
            if (mirror_.pq_) {
                float base = 0;
                mirror_.pq_->list_table(prepared_, p, table_.data(), &base);
                adc_scan(codes, n, m, table_.data(), m, base, out);
                return;
            }
            if (n == 0)
                return;
            // An entry's factors follow its bit planes, unaligned: copied out for scan.
            const size_t planes = mirror_.rabitq_->code_bytes();
            factors_.resize(n);
            for (size_t i = 0; i < n; i++)
                std::memcpy(&factors_[i], codes + i * m + planes, sizeof(RabitqFactors));
            mirror_.rabitq_->prepare_list(rabitq_query_, list, list_query_);
            // Ranked by lower bounds, as the GPU ranks them (rabitq_index.h).
            mirror_.rabitq_->scan_keys(list_query_, codes, m, factors_.data(), n, kRabitqLowerEps0, out);
        }

    private:
        const CpuMirror& mirror_;
        std::vector<float> table_;
        IvfPqQuery prepared_;
        RabitqQuery rabitq_query_;
        RabitqListQuery list_query_;
        std::vector<int32_t> probed_;
        std::vector<RabitqFactors> factors_;
    };

    size_t d_, m_, lists_;
    std::unique_ptr<IvfPqModel> pq_;       // PQ codes (else null)
    std::unique_ptr<RabitqModel> rabitq_;  // RaBitQ codes (else null)
    std::vector<std::vector<uint8_t>> codes_;
    std::vector<std::vector<int64_t>> labels_;
    std::vector<std::vector<float>> vectors_;  // per list, d floats per entry (empty: none)
    std::vector<std::vector<int64_t>> keys_;   // per list, one filter key per entry (empty: none)
    Metric metric_;
    size_t entries_ = 0;
};

class CpuEmulationDevice final : public ComputeDevice {
public:
    std::string description() const override { return "CPU emulation (testing only, no GPU)"; }
    size_t memory_capacity() const override { return size_t(1) << 30; }
    size_t mirror_bytes(const MirrorSpec& spec, size_t n) const override
    {
        // A RaBitQ mirror also holds its model (the rotation and P c).
        const size_t model = spec.rabitq_bits != 0 ? rabitq_model_bytes(spec.d, spec.lists) : 0;
        return model + n * (spec.m + sizeof(int64_t) + (spec.vectors ? spec.d * sizeof(float) : 0) +
                            (spec.filter_keys ? sizeof(int64_t) : 0));
    }
    std::unique_ptr<Mirror> create_mirror(const MirrorSpec& spec) override
    {
        if (spec.rabitq_bits != 0) {
            require_rabitq_spec(spec);
            if (spec.rabitq_model == nullptr || spec.centroids == nullptr)
                throw Error(ErrorKind::InvalidArgument, "RaBitQ mirror: no model");
        } else {
            require_gpu_m(spec.d, spec.m);
        }
        return std::make_unique<CpuMirror>(spec);
    }
    void train(const float* x, size_t n, size_t d, size_t lists, size_t m, Metric metric,
               const IvfPqTrainParams& params, float* centroids, float* codebooks) override
    {
        require_gpu_m(d, m);
        IvfPqModel model(d, lists, m, metric);
        model.train(x, n, params);
        std::memcpy(centroids, model.centroids().data(), model.centroids().size() * sizeof(float));
        std::memcpy(codebooks, model.pq().codebooks().data(),
                    model.pq().codebooks().size() * sizeof(float));
    }
    void exact_knn(const float* queries, size_t nq, const float* base, size_t n, size_t d,
                   Metric metric, size_t k, float* dist, int64_t* labels) override
    {
        require_select_k(k, "exact search");
        brute_force_knn(queries, nq, base, n, d, metric, k, dist, labels);
    }
    void encode(const MirrorSpec& spec, const float* x, size_t n, int32_t* list_ids,
                uint8_t* codes) override
    {
        if (spec.rabitq_bits != 0) {
            require_rabitq_spec(spec);
            const std::unique_ptr<RabitqModel> model = rabitq_model_of(spec);
            model->assign(x, n, list_ids);
            model->encode_rows(x, n, list_ids, codes);
            return;
        }
        require_gpu_m(spec.d, spec.m);
        IvfPqModel model(spec.d, spec.lists, spec.m, spec.metric);
        model.set_centroids(spec.centroids);
        model.set_codebooks(spec.codebooks);
        model.encode(x, n, list_ids, codes);
    }
    std::unique_ptr<MetricMirror> create_metric_mirror(const MetricSpec& spec) override
    {
        // The engine's own index, restored from the state (metric_mirror.cpp).
        return make_engine_metric_mirror(spec);
    }
};

}  // namespace

void require_rabitq_spec(const MirrorSpec& spec)
{
    const auto bad = [](const std::string& why) { throw Error(ErrorKind::InvalidArgument, "RaBitQ mirror: " + why); };
    if (spec.rabitq_bits < kRabitqMinBits || spec.rabitq_bits > kRabitqMaxBits)
        bad(std::to_string(spec.rabitq_bits) + " bits per dimension, outside [" + std::to_string(kRabitqMinBits) +
            ", " + std::to_string(kRabitqMaxBits) + "]");
    if (spec.d < 1 || spec.d > kRabitqMaxDims)
        bad("d = " + std::to_string(spec.d) + " outside [1, " + std::to_string(kRabitqMaxDims) + "]");
    if (spec.lists < 1)
        bad("no lists");
    if (spec.m != rabitq_row_bytes(spec.d, spec.rabitq_bits))
        bad("m = " + std::to_string(spec.m) + " bytes a row, not the " +
            std::to_string(rabitq_row_bytes(spec.d, spec.rabitq_bits)) + " of d = " + std::to_string(spec.d) +
            " at " + std::to_string(spec.rabitq_bits) + " bits");
    if (spec.vectors)
        bad("RaBitQ mirrors keep no vectors");
}

std::unique_ptr<ComputeDevice> make_cpu_emulation_device()
{
    return std::make_unique<CpuEmulationDevice>();
}

}  // namespace gpuivfpq
