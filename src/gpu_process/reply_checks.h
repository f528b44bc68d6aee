// Checks of the numbers in an answer from the GPU process that index
// arrays (hit offsets, object ids, row labels, list ids) or that an index
// stores (a build's RaBitQ rows). The GPU process is
// outside the fault boundary (it may die or misbehave), so the service's
// client (gpu_process_client.cpp) checks every reply with these before it
// passes anything on, and the backends check with the same routines what
// they read from the service before they index with it. PostgreSQL-free,
// allocation-free and non-throwing, so that PostgreSQL code calls them too.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace gpuivfpq {
namespace replycheck {

// Every v[i] (n of them) lies in [lo, hi).
template <typename T>
inline bool all_within(const T* v, size_t n, T lo, T hi)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] < lo || v[i] >= hi)
            return false;
    return true;
}

// The hit offsets of nq queries (nq + 1: query i's hits are [offsets[i],
// offsets[i + 1])) start at 0, never decrease, and end within room hits.
inline bool hit_offsets_sound(const uint64_t* offsets, size_t nq, uint64_t room)
{
    if (offsets[0] != 0)
        return false;
    for (size_t i = 0; i < nq; i++)
        if (offsets[i + 1] < offsets[i])
            return false;
    return offsets[nq] <= room;
}

// n object ids, one every stride uint32 values from ids, each below objects.
inline bool ids_below(const uint32_t* ids, size_t n, size_t stride, uint64_t objects)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i * stride] >= objects)
            return false;
    return true;
}

// The labels of a gpu_ivfpq mirror are heap TIDs as am.h encodes them
// (GpuIvfpqTidToLabel: block << 16 | offset): a block below
// InvalidBlockNumber (0xFFFFFFFF) and an offset from FirstOffsetNumber (1).
constexpr int64_t kTidLabelEnd = int64_t(0xFFFFFFFF) << 16;
inline bool tid_label(int64_t label)
{
    return label >= 0 && label < kTidLabelEnd && (label & 0xFFFF) != 0;
}

// Candidate labels (n) as a search answers them: each a TID label or -1
// (no candidate).
inline bool tid_labels_sound(const int64_t* labels, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (labels[i] != -1 && !tid_label(labels[i]))
            return false;
    return true;
}

// The n rows a search answers (an honest process counts them up to the
// first -1): every label a TID label, no two the same. Up to
// kSmallRowSet / 2 rows (a scan round's 100 candidates) go through an
// open-addressing set on the stack in one pass; more are sorted in scratch
// (room for n). Sorting 100 labels took 4% of a backend's CPU samples in
// RaBitQ scans (development machine, emulated GPU, perf).
constexpr size_t kSmallRowSet = 256;
// A label's first slot in that set: the top 8 bits of the label times
// 2^64 / phi (Fibonacci hashing); 8 bits are the set's 256 slots.
static_assert(kSmallRowSet == size_t(1) << 8, "small_row_slot gives 8-bit slots");
inline size_t small_row_slot(int64_t label)
{
    return size_t((uint64_t(label) * 0x9E3779B97F4A7C15ull) >> 56);
}
inline bool tid_rows_sound(const int64_t* labels, size_t n, int64_t* scratch)
{
    for (size_t i = 0; i < n; i++)
        if (!tid_label(labels[i]))
            return false;
    if (n <= kSmallRowSet / 2) {
        int64_t set[kSmallRowSet];
        std::fill(set, set + kSmallRowSet, int64_t(-1));  // no TID label is -1
        for (size_t i = 0; i < n; i++) {
            size_t h = small_row_slot(labels[i]);
            while (set[h] != -1) {
                if (set[h] == labels[i])
                    return false;
                h = (h + 1) & (kSmallRowSet - 1);
            }
            set[h] = labels[i];
        }
        return true;
    }
    std::copy(labels, labels + n, scratch);
    std::sort(scratch, scratch + n);
    return std::adjacent_find(scratch, scratch + n) == scratch + n;
}

// Distances of ranked rows: ascending (infinities allowed), NaN only after
// every number (a cosine distance to a zero vector is NaN, and ranks last).
inline bool ascending_sound(const double* d, size_t n)
{
    for (size_t i = 1; i < n; i++)
        if (std::isnan(d[i - 1]) ? !std::isnan(d[i]) : (!std::isnan(d[i]) && d[i] < d[i - 1]))
            return false;
    return true;
}

// RaBitQ rows as a build's encoding answers them (n rows of d dimensions
// at bits per dimension: bits planes of (d + 31) / 32 little-endian words,
// then the factors add, rescale and error as three floats): what the CPU
// engine writes could be any bits in the planes but their padding (0), a
// rescale and an error at or above 0 (infinity included), and an add at or
// above 0 but for inner product (ip), where it is any number; never NaN.
inline bool rabitq_rows_sound(const uint8_t* rows, size_t n, size_t d, int bits, bool ip)
{
    if (d == 0 || bits < 1 || bits > 8)
        return false;
    const size_t words = (d + 31) / 32, code = size_t(bits) * words * 4, row = code + 3 * sizeof(float);
    const uint32_t pad = d % 32 == 0 ? 0u : ~((uint32_t(1) << (d % 32)) - 1u);
    for (size_t i = 0; i < n; i++) {
        const uint8_t* r = rows + i * row;
        for (int p = 0; p < bits; p++) {
            const uint8_t* last = r + (size_t(p) * words + words - 1) * 4;
            const uint32_t w = uint32_t(last[0]) | uint32_t(last[1]) << 8 | uint32_t(last[2]) << 16 |
                               uint32_t(last[3]) << 24;
            if (w & pad)
                return false;
        }
        float f[3];
        std::memcpy(f, r + code, sizeof f);
        if (f[0] != f[0] || (!ip && !(f[0] >= 0.0f)) || !(f[1] >= 0.0f) || !(f[2] >= 0.0f))
            return false;
    }
    return true;
}

}  // namespace replycheck
}  // namespace gpuivfpq
