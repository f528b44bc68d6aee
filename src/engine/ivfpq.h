// IVFADC model: coarse quantizer + residual product quantizer, the paper's
// three-term distance decomposition, and per-query lookup tables.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "distances.h"
#include "kmeans.h"
#include "pq.h"

namespace gpuivfpq {

struct IvfPqTrainParams {
    int iterations = 10;          // k-means iterations, coarse and PQ
    uint64_t seed = 1234;
    size_t max_points_per_centroid = 64;  // coarse training subsample bound
    size_t pq_max_training = 65536;       // PQ training subsample bound
    int threads = 1;
};

// Whether the quantizers can rank distances from query q (d floats): its
// squared norm, in double, is at most kMaxRankedNormSqr (search_limits.h).
bool ivfpq_ranks_query(const float* q, size_t d);

// ---- How IVFPQ training draws and seeds, shared by IvfPqModel::train and
// the GPU training (gpu/ train_ivfpq_gpu), so that one seed gives both the
// same samples and initial centroids. ----

// The training rows: from Rng(seed), first the coarse quantizer's sample
// (at most lists * max_points_per_centroid of the n rows), then the PQ's
// (at most pq_max_training), each ascending.
struct IvfPqTrainingRows {
    std::vector<size_t> coarse, pq;
};
IvfPqTrainingRows ivfpq_training_rows(size_t n, size_t lists, uint64_t seed,
                                      size_t max_points_per_centroid, size_t pq_max_training);

// The coarse quantizer's k-means parameters (it trains on the coarse rows).
KMeansParams ivfpq_coarse_params(const IvfPqTrainParams& params);

// Trains the coarse quantizer alone (lists x d floats into centroids) as
// IvfPqModel::train does (the same rows, seeds and normalisation for
// Cosine): for indexes whose rows are coded against the list centroids by
// other codes (RaBitQ).
void ivfpq_train_coarse(const float* x, size_t n, size_t d, size_t lists, Metric metric,
                        const IvfPqTrainParams& params, float* centroids);

// The PQ's k-means parameters, for pq_rows residuals (no further
// subsample); sub-quantizer j uses pq_subquantizer_seed(seed, j).
KMeansParams ivfpq_pq_params(const IvfPqTrainParams& params, size_t pq_rows);

// Per-query state: the ordered probe list and the query-only table (term 3).
struct IvfPqQuery {
    std::vector<float> q;            // the query (unit length for Cosine)
    std::vector<int32_t> lists;      // probed lists, nearest first
    std::vector<float> coarse;       // their coarse distances (||q-c||^2, or -<q,c> for IP)
    std::vector<float> term3;        // m x 256: -2<q_j, C_jc> (L2/Cosine) or -<q_j, C_jc> (IP)
};

// The trained quantizers of one index. Vectors are encoded as
// (list = nearest coarse centroid, code = PQ(x - centroid)). For Cosine the
// model normalises inputs and works in L2 on the unit sphere, which ranks
// exactly like cosine distance.
class IvfPqModel {
public:
    IvfPqModel(size_t d, size_t lists, size_t m, Metric metric);

    size_t d() const { return d_; }
    size_t lists() const { return lists_; }
    size_t m() const { return pq_.m(); }
    Metric metric() const { return metric_; }

    const std::vector<float>& centroids() const { return centroids_; }  // lists x d
    const ProductQuantizer& pq() const { return pq_; }

    // Loads trained parameters (from index pages).
    void set_centroids(const float* data);  // lists x d
    void set_codebooks(const float* data);  // m x 256 x (d/m)

    // Trains on n sample vectors (n >= 1; with n < lists some centroids repeat).
    void train(const float* x, size_t n, const IvfPqTrainParams& params);

    // Encodes n vectors: list_ids[i], codes[i*m .. i*m+m), and optionally
    // centroid_dist[i] = exact Euclidean distance from the (normalised) vector
    // to its list centroid (the covering radius bookkeeping of range search).
    void encode(const float* x, size_t n, int32_t* list_ids, uint8_t* codes,
                float* centroid_dist = nullptr, int threads = 1) const;

    // out[i] = exact Euclidean distance from the (normalised) x_i to the
    // centroid of list_ids[i]: encode's centroid_dist for codes made elsewhere.
    void centroid_distances(const float* x, size_t n, const int32_t* list_ids, float* out,
                            int threads = 1) const;

    // out[i] = ||x_i - reconstruct(list_ids[i], code_i)|| for the (normalised)
    // x_i: how far ADC distances can be from exact ones (range search bound).
    void quantization_errors(const float* x, size_t n, const int32_t* list_ids, const uint8_t* codes,
                             float* out, int threads = 1) const;

    // Builds the precomputed term-1 tables (lists x m x 256 floats:
    // ||r||^2 + 2<c_j, r> per list, sub-quantizer and code) when they take at
    // most max_bytes; returns whether they are in use. Not used for IP,
    // where the table does not depend on the list.
    bool precompute_tables(size_t max_bytes);
    bool has_precomputed() const { return !term1_.empty(); }
    size_t precomputed_bytes() const { return term1_.size() * sizeof(float); }

    // Coarse search and term 3 for one query: the nprobe nearest lists
    // (nprobe is clamped to lists), ordered nearest first.
    void prepare_query(const float* q, size_t nprobe, IvfPqQuery& out) const;

    // The ADC table (m x 256) and base distance for the probe-th list of a
    // prepared query: distance(code) = base + sum_j table[j*256 + code[j]].
    void list_table(const IvfPqQuery& query, size_t probe, float* table, float* base) const;

    // Reconstruction of a code in a list (for tests): centroid + decode(code).
    void reconstruct(int32_t list, const uint8_t* code, float* out) const;

private:
    size_t d_, lists_;
    Metric metric_;
    std::vector<float> centroids_;
    std::vector<float> centroid_norms_;  // ||c||^2 per list
    ProductQuantizer pq_;
    std::vector<float> term1_;           // lists x m x 256, or empty
};

}  // namespace gpuivfpq
