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

// sum_i a[i] * b[i] in double, in four interleaved partial sums (a fixed
// order: the same value on every thread and machine).
template <typename A, typename B>
inline double dot_double(const A* a, const B* b, size_t n)
{
    double p[4] = {0.0, 0.0, 0.0, 0.0};
    size_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++)
            p[j] += double(a[i + j]) * double(b[i + j]);
    for (; i < n; i++)
        p[0] += double(a[i]) * double(b[i]);
    return (p[0] + p[1]) + (p[2] + p[3]);
}

// Columns of the rotation built together: 32 columns of 2000 doubles stay in
// the L2 cache while every reflector streams past them once.
constexpr size_t kRotationBlock = 32;

// Rows encoded per parallel_for step, rotated together (a row costs O(d^2)
// for its rotation plus its grid search).
constexpr size_t kEncodeTile = 16;

// ---- The rotation of many vectors ----
//
// out = P x computed exactly as dot_double computes each coordinate: lane
// j of a 4-double vector is dot_double's partial sum p[j], products and
// sums rounded separately (the build has no FMA contraction), the d % 4
// last terms added to lane 0 in order, then (p0 + p1) + (p2 + p3). Only the
// order of the loops differs, so the bits are dot_double's.

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
__attribute__((target("arch=x86-64-v3"))) void rotate_block_avx2(
    const float* p, const double* x, size_t d, size_t k0, size_t k1, double* acc)
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

void rotate_rows_avx2(const float* P, size_t d, const double* x, size_t n, double* out,
                      double* acc)
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

// ---- The grid search ----
//
// The sweep of rabitq_best_grid_point, defined as the papers' algorithm
// with a heap runs it: with u = |o| and the coordinates with u_i > 0 ranked
// by decreasing u_i (ties by index), the coordinate of rank r steps to level
// j (1 <= j < 2^(bits-1)) at t = j * (1 / u_r), both operations in double;
// the steps are taken in (t, j, r) order; ip = <y, u> starts at the sum of
// u_i / 2 in index order and each step adds u_r; nsq = ||y||^2 starts at
// d / 4 and each step adds 2j; a step becomes the best when ip * ip *
// best_nsq > best_ip * best_ip * nsq. The code below returns exactly that
// sweep's best point, bit for bit, with less work:
//
// - It takes the steps a slice of t at a time. In a slice, each level's
//   steps are a run already sorted by rank; a counting sort on t (about two
//   buckets per step) and an insertion pass put them in (t, j, r) order.
// - The running sums are the sweep's own (same additions, same order). The
//   best of a slice is found as the largest ip^2 / nsq; only when another
//   step (or the previous best) comes within 1e-12 of it, where rounding
//   could decide the comparison, is the slice replayed with the sweep's
//   comparisons, one step at a time.
// - Once a while has passed without a new best, it stops when no point left
//   can beat the best (rest_bound); the result is the full sweep's.

// One step of the sweep: its scale t and (level << 16) | rank.
struct SweepStep {
    double t;
    uint32_t tag;
};
static_assert(kRabitqMaxDims < (1u << 16), "a rank must fit 16 bits of a step's tag");

// A coordinate with u > 0, for the ranking.
struct RankedCoord {
    double u;
    uint32_t i;
};

// Per rank, for the binned sweep: 1/u, and u in units of ip's ulp rounded
// to an integer (NaN for a tie).
struct RankUnits {
    double w, inc;
};

// A gathered step of the binned sweep and the next step of its bucket.
struct BinnedStep {
    double t;
    uint32_t tag, link;
};

// A bucket of the binned sweep: its sum of rounded u and of levels, and its
// first step.
struct BucketSums {
    double inc;
    uint32_t levels, head;
};

#define RABITQ_INLINE inline __attribute__((always_inline))

// W lanes of doubles (GCC vector extensions); VU for unaligned loads and
// stores through double pointers.
template <int W>
struct DoubleLanes {
    typedef double V __attribute__((vector_size(W * 8)));
    typedef double VU __attribute__((vector_size(W * 8), aligned(8), may_alias));
};

class GridSearch {
public:
    RabitqGridPoint run(const double* o, size_t d, int bits, uint8_t* x);

private:
    template <int W>
    RABITQ_INLINE RabitqGridPoint run_impl(const double* o, size_t d, int bits, uint8_t* x);
    template <int W>
    RABITQ_INLINE void sweep_sequential(size_t d, unsigned levels, double ip, double nsq);
    template <int W>
    RABITQ_INLINE bool sweep_binned(size_t d, unsigned levels, double ip, double nsq);
#if GPU_IVFPQ_X86_DISPATCH
    __attribute__((target("arch=x86-64-v3"))) RabitqGridPoint run_avx2(const double* o, size_t d,
                                                                       int bits, uint8_t* x);
#endif
    RABITQ_INLINE void rank_coordinates(size_t d);
    RABITQ_INLINE size_t gather_slice(unsigned first, unsigned levels, double t_lo, double t_hi,
                                      size_t nb);
    RABITQ_INLINE void sort_slice(size_t n, unsigned first, unsigned levels);
    template <int W>
    RABITQ_INLINE void sweep_slice(size_t n);
    RABITQ_INLINE size_t slice_size(unsigned levels) const;
    template <int W>
    RABITQ_INLINE void round_units();
    template <int W>
    RABITQ_INLINE void set_binade(double ip);
    size_t gather_binned(unsigned first, unsigned levels, double t_lo, double t_hi, size_t nb);
    template <int W>
    RABITQ_INLINE void take_buckets(size_t nb, double t_lo, double scale);
    RABITQ_INLINE bool take_steps(const SweepStep* st, size_t n, double* ip, double* nsq);
    RABITQ_INLINE bool consider(double ip, double nsq, const SweepStep& step);
    RABITQ_INLINE size_t bucket_steps(size_t b);
    template <int W>
    RABITQ_INLINE double rest_bound(size_t d, unsigned levels, double t);
    template <int W>
    RABITQ_INLINE void box_sums(double lambda, double hi, double* a, double* b, double* c) const;
    double rest_bound_sorted(size_t d, double hi);

    // Ranking.
    std::vector<double> u_;  // |o_i| by coordinate
    std::vector<RankedCoord> ranked_, ranked_tmp_;
    std::vector<uint32_t> key_;
    std::vector<uint32_t> coord_;  // coordinate of each rank
    std::vector<double> us_, w_;   // u and 1 / u by rank
    std::vector<double> rest_;     // rest_[r] = sum of us_ from rank r on
    std::vector<double> rest2_;    // rest2_[r] = sum of us_^2 from rank r on
    size_t m_ = 0;                 // coordinates with u > 0
    // The sweep: per level the first rank not swept yet and the end of the
    // slice's run; the slice's buckets, steps and running sums.
    std::vector<uint32_t> next_, end_;
    std::vector<uint32_t> count_, bucket_;
    std::vector<SweepStep> steps_;
    std::vector<double> ipv_, nsqv_, qv_;
    double ip_ = 0, nsq_ = 0, best_ip_ = 0, best_nsq_ = 0, best_ip_sq_ = 0;
    SweepStep best_{0.0, 0};
    bool stepped_ = false;  // the best is after some step
    size_t swept_ = 0, best_at_ = 0;
    // The binned sweep (sweep_binned): ip = a_ unit_ exactly (2^52 <= a_ <
    // 2^53), 4 nsq = n4_; per rank 1/u and u in units of this binade and the
    // next, rounded (NaN for a tie); the slice's steps and per bucket their
    // list and sums, then the states before and after it.
    double a_ = 0, unit_ = 0, n4_ = 0;
    std::vector<RankUnits> units_;
    std::vector<BinnedStep> binned_;
    std::vector<BucketSums> sums_;
    std::vector<double> bucket_a_, bucket_n4_, bucket_j_, bucket_a0_, bucket_n40_, bucket_q_;
    std::vector<SweepStep> bucket_buf_;
    double best_q_ = 0;
    bool ambiguous_ = false;
    // The best is the state after bucket best_bucket_ of the slice being
    // taken (its last step is found when the slice is done), or none (-1).
    ptrdiff_t best_bucket_ = -1;
    size_t best_pos_ = 0;  // the bucket of the last new best in the slice
    // The bound: levels reached + 1/2 by rank, and its last optimal scale.
    std::vector<uint32_t> level_count_;
    std::vector<double> lo_;
    double lambda_ = 0.0;
};

// Ranks the coordinates with u > 0 (coord_, us_, w_, rest_, rest2_): decreasing u,
// ties by index. A counting sort on u (buckets of equal width) and an
// insertion pass; std::sort where the values bunch up.
RABITQ_INLINE void GridSearch::rank_coordinates(size_t d)
{
    ranked_.resize(d);
    RankedCoord* rc = ranked_.data();
    const double* u = u_.data();
    size_t m = 0;
    double umax = 0.0;
    for (size_t i = 0; i < d; i++)
        if (u[i] > 0.0) {
            rc[m++] = {u[i], uint32_t(i)};
            umax = std::max(umax, u[i]);
        }
    m_ = m;
    auto before = [](const RankedCoord& a, const RankedCoord& b) {
        return a.u > b.u || (a.u == b.u && a.i < b.i);
    };
    size_t nb = 16;
    while (nb < 2 * m)
        nb *= 2;
    const double scale = double(nb) / umax;
    bool sorted = false;
    if (m > 32 && scale > 0.0 && scale < std::numeric_limits<double>::infinity()) {
        count_.assign(nb, 0);
        key_.resize(m);
        ranked_tmp_.resize(m);
        uint32_t* cnt = count_.data();
        uint32_t* key = key_.data();
        RankedCoord* out = ranked_tmp_.data();
        for (size_t r = 0; r < m; r++) {
            const double f = rc[r].u * scale;
            key[r] = uint32_t(nb - 1) - std::min(uint32_t(nb - 1), uint32_t(f));
            cnt[key[r]]++;
        }
        uint32_t sum = 0;
        for (size_t b = 0; b < nb; b++) {
            const uint32_t c = cnt[b];
            cnt[b] = sum;
            sum += c;
        }
        for (size_t r = 0; r < m; r++)
            out[cnt[key[r]]++] = rc[r];
        // Buckets are in order, and by index within one.
        size_t shifts = 0;
        sorted = true;
        for (size_t r = 1; r < m; r++) {
            if (!before(out[r], out[r - 1]))
                continue;
            const RankedCoord c = out[r];
            size_t q = r;
            do {
                out[q] = out[q - 1];
                q--;
            } while (q > 0 && before(c, out[q - 1]));
            out[q] = c;
            shifts += r - q;
            if (shifts > 8 * m) {
                sorted = false;
                break;
            }
        }
        if (sorted)
            std::copy(out, out + m, rc);
    }
    if (!sorted)
        std::sort(rc, rc + m, before);
    coord_.resize(m);
    us_.resize(m);
    w_.resize(m);
    rest_.resize(m + 1);
    rest2_.resize(m + 1);
    uint32_t* coord = coord_.data();
    double* us = us_.data();
    double* w = w_.data();
    double* rest = rest_.data();
    for (size_t r = 0; r < m; r++) {
        coord[r] = rc[r].i;
        us[r] = rc[r].u;
        w[r] = 1.0 / rc[r].u;
    }
    double* rest2 = rest2_.data();
    rest[m] = rest2[m] = 0.0;
    for (size_t r = m; r-- > 0;) {
        rest[r] = rest[r + 1] + us[r];
        rest2[r] = rest2[r + 1] + us[r] * us[r];
    }
}

// Gathers the steps at t_lo <= t < t_hi (every step left when t_hi is
// infinite) of levels first..levels: sets end_, counts the steps of each of
// nb buckets of t (count_, then bucket start offsets) and returns how many.
RABITQ_INLINE size_t GridSearch::gather_slice(unsigned first, unsigned levels, double t_lo,
                                              double t_hi, size_t nb)
{
    const size_t m = m_;
    const bool last = !(t_hi < std::numeric_limits<double>::infinity());
    const double scale = last ? 0.0 : double(nb) / (t_hi - t_lo), top = double(nb);
    count_.assign(nb, 0);
    uint32_t* __restrict cnt = count_.data();
    const double* __restrict w = w_.data();
    const uint32_t* next = next_.data();
    uint32_t* end = end_.data();
    size_t n = 0;
    for (unsigned j = first; j <= levels; j++) {
        const double jd = double(j);
        size_t r = next[j];
        if (bucket_.size() < n + (m - r))
            bucket_.resize(std::max(n + (m - r), 2 * bucket_.size()));
        uint32_t* __restrict bk = bucket_.data() + n;
        const size_t r0 = r;
        for (; r < m; r++) {
            const double t = jd * w[r];
            if (!(t < t_hi) && !last)
                break;
            const double f = (t - t_lo) * scale;  // >= 0: steps before t_lo are swept
            const uint32_t b = f < top ? uint32_t(f) : uint32_t(nb - 1);
            bk[r - r0] = b;
            cnt[b]++;
        }
        end[j] = uint32_t(r);
        n += r - r0;
    }
    uint32_t sum = 0;
    for (size_t b = 0; b < nb; b++) {
        const uint32_t c = cnt[b];
        cnt[b] = sum;
        sum += c;
    }
    return n;
}

// Sorts the n gathered steps (levels first..levels) into steps_, in (t, j,
// r) order.
RABITQ_INLINE void GridSearch::sort_slice(size_t n, unsigned first, unsigned levels)
{
    if (steps_.size() < n) {
        steps_.resize(std::max(n, 2 * steps_.size()));
        ipv_.resize(steps_.size() + 8);
        nsqv_.resize(steps_.size() + 8);
        qv_.resize(steps_.size() + 8);
    }
    SweepStep* __restrict st = steps_.data();
    {
        uint32_t* __restrict cnt = count_.data();
        const uint32_t* __restrict bk = bucket_.data();
        const double* __restrict w = w_.data();
        const uint32_t* next = next_.data();
        const uint32_t* end = end_.data();
        size_t e = 0;
        for (unsigned j = first; j <= levels; j++) {
            const double jd = double(j);
            const uint32_t tag = j << 16;
            for (size_t r = next[j]; r < end[j]; r++)
                st[cnt[bk[e++]]++] = {jd * w[r], tag | uint32_t(r)};
        }
    }
    // Buckets are in order of t, and within one the steps are in (j, r)
    // order: an insertion pass on t alone completes the (t, j, r) order.
    size_t shifts = 0;
    for (size_t s = 1; s < n; s++) {
        if (!(st[s].t < st[s - 1].t))
            continue;
        const SweepStep v = st[s];
        size_t q = s;
        do {
            st[q] = st[q - 1];
            q--;
        } while (q > 0 && v.t < st[q - 1].t);
        st[q] = v;
        shifts += s - q;
        if (shifts > 16 * n) {
            std::sort(st, st + n, [](const SweepStep& a, const SweepStep& b) {
                return a.t < b.t || (a.t == b.t && a.tag < b.tag);
            });
            break;
        }
    }
}

// Takes the n sorted steps of steps_ as the sweep does: the running sums,
// and the best with the sweep's comparisons (the slice's largest ip^2 / nsq
// where no other step comes within 1e-12 of it).
template <int W>
RABITQ_INLINE void GridSearch::sweep_slice(size_t n)
{
    typedef typename DoubleLanes<W>::V V;
    typedef typename DoubleLanes<W>::VU VU;
    const SweepStep* __restrict st = steps_.data();
    // The running sums, exactly the sweep's.
    double* __restrict ipv = ipv_.data();
    double* __restrict nv = nsqv_.data();
    double* __restrict qv = qv_.data();
    {
        const double* __restrict us = us_.data();
        double ip = ip_, nsq = nsq_;
        for (size_t s = 0; s < n; s++) {
            const uint32_t tag = st[s].tag;
            ip += us[tag & 0xffffu];
            nsq += 2.0 * double(tag >> 16);
            ipv[s] = ip;
            nv[s] = nsq;
        }
        ip_ = ip;
        nsq_ = nsq;
    }
    // The slice's largest ip^2 / nsq, its first step, and how many come
    // within 1e-12 of it.
    constexpr double kInf = std::numeric_limits<double>::infinity();
    const double qb = best_ip_sq_ / best_nsq_;
    size_t nv4 = (n + W - 1) / W * W;
    for (size_t s = n; s < nv4; s++) {
        ipv[s] = 0.0;
        nv[s] = 1.0;
    }
    V mx;
    for (int l = 0; l < W; l++)
        mx[l] = -kInf;
    for (size_t s = 0; s < nv4; s += W) {
        const V ip = *reinterpret_cast<const VU*>(ipv + s);
        const V q = ip * ip / *reinterpret_cast<const VU*>(nv + s);
        *reinterpret_cast<VU*>(qv + s) = q;
        mx = q > mx ? q : mx;
    }
    double top = mx[0];
    for (int l = 1; l < W; l++)
        top = std::max(top, mx[l]);
    const bool finite = std::isfinite(ip_) && std::isfinite(qb) && std::isfinite(top);
    if (finite && top < qb * (1.0 - 1e-12)) {
        swept_ += n;
        return;  // nothing here comes near the best
    }
    if (finite && top > qb * (1.0 + 1e-12)) {
        const double band = top * (1.0 - 1e-12);
        size_t near = 0, at = 0;
        for (size_t s = 0; s < n; s++)
            near += qv[s] >= band;
        while (qv[at] != top)
            at++;
        if (near == 1) {
            best_ip_ = ipv[at];
            best_nsq_ = nv[at];
            best_ip_sq_ = ipv[at] * ipv[at];
            best_ = st[at];
            best_at_ = swept_ + at + 1;
            stepped_ = true;
            swept_ += n;
            return;
        }
    }
    // Near ties (or values that are not finite): the sweep's comparisons.
    for (size_t s = 0; s < n; s++) {
        const double ip = ipv[s], nsq = nv[s];
        if (ip * ip * best_nsq_ > best_ip_sq_ * nsq) {
            best_ip_ = ip;
            best_ip_sq_ = ip * ip;
            best_nsq_ = nsq;
            best_ = st[s];
            best_at_ = swept_ + s + 1;
            stepped_ = true;
        }
    }
    swept_ += n;
}

// The sums over the box that bound the rest of the sweep, at scale lambda:
// z = clamp(lambda u, lo, hi); a = <z, u> and c = ||z||^2 over the clamped
// coordinates, b = ||u||^2 over the free ones. The cosine of z and u is
// (a + lambda b) / sqrt(c + lambda^2 b).
template <int W>
RABITQ_INLINE void GridSearch::box_sums(double lambda, double hi, double* a_out, double* b_out,
                                        double* c_out) const
{
    typedef typename DoubleLanes<W>::V V;
    typedef typename DoubleLanes<W>::VU VU;
    const size_t m = m_;
    const double* us = us_.data();
    const double* lo = lo_.data();
    V lv, hv, a = {}, b = {}, c = {};
    for (int l = 0; l < W; l++) {
        lv[l] = lambda;
        hv[l] = hi;
    }
    const V zero = {};
    size_t r = 0;
    for (; r + W <= m; r += W) {
        const V u = *reinterpret_cast<const VU*>(us + r);
        const V l = *reinterpret_cast<const VU*>(lo + r);
        const V z = lv * u;
        const auto below = z <= l, above = z >= hv;
        const auto clamped = below | above;
        const V zc = below ? l : hv;
        a += clamped ? zc * u : zero;
        c += clamped ? zc * zc : zero;
        b += clamped ? zero : u * u;
    }
    double as = 0.0, bs = 0.0, cs = 0.0;
    for (int l = 0; l < W; l++) {
        as += a[l];
        bs += b[l];
        cs += c[l];
    }
    for (; r < m; r++) {
        const double z = lambda * us[r];
        if (z <= lo[r] || z >= hi) {
            const double zc = z <= lo[r] ? lo[r] : hi;
            as += zc * us[r];
            cs += zc * zc;
        } else {
            bs += us[r] * us[r];
        }
    }
    *a_out = as;
    *b_out = bs;
    *c_out = cs;
}

// The largest cos(z, u) over real z with k + 1/2 <= z <= hi (k the levels
// reached, lo_), walking the sorted points where the clamp of lambda u
// changes: rest_bound's fallback.
double GridSearch::rest_bound_sorted(size_t d, double hi)
{
    struct Change {
        double lambda;
        uint32_t rank;
        bool to_hi;  // false: leaves lo; true: reaches hi
    };
    std::vector<Change> changes;
    changes.reserve(2 * m_);
    double a = 0.0, b = 0.0, c = 0.25 * double(d - m_);
    for (size_t r = 0; r < m_; r++) {
        a += lo_[r] * us_[r];
        c += lo_[r] * lo_[r];
        changes.push_back({lo_[r] / us_[r], uint32_t(r), false});
        changes.push_back({hi / us_[r], uint32_t(r), true});
    }
    std::sort(changes.begin(), changes.end(), [](const Change& x, const Change& y) {
        return x.lambda < y.lambda ||
               (x.lambda == y.lambda &&
                (x.to_hi < y.to_hi || (x.to_hi == y.to_hi && x.rank < y.rank)));
    });
    double best = 0.0, from = 0.0;
    for (size_t e = 0; e <= changes.size(); e++) {
        const double to = e < changes.size() ? changes[e].lambda : from;
        const double lambda = e < changes.size() ? std::min(std::max(c / a, from), to) : from;
        best = std::max(best, (a + lambda * b) / std::sqrt(c + lambda * lambda * b));
        if (e == changes.size())
            break;
        const size_t r = changes[e].rank;
        if (!changes[e].to_hi) {
            a -= lo_[r] * us_[r];
            c -= lo_[r] * lo_[r];
            b += us_[r] * us_[r];
        } else {
            b -= us_[r] * us_[r];
            a += hi * us_[r];
            c += hi * hi;
        }
        from = to;
    }
    return best;
}

// An upper bound on the cosine of every point the rest of the sweep can
// reach: the best real z in the box [k + 1/2, hi] (k the levels reached so
// far). The best z is clamp(lambda u, lo, hi) where phi = c - lambda a
// changes sign (the cosine's derivative in lambda is b phi, and phi falls as
// lambda grows: one peak). Newton steps on the piecewise linear phi find
// it, from t (the sweep's scale) or the last root; with lambda1 < root <
// lambda2 certified by the signs of phi, <z(lambda2), u> / ||z(lambda1)||
// bounds the peak, as both grow with lambda. Where the signs cannot be
// certified, the sorted walk does it.
template <int W>
RABITQ_INLINE double GridSearch::rest_bound(size_t d, unsigned levels, double t)
{
    const size_t m = m_;
    // k_r = the levels whose next rank is past r.
    level_count_.assign(m + 1, 0);
    for (unsigned j = 1; j <= levels; j++)
        level_count_[next_[j]]++;
    lo_.resize(m + W);
    unsigned done = 0;
    for (size_t r = 0; r < m; r++) {
        done += level_count_[r];
        lo_[r] = double(levels - done) + 0.5;
    }
    const double hi = double(levels) + 0.5, c0 = 0.25 * double(d - m);
    constexpr double kInf = std::numeric_limits<double>::infinity();
    double lambda = lambda_ > 0.0 ? lambda_ : t;
    if (!(lambda > 0.0 && lambda < kInf))
        lambda = hi / us_[0];
    double left = 0.0, right = kInf, a, b, c;
    for (int it = 0; it < 50; it++) {
        box_sums<W>(lambda, hi, &a, &b, &c);
        c += c0;
        const double phi = c - lambda * a;
        if (phi > 0.0)
            left = lambda;
        else if (phi < 0.0)
            right = lambda;
        else
            break;
        double next = c / a;  // the root of phi on lambda's piece
        if (!(next > left && next < right))
            next = right < kInf ? 0.5 * (left + right) : 2.0 * left;
        if (next == lambda || right - left <= 1e-13 * left)
            break;
        lambda = next;
    }
    lambda_ = lambda;
    const double l1 = lambda * (1.0 - 1e-9), l2 = lambda * (1.0 + 1e-9);
    double a1, b1, c1, a2, b2, c2;
    box_sums<W>(l1, hi, &a1, &b1, &c1);
    box_sums<W>(l2, hi, &a2, &b2, &c2);
    c1 += c0;
    c2 += c0;
    // Sums of at most 2000 terms are exact to 2000 ulp: 1e-12 of their size
    // certifies a sign.
    const double phi1 = c1 - l1 * a1, phi2 = c2 - l2 * a2;
    if (phi1 > 1e-12 * (c1 + l1 * a1) && phi2 < -1e-12 * (c2 + l2 * a2) && l2 < kInf)
        return (a2 + l2 * b2) / std::sqrt(c1 + l1 * l1 * b1);
    return rest_bound_sorted(d, hi);
}

// Steps per slice: enough that the per-level work of a slice is small
// beside its steps.
RABITQ_INLINE size_t GridSearch::slice_size(unsigned levels) const
{
    return std::max<size_t>(256, std::min<size_t>(4096, m_ * levels / 16));
}

// The sweep with sorted slices and the sweep's own comparisons: the
// reference the binned sweep falls back on.
template <int W>
RABITQ_INLINE void GridSearch::sweep_sequential(size_t d, unsigned levels, double ip, double nsq)
{
    const size_t m = m_;
    ip_ = best_ip_ = ip;
    nsq_ = best_nsq_ = nsq;
    best_ip_sq_ = ip * ip;
    best_ = {0.0, 0};
    stepped_ = false;
    swept_ = best_at_ = 0;
    lambda_ = 0.0;
    next_.assign(levels + 1, 0);
    end_.assign(levels + 1, 0);
    const size_t slice = slice_size(levels);
    size_t nb = 2;
    while (nb < 2 * slice)
        nb *= 2;
    constexpr double kInf = std::numeric_limits<double>::infinity();
    unsigned first = 1;  // levels below first are done
    double t_lo = 0.0;
    while (first <= levels) {
        // About `slice` steps at the current rate: the u of the ranks not at
        // the top level yet.
        double t_hi = t_lo + double(slice) / rest_[next_[levels]];
        if (!(t_hi > t_lo) || !(t_hi < kInf))
            t_hi = kInf;
        const size_t n = gather_slice(first, levels, t_lo, t_hi, nb);
        sort_slice(n, first, levels);
        sweep_slice<W>(n);
        for (unsigned j = first; j <= levels; j++)
            next_[j] = end_[j];
        while (first <= levels && next_[first] >= m)
            first++;
        t_lo = t_hi;
        // Past the peak (no new best for a while): stop once nothing left
        // can beat the best, with room for the rounding of the running sums.
        if (first <= levels && swept_ - best_at_ >= slice / 4 &&
            rest_bound<W>(d, levels, t_lo) * (1.0 + 1e-9) < best_ip_ / std::sqrt(best_nsq_))
            break;
    }
}

// ---- The binned sweep ----
//
// Between two powers of two ip keeps one ulp, unit_, so each addition
// rounds u to a multiple of it: ip + u rounds to ip + round(u / unit_)
// unit_, whatever ip is, unless u / unit_ ends in exactly .5 (a tie, which
// rounds to even and so depends on ip). So until ip reaches the next power
// of two, the ip after any set of steps is a_ unit_ plus the sum of their
// rounded u: it depends on which steps were taken, not on their order. The
// binned sweep cuts a slice into buckets of t (steps in bucket order are in
// sweep order), adds up each bucket's integers without sorting it, and so
// knows every state the sweep passes at a bucket boundary exactly. The steps
// inside a bucket are sorted and taken only where a state there could come
// near the best: its ip grows by at most (1 + 2^-52) nsq-growth / (2 t) plus
// half a unit per step, which bounds ip^2 / nsq over the bucket. The bucket
// where ip reaches the next power of two is taken step by step in double,
// as are slices with a tie. The best is the state of largest ip^2 / nsq;
// where another state comes within 3e-12 of it, which of them the sweep
// keeps depends on its rounded comparisons, and the sequential sweep
// decides instead.

// Rounds u / unit_ for every rank into units_ (NaN for a tie, so that the
// sum of a bucket with one is NaN). v + 2^52 - 2^52 rounds v < 2^52 to an
// integer (to even); then the floor, and .5 tells a tie.
template <int W>
RABITQ_INLINE void GridSearch::round_units()
{
    typedef typename DoubleLanes<W>::V V;
    typedef typename DoubleLanes<W>::VU VU;
    const size_t m = m_;
    units_.resize(m + W);
    us_.resize(std::max(us_.size(), m + W));  // (lanes past m are ignored)
    const double* us = us_.data();
    const double* w = w_.data();
    RankUnits* ru = units_.data();
    const double scale = 1.0 / unit_;  // a power of two: exact
    const V sc = scale + V{}, big = 0x1p52 + V{}, one = 1.0 + V{}, half = 0.5 + V{};
    const V nan = std::numeric_limits<double>::quiet_NaN() + V{};
    for (size_t r = 0; r < m; r += W) {
        const V v = *reinterpret_cast<const VU*>(us + r) * sc;
        V f = (v + big) - big;
        f = f > v ? f - one : f;
        f = v >= big ? v : f;  // already an integer
        const V fr = v - f;
        V inc = fr > half ? f + one : f;
        inc = fr == half ? nan : inc;
        for (int l = 0; l < W && r + size_t(l) < m; l++) {
            ru[r + size_t(l)].w = w[r + size_t(l)];
            ru[r + size_t(l)].inc = inc[l];
        }
    }
}

// Sets the binade of ip (a double > 0, normal): a_, unit_ and units_.
template <int W>
RABITQ_INLINE void GridSearch::set_binade(double ip)
{
    int e = 0;
    std::frexp(ip, &e);
    unit_ = std::ldexp(1.0, e - 53);
    a_ = ip / unit_;
    round_units<W>();
}

// Gathers the steps at t_lo <= t < t_hi (finite) of levels first..levels
// into binned_ (level by level, by rank) and nb buckets of t: each
// bucket's list of steps, its sum of rounded u and of levels. Sets end_;
// returns the number of steps.
__attribute__((noinline)) size_t GridSearch::gather_binned(unsigned first, unsigned levels,
                                                           double t_lo, double t_hi, size_t nb)
{
    const size_t m = m_;
    const double scale = double(nb) / (t_hi - t_lo);
    const uint32_t last = uint32_t(nb - 1);
    sums_.assign(nb, {0.0, 0, UINT32_MAX});
    BucketSums* __restrict bs = sums_.data();
    const RankUnits* __restrict ru = units_.data();
    const uint32_t* next = next_.data();
    uint32_t* end = end_.data();
    size_t n = 0;
    for (unsigned j = first; j <= levels; j++) {
        const double jd = double(j);
        const uint32_t tag = j << 16;
        size_t r = next[j];
        if (binned_.size() < n + (m - r))
            binned_.resize(std::max(n + (m - r), 2 * binned_.size()));
        BinnedStep* __restrict ev = binned_.data();
        const size_t r0 = r;
        for (; r < m; r++) {
            const double t = jd * ru[r].w;
            if (!(t < t_hi))
                break;
            // (t - t_lo) * scale >= 0: the steps before t_lo are taken.
            const uint32_t f = uint32_t((t - t_lo) * scale), b = f < last ? f : last;
            BucketSums& s = bs[b];
            ev[n + (r - r0)] = {t, tag | uint32_t(r), s.head};
            s.head = uint32_t(n + (r - r0));
            s.inc += ru[r].inc;
            s.levels += j;
        }
        end[j] = uint32_t(r);
        n += r - r0;
    }
    return n;
}

// Copies bucket b's steps into bucket_buf_, sorted in (t, j, r) order;
// returns how many.
RABITQ_INLINE size_t GridSearch::bucket_steps(size_t b)
{
    size_t k = 0;
    const BinnedStep* ev = binned_.data();
    for (uint32_t e = sums_[b].head; e != UINT32_MAX; e = ev[e].link) {
        if (bucket_buf_.size() <= k)
            bucket_buf_.resize(std::max<size_t>(64, 2 * k));
        bucket_buf_[k++] = {ev[e].t, ev[e].tag};
    }
    SweepStep* st = bucket_buf_.data();
    auto before = [](const SweepStep& a, const SweepStep& c) {
        return a.t < c.t || (a.t == c.t && a.tag < c.tag);
    };
    if (k > 32) {
        std::sort(st, st + k, before);
    } else {
        for (size_t s = 1; s < k; s++) {
            const SweepStep v = st[s];
            size_t q = s;
            while (q > 0 && before(v, st[q - 1])) {
                st[q] = st[q - 1];
                q--;
            }
            st[q] = v;
        }
    }
    return k;
}

// A state the sweep passes (after step `step`): the best if its ip^2 / nsq
// is the largest so far (returns true then); ambiguous_ once another comes
// within 3e-12 of it.
RABITQ_INLINE bool GridSearch::consider(double ip, double nsq, const SweepStep& step)
{
    const double q = ip * ip / nsq;
    if (q > best_q_ * (1.0 + 3e-12)) {
        ambiguous_ = false;
    } else if (q >= best_q_ * (1.0 - 3e-12)) {
        ambiguous_ = true;
        if (!(q > best_q_))
            return false;
    } else {
        return false;
    }
    best_q_ = q;
    best_ip_ = ip;
    best_nsq_ = nsq;
    best_ = step;
    stepped_ = true;
    best_bucket_ = -1;
    return true;
}

// Takes n sorted steps one by one in double from (ip, nsq), as the sweep
// does, considering each state; returns whether one became the best.
RABITQ_INLINE bool GridSearch::take_steps(const SweepStep* st, size_t n, double* ip, double* nsq)
{
    const double* us = us_.data();
    double a = *ip, q = *nsq;
    bool better = false;
    for (size_t s = 0; s < n; s++) {
        a += us[st[s].tag & 0xffffu];
        q += 2.0 * double(st[s].tag >> 16);
        better |= consider(a, q, st[s]);
    }
    *ip = a;
    *nsq = q;
    return better;
}

// Takes the nb buckets of a gathered slice: the states at bucket
// boundaries, the steps of buckets that could hold a state near the best,
// and the bucket where ip reaches the next power of two, if any, step by
// step; after that bucket the later buckets' sums are made again in the new
// units.
template <int W>
RABITQ_INLINE void GridSearch::take_buckets(size_t nb, double t_lo, double scale)
{
    typedef typename DoubleLanes<W>::V V;
    typedef typename DoubleLanes<W>::VU VU;
    for (auto* v : {&bucket_a_, &bucket_n4_, &bucket_j_, &bucket_a0_, &bucket_n40_, &bucket_q_})
        v->resize(nb + W);
    double* __restrict ba = bucket_a_.data();
    double* __restrict bn = bucket_n4_.data();
    double* __restrict bj = bucket_j_.data();
    double* __restrict ba0 = bucket_a0_.data();
    double* __restrict bn0 = bucket_n40_.data();
    double* __restrict bq = bucket_q_.data();
    BucketSums* bs = sums_.data();
    const double* __restrict us = us_.data();
    const double inv_scale = 1.0 / scale;
    for (size_t b0 = 0; b0 < nb;) {
        // States before and after each bucket from b0, up to the one where
        // ip reaches 2^53 units (the next binade).
        const double unit = unit_;
        double a = a_, n4 = n4_;
        size_t cross = nb;
        for (size_t b = b0; b < nb; b++) {
            ba0[b] = a;
            bn0[b] = n4;
            const double next = a + bs[b].inc;
            if (next == next) {
                a = next;
            } else {
                // A tie: the bucket's steps one by one, in double.
                const size_t k = bucket_steps(b);
                double ip = a * unit;
                for (size_t s = 0; s < k; s++)
                    ip += us[bucket_buf_[s].tag & 0xffffu];
                a = ip / unit;
            }
            bj[b] = double(bs[b].levels);
            n4 += 8.0 * bj[b];
            if (a >= 0x1p53) {
                cross = b;
                break;
            }
            ba[b] = a;
            bn[b] = n4;
        }
        const double cross_a = cross < nb ? ba0[cross] : 0.0;
        const double cross_n4 = cross < nb ? bn0[cross] : 0.0;
        // ip^2 / nsq of each state after a bucket (-1 after an empty one,
        // which repeats a state; and outside b0..cross).
        const size_t vb = b0 / W * W, ve = (cross + W - 1) / W * W;
        for (size_t b = vb; b < b0; b++)
            bj[b] = 0.0;
        for (size_t b = cross; b < ve; b++) {
            ba[b] = ba0[b] = 0.0;
            bn[b] = bn0[b] = 4.0;
            bj[b] = 0.0;
        }
        V top_v = -1.0 + V{};
        const V uv = unit + V{}, quarter = 0.25 + V{}, zero = V{}, none = -1.0 + V{};
        for (size_t b = vb; b < ve; b += W) {
            const V ip = *reinterpret_cast<const VU*>(ba + b) * uv;
            V q = ip * ip / (*reinterpret_cast<const VU*>(bn + b) * quarter);
            q = *reinterpret_cast<const VU*>(bj + b) > zero ? q : none;
            *reinterpret_cast<VU*>(bq + b) = q;
            top_v = q > top_v ? q : top_v;
        }
        double top = top_v[0];
        for (int l = 1; l < W; l++)
            top = std::max(top, top_v[l]);
        if (top > best_q_ * (1.0 + 3e-12)) {
            size_t at = b0, near = 0;
            const double band = top * (1.0 - 3e-12);
            while (bq[at] != top)
                at++;
            for (size_t b = b0; b < cross; b++)
                near += bq[b] >= band;
            best_q_ = top;
            best_ip_ = ba[at] * unit;
            best_nsq_ = 0.25 * bn[at];
            best_bucket_ = ptrdiff_t(at);
            best_pos_ = at;
            stepped_ = true;
            ambiguous_ = near > 1;
        } else if (top >= best_q_ * (1.0 - 3e-12)) {
            ambiguous_ = true;  // (the best stays: this only decides a fallback)
        }
        // Buckets with two or more steps where a state could reach the
        // best: ip grows by at most slope per unit of nsq (the steps are at
        // t >= tb, a bucket to spare) plus half a unit per step, and the
        // largest ip^2 / nsq on such a line is at one of its ends.
        const double thr = best_q_ * (1.0 - 3e-12) * (1.0 - 1e-13);
        const V thr_v = thr + V{}, two = 2.0 + V{}, lo_v = t_lo + V{}, is_v = inv_scale + V{};
        const V half_unit = 0.5 * unit + V{}, grow = 0.5 * (1.0 + 0x1p-50) + V{};
        V lane;
        for (int l = 0; l < W; l++)
            lane[l] = double(l) - 1.0;
        for (size_t b = vb; b < ve; b += W) {
            const V nj = *reinterpret_cast<const VU*>(bj + b);
            const V ip0 = *reinterpret_cast<const VU*>(ba0 + b) * uv;
            const V nsq0 = *reinterpret_cast<const VU*>(bn0 + b) * quarter;
            const V nsq1 = *reinterpret_cast<const VU*>(bn + b) * quarter;
            V tb = double(b) + lane;
            tb = tb > zero ? tb : zero;
            tb = lo_v + tb * is_v;
            const V slope = grow / tb, pad = half_unit * nj;
            const V ip_first = ip0 + two * slope + pad, ip_last = ip0 + (nsq1 - nsq0) * slope + pad;
            const auto hit = (nj >= two) & ((ip_first * ip_first >= thr_v * (nsq0 + two)) |
                                            (ip_last * ip_last >= thr_v * nsq1));
            for (int l = 0; l < W; l++) {
                if (!hit[l])
                    continue;
                const size_t c = b + size_t(l);
                const size_t k = bucket_steps(c);
                double ip = ba0[c] * unit, nsq = 0.25 * bn0[c];
                for (size_t s = 0; s + 1 < k; s++) {
                    const uint32_t tag = bucket_buf_[s].tag;
                    ip += us[tag & 0xffffu];
                    nsq += 2.0 * double(tag >> 16);
                    if (consider(ip, nsq, bucket_buf_[s]))
                        best_pos_ = c;
                }
            }
        }
        if (best_bucket_ >= 0) {
            // The best is the state after a bucket: its last step.
            const size_t k = bucket_steps(size_t(best_bucket_));
            best_ = bucket_buf_[k - 1];
            best_bucket_ = -1;
        }
        if (cross == nb) {
            a_ = a;
            n4_ = n4;
            return;
        }
        // The crossing bucket, step by step in double; then the sums of the
        // later buckets in the new units.
        double ip = cross_a * unit, nsq = 0.25 * cross_n4;
        const size_t k = bucket_steps(cross);
        if (take_steps(bucket_buf_.data(), k, &ip, &nsq))
            best_pos_ = cross;
        set_binade<W>(ip);
        n4_ = 4.0 * nsq;
        const BinnedStep* ev = binned_.data();
        const RankUnits* ru = units_.data();
        for (size_t b = cross + 1; b < nb; b++) {
            double sum = 0.0;
            for (uint32_t e = bs[b].head; e != UINT32_MAX; e = ev[e].link)
                sum += ru[ev[e].tag & 0xffffu].inc;
            bs[b].inc = sum;
        }
        b0 = cross + 1;
    }
}

// The sweep by buckets (see above). Returns false where it cannot decide
// the best (a near tie, or values that are not finite): then the
// sequential sweep does.
template <int W>
RABITQ_INLINE bool GridSearch::sweep_binned(size_t d, unsigned levels, double ip, double nsq)
{
    if (!(ip >= std::numeric_limits<double>::min() && ip < 0x1p1000))
        return false;
    const size_t m = m_;
    best_ip_ = ip;
    best_nsq_ = nsq;
    best_q_ = ip * ip / nsq;
    best_pos_ = 0;
    best_ = {0.0, 0};
    stepped_ = false;
    ambiguous_ = false;
    best_bucket_ = -1;
    swept_ = best_at_ = 0;
    lambda_ = 0.0;
    set_binade<W>(ip);
    n4_ = 4.0 * nsq;
    next_.assign(levels + 1, 0);
    end_.assign(levels + 1, 0);
    const size_t slice = slice_size(levels);
    constexpr double kInf = std::numeric_limits<double>::infinity();
    unsigned first = 1;  // levels below first are done
    double t_lo = 0.0;
    while (first <= levels) {
        const double rate = rest_[next_[levels]];  // steps per unit of t
        double t_hi = t_lo + double(slice) / rate;
        // Not much past where ip should reach the next power of two (ip
        // grows at the sum of u^2 of the ranks below the top level): steps
        // after it in the slice are summed twice.
        const double t_next = t_lo + (1.01 * 0x1p53 - a_) * unit_ / rest2_[next_[levels]];
        if (t_next > t_lo && t_next < t_hi)
            t_hi = t_next;
        if (!(t_hi > t_lo) || !(t_hi < kInf))
            t_hi = kInf;
        const double best_before = best_q_;
        // About four steps per bucket.
        size_t nb = 16;
        while (double(nb) * 4.0 < (t_hi - t_lo) * rate && nb < 4 * slice)
            nb *= 2;
        size_t n = 0;
        if (t_hi == kInf) {
            // The last slice: step by step, in double.
            n = gather_slice(first, levels, t_lo, t_hi, 2 * nb);
            sort_slice(n, first, levels);
            double a = a_ * unit_, q = 0.25 * n4_;
            if (take_steps(steps_.data(), n, &a, &q))
                best_pos_ = nb - 1;
            set_binade<W>(a);
            n4_ = 4.0 * q;
        } else {
            n = gather_binned(first, levels, t_lo, t_hi, nb);
            take_buckets<W>(nb, t_lo, double(nb) / (t_hi - t_lo));
        }
        for (unsigned j = first; j <= levels; j++)
            next_[j] = end_[j];
        if (best_q_ > best_before)  // about where (for when to stop)
            best_at_ = swept_ + n * (best_pos_ + 1) / nb;
        swept_ += n;
        while (first <= levels && next_[first] >= m)
            first++;
        t_lo = t_hi;
        // Past the peak (no new best for a while): stop once nothing left
        // can beat the best, with room for the rounding of ip.
        if (first <= levels && swept_ - best_at_ >= slice / 4 &&
            rest_bound<W>(d, levels, t_lo) * (1.0 + 1e-9) < best_ip_ / std::sqrt(best_nsq_))
            break;
    }
    return !ambiguous_;
}

template <int W>
RABITQ_INLINE RabitqGridPoint GridSearch::run_impl(const double* o, size_t d, int bits,
                                                   uint8_t* x)
{
    const unsigned half = 1u << (bits - 1), levels = half - 1;
    u_.resize(d);
    double* u = u_.data();
    double ip = 0.0;
    for (size_t i = 0; i < d; i++) {
        u[i] = std::fabs(o[i]);
        ip += 0.5 * u[i];
        x[i] = uint8_t(o[i] >= 0.0 ? half : half - 1);
    }
    const double nsq = 0.25 * double(d);
    if (levels == 0)
        return {ip, nsq};
    rank_coordinates(d);
    const size_t m = m_;
    if (m == 0)
        return {ip, nsq};
    if (!sweep_binned<W>(d, levels, ip, nsq))
        sweep_sequential<W>(d, levels, ip, nsq);
    if (stepped_) {
        // Levels at the best step: rank r's steps (j w_r, j, r) up to it.
        const double tb = best_.t;
        const unsigned jb = best_.tag >> 16, rb = best_.tag & 0xffffu;
        const double* us = us_.data();
        const double* w = w_.data();
        const uint32_t* coord = coord_.data();
        for (size_t r = 0; r < m; r++) {
            auto taken = [&](unsigned j) {
                const double t = double(j) * w[r];
                return t < tb || (t == tb && (j < jb || (j == jb && r <= rb)));
            };
            const double f = tb * us[r];
            unsigned k = f >= double(levels) ? levels : (f >= 0.0 ? unsigned(f) : 0u);
            while (k < levels && taken(k + 1))
                k++;
            while (k > 0 && !taken(k))
                k--;
            const uint32_t i = coord[r];
            x[i] = uint8_t(o[i] >= 0.0 ? half + k : half - 1 - k);
        }
    }
    return {best_ip_, best_nsq_};
}

#if GPU_IVFPQ_X86_DISPATCH
__attribute__((target("arch=x86-64-v3"))) RabitqGridPoint GridSearch::run_avx2(const double* o,
                                                                              size_t d, int bits,
                                                                              uint8_t* x)
{
    return run_impl<4>(o, d, bits, x);
}
#endif

RabitqGridPoint GridSearch::run(const double* o, size_t d, int bits, uint8_t* x)
{
#if GPU_IVFPQ_X86_DISPATCH
    if (detail::cpu_has_avx2())
        return run_avx2(o, d, bits, x);
#endif
    return run_impl<2>(o, d, bits, x);
}

}  // namespace

// ---- Code layout ----

void rabitq_pack(const uint8_t* x, size_t d, int bits, uint8_t* code)
{
    require_bits(bits);
    require(x && code, "rabitq_pack: null pointer");
    const size_t plane_bytes = rabitq_plane_words(d) * 4;
    std::memset(code, 0, size_t(bits) * plane_bytes);
    for (int p = 0; p < bits; p++) {
        const int shift = bits - 1 - p;
        uint8_t* plane = code + size_t(p) * plane_bytes;
        for (size_t i = 0; i < d; i++)
            plane[i / 8] |= uint8_t(((x[i] >> shift) & 1u) << (i % 8));
    }
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

// ---- The grid search (the public entry) ----

RabitqGridPoint rabitq_best_grid_point(const double* o, size_t d, int bits, uint8_t* x)
{
    require_bits(bits);
    require(o && x, "rabitq_best_grid_point: null pointer");
    require(d <= kRabitqMaxDims, "rabitq_best_grid_point: dimension above " +
                                     std::to_string(kRabitqMaxDims));
    GridSearch search;
    return search.run(o, d, bits, x);
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
        beta[k] = 2.0 / dot_double(vk, vk, m);
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
                    const double w = beta[kk] * dot_double(vk, col, m);
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

void RabitqRotation::apply(const double* x, double* out) const
{
    apply_rows(x, 1, out);
}

void RabitqRotation::apply_rows(const double* x, size_t n, double* out) const
{
    std::vector<double> acc(std::min(n, kEncodeTile) * d_ * 4);
    for (size_t s = 0; s < n; s += kEncodeTile)
        rotate_rows(p_.data(), d_, x + s * d_, std::min(kEncodeTile, n - s), out + s * d_,
                    acc.data());
}

// ---- The model ----

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
}

void RabitqModel::set_centroids(const float* data)
{
    require(data != nullptr, "RaBitQ: null centroids");
    std::copy(data, data + centroids_.size(), centroids_.begin());
}

void RabitqModel::assign(const float* x, size_t n, int32_t* list_ids, int threads) const
{
    if (n == 0)
        return;
    require(x && list_ids, "RaBitQ: null pointer in assign");
    if (metric_ != Metric::Cosine) {
        assign_nearest(x, n, centroids_.data(), lists_, d_, list_ids, nullptr, threads);
        return;
    }
    constexpr size_t kRows = 4096;
    std::vector<float> buf(std::min(n, kRows) * d_);
    for (size_t r0 = 0; r0 < n; r0 += kRows) {
        const size_t nr = std::min(kRows, n - r0);
        std::memcpy(buf.data(), x + r0 * d_, nr * d_ * sizeof(float));
        normalize_rows(buf.data(), nr, d_);
        assign_nearest(buf.data(), nr, centroids_.data(), lists_, d_, list_ids + r0, nullptr,
                       threads);
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
        GridSearch grid;
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
                for (size_t k = 0; k < d; k++)
                    ri[k] = double(row[k]) - double(c[k]);
                const double sq = dot_double(ri, ri, d);
                const double rn = std::sqrt(sq);
                if (!(rn > 0.0) || !std::isfinite(rn)) {
                    // A row on its centroid (or not finite): the estimate is
                    // the query's distance to the centroid, exactly.
                    std::fill(ri, ri + d, 0.0);
                    grid.run(ri, d, bits_, xu.data());
                    rabitq_pack(xu.data(), d, bits_, codes + i * cb);
                    factors[i] = {0.0f, 0.0f, 0.0f};
                    continue;
                }
                for (size_t k = 0; k < d; k++)
                    ri[k] /= rn;
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
                const double on = std::sqrt(dot_double(ro, ro, d));
                for (size_t k = 0; k < d; k++)
                    ro[k] /= on;
                const RabitqGridPoint g = grid.run(ro, d, bits_, xu.data());
                rabitq_pack(xu.data(), d, bits_, codes + i * cb);
                const double a = g.ip / std::sqrt(g.norm_sqr);  // cosine of o' and y
                double add = rsq[s];
                if (metric_ == Metric::InnerProduct) {
                    add = 0.0;
                    for (size_t k = 0; k < d; k++)
                        add += double(c[k]) * (double(row[k]) - double(c[k]));
                }
                RabitqFactors& f = factors[i];
                f.add = float(add);
                f.rescale = float(rn / g.ip);
                f.error = d >= 2 ? float(rn * std::sqrt(std::max(0.0, 1.0 - a * a)) /
                                         (a * std::sqrt(double(d - 1))))
                                 : 0.0f;
            }
        }
    });
}

void RabitqModel::prepare_query(const float* q, RabitqQuery& out) const
{
    require(q != nullptr, "RaBitQ: null query");
    out.q.assign(q, q + d_);
    if (metric_ == Metric::Cosine)
        normalize_rows(out.q.data(), 1, d_);
}

void RabitqModel::prepare_list(const RabitqQuery& query, int32_t list, RabitqListQuery& out) const
{
    require(query.q.size() == d_, "RaBitQ: query was not prepared by a model of this dimension");
    require(list >= 0 && size_t(list) < lists_, "RaBitQ: list id out of range");
    const float* c = centroids_.data() + size_t(list) * d_;
    const size_t groups = rabitq_plane_words(d_) * 4;  // code bytes per plane
    std::vector<double> qr(d_), rot(groups * 8, 0.0);
    for (size_t k = 0; k < d_; k++)
        qr[k] = double(query.q[k]) - double(c[k]);
    const double qsq = dot_double(qr.data(), qr.data(), d_);
    rotation_.apply(qr.data(), rot.data());

    out.list = list;
    out.lut.resize(groups * 256);
    for (size_t j = 0; j < groups; j++) {
        const double* v = rot.data() + j * 8;
        double tab[256];
        tab[0] = -0.5 * (((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7])));
        for (unsigned b = 1; b < 256; b++)
            tab[b] = tab[b & (b - 1)] + v[__builtin_ctz(b)];
        for (unsigned b = 0; b < 256; b++)
            out.lut[j * 256 + b] = float(tab[b]);
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
        out.base = float(-dot_double(query.q.data(), c, d_));
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
    for (size_t i = 0; i < n; i++) {
        check_interrupt_every(i);
        const RabitqEstimate e = finish_estimate(
            lq, factors[i],
            code_inner_product(lq.lut.data(), codes + i * code_stride, plane_bytes, bits_), eps0);
        estimate[i] = e.estimate;
        if (bound)
            bound[i] = e.bound;
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
                                          size_t k) const
{
    TopK top(k);
    scan_probed(lists, q, nprobe, 0.0f, false,
                [&](float est, float, int64_t label) { top.push(est, label); });
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
