// Sparse Spatial Selection (Brisaboa et al.): pivots chosen far apart, and
// the table of object-to-pivot distances, over words under edit distance.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "metric_index.h"

namespace gpuivfpq {

// SSS: scanning the objects in id order, an object becomes a pivot when its
// distance to every pivot so far is >= alpha * M (and > 0: a duplicate is
// never a pivot), M being the largest distance in the set. Every object keeps
// its distances to the pivots in a table of bytes, clamped at kTableMax; a
// query discards x when |d(p, x) - d(q, p)| > r for some pivot p and computes
// d(q, x) for the rest. The filter compares bytes: d(q, p) is clamped at
// kTableMax too, and |a - b| of two clamped values never exceeds the true
// |d(p, x) - d(q, p)| (docs/metric-search.md), so it stays a lower bound.
// Pivots are fixed once built: an insert adds a table row, never a pivot (a
// rebuild chooses them again).
class SparseSpatialSelection : public MetricIndex {
public:
    // Largest distance the table stores: a stored kTableMax means ">= 255",
    // which the filter then uses only as a lower bound.
    static constexpr uint32_t kTableMax = 255;
    // Pivots the filter checks between two early exits.
    static constexpr size_t kFilterChunk = 32;

    // Builds over words (ids 0..n-1). alpha in (0, 1], else
    // Error(InvalidArgument). max_distance is M; 0 estimates it (see
    // estimate_max_distance). max_pivots > 0 ends the selection once that
    // many are chosen (the table costs a byte per object and pivot: small
    // alphas pick a large share of a set of words); 0 leaves it to alpha.
    // threads parallelise the estimate and the table; the index is the same
    // for any thread count.
    SparseSpatialSelection(WordList words, double alpha, int threads = 1, uint32_t max_distance = 0,
                           size_t max_pivots = 0);

    double alpha() const { return alpha_; }
    // M as used for the pivot threshold (given or estimated).
    uint32_t max_distance() const { return max_distance_; }
    size_t pivots() const { return pivots_.size(); }
    uint32_t pivot(size_t p) const { return pivots_[p]; }
    bool is_pivot(uint32_t id) const { return pivot_flag_[id] != 0; }
    // size() rows of pivots() bytes, object-major (an insert appends a row):
    // table()[id * pivots() + p] = min(d(pivot p, id), kTableMax).
    const uint8_t* table() const { return table_.data(); }
    uint8_t table_entry(uint32_t id, size_t p) const
    {
        return table_[size_t(id) * pivots_.size() + p];
    }
    // Distance evaluations of the build (the estimate of M included).
    uint64_t build_evaluations() const { return build_evaluations_; }

    // An index restored from the state another one exposed: its words and
    // removed flags (one per word, nonzero: removed), alpha(),
    // max_distance(), the pivots in their order (pivot(p)) and the table
    // (size() rows of pivots() bytes, as table() lays it out). It answers and
    // takes inserts exactly as the original. Sizes that differ, a pivot out
    // of range or given twice, or alpha outside (0, 1] throw
    // Error(InvalidArgument); the table's distances are trusted, since
    // checking them costs a build's distances.
    static std::unique_ptr<SparseSpatialSelection> restore(WordList words,
                                                           std::vector<uint8_t> removed,
                                                           double alpha, uint32_t max_distance,
                                                           std::vector<uint32_t> pivots,
                                                           std::vector<uint8_t> table);

    // Reports the pivots within r, then filters the other objects by the
    // table (kFilterChunk pivots at a time, vectorised, stopping at the first
    // chunk that rules the object out) and computes the distance of the
    // survivors.
    std::vector<MetricHit> range(WordView q, uint32_t r,
                                 MetricStats* stats = nullptr) const override;
    // The pivots first; then the objects the filter keeps at the radius the
    // pivots give, by increasing lower bound (a counting sort: bounds are
    // bytes), stopping once the bound exceeds the current k-th distance.
    std::vector<MetricHit> knn(WordView q, size_t k, MetricStats* stats = nullptr) const override;

    // The table row insert(w) would append for w: min(d(pivot p, w),
    // kTableMax) for every pivot, without inserting it.
    std::vector<uint8_t> table_row(WordView w) const;
    // Inserts w with row (pivots() bytes, table_row() of w on an index in
    // this state, trusted) as its table row; returns its id.
    uint32_t insert_at(WordView w, const uint8_t* row);

    // A lower estimate of the largest distance among words, deterministic:
    // farthest-point sweeps, the first from object 0, each next from the
    // object farthest from the previous start, while the largest distance
    // found grows (at most 4 sweeps of n distances). The result is at least
    // half the true maximum (triangle inequality) and usually equals it; it
    // only steers the choice of pivots, never the exactness of queries.
    static uint32_t estimate_max_distance(const WordList& words, int threads,
                                          uint64_t* evaluations = nullptr);

private:
    // An index with words and removed flags and no pivots yet (restore).
    SparseSpatialSelection(WordList words, std::vector<uint8_t> removed, double alpha,
                           uint32_t max_distance);

    void place(uint32_t id) override;
    // Appends object id's table row (pivots() bytes).
    void append_row(const uint8_t* row);
    // d(q, p) for every pivot, exact and clamped to a byte.
    void pivot_distances(const EditPattern& q, std::vector<uint32_t>& exact,
                         std::vector<uint8_t>& clamped) const;

    double alpha_;
    uint32_t max_distance_ = 0;
    std::vector<uint32_t> pivots_;
    std::vector<uint8_t> pivot_flag_;
    std::vector<uint8_t> table_;
    uint64_t build_evaluations_ = 0;
};

}  // namespace gpuivfpq
