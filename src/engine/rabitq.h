// Extended RaBitQ codes: B bits per dimension of a rotated IVF residual, with
// an unbiased distance estimate and an error bound per (query, row) pair, so
// that an index needs no float copy of its rows (docs/rabitq-codes.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "distances.h"
#include "topk.h"

namespace gpuivfpq {

// Bits per dimension a code may have (B = 1 is the original 1-bit RaBitQ).
constexpr int kRabitqMinBits = 1;
constexpr int kRabitqMaxBits = 8;

// Largest dimension with RaBitQ codes: the rotation is a dense d x d matrix
// stored in the index (16 MB of floats at this size).
constexpr size_t kRabitqMaxDims = 2000;

// The bound's default confidence parameter (the papers' eps0): the error of
// an estimate is about Gaussian with a known scale, and eps0 counts those
// scales (docs/rabitq-codes.md, "The error bound, and what eps0 means").
constexpr float kRabitqDefaultEps0 = 1.9f;

// The confidence of the lower bounds that scans rank candidates by and
// re-rank against (estimate - bound: the true distance lies below it for
// about 0.1% of pairs at eps0 = 3): a candidate whose lower bound exceeds
// the k-th exact distance found so far is not fetched (docs/rabitq-codes.md,
// "Re-ranking by lower bounds").
constexpr float kRabitqLowerEps0 = 3.0f;

// ---- Code layout (what the index pages and the GPU store per row) ----
//
// A row's code is `bits` bit planes of rabitq_plane_words(d) 32-bit words
// each, most significant plane first; a row's code is bits * plane_words
// consecutive little-endian uint32 words (4-byte aligned: a GPU reads it
// with 32-bit loads, one warp lane per word). Plane p (0 <= p < bits)
// holds bit (bits - 1 - p) of every dimension's unsigned value x_i: bit
// (i % 32) of word (i / 32). Padding bits (i >= d) are 0. Plane 0 is the
// sign plane (x_i >= 2^(bits-1) iff the rotated residual's coordinate i is
// >= 0): the 1-bit RaBitQ code, and the first p planes are the code
// truncated to p bits.

// 32-bit words per bit plane: ceil(d / 32).
constexpr size_t rabitq_plane_words(size_t d) { return (d + 31) / 32; }

// Bytes of one row's code: bits * plane_words * 4.
constexpr size_t rabitq_code_bytes(size_t d, int bits)
{
    return size_t(bits) * rabitq_plane_words(d) * 4;
}

// The per-row factors of the estimator, three float32 stored beside the code.
struct RabitqFactors {
    // L2 and Cosine: ||r||^2; InnerProduct: <c, r> (r = o - c, c the list centroid).
    float add;
    // ||r|| / <y, o'>: turns <y, q'> into the estimate of <r, q - c>.
    float rescale;
    // ||r|| * sqrt(1 - a^2) / (a * sqrt(d - 1)), a = <y/||y||, o'>: the
    // bound's half-width per unit of eps0 and of ||q - c|| (twice that for
    // L2; 0 for d = 1 and for a zero residual).
    float error;
};
static_assert(sizeof(RabitqFactors) == 12, "RabitqFactors is stored as three float32");

// Bytes one row takes in an index: its code and its factors.
constexpr size_t rabitq_row_bytes(size_t d, int bits)
{
    return rabitq_code_bytes(d, bits) + sizeof(RabitqFactors);
}

// The widest row any index with RaBitQ codes has (kRabitqMaxDims at
// kRabitqMaxBits: 2028 bytes): what the GPU service's change log and its WAL
// announcements must carry.
constexpr size_t kRabitqMaxRowBytes = rabitq_row_bytes(kRabitqMaxDims, kRabitqMaxBits);

// The model of an index with RaBitQ codes as its pages, the service and the
// GPU mirrors pass it on, one blob: the rotation P (d x d floats, row-major,
// RabitqRotation::matrix()), then from rabitq_rotated_offset(d) (8-byte
// aligned) P c of every list centroid c (lists x d doubles,
// RabitqModel::rotated_centroids()).
constexpr size_t rabitq_rotated_offset(size_t d)
{
    return (d * d * sizeof(float) + sizeof(double) - 1) / sizeof(double) * sizeof(double);
}
constexpr size_t rabitq_model_bytes(size_t d, size_t lists)
{
    return rabitq_rotated_offset(d) + lists * d * sizeof(double);
}

// Writes the code of the d unsigned values x (each below 2^bits) into
// code (rabitq_code_bytes(d, bits) bytes, padding zeroed).
void rabitq_pack(const uint8_t* x, size_t d, int bits, uint8_t* code);

// Reads the d unsigned values of a code back into x.
void rabitq_unpack(const uint8_t* code, size_t d, int bits, uint8_t* x);

// The grid point extended RaBitQ picks for a unit vector.
struct RabitqGridPoint {
    double ip;        // <y, o>, y_i = x_i - (2^bits - 1) / 2
    double norm_sqr;  // ||y||^2
};

// Finds the point y of the grid {-(2^bits-1)/2, ..., (2^bits-1)/2}^d (step
// 1) whose direction has the largest cosine with o (d <= kRabitqMaxDims
// doubles, unit length or zero): writes its unsigned values x_i = y_i +
// (2^bits - 1) / 2 (d bytes) and returns <y, o> and ||y||^2. Exact: the
// papers' sweep over the scale factors at which a coordinate's rounding
// changes, and its result bit for bit (which the codes and factors depend
// on): with u = |o| and the coordinates with u_i > 0 ranked by decreasing
// u_i (ties by index), rank r steps to level j (1 <= j < 2^(bits-1)) at t =
// j * (1 / u_r) in double; steps in (t, j, r) order; <y, u> starts at the
// sum of u_i / 2 in index order and adds u_r per step, in double; ||y||^2
// starts at d / 4 and adds 2j; a state is the new best when ip * ip *
// best_nsq > best_ip * best_ip * nsq. The work is far less than the sweep's
// (rabitq_grid.cpp). Deterministic: depends on o only.
RabitqGridPoint rabitq_best_grid_point(const double* o, size_t d, int bits, uint8_t* x);

// A random orthogonal d x d matrix P, drawn from the Haar distribution by
// Stewart's method (Householder reflections of Gaussian vectors) in double
// precision from the engine's Rng. The Gaussians come from Marsaglia's polar
// method with a logarithm written here, and every step uses only IEEE +, -,
// *, / and sqrt in a fixed order: a seed gives the same floats on every
// machine and for every thread count. Stored in an index as its d * d
// floats (matrix()); from_matrix loads it back.
class RabitqRotation {
public:
    // Generates P for a seed: O(d^3), 0.4 s at d = 768 and 6 s at d = 2000
    // on one core (shared); threads split its columns.
    static RabitqRotation generate(size_t d, uint64_t seed, int threads = 1);

    // Loads d * d floats (row-major P, as matrix() gives them); they must be
    // finite.
    static RabitqRotation from_matrix(size_t d, const float* matrix);

    size_t d() const { return d_; }

    // P, row-major: the rotation maps x to P x, (P x)_i = sum_j P[i*d + j] x_j.
    const std::vector<float>& matrix() const { return p_; }

    // out = P x for one vector (d values), summed in double in a fixed
    // order (identical on every thread and CPU): coordinate i is the sum
    // of P[i*d + j] x_j in four partial sums, p[j % 4] for j < d - d % 4,
    // the last d % 4 terms added to p[0] in order, then (p0 + p1) + (p2 + p3).
    void apply(const float* x, float* out) const;
    void apply(const double* x, double* out) const;

    // apply for n vectors (n x d, row-major, into n x d): the same bits as
    // n calls of apply, with P read once per 16 vectors.
    void apply_rows(const double* x, size_t n, double* out) const;

private:
    RabitqRotation(size_t d, std::vector<float> p) : d_(d), p_(std::move(p)) {}
    size_t d_;
    std::vector<float> p_;
};

// A query prepared for an index: the query (unit length for Cosine) and
// its rotation P q (double).
struct RabitqQuery {
    std::vector<float> q;
    std::vector<double> rotated;
};

// What scanning one list needs for one query: q' = P (q - c) folded into
// byte lookup tables, and the constants of the estimate.
struct RabitqListQuery {
    int32_t list = -1;
    // lut[j * 256 + v] = sum over the set bits t of v of q'[8j + t], minus
    // half the sum of q'[8j .. 8j + 8): the centred sum of one code byte,
    // so <y, q'> = sum_p 2^(bits-1-p) sum_j lut[j*256 + byte j of plane p].
    // Computed as the float sum of the byte's two nibble entries (low: bits
    // 0-3 and the minus half, high: bits 4-7), each summed in double
    // (highest set bit first) and rounded to float.
    std::vector<float> lut;
    float qr_norm = 0;  // ||q - c||
    // estimate = base + add_scale * add + ip_scale * rescale * <y, q'>;
    // bound = bound_scale * error * eps0.
    float base = 0;
    float add_scale = 0;
    float ip_scale = 0;
    float bound_scale = 0;
};

// One estimate and its bound: the true distance lies in
// [estimate - bound, estimate + bound] but for a small share of pairs
// (about 6% at eps0 = 1.9, 0.3% at eps0 = 3; docs/rabitq-codes.md).
struct RabitqEstimate {
    float estimate;
    float bound;
};

// A candidate of search_candidates: it may be among the k nearest.
struct RabitqCandidate {
    int64_t label;
    float estimate, lower, upper;
};

// One IVF list of an index: n rows, their labels, codes (code_bytes apart)
// and factors.
struct RabitqList {
    const int64_t* labels = nullptr;
    const uint8_t* codes = nullptr;
    const RabitqFactors* factors = nullptr;
    size_t n = 0;
};

// An IVF index with RaBitQ codes: list centroids (trained elsewhere, e.g. by
// kmeans_train), a rotation and the code width. Rows are encoded against the
// centroid of their list; estimates are the metric's ranking distance of
// metric_distance (L2: ||q - o||^2, InnerProduct: -<q, o>, Cosine:
// 1 - cos(q, o)). For Cosine, rows and queries are normalised here, as
// IvfPqModel does, and the centroids are those of normalised rows.
class RabitqModel {
public:
    // rotation.d() must equal d.
    RabitqModel(size_t d, size_t lists, int bits, Metric metric, RabitqRotation rotation);
    // The same with the rotation's d * d floats (RabitqRotation::from_matrix).
    RabitqModel(size_t d, size_t lists, int bits, Metric metric, const float* rotation_matrix);

    size_t d() const { return d_; }
    size_t lists() const { return lists_; }
    int bits() const { return bits_; }
    Metric metric() const { return metric_; }
    size_t code_bytes() const { return rabitq_code_bytes(d_, bits_); }
    const RabitqRotation& rotation() const { return rotation_; }
    const std::vector<float>& centroids() const { return centroids_; }  // lists x d
    // P c of every list centroid c (lists x d doubles), which prepare_list
    // subtracts from P q.
    const std::vector<double>& rotated_centroids() const { return rotated_; }

    // Loads the list centroids (lists x d floats) and rotates them
    // (lists x d^2 multiply-adds over `threads` threads; the same bits for
    // any thread count).
    void set_centroids(const float* data, int threads = 1);
    // Loads the list centroids with their rotations as rotated_centroids()
    // gave them (an index keeps both; they must be finite).
    void set_centroids(const float* data, const double* rotated);

    // list_ids[i] = the L2-nearest centroid of row i (normalised for Cosine):
    // the list a row belongs to (assign_nearest, as IVFPQ assigns).
    void assign(const float* x, size_t n, int32_t* list_ids, int threads = 1) const;

    // Encodes n rows against the centroids of their lists: codes (n x
    // code_bytes()) and factors (n). Rows are independent: the bytes do not
    // depend on threads.
    void encode(const float* x, size_t n, const int32_t* list_ids, uint8_t* codes,
                RabitqFactors* factors, int threads = 1) const;
    // The same as an index stores the rows: rows (n x rabitq_row_bytes(d,
    // bits)) each its code, then its factors (what a build writes and the
    // GPU's build encoder returns).
    void encode_rows(const float* x, size_t n, const int32_t* list_ids, uint8_t* rows, int threads = 1) const;

    // Normalises the query for Cosine.
    void prepare_query(const float* q, RabitqQuery& out) const;

    // Prepares the scan of one list for a prepared query: q' = P q - P c in
    // double, then 256 * d / 8 lookup entries (O(d) besides the tables).
    void prepare_list(const RabitqQuery& query, int32_t list, RabitqListQuery& out) const;

    // The estimate and bound of one row of the prepared list.
    RabitqEstimate estimate(const RabitqListQuery& lq, const uint8_t* code, const RabitqFactors& f,
                            float eps0 = kRabitqDefaultEps0) const;

    // Estimates and bounds of n rows of the prepared list: codes at
    // code_stride bytes from each other (>= code_bytes()), factors
    // contiguous; bound may be null. Estimates that overflowed read
    // kOverflowDistance (rank_distance), never NaN; a bound is >= 0 or +inf.
    void scan(const RabitqListQuery& lq, const uint8_t* codes, size_t code_stride,
              const RabitqFactors* factors, size_t n, float eps0, float* estimate,
              float* bound) const;

    // The rank keys of n rows of the prepared list (scan's arguments): the
    // lower bound estimate - bound at eps0 (> 0), or the estimate (eps0 =
    // 0). A bound of +inf (a row whose error is past the float range) gives
    // -inf: such a row always ranks first.
    void scan_keys(const RabitqListQuery& lq, const uint8_t* codes, size_t code_stride,
                   const RabitqFactors* factors, size_t n, float eps0, float* key) const;

    // The nprobe lists nearest to a prepared query (brute_force_knn over the
    // centroids: L2, or -<q, c> for InnerProduct), nearest first.
    std::vector<int32_t> probe_lists(const RabitqQuery& query, size_t nprobe) const;

    // Reference search: the k rows of the nprobe nearest lists with the
    // smallest rank keys (scan_keys: the estimates, or with eps0 > 0 the
    // lower bounds), ascending (lists: lists() entries).
    std::vector<Neighbor> search(const RabitqList* lists, const float* q, size_t nprobe, size_t k,
                                 float eps0 = 0.0f) const;

    // Candidates for an exact re-rank: every row of the probed lists whose
    // lower bound (estimate - bound) is at most the k-th smallest upper
    // bound, ordered by estimate. Where the bounds hold, the k nearest rows
    // of the probed lists are among them.
    std::vector<RabitqCandidate> search_candidates(const RabitqList* lists, const float* q,
                                                   size_t nprobe, size_t k,
                                                   float eps0 = kRabitqDefaultEps0) const;

private:
    // Calls visit(estimate, bound, label) for every row of the probed lists.
    template <typename Visit>
    void scan_probed(const RabitqList* lists, const float* q, size_t nprobe, float eps0,
                     bool want_bound, Visit&& visit) const;

    size_t d_, lists_;
    int bits_;
    Metric metric_;
    RabitqRotation rotation_;
    std::vector<float> centroids_;
    std::vector<float> centroid_norms_;  // ||c||^2 per list, for assign
    std::vector<double> rotated_;        // P c per list

    void set_centroid_norms();
};

}  // namespace gpuivfpq
