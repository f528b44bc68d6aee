// A gpu_metric search request as it travels to the GPU process, in a slot
// of the direct path (query_queue.h) or, too large for one, in a DSM segment
// the service reads (src/service/serve.cpp): the queries' code points (ncps
// uint32), their offsets (nq + 1 uint64) and radii (nradii uint32), then
// the answer: hit offsets (nq + 1 uint64) and the hits as (object id,
// distance) uint32 pairs, as many as the rest of the room holds.
//
// PostgreSQL-free, allocation-free and non-throwing: the backends, the
// service and the GPU process lay requests out and check them with these.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gpuivfpq {

struct MetricSearchLayout {
    size_t cps, offsets, radii, hit_offsets;
    size_t hits;  // the hits start here; the room is the rest
};

inline size_t metric_align8(size_t n) { return (n + 7) / 8 * 8; }

inline MetricSearchLayout metric_search_layout(uint64_t nq, uint64_t ncps, uint64_t nradii)
{
    MetricSearchLayout l;
    l.cps = 0;
    l.offsets = metric_align8(size_t(ncps) * sizeof(uint32_t));
    l.radii = l.offsets + metric_align8(size_t(nq + 1) * sizeof(uint64_t));
    l.hit_offsets = l.radii + metric_align8(size_t(nradii) * sizeof(uint32_t));
    l.hits = l.hit_offsets + metric_align8(size_t(nq + 1) * sizeof(uint64_t));
    return l;
}

// Whether a request of nq queries with ncps code points and nradii radii,
// k-NN with k > 0 or a range search with k = 0, is sound in capacity bytes
// at base: its arrays and the hit offsets fit (checked before any size is
// computed from the counts, so that nothing overflows), its offsets start
// at 0, never decrease and end within its code points, and a range search
// has one radius or one a query, a k-NN search none. The layout goes to *l.
inline bool metric_request_sound(int64_t nq, int64_t ncps, int64_t nradii, int64_t k, const char* base,
                                 size_t capacity, MetricSearchLayout* l)
{
    if (nq < 0 || ncps < 0 || nradii < 0 || k < 0 || uint64_t(nq) > capacity || uint64_t(ncps) > capacity ||
        uint64_t(nradii) > capacity)
        return false;
    *l = metric_search_layout(uint64_t(nq), uint64_t(ncps), uint64_t(nradii));
    if (l->hits > capacity)
        return false;
    if (k > 0 ? nradii != 0 : (nradii != 1 && nradii != nq))
        return false;
    const uint64_t* offsets = reinterpret_cast<const uint64_t*>(base + l->offsets);
    if (offsets[0] != 0)
        return false;
    for (int64_t q = 0; q < nq; q++)
        if (offsets[q + 1] < offsets[q])
            return false;
    return offsets[nq] <= uint64_t(ncps);
}

// Writes queries [first, first + nq) of a batch's hits (query i's are
// [offsets[i], offsets[i + 1]) of ids and distances) as the answer of a
// request laid out by l in capacity bytes at base, their hit offsets from
// 0 again, and adds their distance evaluations (evaluations[i] for query i
// < nevaluations) into *evaluations_out. Returns the bytes the answer
// needs; nothing is written when that exceeds capacity.
inline uint64_t write_metric_answer(const uint64_t* offsets, const uint32_t* ids, const uint32_t* distances,
                                    const uint64_t* evaluations, size_t nevaluations, size_t first, size_t nq,
                                    char* base, size_t capacity, const MetricSearchLayout& l,
                                    uint64_t* evaluations_out)
{
    const uint64_t from = offsets[first];
    const uint64_t total = offsets[first + nq] - from;
    const uint64_t need = l.hits + total * 2 * sizeof(uint32_t);
    *evaluations_out = 0;
    for (size_t q = first; q < first + nq && q < nevaluations; q++)
        *evaluations_out += evaluations[q];
    if (need > capacity)
        return need;
    uint64_t* out_offsets = reinterpret_cast<uint64_t*>(base + l.hit_offsets);
    uint32_t* out = reinterpret_cast<uint32_t*>(base + l.hits);
    for (size_t q = 0; q <= nq; q++)
        out_offsets[q] = offsets[first + q] - from;
    for (uint64_t i = 0; i < total; i++) {
        out[2 * i] = ids[from + i];
        out[2 * i + 1] = distances[from + i];
    }
    return need;
}

}  // namespace gpuivfpq
