// One RaBitQ row's estimate from its list's byte tables in shared memory,
// RabitqModel::scan's sums in its order with round-to-nearest intrinsics (no
// fused multiply-add): the CPU engine's estimate bit for bit. Shared by the
// list scan of rabitq_scan.h and the searches of rabitq_index.h.
#pragma once

#include <cstdint>

#include "engine/distances.h"
#include "engine/rabitq.h"
#include "engine/search_limits.h"
#include "list_layout.cuh"

namespace gpuivfpq::gpu {

// <y, q'> of a code: per plane the sum of its bytes' table entries
// (entry(j, byte): byte group j's entry of that byte), planes combined most
// significant first.
template <typename Entry>
__device__ __forceinline__ float rabitq_code_ip_by(const uint8_t* code, int plane_bytes, int bits, Entry entry)
{
    float ip = 0.0f;
    for (int p = 0; p < bits; p++) {
        const uint32_t* plane = reinterpret_cast<const uint32_t*>(code + size_t(p) * plane_bytes);
        float s = 0.0f;
        for (int w = 0; w < plane_bytes / 4; w++) {
            const uint32_t word = plane[w];  // bytes 4w .. 4w + 3, little endian
            for (int b = 0; b < 4; b++)
                s = __fadd_rn(s, entry(4 * w + b, (word >> (8 * b)) & 0xff));
        }
        ip = __fadd_rn(__fmul_rn(2.0f, ip), s);
    }
    return ip;
}

// From the byte tables: lut[j * 256 + byte].
__device__ __forceinline__ float rabitq_code_ip(const float* lut, const uint8_t* code, int plane_bytes, int bits)
{
    return rabitq_code_ip_by(code, plane_bytes, bits,
                             [lut](int j, uint32_t byte) { return lut[j * 256 + byte]; });
}

// From the nibble tables: nib[j * 32 + v] the low nibble v's entry of byte
// group j, nib[j * 32 + 16 + v] the high one's; a byte's entry is their
// float sum, as RabitqModel::prepare_list forms its byte tables, so the
// sums are those of rabitq_code_ip. Written out rather than through
// rabitq_code_ip_by, whose index arithmetic took 17 instructions a code
// byte in the list blocks (12.5 now, ncu on an H100): a word's four groups'
// tables lie 128 floats apart, and two masks of the word put every byte's
// low and high nibble, times 4, into that byte, so that a nibble's entry is
// one byte permute off the word's tables (shared-memory loads take the
// table's address and the group's offset themselves). Several words are
// loaded before any is summed (rabitq_code_ip_nibbles), so that their
// loads wait together (one load in flight at a time left 768-d rows
// waiting).
//
// One plane word's four bytes added to s in order; t: the nibble tables of
// the word's first byte group.
__device__ __forceinline__ float rabitq_nibble_word(float s, uint32_t word, const char* t)
{
    const uint32_t lo = (word << 2) & 0x3c3c3c3cu;  // byte b: its low nibble x 4
    const uint32_t hi = (word >> 2) & 0x3c3c3c3cu;  // byte b: its high nibble x 4
#pragma unroll
    for (int b = 0; b < 4; b++) {
        const float el = *reinterpret_cast<const float*>(t + 128 * b + __byte_perm(lo, 0, 0x4440 + b));
        const float eh = *reinterpret_cast<const float*>(t + 128 * b + 64 + __byte_perm(hi, 0, 0x4440 + b));
        s = __fadd_rn(s, __fadd_rn(el, eh));
    }
    return s;
}

// <y, q'> of one code from its list's nibble tables, in rabitq_code_ip's
// order (per plane its words in order, planes folded most significant
// first). The code's word w is row[w * stride] (stride kInterleaveRows in
// the mirror's interleaved lists, list_layout.cuh). Eight words are loaded
// before any is summed, across planes: in the interleaved lists a word's
// load brings no neighbour along (a row-major row's sector held eight), so
// a thread's loads in flight at a time bound its wait.
__device__ __forceinline__ float rabitq_code_ip_nibbles(const float* nib, const uint32_t* row, int stride,
                                                        int plane_bytes, int bits)
{
    const int words = plane_bytes / 4, total = words * bits;
    const char* const t0 = reinterpret_cast<const char*>(nib);
    const char* t = t0;  // the tables of the word's first byte group
    float ip = 0.0f, s = 0.0f;
    int w = 0;  // the word's place in its plane
    auto add = [&](uint32_t x) {
        s = rabitq_nibble_word(s, x, t);
        t += 512;
        if (++w == words) {
            ip = __fadd_rn(__fmul_rn(2.0f, ip), s);
            s = 0.0f;
            w = 0;
            t = t0;
        }
    };
    int k = 0;
    for (; k + 8 <= total; k += 8) {
        uint32_t x[8];
#pragma unroll
        for (int i = 0; i < 8; i++)
            x[i] = __ldg(row + size_t(k + i) * stride);
#pragma unroll
        for (int i = 0; i < 8; i++)
            add(x[i]);
    }
    for (; k < total; k++)
        add(__ldg(row + size_t(k) * stride));
    return ip;
}

// A row's factors (the words after its code_bytes / 4 code words).
__device__ __forceinline__ RabitqFactors rabitq_factors_at(const uint32_t* row, int stride, int code_bytes)
{
    const uint32_t* f = row + size_t(code_bytes / 4) * stride;
    RabitqFactors out;
    out.add = __uint_as_float(__ldg(f));
    out.rescale = __uint_as_float(__ldg(f + stride));
    out.error = __uint_as_float(__ldg(f + 2 * stride));
    return out;
}

// The ranking estimate: base + add_scale * add + ip_scale * (rescale * ip).
__device__ __forceinline__ float rabitq_estimate(float base, float add_scale, float ip_scale,
                                                 const RabitqFactors& f, float ip)
{
    const float est =
        __fadd_rn(__fadd_rn(base, __fmul_rn(add_scale, f.add)), __fmul_rn(ip_scale, __fmul_rn(f.rescale, ip)));
    return rank_distance(est);
}

// What a probed list contributes to its rows' estimates and bounds
// (RabitqModel::prepare_list's scalars): base, the metric's two scales, and
// the bound's scale (2 ||q - c|| for L2, ||q - c|| else).
struct RabitqListTerms {
    float base, add_scale, ip_scale, bound_scale;
};

// Lane t (0 .. 7) of the list terms' sums, in dot_double's four partial
// sums by k % 4 (the tail added to the first): t 0 .. 3 the partial sums of
// ||q - c||^2, t 4 .. 7 those of <q, c>; products and sums rounded
// separately. q: the query as the coarse step sees it (normalised for
// Cosine), c: the list's centroid.
__device__ __forceinline__ double rabitq_list_part(const float* q, const float* c, int d, int t)
{
    const int j = t & 3;
    const bool dot = t >= 4;
    const int full = d / 4 * 4;
    double s = 0.0;
    auto term = [&](int k) {
        if (dot)
            return __dmul_rn(double(q[k]), double(c[k]));
        const double r = __dsub_rn(double(q[k]), double(c[k]));
        return __dmul_rn(r, r);
    };
    for (int k = j; k < full; k += 4)
        s = __dadd_rn(s, term(k));
    if (j == 0)
        for (int k = full; k < d; k++)
            s = __dadd_rn(s, term(k));
    return s;
}

// The list's terms from the eight partial sums of rabitq_list_part.
__device__ __forceinline__ RabitqListTerms rabitq_list_terms(const double* part, int metric)
{
    RabitqListTerms t;
    const double qsq = __dadd_rn(__dadd_rn(part[0], part[1]), __dadd_rn(part[2], part[3]));
    const double qn = __dsqrt_rn(qsq);
    t.bound_scale = __double2float_rn(metric == int(Metric::L2) ? __dmul_rn(2.0, qn) : qn);
    switch (metric) {
    case int(Metric::L2):
        t.base = __double2float_rn(qsq);
        t.add_scale = 1.0f;
        t.ip_scale = -2.0f;
        break;
    case int(Metric::Cosine):
        t.base = __double2float_rn(__dmul_rn(0.5, qsq));
        t.add_scale = 0.5f;
        t.ip_scale = -1.0f;
        break;
    default: {  // InnerProduct
        const double qc = __dadd_rn(__dadd_rn(part[4], part[5]), __dadd_rn(part[6], part[7]));
        t.base = __double2float_rn(-qc);
        t.add_scale = -1.0f;
        t.ip_scale = -1.0f;
    }
    }
    return t;
}

// A list's tables in shared memory, built by threads t of n: q' = P q - P c
// into rot (plane_bytes * 8 doubles, zero past d: prepare_list's padded
// groups); after a barrier, rabitq_fill_nibbles.
__device__ __forceinline__ void rabitq_fill_rotated(double* rot, const double* pq, const double* pc, int d,
                                                    int plane_bytes, int t, int n)
{
    for (int k = t; k < plane_bytes * 8; k += n)
        rot[k] = k < d ? __dsub_rn(pq[k], pc[k]) : 0.0;
}

// The nibble tables (prepare_list's, before it sums them into bytes) from
// rot: entry v of group j's low half is minus half the group's sum plus
// q'[8j + t] over the set bits t of v, of its high half the sum of
// q'[8j + 4 + t], each added highest bit first and rounded to float.
__device__ __forceinline__ void rabitq_fill_nibbles(float* lut, const double* rot, int plane_bytes, int t, int n)
{
    for (int e = t; e < plane_bytes * 32; e += n) {
        const double* v = rot + (e >> 5) * 8;
        const int high = (e >> 4) & 1, b = e & 15;
        double x = high ? 0.0
                        : __dmul_rn(-0.5, __dadd_rn(__dadd_rn(__dadd_rn(v[0], v[1]), __dadd_rn(v[2], v[3])),
                                                    __dadd_rn(__dadd_rn(v[4], v[5]), __dadd_rn(v[6], v[7]))));
        for (int bit = 3; bit >= 0; bit--)
            if ((b >> bit) & 1)
                x = __dadd_rn(x, v[4 * high + bit]);
        lut[e] = __double2float_rn(x);
    }
}

// A row's ranking key (RabitqModel::scan_keys) from its factors f and
// <y, q'>: its estimate, or at eps0 > 0 the estimate minus its bound
// (finish_estimate's bound; +inf where that is not a number >= 0).
__device__ __forceinline__ float rabitq_key_of(const RabitqFactors& f, float ip, const RabitqListTerms& t,
                                               float eps0)
{
    const float est = rabitq_estimate(t.base, t.add_scale, t.ip_scale, f, ip);
    if (eps0 > 0.0f) {
        float bound = __fmul_rn(__fmul_rn(t.bound_scale, f.error), eps0);
        if (!(bound >= 0.0f))
            bound = __int_as_float(0x7f800000);
        return __fsub_rn(est, bound);
    }
    return est;
}

// A row's ranking key from its list's nibble tables (word w of the row at
// row[w * stride]).
__device__ __forceinline__ float rabitq_row_key(const uint32_t* row, int stride, const float* lut, int plane_bytes,
                                                int bits, int code_bytes, const RabitqListTerms& t, float eps0)
{
    const float ip = rabitq_code_ip_nibbles(lut, row, stride, plane_bytes, bits);
    return rabitq_key_of(rabitq_factors_at(row, stride, code_bytes), ip, t, eps0);
}

}  // namespace gpuivfpq::gpu
