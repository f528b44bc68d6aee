// Extended RaBitQ: the seeded rotation, the grid search, code packing, the
// per-list lookup tables, the estimator with its bound, and a reference search.
#include "rabitq.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "error.h"
#include "internal.h"

#if GPU_IVFPQ_X86_DISPATCH
#include <immintrin.h>
#endif
#include "interrupt.h"
#include "kmeans.h"
#include "parallel.h"
#include "rabitq_grid.h"
#include "rabitq_row.h"
#include "sampling.h"
#include "search_limits.h"

namespace gpuivfpq {

namespace {

void require_bits(int bits)
{
    require(bits >= kRabitqMinBits && bits <= kRabitqMaxBits,
            "RaBitQ: bits must be between " + std::to_string(kRabitqMinBits) + " and " +
                std::to_string(kRabitqMaxBits) + ", not " + std::to_string(bits));
}

void require_dims(size_t d)
{
    require(d >= 1 && d <= kRabitqMaxDims, "RaBitQ: dimension must be between 1 and " +
                                               std::to_string(kRabitqMaxDims) + ", not " +
                                               std::to_string(d));
}

// ---- Deterministic Gaussians ----

// ln(s) for finite s > 0 from IEEE operations only (libm's log may round
// differently between C libraries): s = m 2^e exactly, m in [sqrt(1/2),
// sqrt(2)), ln m = 2 atanh((m - 1) / (m + 1)) by its series, which has
// converged to double precision after these terms (|z| <= 0.172).
double portable_log(double s)
{
    constexpr double kLn2 = 0.693147180559945309417232121458176568;
    constexpr double kSqrtHalf = 0.707106781186547524400844362104849039;
    int e = 0;
    double m = std::frexp(s, &e);
    if (m < kSqrtHalf) {
        m *= 2.0;
        e -= 1;
    }
    const double z = (m - 1.0) / (m + 1.0), z2 = z * z;
    double term = z, sum = z;
    for (int k = 3; k <= 41; k += 2) {
        term *= z2;
        sum += term / double(k);
    }
    return 2.0 * sum + double(e) * kLn2;
}

// Standard normal draws from an Rng by Marsaglia's polar method (pairs; the
// second of a pair is kept for the next call).
class GaussianSource {
public:
    explicit GaussianSource(uint64_t seed) : rng_(seed) {}

    double next()
    {
        if (has_spare_) {
            has_spare_ = false;
            return spare_;
        }
        for (;;) {
            // Uniform on [-1, 1) in steps of 2^-52.
            const double u = double(rng_.next() >> 11) * 0x1p-52 - 1.0;
            const double v = double(rng_.next() >> 11) * 0x1p-52 - 1.0;
            const double s = u * u + v * v;
            if (s >= 1.0 || s == 0.0)
                continue;
            const double f = std::sqrt(-2.0 * portable_log(s) / s);
            spare_ = v * f;
            has_spare_ = true;
            return u * f;
        }
    }

private:
    Rng rng_;
    bool has_spare_ = false;
    double spare_ = 0.0;
};

// Columns of the rotation built together: 32 columns of 2000 doubles stay in
// the L2 cache while every reflector streams past them once.
constexpr size_t kRotationBlock = 32;

// Rows encoded per parallel_for step, rotated together (a row costs O(d^2)
// for its rotation plus its grid search).
constexpr size_t kEncodeTile = 16;

// ---- The rotation of many vectors ----
//
// out = P x computed exactly as rabitq_dot computes each coordinate: lane
// j of a 4-double vector is rabitq_dot's partial sum p[j], products and
// sums rounded separately (the build has no FMA contraction), the d % 4
// last terms added to lane 0 in order, then (p0 + p1) + (p2 + p3). Only the
// order of the loops differs, so the bits are rabitq_dot's.

typedef double RotV __attribute__((vector_size(32)));
typedef double RotVU __attribute__((vector_size(32), aligned(8), may_alias));
typedef float RotF __attribute__((vector_size(16)));
typedef float RotFU __attribute__((vector_size(16), aligned(4), may_alias));

// The loops of the rotation of n vectors (n <= kEncodeTile): rows of P in
// blocks of kRotateRows (their floats stay in L2), terms in blocks of
// kRotateTerms (a multiple of 4, so that lanes stay put; the inputs' terms
// stay in L1), registers holding NI rows x NS vectors of partial sums.
constexpr size_t kRotateRows = 24, kRotateTerms = 128;

// Partial sums (4 lanes each, acc + (s * d + i) * 4) of NI rows of P (p,
// stride d) and NS vectors (x, stride d) over terms [k0, k1), read and
// written back: the portable form.
template <int NI, int NS>
inline __attribute__((always_inline)) void rotate_block(const float* p, const double* x, size_t d,
                                                        size_t k0, size_t k1, double* acc)
{
    RotV a[NI][NS];
    for (int i = 0; i < NI; i++)
        for (int s = 0; s < NS; s++)
            a[i][s] = *reinterpret_cast<const RotVU*>(acc + (size_t(s) * d + size_t(i)) * 4);
    for (size_t k = k0; k < k1; k += 4) {
        RotV pv[NI];
        for (int i = 0; i < NI; i++) {
            const RotF f = *reinterpret_cast<const RotFU*>(p + size_t(i) * d + k);
            pv[i] = __builtin_convertvector(f, RotV);
        }
        for (int s = 0; s < NS; s++) {
            const RotV xv = *reinterpret_cast<const RotVU*>(x + size_t(s) * d + k);
            for (int i = 0; i < NI; i++)
                a[i][s] += pv[i] * xv;
        }
    }
    for (int i = 0; i < NI; i++)
        for (int s = 0; s < NS; s++)
            *reinterpret_cast<RotVU*>(acc + (size_t(s) * d + size_t(i)) * 4) = a[i][s];
}

#if GPU_IVFPQ_X86_DISPATCH
// rotate_block with AVX2 intrinsics (one conversion of 4 floats per row).
template <int NI, int NS>
__attribute__((target("arch=x86-64-v3"))) void rotate_block_avx2(const float* p, const double* x,
                                                                 size_t d, size_t k0, size_t k1,
                                                                 double* acc)
{
    __m256d a[NI][NS];
    for (int i = 0; i < NI; i++)
        for (int s = 0; s < NS; s++)
            a[i][s] = _mm256_loadu_pd(acc + (size_t(s) * d + size_t(i)) * 4);
    for (size_t k = k0; k < k1; k += 4) {
        __m256d pv[NI];
        for (int i = 0; i < NI; i++)
            pv[i] = _mm256_cvtps_pd(_mm_loadu_ps(p + size_t(i) * d + k));
        for (int s = 0; s < NS; s++) {
            const __m256d xv = _mm256_loadu_pd(x + size_t(s) * d + k);
            for (int i = 0; i < NI; i++)
                a[i][s] = _mm256_add_pd(a[i][s], _mm256_mul_pd(pv[i], xv));
        }
    }
    for (int i = 0; i < NI; i++)
        for (int s = 0; s < NS; s++)
            _mm256_storeu_pd(acc + (size_t(s) * d + size_t(i)) * 4, a[i][s]);
}
#endif

// The blocked loops over one block kernel: Block<ni, ns>::run(p, x, d, k0, k1, acc).
template <template <int, int> class Block>
inline __attribute__((always_inline)) void rotate_loops(const float* P, size_t d, const double* x,
                                                        size_t n, double* out, double* acc)
{
    std::fill(acc, acc + n * d * 4, 0.0);
    const size_t kfull = d / 4 * 4;
    for (size_t i0 = 0; i0 < d; i0 += kRotateRows) {
        const size_t i1 = std::min(d, i0 + kRotateRows);
        for (size_t k0 = 0; k0 < kfull; k0 += kRotateTerms) {
            const size_t k1 = std::min(kfull, k0 + kRotateTerms);
            size_t s = 0;
            for (; s + 4 <= n; s += 4) {
                size_t i = i0;
                for (; i + 3 <= i1; i += 3)
                    Block<3, 4>::run(P + i * d, x + s * d, d, k0, k1, acc + (s * d + i) * 4);
                for (; i < i1; i++)
                    Block<1, 4>::run(P + i * d, x + s * d, d, k0, k1, acc + (s * d + i) * 4);
            }
            for (; s < n; s++) {
                size_t i = i0;
                for (; i + 3 <= i1; i += 3)
                    Block<3, 1>::run(P + i * d, x + s * d, d, k0, k1, acc + (s * d + i) * 4);
                for (; i < i1; i++)
                    Block<1, 1>::run(P + i * d, x + s * d, d, k0, k1, acc + (s * d + i) * 4);
            }
        }
    }
    for (size_t s = 0; s < n; s++)
        for (size_t i = 0; i < d; i++) {
            const double* a = acc + (s * d + i) * 4;
            double p0 = a[0];
            for (size_t k = kfull; k < d; k++)
                p0 += double(P[i * d + k]) * x[s * d + k];
            out[s * d + i] = (p0 + a[1]) + (a[2] + a[3]);
        }
}

template <int NI, int NS>
struct PortableBlock {
    static inline __attribute__((always_inline)) void run(const float* p, const double* x, size_t d,
                                                          size_t k0, size_t k1, double* acc)
    {
        rotate_block<NI, NS>(p, x, d, k0, k1, acc);
    }
};

#if GPU_IVFPQ_X86_DISPATCH
template <int NI, int NS>
struct Avx2Block {
    static inline void run(const float* p, const double* x, size_t d, size_t k0, size_t k1,
                           double* acc)
    {
        rotate_block_avx2<NI, NS>(p, x, d, k0, k1, acc);
    }
};

void rotate_rows_avx2(const float* P, size_t d, const double* x, size_t n, double* out, double* acc)
{
    rotate_loops<Avx2Block>(P, d, x, n, out, acc);
}
#endif

// rotate_rows_impl for the CPU at hand.
void rotate_rows(const float* P, size_t d, const double* x, size_t n, double* out, double* acc)
{
#if GPU_IVFPQ_X86_DISPATCH
    if (detail::cpu_has_avx2()) {
        rotate_rows_avx2(P, d, x, n, out, acc);
        return;
    }
#endif
    rotate_loops<PortableBlock>(P, d, x, n, out, acc);
}

}  // namespace

// ---- Code layout ----

void rabitq_pack(const uint8_t* x, size_t d, int bits, uint8_t* code)
{
    require_bits(bits);
    require(x && code, "rabitq_pack: null pointer");
    rabitq_pack_into(x, d, bits, code);
}

void rabitq_unpack(const uint8_t* code, size_t d, int bits, uint8_t* x)
{
    require_bits(bits);
    require(x && code, "rabitq_unpack: null pointer");
    const size_t plane_bytes = rabitq_plane_words(d) * 4;
    for (size_t i = 0; i < d; i++) {
        unsigned v = 0;
        for (int p = 0; p < bits; p++)
            v = (v << 1) | ((code[size_t(p) * plane_bytes + i / 8] >> (i % 8)) & 1u);
        x[i] = uint8_t(v);
    }
}

// ---- The rotation ----

RabitqRotation RabitqRotation::generate(size_t d, uint64_t seed, int threads)
{
    require_dims(d);
    // Stewart's method: Q = H_0 H_1 ... H_{d-2} S, where H_k reflects the
    // last d - k coordinates so as to map a fresh Gaussian vector g_k (d - k
    // values) onto -sign(g_k[0]) ||g_k|| e_1, and S = diag(s) with s_k =
    // -sign(g_k[0]) (the last one: sign(g_{d-1}[0])). This is the Q of the
    // QR of a Gaussian matrix with R's diagonal made positive: Haar.
    GaussianSource gauss(seed);
    std::vector<size_t> offset(d);
    std::vector<double> v, beta(d, 0.0), sign(d, 1.0);
    v.reserve(d * (d + 1) / 2);
    for (size_t k = 0; k < d; k++) {
        check_interrupt_every(k);
        const size_t m = d - k;
        offset[k] = v.size();
        double nsq = 0.0;
        do {
            v.resize(offset[k]);
            nsq = 0.0;
            for (size_t i = 0; i < m; i++) {
                const double g = gauss.next();
                v.push_back(g);
                nsq += g * g;
            }
        } while (nsq == 0.0);
        double* vk = v.data() + offset[k];
        const double s = vk[0] >= 0.0 ? 1.0 : -1.0;
        if (m == 1) {
            sign[k] = s;
            continue;
        }
        sign[k] = -s;
        const double norm = std::sqrt(nsq);
        // ||v||^2 = ||g||^2 + 2 |g_0| ||g|| + ||g||^2 after v_0 += sign * ||g||.
        vk[0] += s * norm;
        beta[k] = 2.0 / rabitq_dot(vk, vk, m);
    }

    // Columns of Q in blocks: M = S, then M = H_k M for k = d-2 .. 0. Column
    // j is s_j e_j until H_j reaches it, so H_k only touches columns j >= k.
    // Each column is computed alone: the result is the same for any threads.
    std::vector<float> p(d * d);
    const size_t nblocks = (d + kRotationBlock - 1) / kRotationBlock;
    parallel_for(nblocks, threads, [&](size_t b0, size_t b1) {
        std::vector<double> cols(kRotationBlock * d);
        for (size_t b = b0; b < b1; b++) {
            const size_t j0 = b * kRotationBlock, j1 = std::min(d, j0 + kRotationBlock);
            std::fill(cols.begin(), cols.end(), 0.0);
            for (size_t j = j0; j < j1; j++)
                cols[(j - j0) * d + j] = sign[j];
            const size_t kmax = std::min(j1 - 1, d >= 2 ? d - 2 : 0);
            for (size_t kk = kmax + 1; kk-- > 0;) {
                check_interrupt_every(kk);
                if (d - kk == 1)
                    continue;
                const double* vk = v.data() + offset[kk];
                const size_t m = d - kk;
                for (size_t j = std::max(j0, kk); j < j1; j++) {
                    double* col = cols.data() + (j - j0) * d + kk;
                    const double w = beta[kk] * rabitq_dot(vk, col, m);
                    for (size_t i = 0; i < m; i++)
                        col[i] -= w * vk[i];
                }
            }
            for (size_t j = j0; j < j1; j++)
                for (size_t i = 0; i < d; i++)
                    p[i * d + j] = float(cols[(j - j0) * d + i]);
        }
    });
    return RabitqRotation(d, std::move(p));
}

RabitqRotation RabitqRotation::from_matrix(size_t d, const float* matrix)
{
    require_dims(d);
    require(matrix != nullptr, "RaBitQ rotation: null matrix");
    std::vector<float> p(matrix, matrix + d * d);
    for (float f : p)
        require(std::isfinite(f), "RaBitQ rotation: the matrix has a value that is not finite");
    return RabitqRotation(d, std::move(p));
}

void RabitqRotation::apply(const float* x, float* out) const
{
    std::vector<double> xd(x, x + d_), od(d_);
    apply_rows(xd.data(), 1, od.data());
    for (size_t i = 0; i < d_; i++)
        out[i] = float(od[i]);
}

void RabitqRotation::apply(const double* x, double* out) const { apply_rows(x, 1, out); }

void RabitqRotation::apply_rows(const double* x, size_t n, double* out) const
{
    std::vector<double> acc(std::min(n, kEncodeTile) * d_ * 4);
    for (size_t s = 0; s < n; s += kEncodeTile)
        rotate_rows(p_.data(), d_, x + s * d_, std::min(kEncodeTile, n - s), out + s * d_,
                    acc.data());
}

// ---- The model ----

RabitqModel::RabitqModel(size_t d, size_t lists, int bits, Metric metric,
                         const float* rotation_matrix)
    : RabitqModel(d, lists, bits, metric, RabitqRotation::from_matrix(d, rotation_matrix))
{
}

RabitqModel::RabitqModel(size_t d, size_t lists, int bits, Metric metric, RabitqRotation rotation)
    : d_(d), lists_(lists), bits_(bits), metric_(metric), rotation_(std::move(rotation))
{
    require_dims(d);
    require_bits(bits);
    require(lists >= 1, "RaBitQ: lists must be at least 1");
    require(lists <= size_t(INT32_MAX), "RaBitQ: too many lists");
    require(metric == Metric::L2 || metric == Metric::InnerProduct || metric == Metric::Cosine,
            "RaBitQ: unknown metric");
    require(rotation_.d() == d, "RaBitQ: the rotation has dimension " +
                                    std::to_string(rotation_.d()) + ", the model " +
                                    std::to_string(d));
    centroids_.assign(detail::checked_mul(lists, d, "RaBitQ centroids"), 0.0f);
    centroid_norms_.assign(lists, 0.0f);
    rotated_.assign(centroids_.size(), 0.0);  // P 0
}

void RabitqModel::set_centroid_norms()
{
    for (size_t l = 0; l < lists_; l++)
        centroid_norms_[l] = norm_sqr(centroids_.data() + l * d_, d_);
}

void RabitqModel::set_centroids(const float* data, int threads)
{
    require(data != nullptr, "RaBitQ: null centroids");
    std::copy(data, data + centroids_.size(), centroids_.begin());
    set_centroid_norms();
    // P c per list, in tiles of rows (each row's sums in apply's order).
    rotated_.assign(centroids_.size(), 0.0);
    const size_t ntiles = (lists_ + kEncodeTile - 1) / kEncodeTile;
    parallel_for(ntiles, threads, [&](size_t t0, size_t t1) {
        std::vector<double> acc(kEncodeTile * d_ * 4), c(kEncodeTile * d_);
        for (size_t t = t0; t < t1; t++) {
            check_interrupt();
            const size_t r0 = t * kEncodeTile, nr = std::min(kEncodeTile, lists_ - r0);
            std::copy(centroids_.begin() + r0 * d_, centroids_.begin() + (r0 + nr) * d_, c.begin());
            rotate_rows(rotation_.matrix().data(), d_, c.data(), nr, rotated_.data() + r0 * d_,
                        acc.data());
        }
    });
}

void RabitqModel::set_centroids(const float* data, const double* rotated)
{
    require(data != nullptr && rotated != nullptr, "RaBitQ: null centroids");
    for (size_t i = 0; i < centroids_.size(); i++)
        require(std::isfinite(rotated[i]), "RaBitQ: a rotated centroid is not finite");
    std::copy(data, data + centroids_.size(), centroids_.begin());
    set_centroid_norms();
    rotated_.assign(rotated, rotated + centroids_.size());
}

void RabitqModel::assign(const float* x, size_t n, int32_t* list_ids, int threads) const
{
    if (n == 0)
        return;
    require(x && list_ids, "RaBitQ: null pointer in assign");
    if (metric_ != Metric::Cosine) {
        assign_nearest(x, n, centroids_.data(), lists_, d_, list_ids, nullptr, threads,
                       centroid_norms_.data());
        return;
    }
    constexpr size_t kRows = 4096;
    std::vector<float> buf(std::min(n, kRows) * d_);
    for (size_t r0 = 0; r0 < n; r0 += kRows) {
        const size_t nr = std::min(kRows, n - r0);
        std::memcpy(buf.data(), x + r0 * d_, nr * d_ * sizeof(float));
        normalize_rows(buf.data(), nr, d_);
        assign_nearest(buf.data(), nr, centroids_.data(), lists_, d_, list_ids + r0, nullptr,
                       threads, centroid_norms_.data());
    }
}

void RabitqModel::encode(const float* x, size_t n, const int32_t* list_ids, uint8_t* codes,
                         RabitqFactors* factors, int threads) const
{
    if (n == 0)
        return;
    require(x && list_ids && codes && factors, "RaBitQ: null pointer in encode");
    for (size_t i = 0; i < n; i++)
        require(list_ids[i] >= 0 && size_t(list_ids[i]) < lists_, "RaBitQ: list id out of range");
    const size_t cb = code_bytes(), d = d_;
    const size_t ntiles = (n + kEncodeTile - 1) / kEncodeTile;
    parallel_for(ntiles, threads, [&](size_t t0, size_t t1) {
        // A tile's rows (normalised for Cosine), unit residuals and their
        // rotations; rows with a residual to rotate are listed in `live`.
        std::vector<float> rows(kEncodeTile * d);
        std::vector<double> r(kEncodeTile * d), rot(kEncodeTile * d), acc(kEncodeTile * d * 4);
        std::vector<double> rnorm(kEncodeTile), rsq(kEncodeTile);
        std::vector<size_t> live(kEncodeTile);
        std::vector<uint8_t> xu(d);
        detail::RabitqGridSearch grid;
        for (size_t t = t0; t < t1; t++) {
            check_interrupt();
            const size_t i0 = t * kEncodeTile, i1 = std::min(n, i0 + kEncodeTile);
            size_t nlive = 0;
            for (size_t i = i0; i < i1; i++) {
                float* row = rows.data() + (i - i0) * d;
                std::memcpy(row, x + i * d, d * sizeof(float));
                if (metric_ == Metric::Cosine)
                    normalize_rows(row, 1, d);
                const float* c = centroids_.data() + size_t(list_ids[i]) * d;
                // The residual in double: o - c cannot overflow there.
                double* ri = r.data() + nlive * d;
                const double sq = rabitq_residual(row, c, d, ri);
                const double rn = std::sqrt(sq);
                if (!rabitq_residual_live(rn)) {
                    // A row on its centroid (or not finite): the estimate is
                    // the query's distance to the centroid, exactly.
                    std::fill(ri, ri + d, 0.0);
                    grid.run(ri, d, bits_, xu.data());
                    rabitq_pack(xu.data(), d, bits_, codes + i * cb);
                    factors[i] = {0.0f, 0.0f, 0.0f};
                    continue;
                }
                rabitq_scale_down(ri, d, rn);
                rsq[nlive] = sq;
                rnorm[nlive] = rn;
                live[nlive++] = i;
            }
            rotate_rows(rotation_.matrix().data(), d, r.data(), nlive, rot.data(), acc.data());
            for (size_t s = 0; s < nlive; s++) {
                const size_t i = live[s];
                const float* row = rows.data() + (i - i0) * d;
                const float* c = centroids_.data() + size_t(list_ids[i]) * d;
                double* ro = rot.data() + s * d;
                const double rn = rnorm[s];
                // P is orthogonal to float precision: make o' unit again.
                rabitq_scale_down(ro, d, std::sqrt(rabitq_dot(ro, ro, d)));
                const RabitqGridPoint g = grid.run(ro, d, bits_, xu.data());
                rabitq_pack(xu.data(), d, bits_, codes + i * cb);
                factors[i] = rabitq_factors(metric_ == Metric::InnerProduct ? rabitq_ip_add(c, row, d) : rsq[s],
                                            rn, g, d);
            }
        }
    });
}

void RabitqModel::encode_rows(const float* x, size_t n, const int32_t* list_ids, uint8_t* rows, int threads) const
{
    if (n == 0)
        return;
    const size_t cb = code_bytes(), rb = rabitq_row_bytes(d_, bits_);
    std::vector<uint8_t> codes(n * cb);
    std::vector<RabitqFactors> factors(n);
    encode(x, n, list_ids, codes.data(), factors.data(), threads);
    for (size_t i = 0; i < n; i++) {
        std::memcpy(rows + i * rb, codes.data() + i * cb, cb);
        std::memcpy(rows + i * rb + cb, &factors[i], sizeof(RabitqFactors));
    }
}

void RabitqModel::prepare_query(const float* q, RabitqQuery& out) const
{
    require(q != nullptr, "RaBitQ: null query");
    out.q.assign(q, q + d_);
    if (metric_ == Metric::Cosine)
        normalize_rows(out.q.data(), 1, d_);
    const std::vector<double> qd(out.q.begin(), out.q.end());
    out.rotated.assign(d_, 0.0);
    rotation_.apply(qd.data(), out.rotated.data());
}

void RabitqModel::prepare_list(const RabitqQuery& query, int32_t list, RabitqListQuery& out) const
{
    require(query.q.size() == d_, "RaBitQ: query was not prepared by a model of this dimension");
    require(list >= 0 && size_t(list) < lists_, "RaBitQ: list id out of range");
    require(query.rotated.size() == d_, "RaBitQ: query was not prepared by a model of this dimension");
    const float* c = centroids_.data() + size_t(list) * d_;
    const double* pc = rotated_.data() + size_t(list) * d_;
    const size_t groups = rabitq_plane_words(d_) * 4;  // code bytes per plane
    std::vector<double> qr(d_), rot(groups * 8, 0.0);
    for (size_t k = 0; k < d_; k++)
        qr[k] = double(query.q[k]) - double(c[k]);
    const double qsq = rabitq_dot(qr.data(), qr.data(), d_);
    // q' = P (q - c) = P q - P c: O(d) per list instead of a rotation.
    for (size_t k = 0; k < d_; k++)
        rot[k] = query.rotated[k] - pc[k];

    out.list = list;
    out.lut.resize(groups * 256);
    for (size_t j = 0; j < groups; j++) {
        // A byte's entry is the float sum of its two nibbles' entries, each
        // rounded to float once: the GPU keeps only the 2 x 16 nibble
        // entries of a group (an eighth of the shared memory) and sums the
        // same two floats (gpu/src/rabitq_index.cu).
        const double* v = rot.data() + j * 8;
        double lo[16], hi[16];
        lo[0] = -0.5 * (((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7])));
        hi[0] = 0.0;
        for (unsigned b = 1; b < 16; b++) {
            lo[b] = lo[b & (b - 1)] + v[__builtin_ctz(b)];
            hi[b] = hi[b & (b - 1)] + v[4 + __builtin_ctz(b)];
        }
        float flo[16], fhi[16];
        for (unsigned b = 0; b < 16; b++) {
            flo[b] = float(lo[b]);
            fhi[b] = float(hi[b]);
        }
        for (unsigned b = 0; b < 256; b++)
            out.lut[j * 256 + b] = flo[b & 15] + fhi[b >> 4];
    }
    const double qn = std::sqrt(qsq);
    out.qr_norm = float(qn);
    switch (metric_) {
    case Metric::L2:
        out.base = float(qsq);
        out.add_scale = 1.0f;
        out.ip_scale = -2.0f;
        out.bound_scale = float(2.0 * qn);
        break;
    case Metric::Cosine:  // (||q - o||^2) / 2 on the unit sphere
        out.base = float(0.5 * qsq);
        out.add_scale = 0.5f;
        out.ip_scale = -1.0f;
        out.bound_scale = float(qn);
        break;
    case Metric::InnerProduct:  // -<q, c> - <c, r> - <q - c, r>
        out.base = float(-rabitq_dot(query.q.data(), c, d_));
        out.add_scale = -1.0f;
        out.ip_scale = -1.0f;
        out.bound_scale = float(qn);
        break;
    }
}

namespace {

// <y, q'> of one code from the list's byte tables: per plane the sum of
// its bytes' entries, planes combined most significant first.
inline float code_inner_product(const float* lut, const uint8_t* code, size_t plane_bytes, int bits)
{
    float ip = 0.0f;
    for (int p = 0; p < bits; p++) {
        const uint8_t* plane = code + size_t(p) * plane_bytes;
        float s = 0.0f;
        for (size_t j = 0; j < plane_bytes; j++)
            s += lut[j * 256 + plane[j]];
        ip = 2.0f * ip + s;
    }
    return ip;
}

// code_inner_product of four codes at once (code_stride bytes apart): the
// same sums in the same order per code, the four chains interleaved so that
// their additions overlap (one code's chain waits on each addition).
inline void code_inner_product4(const float* lut, const uint8_t* codes, size_t code_stride,
                                size_t plane_bytes, int bits, float* ip)
{
    const uint8_t* c0 = codes;
    const uint8_t* c1 = codes + code_stride;
    const uint8_t* c2 = codes + 2 * code_stride;
    const uint8_t* c3 = codes + 3 * code_stride;
    float ip0 = 0.0f, ip1 = 0.0f, ip2 = 0.0f, ip3 = 0.0f;
    for (int p = 0; p < bits; p++) {
        const size_t off = size_t(p) * plane_bytes;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        for (size_t j = 0; j < plane_bytes; j++) {
            const float* t = lut + j * 256;
            s0 += t[c0[off + j]];
            s1 += t[c1[off + j]];
            s2 += t[c2[off + j]];
            s3 += t[c3[off + j]];
        }
        ip0 = 2.0f * ip0 + s0;
        ip1 = 2.0f * ip1 + s1;
        ip2 = 2.0f * ip2 + s2;
        ip3 = 2.0f * ip3 + s3;
    }
    ip[0] = ip0;
    ip[1] = ip1;
    ip[2] = ip2;
    ip[3] = ip3;
}

inline RabitqEstimate finish_estimate(const RabitqListQuery& lq, const RabitqFactors& f, float ip,
                                      float eps0)
{
    const float est = lq.base + lq.add_scale * f.add + lq.ip_scale * (f.rescale * ip);
    const float bound = lq.bound_scale * f.error * eps0;
    // Past the float range: rank like the engine's other approximate
    // distances (never NaN), and a bound that says nothing.
    return {rank_distance(est), bound >= 0.0f ? bound : std::numeric_limits<float>::infinity()};
}

}  // namespace

RabitqEstimate RabitqModel::estimate(const RabitqListQuery& lq, const uint8_t* code,
                                     const RabitqFactors& f, float eps0) const
{
    require(code != nullptr, "RaBitQ: null code");
    const size_t plane_bytes = rabitq_plane_words(d_) * 4;
    require(lq.lut.size() == plane_bytes * 256, "RaBitQ: list query of another dimension");
    return finish_estimate(lq, f, code_inner_product(lq.lut.data(), code, plane_bytes, bits_),
                           eps0);
}

void RabitqModel::scan(const RabitqListQuery& lq, const uint8_t* codes, size_t code_stride,
                       const RabitqFactors* factors, size_t n, float eps0, float* estimate,
                       float* bound) const
{
    if (n == 0)
        return;
    require(codes && factors && estimate, "RaBitQ: null pointer in scan");
    require(code_stride >= code_bytes(), "RaBitQ: code stride shorter than a code");
    require(eps0 >= 0.0f, "RaBitQ: eps0 must not be negative");
    const size_t plane_bytes = rabitq_plane_words(d_) * 4;
    require(lq.lut.size() == plane_bytes * 256, "RaBitQ: list query of another dimension");
    const float* lut = lq.lut.data();
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        check_interrupt_every(i);
        float ip[4];
        code_inner_product4(lut, codes + i * code_stride, code_stride, plane_bytes, bits_, ip);
        for (size_t r = 0; r < 4; r++) {
            const RabitqEstimate e = finish_estimate(lq, factors[i + r], ip[r], eps0);
            estimate[i + r] = e.estimate;
            if (bound)
                bound[i + r] = e.bound;
        }
    }
    for (; i < n; i++) {
        const RabitqEstimate e = finish_estimate(
            lq, factors[i], code_inner_product(lut, codes + i * code_stride, plane_bytes, bits_), eps0);
        estimate[i] = e.estimate;
        if (bound)
            bound[i] = e.bound;
    }
}

void RabitqModel::scan_keys(const RabitqListQuery& lq, const uint8_t* codes, size_t code_stride,
                            const RabitqFactors* factors, size_t n, float eps0, float* key) const
{
    if (eps0 == 0.0f) {
        scan(lq, codes, code_stride, factors, n, 0.0f, key, nullptr);
        return;
    }
    // Bounds in chunks on the stack: scans run per list, inside callers
    // that must not allocate per row.
    constexpr size_t kChunk = 256;
    float bound[kChunk];
    for (size_t i = 0; i < n; i += kChunk) {
        const size_t c = std::min(kChunk, n - i);
        scan(lq, codes + i * code_stride, code_stride, factors + i, c, eps0, key + i, bound);
        for (size_t r = 0; r < c; r++)
            key[i + r] = key[i + r] - bound[r];
    }
}

std::vector<int32_t> RabitqModel::probe_lists(const RabitqQuery& query, size_t nprobe) const
{
    require(query.q.size() == d_, "RaBitQ: query was not prepared by a model of this dimension");
    require(nprobe >= 1, "RaBitQ: nprobe must be at least 1");
    nprobe = std::min(nprobe, lists_);
    std::vector<float> dist(nprobe);
    std::vector<int64_t> label(nprobe);
    brute_force_knn(query.q.data(), 1, centroids_.data(), lists_, d_,
                    metric_ == Metric::InnerProduct ? Metric::InnerProduct : Metric::L2, nprobe,
                    dist.data(), label.data());
    return std::vector<int32_t>(label.begin(), label.end());
}

template <typename Visit>
void RabitqModel::scan_probed(const RabitqList* lists, const float* q, size_t nprobe, float eps0,
                              bool want_bound, Visit&& visit) const
{
    require(lists != nullptr, "RaBitQ: null lists");
    RabitqQuery query;
    prepare_query(q, query);
    RabitqListQuery lq;
    std::vector<float> est, bnd;
    for (int32_t l : probe_lists(query, nprobe)) {
        check_interrupt();
        const RabitqList& list = lists[l];
        if (list.n == 0)
            continue;
        require(list.labels && list.codes && list.factors, "RaBitQ: null pointer in a list");
        prepare_list(query, l, lq);
        est.resize(list.n);
        bnd.assign(list.n, 0.0f);
        scan(lq, list.codes, code_bytes(), list.factors, list.n, eps0, est.data(),
             want_bound ? bnd.data() : nullptr);
        for (size_t i = 0; i < list.n; i++)
            visit(est[i], bnd[i], list.labels[i]);
    }
}

std::vector<Neighbor> RabitqModel::search(const RabitqList* lists, const float* q, size_t nprobe,
                                          size_t k, float eps0) const
{
    require(eps0 >= 0.0f, "RaBitQ: eps0 must not be negative");
    TopK top(k);
    scan_probed(lists, q, nprobe, eps0, eps0 > 0.0f, [&](float est, float bound, int64_t label) {
        top.push(eps0 > 0.0f ? est - bound : est, label);
    });
    return top.take_sorted();
}

std::vector<RabitqCandidate> RabitqModel::search_candidates(const RabitqList* lists, const float* q,
                                                            size_t nprobe, size_t k,
                                                            float eps0) const
{
    require(eps0 >= 0.0f, "RaBitQ: eps0 must not be negative");
    // The k smallest upper bounds so far: a row whose lower bound exceeds
    // the k-th of them cannot be among the k nearest (where bounds hold).
    TopK upper(k);
    std::vector<RabitqCandidate> out;
    scan_probed(lists, q, nprobe, eps0, true, [&](float est, float bound, int64_t label) {
        const RabitqCandidate c{label, est, est - bound, est + bound};
        upper.push(c.upper, label);
        if (!(c.lower > upper.threshold()))
            out.push_back(c);
    });
    // The threshold only fell while scanning: drop what its final value excludes.
    const float thr = upper.threshold();
    out.erase(std::remove_if(out.begin(), out.end(),
                             [thr](const RabitqCandidate& c) { return c.lower > thr; }),
              out.end());
    std::sort(out.begin(), out.end(), [](const RabitqCandidate& a, const RabitqCandidate& b) {
        return neighbor_less({a.estimate, a.label}, {b.estimate, b.label});
    });
    return out;
}

}  // namespace gpuivfpq
