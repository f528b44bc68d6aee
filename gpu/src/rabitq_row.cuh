// One RaBitQ row's estimate from its list's byte tables in shared memory,
// RabitqModel::scan's sums in its order with round-to-nearest intrinsics (no
// fused multiply-add): the CPU engine's estimate bit for bit. Shared by the
// list scan of rabitq_scan.h and the searches of rabitq_index.h.
#pragma once

#include <cstdint>

#include "engine/rabitq.h"
#include "engine/search_limits.h"

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
// table's address and the group's offset themselves). Four words of a
// plane are loaded before any is summed, so that their loads wait
// together (one load in flight at a time left 768-d rows waiting).
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

__device__ __forceinline__ float rabitq_code_ip_nibbles(const float* nib, const uint8_t* code, int plane_bytes,
                                                        int bits)
{
    const int words = plane_bytes / 4;
    float ip = 0.0f;
    for (int p = 0; p < bits; p++) {
        const uint32_t* plane = reinterpret_cast<const uint32_t*>(code + size_t(p) * plane_bytes);
        const char* t = reinterpret_cast<const char*>(nib);
        float s = 0.0f;
        int w = 0;
        for (; w + 4 <= words; w += 4, t += 4 * 512) {
            uint32_t x[4];  // bytes 4w .. 4w + 15, little endian
#pragma unroll
            for (int i = 0; i < 4; i++)
                x[i] = __ldg(plane + w + i);
#pragma unroll
            for (int i = 0; i < 4; i++)
                s = rabitq_nibble_word(s, x[i], t + 512 * i);
        }
        for (; w < words; w++, t += 512)
            s = rabitq_nibble_word(s, __ldg(plane + w), t);
        ip = __fadd_rn(__fmul_rn(2.0f, ip), s);
    }
    return ip;
}

// The ranking estimate: base + add_scale * add + ip_scale * (rescale * ip).
__device__ __forceinline__ float rabitq_estimate(float base, float add_scale, float ip_scale,
                                                 const RabitqFactors& f, float ip)
{
    const float est =
        __fadd_rn(__fadd_rn(base, __fmul_rn(add_scale, f.add)), __fmul_rn(ip_scale, __fmul_rn(f.rescale, ip)));
    return rank_distance(est);
}

}  // namespace gpuivfpq::gpu
