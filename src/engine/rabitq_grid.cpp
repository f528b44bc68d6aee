// The grid search of extended RaBitQ: the grid point of best cosine with a
// unit vector, exactly the point (and the rounded sums) of the papers' sweep.
#include "rabitq_grid.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "error.h"
#include "internal.h"

namespace gpuivfpq {
namespace detail {

namespace {

// What is computed: the papers' sweep, as a heap of levels runs it. With
// u = |o| and the coordinates with u_i > 0 ranked by decreasing u_i (ties
// by index), the coordinate of rank r steps to level j (1 <= j < 2^(bits-1))
// at t = j * (1 / u_r), both operations in double; the steps are taken in
// (t, j, r) order; ip = <y, u> starts at the sum of u_i / 2 in index order
// and each step adds u_r (rounded, in double); nsq = ||y||^2 starts at d / 4
// and each step adds 2j; a state becomes the best when ip * ip * best_nsq >
// best_ip * best_ip * nsq. The result is the best state's levels, ip and
// nsq, bit for bit, though far fewer steps are sorted or summed one by one:
//
// - The binned sweep (the usual way, see there) sums the steps of a bucket
//   of t without sorting them: between two powers of two, the rounded sum
//   does not depend on their order.
// - The sequential sweep takes slices of steps sorted by a counting sort,
//   with the sweep's own sums and comparisons: it decides where two states
//   come within 3e-12 of each other (where the binned sweep cannot tell
//   which the sweep keeps), and for values that are not finite.
// - Both stop once the best is a while behind and no point left can beat it
//   (rest_bound: the best real point of the box the rest of the sweep stays
//   in); the result is the full sweep's.

// One step of the sweep: its scale t and (level << 16) | rank (which
// orders steps of equal t as the sweep does).
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

// For the binned sweep: per rank 1/u and u in units of ip's ulp, rounded
// (NaN for a tie); per gathered step its tag and the next step of its
// bucket; per bucket its sum of rounded u and of levels, and first step.
struct RankUnits {
    double w, inc;
};
struct BinnedStep {
    uint32_t tag, link;
};
struct Bucket {
    double inc;
    uint32_t levels, head;
};

#define RABITQ_INLINE inline __attribute__((always_inline))

// Steps per bucket of the binned sweep (on average): more make fewer
// buckets, and more steps to sort in those near the best.
constexpr double kStepsPerBucket = 6.0;

// W lanes of doubles (GCC vector extensions); VU for unaligned loads and
// stores through double pointers.
template <int W>
struct DoubleLanes {
    typedef double V __attribute__((vector_size(W * 8)));
    typedef double VU __attribute__((vector_size(W * 8), aligned(8), may_alias));
};

}  // namespace

class RabitqGridSearch::Impl {
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
    RABITQ_INLINE bool slice_ends_sweep(size_t d, unsigned levels, size_t slice, double t_lo,
                                        unsigned* first);
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
    // Both sweeps: per level the first rank not swept yet and the end of the
    // slice's run; the best (and when it came, in steps). The sequential
    // sweep: the slice's buckets and sorted steps, its running sums.
    std::vector<uint32_t> next_, end_;
    std::vector<uint32_t> count_, bucket_;
    std::vector<SweepStep> steps_;
    double ip_ = 0, nsq_ = 0, best_ip_ = 0, best_nsq_ = 0, best_ip_sq_ = 0;
    SweepStep best_{0.0, 0};
    bool stepped_ = false;  // the best is after some step
    size_t swept_ = 0, best_at_ = 0;
    // The binned sweep (sweep_binned): ip = a_ unit_ exactly (2^52 <= a_ <
    // 2^53), 4 nsq = n4_; the units of the ranks, the slice's steps and
    // buckets; the states between buckets (bucket b runs from state b to
    // state b + 1).
    double a_ = 0, unit_ = 0, n4_ = 0;
    std::vector<RankUnits> units_;
    std::vector<BinnedStep> binned_;
    std::vector<Bucket> buckets_;
    std::vector<double> state_a_, state_n4_, state_q_;
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
RABITQ_INLINE void RabitqGridSearch::Impl::rank_coordinates(size_t d)
{
    ranked_.resize(d);
    RankedCoord* rc = ranked_.data();
    const double* u = u_.data();
    size_t m = 0;
    double umax = 0.0;
    for (size_t i = 0; i < d; i++) {
        rc[m] = {u[i], uint32_t(i)};
        m += u[i] > 0.0;
        umax = std::max(umax, u[i]);
    }
    m_ = m;
    auto before = [](const RankedCoord& a, const RankedCoord& b) {
        return a.u > b.u || (a.u == b.u && a.i < b.i);
    };
    size_t nb = 16;
    while (2 * nb < m)
        nb *= 2;
    const double scale = double(nb) / umax;
    bool sorted = false;
    if (m > 32 && scale > 0.0 && scale < std::numeric_limits<double>::infinity()) {
        count_.assign(nb + 1, 0);
        key_.resize(m);
        ranked_tmp_.resize(m);
        uint32_t* cnt = count_.data() + 1;
        uint32_t* key = key_.data();
        RankedCoord* out = ranked_tmp_.data();
        const uint32_t last = uint32_t(nb - 1);
        for (size_t r = 0; r < m; r++) {
            const uint32_t f = uint32_t(rc[r].u * scale);
            key[r] = last - (f < last ? f : last);
            cnt[key[r]]++;
        }
        cnt--;  // cnt[b] = the number in buckets before b
        for (size_t b = 1; b <= nb; b++)
            cnt[b] += cnt[b - 1];
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
            rc = out;
    }
    if (!sorted)
        std::sort(rc, rc + m, before);
    coord_.resize(m);
    us_.resize(m);
    w_.resize(m);
    rest_.resize(m + 1);
    rest2_.resize(m + 1);
    units_.resize(m + 8);
    uint32_t* coord = coord_.data();
    double* us = us_.data();
    double* w = w_.data();
    double* rest = rest_.data();
    double* rest2 = rest2_.data();
    RankUnits* ru = units_.data();
    rest[m] = rest2[m] = 0.0;
    for (size_t r = m; r-- > 0;) {
        coord[r] = rc[r].i;
        us[r] = rc[r].u;
        w[r] = ru[r].w = 1.0 / rc[r].u;
        rest[r] = rest[r + 1] + us[r];
        rest2[r] = rest2[r + 1] + us[r] * us[r];
    }
}

// Gathers the steps at t_lo <= t < t_hi (every step left when t_hi is
// infinite) of levels first..levels: sets end_, counts the steps of each of
// nb buckets of t (count_, then bucket start offsets) and returns how many.
RABITQ_INLINE size_t RabitqGridSearch::Impl::gather_slice(unsigned first, unsigned levels,
                                                          double t_lo, double t_hi, size_t nb)
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
RABITQ_INLINE void RabitqGridSearch::Impl::sort_slice(size_t n, unsigned first, unsigned levels)
{
    if (steps_.size() < n)
        steps_.resize(std::max(n, 2 * steps_.size()));
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

// Takes the n sorted steps of steps_ as the sweep does: its running sums
// and comparisons.
RABITQ_INLINE void RabitqGridSearch::Impl::sweep_slice(size_t n)
{
    const SweepStep* st = steps_.data();
    const double* us = us_.data();
    double ip = ip_, nsq = nsq_;
    for (size_t s = 0; s < n; s++) {
        const uint32_t tag = st[s].tag;
        ip += us[tag & 0xffffu];
        nsq += 2.0 * double(tag >> 16);
        if (ip * ip * best_nsq_ > best_ip_sq_ * nsq) {
            best_ip_ = ip;
            best_ip_sq_ = ip * ip;
            best_nsq_ = nsq;
            best_ = st[s];
            best_at_ = swept_ + s + 1;
            stepped_ = true;
        }
    }
    ip_ = ip;
    nsq_ = nsq;
    swept_ += n;
}

// The sums over the box that bound the rest of the sweep, at scale lambda:
// z = clamp(lambda u, lo, hi); a = <z, u> and c = ||z||^2 over the clamped
// coordinates, b = ||u||^2 over the free ones. The cosine of z and u is
// (a + lambda b) / sqrt(c + lambda^2 b).
template <int W>
RABITQ_INLINE void RabitqGridSearch::Impl::box_sums(double lambda, double hi, double* a_out,
                                                    double* b_out, double* c_out) const
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
double RabitqGridSearch::Impl::rest_bound_sorted(size_t d, double hi)
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
RABITQ_INLINE double RabitqGridSearch::Impl::rest_bound(size_t d, unsigned levels, double t)
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
// After a slice (both sweeps): moves *first past the levels every rank has
// reached; true when the sweep can stop there, being past the peak (no new
// best for a while) with nothing left that can beat the best, with room for
// the rounding of the running sums.
template <int W>
RABITQ_INLINE bool RabitqGridSearch::Impl::slice_ends_sweep(size_t d, unsigned levels, size_t slice,
                                                            double t_lo, unsigned* first)
{
    while (*first <= levels && next_[*first] >= m_)
        (*first)++;
    return *first <= levels && swept_ - best_at_ >= slice / 4 &&
           rest_bound<W>(d, levels, t_lo) * (1.0 + 1e-9) < best_ip_ / std::sqrt(best_nsq_);
}

RABITQ_INLINE size_t RabitqGridSearch::Impl::slice_size(unsigned levels) const
{
    return std::max<size_t>(256, std::min<size_t>(4096, m_ * levels / 16));
}

// The sweep with sorted slices and the sweep's own comparisons: the
// reference the binned sweep falls back on.
template <int W>
RABITQ_INLINE void RabitqGridSearch::Impl::sweep_sequential(size_t d, unsigned levels, double ip,
                                                            double nsq)
{
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
        sweep_slice(n);
        for (unsigned j = first; j <= levels; j++)
            next_[j] = end_[j];
        t_lo = t_hi;
        if (slice_ends_sweep<W>(d, levels, slice, t_lo, &first))
            break;
    }
}

// ---- The binned sweep ----
//
// Between two powers of two, ip keeps one ulp (unit_), so an addition rounds
// u to a multiple of it: ip + u rounds to ip + round(u / unit_) unit_,
// whatever ip is, unless u / unit_ ends in exactly .5 (a tie, which rounds
// to even and so depends on ip). Until ip reaches the next power of two, the
// ip after a set of steps is therefore a_ unit_ plus the sum of their
// rounded u: it depends on which steps were taken, not on their order.
//
// The binned sweep cuts a slice of t into buckets (the steps of a bucket
// come after those of the buckets before it), adds up each bucket's rounded
// u and levels without sorting it, and so knows exactly every state the
// sweep passes at a bucket boundary. Inside a bucket, ip grows by at most
// (1 + 2^-50) / (2 t) per unit of nsq plus half a unit per step (t the
// bucket's smallest scale), which bounds ip^2 / nsq there; only buckets
// whose bound comes near the best are sorted and taken step by step. So are
// a bucket with a tie and the bucket where ip reaches the next power of
// two, in double, after which the later buckets' sums are made again in the
// new unit. The best is the state of largest ip^2 / nsq; where another state
// comes within 3e-12 of it, which one the sweep keeps depends on its rounded
// comparisons, and the sequential sweep decides.

// Rounds u / unit_ for every rank into units_ (NaN for a tie, so that the
// sum of a bucket with one is NaN). v + 2^52 - 2^52 rounds v < 2^52 to an
// integer (to even); then the floor, and .5 tells a tie.
template <int W>
RABITQ_INLINE void RabitqGridSearch::Impl::round_units()
{
    typedef typename DoubleLanes<W>::V V;
    typedef typename DoubleLanes<W>::VU VU;
    const size_t m = m_;
    if (us_.size() < m + W)
        us_.resize(m + W, 0.0);  // (lanes past m are not used)
    const double* us = us_.data();
    RankUnits* ru = units_.data();     // (m + 8 entries: rank_coordinates)
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
        for (int l = 0; l < W; l++)
            ru[r + size_t(l)].inc = inc[l];
    }
}

// Sets the binade of ip (a double > 0, normal): a_, unit_ and units_.
template <int W>
RABITQ_INLINE void RabitqGridSearch::Impl::set_binade(double ip)
{
    int e = 0;
    std::frexp(ip, &e);
    unit_ = std::ldexp(1.0, e - 53);
    a_ = ip / unit_;
    round_units<W>();
}

// Gathers the steps at t_lo <= t < t_hi (finite) of levels first..levels
// (level by level, by rank) into nb buckets of t: each bucket's list of
// steps, its sum of rounded u and of levels. Sets end_; returns the number
// of steps.
__attribute__((noinline)) size_t RabitqGridSearch::Impl::gather_binned(unsigned first,
                                                                       unsigned levels, double t_lo,
                                                                       double t_hi, size_t nb)
{
    const size_t m = m_;
    const double scale = double(nb) / (t_hi - t_lo);
    const uint32_t last = uint32_t(nb - 1);
    buckets_.assign(nb, {0.0, 0, UINT32_MAX});
    Bucket* __restrict bk = buckets_.data();
    const RankUnits* __restrict ru = units_.data();
    const uint32_t* next = next_.data();
    uint32_t* end = end_.data();
    uint32_t n = 0;
    unsigned j = first;
    // Levels whose first step, j w_0, is at t_hi or later have none here.
    for (; j <= levels && double(j) * ru[0].w < t_hi; j++) {
        const double jd = double(j);
        size_t r = next[j];
        if (binned_.size() < n + (m - r))
            binned_.resize(std::max(n + (m - r), 2 * binned_.size()));
        BinnedStep* __restrict ev = binned_.data();
        uint32_t tag = (j << 16) | uint32_t(r);
        for (; r < m; r++, n++, tag++) {
            const double t = jd * ru[r].w;
            if (!(t < t_hi))
                break;
            // (t - t_lo) * scale >= 0: the steps before t_lo are taken.
            const uint32_t f = uint32_t((t - t_lo) * scale), b = f < last ? f : last;
            Bucket& c = bk[b];
            ev[n].tag = tag;
            ev[n].link = c.head;
            c.head = n;
            c.inc += ru[r].inc;
            c.levels += j;
        }
        end[j] = uint32_t(r);
    }
    for (; j <= levels; j++)
        end[j] = next[j];
    return n;
}

// Copies bucket b's steps into bucket_buf_, sorted in (t, j, r) order;
// returns how many.
RABITQ_INLINE size_t RabitqGridSearch::Impl::bucket_steps(size_t b)
{
    size_t k = 0;
    const double* w = w_.data();
    const BinnedStep* ev = binned_.data();
    for (uint32_t e = buckets_[b].head; e != UINT32_MAX; e = ev[e].link) {
        if (bucket_buf_.size() <= k)
            bucket_buf_.resize(std::max<size_t>(64, 2 * k));
        const uint32_t tag = ev[e].tag;
        bucket_buf_[k++] = {double(tag >> 16) * w[tag & 0xffffu], tag};
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
RABITQ_INLINE bool RabitqGridSearch::Impl::consider(double ip, double nsq, const SweepStep& step)
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
RABITQ_INLINE bool RabitqGridSearch::Impl::take_steps(const SweepStep* st, size_t n, double* ip,
                                                      double* nsq)
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
RABITQ_INLINE void RabitqGridSearch::Impl::take_buckets(size_t nb, double t_lo, double scale)
{
    typedef typename DoubleLanes<W>::V V;
    typedef typename DoubleLanes<W>::VU VU;
    // State b is before bucket b (after bucket b - 1), at index b of these
    // arrays, which start W entries in (room for index -1) and end with
    // padding.
    const size_t ns = (nb + 1 + W - 1) / W * W + 2 * W;
    state_a_.resize(ns);
    state_n4_.resize(ns);
    state_q_.resize(ns);
    double* __restrict sa = state_a_.data() + W;
    double* __restrict sn = state_n4_.data() + W;
    double* __restrict sq = state_q_.data() + W;
    Bucket* bk = buckets_.data();
    const double* __restrict us = us_.data();
    const double inv_scale = 1.0 / scale;
    V lane;
    for (int l = 0; l < W; l++)
        lane[l] = double(l);
    for (size_t b0 = 0; b0 < nb;) {
        // States from b0 on, up to the bucket where ip reaches 2^53 units
        // (the next binade).
        const double unit = unit_;
        double a = a_, n4 = n4_;
        sa[b0] = a;
        sn[b0] = n4;
        size_t cross = nb;
        for (size_t b = b0; b < nb; b++) {
            const double next = a + bk[b].inc;
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
            n4 += 8.0 * double(bk[b].levels);
            if (a >= 0x1p53) {
                cross = b;
                break;
            }
            sa[b + 1] = a;
            sn[b + 1] = n4;
        }
        // ip^2 / nsq of the states after buckets b0..cross-1 (indices b0 + 1
        // to cross), -1 after an empty bucket (a state repeated) and
        // elsewhere.
        const size_t vb = (b0 + 1) / W * W, ve = (cross + W) / W * W;
        for (size_t b = cross + 1; b < ve + W; b++) {
            sa[b] = 0.0;
            sn[b] = -1.0;
        }
        V top_v = -1.0 + V{};
        const V uv = unit + V{}, quarter = 0.25 + V{}, none = -1.0 + V{};
        const V first_v = double(b0) + 0.5 + V{};
        for (size_t b = vb; b < ve; b += W) {
            const V ip = *reinterpret_cast<const VU*>(sa + b) * uv;
            const V n4v = *reinterpret_cast<const VU*>(sn + b);
            V q = ip * ip / (n4v * quarter);
            q = n4v > *reinterpret_cast<const VU*>(sn + b - 1) ? q : none;
            q = double(b) + lane > first_v ? q : none;
            *reinterpret_cast<VU*>(sq + b) = q;
            top_v = q > top_v ? q : top_v;
        }
        double top = top_v[0];
        for (int l = 1; l < W; l++)
            top = std::max(top, top_v[l]);
        if (top > best_q_ * (1.0 + 3e-12)) {
            size_t at = b0 + 1, near = 0;
            const double band = top * (1.0 - 3e-12);
            while (sq[at] != top)
                at++;
            for (size_t b = b0 + 1; b <= cross; b++)
                near += sq[b] >= band;
            best_q_ = top;
            best_ip_ = sa[at] * unit;
            best_nsq_ = 0.25 * sn[at];
            best_bucket_ = ptrdiff_t(at - 1);
            best_pos_ = at - 1;
            stepped_ = true;
            ambiguous_ = near > 1;
        } else if (top >= best_q_ * (1.0 - 3e-12)) {
            ambiguous_ = true;  // (the best stays: this only decides a fallback)
        }
        // Buckets whose steps could hold a state near the best: ip grows by
        // at most slope per unit of nsq (the steps are at t >= tb, a bucket
        // to spare) plus half a unit per step, and the largest ip^2 / nsq on
        // such a line is at one of its ends. Their steps are sorted and
        // taken in double.
        const double thr = best_q_ * (1.0 - 3e-12) * (1.0 - 1e-13);
        const V thr_v = thr + V{}, two = 2.0 + V{}, lo_v = t_lo + V{}, is_v = inv_scale + V{};
        const V pad_per_n4 = unit / 16.0 + V{}, grow = 0.5 * (1.0 + 0x1p-50) + V{}, zero = V{};
        const V sixteen = 16.0 + V{}, last_v = double(cross) - 0.5 + V{},
                from_v = double(b0) - 0.5 + V{};
        for (size_t b = b0 / W * W; b < cross; b += W) {
            const V n40 = *reinterpret_cast<const VU*>(sn + b);
            const V n41 = *reinterpret_cast<const VU*>(sn + b + 1);
            const V dn4 = n41 - n40;  // 8 x (sum of levels): two steps or more make >= 16
            const V ip0 = *reinterpret_cast<const VU*>(sa + b) * uv;
            const V nsq0 = n40 * quarter, nsq1 = n41 * quarter;
            const V idx = double(b) + lane;
            V tb = idx - 1.0;
            tb = tb > zero ? lo_v + tb * is_v : lo_v;
            const V slope = grow / tb, pad = pad_per_n4 * dn4;
            const V ip_first = ip0 + two * slope + pad, ip_last = ip0 + (nsq1 - nsq0) * slope + pad;
            const auto hit = (dn4 >= sixteen) & (idx > from_v) & (idx < last_v) &
                             ((ip_first * ip_first >= thr_v * (nsq0 + two)) |
                              (ip_last * ip_last >= thr_v * nsq1));
            for (int l = 0; l < W; l++) {
                if (!hit[l])
                    continue;
                const size_t c = b + size_t(l);
                const size_t k = bucket_steps(c);
                double ip = sa[c] * unit, nsq = 0.25 * sn[c];
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
        double ip = sa[cross] * unit, nsq = 0.25 * sn[cross];
        const size_t k = bucket_steps(cross);
        if (take_steps(bucket_buf_.data(), k, &ip, &nsq))
            best_pos_ = cross;
        set_binade<W>(ip);
        n4_ = 4.0 * nsq;
        const BinnedStep* ev = binned_.data();
        const RankUnits* ru = units_.data();
        for (size_t b = cross + 1; b < nb; b++) {
            double sum = 0.0;
            for (uint32_t e = bk[b].head; e != UINT32_MAX; e = ev[e].link)
                sum += ru[ev[e].tag & 0xffffu].inc;
            bk[b].inc = sum;
        }
        b0 = cross + 1;
    }
}

// The sweep by buckets (see above). Returns false where it cannot decide
// the best (a near tie, or values that are not finite): then the
// sequential sweep does.
template <int W>
RABITQ_INLINE bool RabitqGridSearch::Impl::sweep_binned(size_t d, unsigned levels, double ip,
                                                        double nsq)
{
    if (!(ip >= std::numeric_limits<double>::min() && ip < 0x1p1000))
        return false;
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
        // About kStepsPerBucket steps per bucket.
        size_t nb = 8;
        while (double(nb) * kStepsPerBucket < (t_hi - t_lo) * rate && nb < slice)
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
        t_lo = t_hi;
        if (slice_ends_sweep<W>(d, levels, slice, t_lo, &first))
            break;
    }
    return !ambiguous_;
}

template <int W>
RABITQ_INLINE RabitqGridPoint RabitqGridSearch::Impl::run_impl(const double* o, size_t d, int bits,
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
            // floor(tb u), off by one at most; checked with the sweep's t.
            const double f = tb * us[r];
            unsigned k = f < double(levels) ? unsigned(f) : levels;  // f >= 0
            if (k < levels && taken(k + 1)) {
                do
                    k++;
                while (k < levels && taken(k + 1));
            } else {
                while (k > 0 && !taken(k))
                    k--;
            }
            const uint32_t i = coord[r];
            x[i] = uint8_t(o[i] >= 0.0 ? half + k : half - 1 - k);
        }
    }
    return {best_ip_, best_nsq_};
}

#if GPU_IVFPQ_X86_DISPATCH
__attribute__((target("arch=x86-64-v3"))) RabitqGridPoint RabitqGridSearch::Impl::run_avx2(
    const double* o, size_t d, int bits, uint8_t* x)
{
    return run_impl<4>(o, d, bits, x);
}
#endif

RabitqGridPoint RabitqGridSearch::Impl::run(const double* o, size_t d, int bits, uint8_t* x)
{
#if GPU_IVFPQ_X86_DISPATCH
    if (detail::cpu_has_avx2())
        return run_avx2(o, d, bits, x);
#endif
    return run_impl<2>(o, d, bits, x);
}

RabitqGridSearch::RabitqGridSearch() : impl_(new Impl) {}

RabitqGridSearch::~RabitqGridSearch() = default;

RabitqGridPoint RabitqGridSearch::run(const double* o, size_t d, int bits, uint8_t* x)
{
    return impl_->run(o, d, bits, x);
}

}  // namespace detail

RabitqGridPoint rabitq_best_grid_point(const double* o, size_t d, int bits, uint8_t* x)
{
    require(bits >= kRabitqMinBits && bits <= kRabitqMaxBits,
            "rabitq_best_grid_point: bits must be between " + std::to_string(kRabitqMinBits) +
                " and " + std::to_string(kRabitqMaxBits) + ", not " + std::to_string(bits));
    require(o && x, "rabitq_best_grid_point: null pointer");
    require(d <= kRabitqMaxDims,
            "rabitq_best_grid_point: dimension above " + std::to_string(kRabitqMaxDims));
    detail::RabitqGridSearch search;
    return search.run(o, d, bits, x);
}

}  // namespace gpuivfpq
