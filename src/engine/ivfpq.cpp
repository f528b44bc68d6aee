// IVFADC model: training, residual encoding and the three-term ADC tables.
#include "ivfpq.h"
#include "interrupt.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>

#include "error.h"
#include "internal.h"
#include "parallel.h"
#include "sampling.h"
#include "search_limits.h"
#include "topk.h"

namespace gpuivfpq {

namespace {

// Copies the listed rows of x (ascending indices) into a dense buffer,
// normalised for Cosine so every later step works on the unit sphere.
std::vector<float> gather_rows(const float* x, const std::vector<size_t>& idx, size_t d,
                               bool normalise)
{
    std::vector<float> out(detail::checked_mul(idx.size(), d, "training sample"));
    for (size_t i = 0; i < idx.size(); i++)
        std::memcpy(out.data() + i * d, x + idx[i] * d, d * sizeof(float));
    if (normalise)
        normalize_rows(out.data(), idx.size(), d);
    return out;
}

}  // namespace

bool ivfpq_ranks_query(const float* q, size_t d)
{
    double s = 0.0;
    for (size_t t = 0; t < d; t++)
        s += double(q[t]) * double(q[t]);
    return s <= kMaxRankedNormSqr;
}

IvfPqModel::IvfPqModel(size_t d, size_t lists, size_t m, Metric metric)
    : d_(d), lists_(lists), metric_(metric), pq_(d, m)
{
    require(lists >= 1, "IVFPQ: lists must be at least 1");
    require(lists <= size_t(INT32_MAX), "IVFPQ: too many lists");
    require(metric == Metric::L2 || metric == Metric::InnerProduct || metric == Metric::Cosine,
            "IVFPQ: unknown metric");
    centroids_.assign(detail::checked_mul(lists, d, "IVFPQ centroids"), 0.0f);
    centroid_norms_.assign(lists, 0.0f);
}

void IvfPqModel::set_centroids(const float* data)
{
    require(data != nullptr, "IVFPQ: null centroids");
    std::copy(data, data + centroids_.size(), centroids_.begin());
    for (size_t l = 0; l < lists_; l++)
        centroid_norms_[l] = norm_sqr(centroids_.data() + l * d_, d_);
    term1_.clear();  // depends on the centroids: stale now
}

void IvfPqModel::set_codebooks(const float* data)
{
    pq_.set_codebooks(data);
    term1_.clear();  // depends on the codebooks: stale now
}

IvfPqTrainingRows ivfpq_training_rows(size_t n, size_t lists, uint64_t seed,
                                      size_t max_points_per_centroid, size_t pq_max_training)
{
    require(lists >= 1, "IVFPQ: lists must be at least 1");
    require(max_points_per_centroid >= 1, "IVFPQ: max_points_per_centroid must be >= 1");
    require(pq_max_training >= 1, "IVFPQ: pq_max_training must be >= 1");
    Rng rng(seed);
    // The coarse sample bounds k-means (which would subsample anyway) and the
    // normalised copy for Cosine.
    const size_t cap =
        max_points_per_centroid > SIZE_MAX / lists ? n : lists * max_points_per_centroid;
    IvfPqTrainingRows rows;
    rows.coarse = sample_indices(n, std::min(n, cap), rng);
    rows.pq = sample_indices(n, std::min(n, pq_max_training), rng);
    return rows;
}

KMeansParams ivfpq_coarse_params(const IvfPqTrainParams& params)
{
    KMeansParams kp;
    kp.iterations = params.iterations;
    kp.seed = params.seed;
    kp.max_points_per_centroid = params.max_points_per_centroid;
    kp.threads = params.threads;
    return kp;
}

KMeansParams ivfpq_pq_params(const IvfPqTrainParams& params, size_t pq_rows)
{
    KMeansParams kp;
    kp.iterations = params.iterations;
    kp.seed = params.seed ^ 0x5bd1e995ULL;
    kp.max_points_per_centroid = std::max<size_t>(pq_rows, 1);  // already subsampled
    kp.threads = params.threads;
    return kp;
}

void ivfpq_train_coarse(const float* x, size_t n, size_t d, size_t lists, Metric metric,
                        const IvfPqTrainParams& params, float* centroids)
{
    require(n >= 1 && x != nullptr && centroids != nullptr, "IVF: no training vectors");
    const IvfPqTrainingRows rows = ivfpq_training_rows(
        n, lists, params.seed, params.max_points_per_centroid, params.pq_max_training);
    const std::vector<float> sample = gather_rows(x, rows.coarse, d, metric == Metric::Cosine);
    kmeans_train(sample.data(), rows.coarse.size(), d, lists, ivfpq_coarse_params(params),
                 centroids);
}

void IvfPqModel::train(const float* x, size_t n, const IvfPqTrainParams& params)
{
    require(n >= 1, "IVFPQ: need at least one training vector");
    require(x != nullptr, "IVFPQ: null training data");
    require(params.iterations >= 0, "IVFPQ: iterations must not be negative");
    require(params.max_points_per_centroid >= 1, "IVFPQ: max_points_per_centroid must be >= 1");
    require(params.pq_max_training >= 1, "IVFPQ: pq_max_training must be >= 1");
    const bool cosine = metric_ == Metric::Cosine;
    const IvfPqTrainingRows rows = ivfpq_training_rows(
        n, lists_, params.seed, params.max_points_per_centroid, params.pq_max_training);

    // Coarse quantizer on its sample.
    {
        std::vector<float> cent(centroids_.size());
        ivfpq_train_coarse(x, n, d_, lists_, metric_, params, cent.data());
        set_centroids(cent.data());
    }

    // PQ on residuals of its sample, each against its nearest centroid.
    const size_t np = rows.pq.size();
    std::vector<float> res = gather_rows(x, rows.pq, d_, cosine);
    std::vector<int32_t> assign(np);
    assign_nearest(res.data(), np, centroids_.data(), lists_, d_, assign.data(), nullptr,
                   params.threads, centroid_norms_.data());
    for (size_t i = 0; i < np; i++) {
        const float* c = centroids_.data() + size_t(assign[i]) * d_;
        for (size_t t = 0; t < d_; t++)
            res[i * d_ + t] -= c[t];
    }
    // A residual past the float range (a value and its centroid of about
    // 2e38 and opposite signs) would make the codebook's sums inf - inf.
    clamp_to_finite(res.data(), res.size());
    pq_.train(res.data(), np, ivfpq_pq_params(params, np));
    term1_.clear();
}

void IvfPqModel::encode(const float* x, size_t n, int32_t* list_ids, uint8_t* codes,
                        float* centroid_dist, int threads) const
{
    if (n == 0)
        return;
    require(x && list_ids && codes, "IVFPQ: null pointer in encode");
    const bool cosine = metric_ == Metric::Cosine;
    const size_t m = pq_.m();
    // Fixed tiles (independent of the thread count): copy, normalise, assign,
    // subtract the centroid, PQ-encode the residual.
    constexpr size_t kRows = 2048;
    const size_t ntiles = (n + kRows - 1) / kRows;
    parallel_for(ntiles, threads, [&](size_t t0, size_t t1) {
        std::vector<float> buf(std::min(kRows, n) * d_), dist(std::min(kRows, n));
        for (size_t t = t0; t < t1; t++) {
            check_interrupt();
            const size_t r0 = t * kRows, nr = std::min(kRows, n - r0);
            std::memcpy(buf.data(), x + r0 * d_, nr * d_ * sizeof(float));
            if (cosine)
                normalize_rows(buf.data(), nr, d_);
            assign_nearest(buf.data(), nr, centroids_.data(), lists_, d_, list_ids + r0,
                           dist.data(), 1, centroid_norms_.data());
            for (size_t i = 0; i < nr; i++) {
                const float* c = centroids_.data() + size_t(list_ids[r0 + i]) * d_;
                float* r = buf.data() + i * d_;
                for (size_t k = 0; k < d_; k++)
                    r[k] -= c[k];
                if (centroid_dist)
                    centroid_dist[r0 + i] = std::sqrt(dist[i]);
            }
            pq_.encode(buf.data(), nr, codes + r0 * m, 1);
        }
    });
}

void IvfPqModel::centroid_distances(const float* x, size_t n, const int32_t* list_ids,
                                    float* out, int threads) const
{
    constexpr size_t kRows = 2048;
    parallel_for((n + kRows - 1) / kRows, threads, [&](size_t t0, size_t t1) {
        std::vector<float> v(d_);
        for (size_t i = t0 * kRows; i < std::min(n, t1 * kRows); i++) {
            if (i % kRows == 0)
                check_interrupt();
            require(list_ids[i] >= 0 && size_t(list_ids[i]) < lists_, "IVFPQ: list id out of range");
            std::memcpy(v.data(), x + i * d_, d_ * sizeof(float));
            if (metric_ == Metric::Cosine)
                normalize_rows(v.data(), 1, d_);
            out[i] = std::sqrt(l2_sqr(v.data(), centroids_.data() + size_t(list_ids[i]) * d_, d_));
        }
    });
}

void IvfPqModel::quantization_errors(const float* x, size_t n, const int32_t* list_ids,
                                     const uint8_t* codes, float* out, int threads) const
{
    constexpr size_t kRows = 2048;
    const size_t m = pq_.m();
    parallel_for((n + kRows - 1) / kRows, threads, [&](size_t t0, size_t t1) {
        std::vector<float> v(d_), rec(d_);
        for (size_t i = t0 * kRows; i < std::min(n, t1 * kRows); i++) {
            if (i % kRows == 0)
                check_interrupt();
            std::memcpy(v.data(), x + i * d_, d_ * sizeof(float));
            if (metric_ == Metric::Cosine)
                normalize_rows(v.data(), 1, d_);
            reconstruct(list_ids[i], codes + i * m, rec.data());
            double s = 0.0;
            for (size_t t = 0; t < d_; t++) {
                double diff = double(v[t]) - rec[t];
                s += diff * diff;
            }
            out[i] = float(std::sqrt(s));
        }
    });
}

bool IvfPqModel::precompute_tables(size_t max_bytes)
{
    term1_.clear();
    term1_.shrink_to_fit();
    // For IP the table (-<q_j, C_jc>) is the same for every list: nothing to store.
    if (metric_ == Metric::InnerProduct)
        return false;
    const size_t m = pq_.m(), dsub = pq_.dsub(), row = m * kPqCentroids;
    if (lists_ > max_bytes / sizeof(float) / row)
        return false;
    const float* cb = pq_.codebooks().data();
    std::vector<float> cnorm(row);
    for (size_t c = 0; c < row; c++)
        cnorm[c] = norm_sqr(cb + c * dsub, dsub);
    try {
        term1_.resize(lists_ * row);
    } catch (const std::bad_alloc&) {
        term1_.clear();
        return false;  // queries still work through the direct tables
    }
    // <c_l,j , C_jc> for all lists at once: one strided GEMM per sub-quantizer
    // writing straight into the (list, j, code) layout.
    for (size_t j = 0; j < m; j++)
        detail::gemm_nt(lists_, kPqCentroids, dsub, centroids_.data() + j * dsub, d_,
                        cb + j * kPqCentroids * dsub, dsub, term1_.data() + j * kPqCentroids,
                        row);
    for (size_t l = 0; l < lists_; l++) {
        float* t = term1_.data() + l * row;
        for (size_t c = 0; c < row; c++)
            t[c] = cnorm[c] + 2.0f * t[c];
    }
    return true;
}

void IvfPqModel::prepare_query(const float* q, size_t nprobe, IvfPqQuery& out) const
{
    require(q != nullptr, "IVFPQ: null query");
    require(nprobe >= 1, "IVFPQ: nprobe must be at least 1");
    nprobe = std::min(nprobe, lists_);
    const bool ip_metric = metric_ == Metric::InnerProduct;
    out.q.assign(q, q + d_);
    if (metric_ == Metric::Cosine)
        normalize_rows(out.q.data(), 1, d_);
    const float* qq = out.q.data();

    // Coarse ranking of all lists: one dot product per centroid (a GEMM of
    // one row would first copy all the centroids into its packed layout, as
    // much memory traffic again as reading them).
    std::vector<float> dist(lists_);
    for (size_t l = 0; l < lists_; l++)
        dist[l] = inner_product(qq, centroids_.data() + l * d_, d_);
    const float qn = norm_sqr(qq, d_);
    // A list whose distance overflowed is still probed, after the others
    // (the GPU's coarse selection ranks it alike).
    for (size_t l = 0; l < lists_; l++)
        dist[l] = rank_distance(ip_metric ? -dist[l] : qn + centroid_norms_[l] - 2.0f * dist[l]);
    TopK top(nprobe);
    top.push_range(dist.data(), lists_, 0);
    std::vector<Neighbor> probes = top.take_sorted();

    // The chosen lists' base distances exactly (the GEMM form cancels badly
    // near a centroid), then re-ordered by them.
    for (Neighbor& p : probes) {
        const float* c = centroids_.data() + size_t(p.label) * d_;
        p.dist = ip_metric ? -inner_product(qq, c, d_) : l2_sqr(qq, c, d_);
    }
    // Ordered as ranked (a NaN, inf - inf of an inner product, would break
    // the sort); the base distances stay as computed, as the GPU's do.
    std::sort(probes.begin(), probes.end(), [](const Neighbor& a, const Neighbor& b) {
        return neighbor_less({rank_distance(a.dist), a.label}, {rank_distance(b.dist), b.label});
    });
    out.lists.resize(probes.size());
    out.coarse.resize(probes.size());
    for (size_t i = 0; i < probes.size(); i++) {
        out.lists[i] = int32_t(probes[i].label);
        out.coarse[i] = probes[i].dist;
    }

    // Term 3, shared by all probed lists.
    out.term3.resize(pq_.m() * kPqCentroids);
    pq_.ip_table(qq, out.term3.data());
    const float scale = ip_metric ? -1.0f : -2.0f;
    for (float& v : out.term3)
        v *= scale;
}

void IvfPqModel::list_table(const IvfPqQuery& query, size_t probe, float* table,
                            float* base) const
{
    require(table && base, "IVFPQ: null pointer in list_table");
    require(probe < query.lists.size() && probe < query.coarse.size(),
            "IVFPQ: probe index out of range");
    const size_t row = pq_.m() * kPqCentroids;
    require(query.q.size() == d_ && query.term3.size() == row,
            "IVFPQ: query was not prepared by a model of this shape");
    const int32_t l = query.lists[probe];
    require(l >= 0 && size_t(l) < lists_, "IVFPQ: list id out of range");

    if (metric_ == Metric::InnerProduct) {
        std::copy(query.term3.begin(), query.term3.end(), table);
        *base = query.coarse[probe];
    } else if (!term1_.empty()) {
        const float* t1 = term1_.data() + size_t(l) * row;
        const float* t3 = query.term3.data();
        for (size_t i = 0; i < row; i++)
            table[i] = t1[i] + t3[i];
        *base = query.coarse[probe];
    } else {
        // Direct table on the residual: ||(q - c_l)_j - C_jc||^2, base 0.
        std::vector<float> r(d_);
        const float* c = centroids_.data() + size_t(l) * d_;
        for (size_t t = 0; t < d_; t++)
            r[t] = query.q[t] - c[t];
        pq_.l2_table(r.data(), table);
        *base = 0.0f;
    }
}

void IvfPqModel::reconstruct(int32_t list, const uint8_t* code, float* out) const
{
    require(code && out, "IVFPQ: null pointer in reconstruct");
    require(list >= 0 && size_t(list) < lists_, "IVFPQ: list id out of range");
    pq_.decode(code, 1, out);
    const float* c = centroids_.data() + size_t(list) * d_;
    for (size_t t = 0; t < d_; t++)
        out[t] += c[t];
}

}  // namespace gpuivfpq
