// One row of a RaBitQ build, written once for the CPU engine
// (RabitqModel::encode) and the GPU's build encoder (gpu/src/rabitq_encode.cu):
// the unit residual, its norm after the rotation, the grid sweep by its
// definition, the factors and the bit planes. Host-device code in
// exact_detail's round-to-nearest operations (no fused multiply-add on either
// side), so both devices write the same codes and factors, bit for bit. The
// rotation itself is each device's own loops in dot_double's order.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "exact_distance.h"
#include "host_device.h"
#include "rabitq.h"

namespace gpuivfpq {

// sum_i a[i] * b[i] in double, in four interleaved partial sums, the n % 4
// last products added to the first, then (p0 + p1) + (p2 + p3): one order on
// every thread, machine and device.
template <typename A, typename B>
GPU_IVFPQ_HOST_DEVICE inline double rabitq_dot(const A* a, const B* b, size_t n)
{
    using namespace exact_detail;
    double p[4] = {0.0, 0.0, 0.0, 0.0};
    size_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++)
            p[j] = add(p[j], mul(double(a[i + j]), double(b[i + j])));
    for (; i < n; i++)
        p[0] = add(p[0], mul(double(a[i]), double(b[i])));
    return add(add(p[0], p[1]), add(p[2], p[3]));
}

// r = v - c in double (v a row, normalised for Cosine; c its list's
// centroid); returns ||r||^2.
GPU_IVFPQ_HOST_DEVICE inline double rabitq_residual(const float* v, const float* c, size_t d, double* r)
{
    using namespace exact_detail;
    for (size_t k = 0; k < d; k++)
        r[k] = sub(double(v[k]), double(c[k]));
    return rabitq_dot(r, r, d);
}

// Whether a residual of norm rn is encoded: a row on its centroid (or one
// whose residual is not finite) gets the zero vector's code and factors 0,
// and its estimate is the query's distance to the centroid, exactly.
GPU_IVFPQ_HOST_DEVICE inline bool rabitq_residual_live(double rn)
{
    return rn > 0.0 && rn <= DBL_MAX;
}

// Divides the d values of v by s in place.
GPU_IVFPQ_HOST_DEVICE inline void rabitq_scale_down(double* v, size_t d, double s)
{
    for (size_t k = 0; k < d; k++)
        v[k] = exact_detail::div(v[k], s);
}

// The inner-product factor's add: <c, v - c> summed in order.
GPU_IVFPQ_HOST_DEVICE inline double rabitq_ip_add(const float* c, const float* v, size_t d)
{
    using namespace exact_detail;
    double add_value = 0.0;
    for (size_t k = 0; k < d; k++)
        add_value = add(add_value, mul(double(c[k]), sub(double(v[k]), double(c[k]))));
    return add_value;
}

// The factors of a row (RabitqFactors): add_value as the metric wants it
// (||r||^2, or rabitq_ip_add), rn = ||r||, g its grid point.
GPU_IVFPQ_HOST_DEVICE inline RabitqFactors rabitq_factors(double add_value, double rn, RabitqGridPoint g, size_t d)
{
    using namespace exact_detail;
    const double a = div(g.ip, root(g.norm_sqr));  // cosine of o' and y
    RabitqFactors f;
    f.add = float(add_value);
    f.rescale = float(div(rn, g.ip));
    f.error = 0.0f;
    if (d >= 2) {
        const double rest = sub(1.0, mul(a, a));
        f.error = float(div(mul(rn, root(0.0 < rest ? rest : 0.0)), mul(a, root(double(d - 1)))));
    }
    return f;
}

// Writes the code of the d unsigned values x (each below 2^bits) into code
// (rabitq_code_bytes(d, bits) bytes, padding bits 0), a plane's 32-bit word
// at a time, its bytes little endian (engine/rabitq.h's layout).
GPU_IVFPQ_HOST_DEVICE inline void rabitq_pack_into(const uint8_t* x, size_t d, int bits, uint8_t* code)
{
    const size_t words = rabitq_plane_words(d);
    for (int p = 0; p < bits; p++) {
        const int shift = bits - 1 - p;
        for (size_t w = 0; w < words; w++) {
            uint32_t v = 0;
            for (size_t b = 0; b < 32 && 32 * w + b < d; b++)
                v |= uint32_t((x[32 * w + b] >> shift) & 1u) << b;
            uint8_t* out = code + (size_t(p) * words + w) * 4;
            out[0] = uint8_t(v);
            out[1] = uint8_t(v >> 8);
            out[2] = uint8_t(v >> 16);
            out[3] = uint8_t(v >> 24);
        }
    }
}

namespace rabitq_detail {

// Swaps two values (std::swap is not a device function).
template <typename T>
GPU_IVFPQ_HOST_DEVICE inline void exchange(T& a, T& b)
{
    const T t = a;
    a = b;
    b = t;
}

// Rank a comes before rank b: larger u first, then the lower coordinate.
GPU_IVFPQ_HOST_DEVICE inline bool rank_before(double ua, uint32_t ia, double ub, uint32_t ib)
{
    return ua > ub || (ua == ub && ia < ib);
}

// Sorts the m pairs (us[r], coord[r]) by rank_before (a heap sort: no
// recursion, no memory beyond the arrays).
GPU_IVFPQ_HOST_DEVICE inline void sort_ranks(double* us, uint16_t* coord, size_t m)
{
    auto later = [&](size_t a, size_t b) { return rank_before(us[b], coord[b], us[a], coord[a]); };
    auto swap_at = [&](size_t a, size_t b) {
        exchange(us[a], us[b]);
        exchange(coord[a], coord[b]);
    };
    auto sift = [&](size_t root, size_t end) {
        for (size_t child = 2 * root + 1; child < end; child = 2 * root + 1) {
            if (child + 1 < end && later(child + 1, child))
                child++;
            if (!later(child, root))
                return;
            swap_at(root, child);
            root = child;
        }
    };
    for (size_t s = m / 2; s-- > 0;)
        sift(s, m);
    for (size_t e = m; e-- > 1;) {
        swap_at(0, e);
        sift(0, e);
    }
}

// Step (ta, ja) of some rank comes before (tb, jb) of another level's next.
GPU_IVFPQ_HOST_DEVICE inline bool step_before(double ta, int ja, double tb, int jb)
{
    return ta < tb || (ta == tb && ja < jb);
}

}  // namespace rabitq_detail

// rabitq_best_grid_point (engine/rabitq.h) by the sweep's definition, for
// kBits bits: the steps (t = j * (1 / u_r), j, r) of every rank r and level
// 1 <= j < 2^(kBits-1), taken in (t, j, r) order from a heap of the levels'
// next steps (a level's steps come in rank order, since t grows with r:
// ranks are by decreasing u), with the sweep's sums and comparisons. The
// same result as rabitq_best_grid_point, bit for bit, which skips most of
// this work (rabitq_grid.cpp); this form needs no memory but us and coord
// (d each, scratch) and a heap of the levels: a GPU thread runs it per row
// (the unit tests hold the two to the same results). o: d doubles, unit
// length or zero; x: d values out.
template <int kBits>
GPU_IVFPQ_HOST_DEVICE inline RabitqGridPoint rabitq_grid_point_sweep(const double* o, size_t d, double* us,
                                                                     uint16_t* coord, uint8_t* x)
{
    using namespace exact_detail;
    using rabitq_detail::step_before;
    constexpr unsigned kHalf = 1u << (kBits - 1);
    constexpr int kLevels = int(kHalf) - 1;
    double ip = 0.0;
    size_t m = 0;
    for (size_t i = 0; i < d; i++) {
        const double u = fabs(o[i]);
        ip = add(ip, mul(0.5, u));
        x[i] = uint8_t(o[i] >= 0.0 ? kHalf : kHalf - 1);
        if (u > 0.0) {
            us[m] = u;
            coord[m] = uint16_t(i);
            m++;
        }
    }
    const double nsq0 = mul(0.25, double(d));
    if constexpr (kLevels == 0) {
        return {ip, nsq0};
    } else {
        if (m == 0)
            return {ip, nsq0};
        rabitq_detail::sort_ranks(us, coord, m);
        // The levels' next steps: a min-heap of (t, j); pos[j] is level j's
        // next rank. All start at rank 0, where t = j w_0 grows with j: the
        // array in level order is a heap already.
        double ht[kLevels];
        uint8_t hj[kLevels];
        uint32_t pos[kLevels + 1];
        const double w0 = div(1.0, us[0]);
        for (int j = 1; j <= kLevels; j++) {
            ht[j - 1] = mul(double(j), w0);
            hj[j - 1] = uint8_t(j);
            pos[j] = 0;
        }
        int hn = kLevels;
        double a = ip, q = nsq0, best_ip = ip, best_nsq = nsq0, best_sq = mul(ip, ip);
        double tb = 0.0;
        int jb = 0;
        uint32_t rb = 0;
        bool stepped = false;
        while (hn > 0) {
            const double t = ht[0];
            const int j = hj[0];
            const uint32_t r = pos[j];
            a = add(a, us[r]);
            q = add(q, 2.0 * double(j));
            if (mul(mul(a, a), best_nsq) > mul(best_sq, q)) {
                best_ip = a;
                best_sq = mul(a, a);
                best_nsq = q;
                tb = t;
                jb = j;
                rb = r;
                stepped = true;
            }
            pos[j] = r + 1;
            double nt = 0.0;
            int nj = j;
            if (r + 1 < m) {
                nt = mul(double(j), div(1.0, us[r + 1]));
            } else {  // level j is done: the last entry takes the root
                --hn;
                nt = ht[hn];
                nj = hj[hn];
            }
            int at = 0;
            for (int child = 1; child < hn; child = 2 * at + 1) {
                if (child + 1 < hn && step_before(ht[child + 1], hj[child + 1], ht[child], hj[child]))
                    child++;
                if (!step_before(ht[child], hj[child], nt, nj))
                    break;
                ht[at] = ht[child];
                hj[at] = hj[child];
                at = child;
            }
            if (hn > 0) {
                ht[at] = nt;
                hj[at] = uint8_t(nj);
            }
        }
        if (stepped) {
            // Each rank's level at the best step: its steps up to (tb, jb, rb).
            for (uint32_t r = 0; r < m; r++) {
                const double w = div(1.0, us[r]);
                unsigned k = 0;
                while (k < unsigned(kLevels)) {
                    const unsigned j = k + 1;
                    const double t = mul(double(j), w);
                    if (!(t < tb || (t == tb && (int(j) < jb || (int(j) == jb && r <= rb)))))
                        break;
                    k = j;
                }
                const uint32_t i = coord[r];
                x[i] = uint8_t(o[i] >= 0.0 ? kHalf + k : kHalf - 1 - k);
            }
        }
        return {best_ip, best_nsq};
    }
}

// rabitq_grid_point_sweep for bits kBits..8 (others: 0 0, x untouched).
template <int kBits = 1>
GPU_IVFPQ_HOST_DEVICE inline RabitqGridPoint rabitq_grid_point_sweep(const double* o, size_t d, int bits,
                                                                     double* us, uint16_t* coord, uint8_t* x)
{
    if constexpr (kBits > kRabitqMaxBits) {
        return {0.0, 0.0};
    } else {
        if (bits == kBits)
            return rabitq_grid_point_sweep<kBits>(o, d, us, coord, x);
        return rabitq_grid_point_sweep<kBits + 1>(o, d, bits, us, coord, x);
    }
}

}  // namespace gpuivfpq
