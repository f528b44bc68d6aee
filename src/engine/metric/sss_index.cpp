// Sparse Spatial Selection: the estimate of M, pivot selection, the clamped
// pivot table, and exact range and k-NN queries filtered by it.
#include "sss_index.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <utility>

#include "engine/error.h"
#include "engine/interrupt.h"
#include "engine/parallel.h"

namespace gpuivfpq {

namespace {

// Below this many distances a parallel_for costs more than it saves.
constexpr size_t kParallelMin = 2048;

// alpha, refused outside (0, 1] (NaN included).
double checked_alpha(double alpha)
{
    if (!(alpha > 0.0 && alpha <= 1.0)) {
        char msg[160];
        std::snprintf(msg, sizeof msg,
                      "sparse spatial selection: alpha must be in (0, 1], got %g (a pivot is "
                      "at least alpha times the largest distance from every other pivot)",
                      alpha);
        throw Error(ErrorKind::InvalidArgument, msg);
    }
    return alpha;
}

// A distance as the table stores it.
inline uint8_t clamp_to_table(uint32_t d)
{
    return uint8_t(std::min(d, SparseSpatialSelection::kTableMax));
}

// |a - b| of two bytes.
inline uint8_t byte_gap(uint8_t a, uint8_t b) { return uint8_t(std::max(a, b) - std::min(a, b)); }

// The largest lower bound |row[p] - dq[p]| over all pivots, or a value above
// r as soon as one chunk of kFilterChunk pivots proves the object farther
// than r. The loop over a chunk is the one the compiler vectorises.
uint32_t row_bound(const uint8_t* row, const uint8_t* dq, size_t np, uint32_t r)
{
    uint8_t bound = 0;
    for (size_t c = 0; c < np; c += SparseSpatialSelection::kFilterChunk) {
        const size_t end = std::min(np, c + SparseSpatialSelection::kFilterChunk);
        for (size_t p = c; p < end; p++)
            bound = std::max(bound, byte_gap(row[p], dq[p]));
        if (bound > r)
            break;
    }
    return bound;
}

}  // namespace

uint32_t SparseSpatialSelection::estimate_max_distance(const WordList& words, int threads,
                                                       uint64_t* evaluations)
{
    const size_t n = words.size();
    std::vector<uint32_t> dist(n);
    uint32_t best = 0;
    size_t start = 0;
    for (int sweep = 0; sweep < 4 && n > 1; sweep++) {
        const EditPattern pattern(words[start]);
        parallel_for(n, n >= kParallelMin ? threads : 1, [&](size_t begin, size_t end) {
            for (size_t j = begin; j < end; j++) {
                check_interrupt_every(j - begin);
                dist[j] = pattern.distance(words[j]);
            }
        });
        if (evaluations)
            *evaluations += n;
        const size_t far = size_t(std::max_element(dist.begin(), dist.end()) - dist.begin());
        if (dist[far] <= best)
            break;
        best = dist[far];
        start = far;
    }
    return best;
}

SparseSpatialSelection::SparseSpatialSelection(WordList words, double alpha, int threads,
                                               uint32_t max_distance, size_t max_pivots)
    : MetricIndex(std::move(words)), alpha_(checked_alpha(alpha)), max_distance_(max_distance)
{
    const size_t n = size();
    if (max_distance_ == 0)
        max_distance_ = estimate_max_distance(words_, threads, &build_evaluations_);

    // d >= alpha * M for integer d means d >= ceil(alpha * M); and at least
    // 1, so that a copy of a pivot never becomes one.
    const uint32_t need =
        std::max<uint32_t>(1, uint32_t(std::ceil(alpha_ * double(max_distance_))));
    std::vector<EditPattern> patterns;
    pivot_flag_.assign(n, 0);
    for (uint32_t x = 0; x < n; x++) {
        if (max_pivots > 0 && pivots_.size() >= max_pivots)
            break;
        check_interrupt_every(x);
        bool far = true;
        for (const EditPattern& p : patterns) {
            check_interrupt_every(++build_evaluations_);
            if (p.within(words_[x], need - 1) < need) {
                far = false;
                break;
            }
        }
        if (far) {
            pivots_.push_back(x);
            pivot_flag_[x] = 1;
            patterns.emplace_back(words_[x]);
        }
    }

    const size_t np = pivots_.size();
    table_.resize(n * np);
    parallel_for(n, n * np >= kParallelMin ? threads : 1, [&](size_t begin, size_t end) {
        for (size_t x = begin; x < end; x++) {
            for (size_t p = 0; p < np; p++) {
                check_interrupt_every((x - begin) * np + p);
                table_[x * np + p] = clamp_to_table(patterns[p].distance(words_[x]));
            }
        }
    });
    build_evaluations_ += uint64_t(n) * np;
}

SparseSpatialSelection::SparseSpatialSelection(WordList words, std::vector<uint8_t> removed,
                                               double alpha, uint32_t max_distance)
    : MetricIndex(std::move(words), std::move(removed)),
      alpha_(checked_alpha(alpha)),
      max_distance_(max_distance)
{
}

std::unique_ptr<SparseSpatialSelection> SparseSpatialSelection::restore(
    WordList words, std::vector<uint8_t> removed, double alpha, uint32_t max_distance,
    std::vector<uint32_t> pivots, std::vector<uint8_t> table)
{
    std::unique_ptr<SparseSpatialSelection> sss(
        new SparseSpatialSelection(std::move(words), std::move(removed), alpha, max_distance));
    const size_t n = sss->size();
    const size_t np = pivots.size();
    char msg[200];
    if (table.size() != n * np || np > n || (n > 0 && np == 0 && !table.empty())) {
        std::snprintf(msg, sizeof msg,
                      "sparse spatial selection: cannot restore %zu pivots and a table of %zu "
                      "bytes over %zu objects (the table holds objects x pivots bytes)",
                      np, table.size(), n);
        throw Error(ErrorKind::InvalidArgument, msg);
    }
    sss->pivot_flag_.assign(n, 0);
    for (size_t p = 0; p < np; p++) {
        const uint32_t x = pivots[p];
        if (x >= n || sss->pivot_flag_[x]) {
            std::snprintf(msg, sizeof msg, "sparse spatial selection: pivot %zu (object %u) is %s",
                          p, x, x >= n ? "not an object of the index" : "a pivot twice");
            throw Error(ErrorKind::InvalidArgument, msg);
        }
        sss->pivot_flag_[x] = 1;
    }
    sss->pivots_ = std::move(pivots);
    sss->table_ = std::move(table);
    return sss;
}

std::vector<uint8_t> SparseSpatialSelection::table_row(WordView w) const
{
    const EditPattern pattern(w);
    const size_t np = pivots_.size();
    std::vector<uint8_t> row(np);
    for (size_t p = 0; p < np; p++) {
        check_interrupt_every(p);
        row[p] = clamp_to_table(pattern.distance(words_[pivots_[p]]));
    }
    return row;
}

void SparseSpatialSelection::place(uint32_t id) { append_row(table_row(words_[id]).data()); }

void SparseSpatialSelection::append_row(const uint8_t* row)
{
    const size_t np = pivots_.size();
    // Reserve first, so that the two appends below cannot fail halfway;
    // geometrically, since reserving the exact size copies the whole table
    // on every insert.
    if (pivot_flag_.capacity() < pivot_flag_.size() + 1)
        pivot_flag_.reserve(std::max(pivot_flag_.size() + 1, pivot_flag_.capacity() * 2));
    if (table_.capacity() < table_.size() + np)
        table_.reserve(std::max(table_.size() + np, table_.capacity() * 2));
    pivot_flag_.push_back(0);
    table_.insert(table_.end(), row, row + np);
}

uint32_t SparseSpatialSelection::insert_at(WordView w, const uint8_t* row)
{
    require(row != nullptr || pivots_.empty(),
            "sparse spatial selection: an insert needs its table row (one byte per pivot)");
    return insert_with(w, [this, row](uint32_t) { append_row(row); });
}

void SparseSpatialSelection::pivot_distances(const EditPattern& q, std::vector<uint32_t>& exact,
                                             std::vector<uint8_t>& clamped) const
{
    exact.resize(pivots_.size());
    clamped.resize(pivots_.size());
    for (size_t p = 0; p < pivots_.size(); p++) {
        check_interrupt_every(p);
        exact[p] = q.distance(words_[pivots_[p]]);
        clamped[p] = clamp_to_table(exact[p]);
    }
}

std::vector<MetricHit> SparseSpatialSelection::range(WordView q, uint32_t r,
                                                     MetricStats* stats) const
{
    const EditPattern pattern(q);
    std::vector<uint32_t> dq;
    std::vector<uint8_t> dqc;
    pivot_distances(pattern, dq, dqc);
    const size_t np = pivots_.size();
    uint64_t evaluations = np;
    std::vector<MetricHit> hits;
    for (size_t p = 0; p < np; p++)
        if (dq[p] <= r && !removed_[pivots_[p]])
            hits.push_back({pivots_[p], dq[p]});
    for (uint32_t x = 0; x < size(); x++) {
        check_interrupt_every(x);
        if (removed_[x] || pivot_flag_[x])
            continue;
        // A byte bound never exceeds a radius of kTableMax or more.
        if (r < kTableMax && row_bound(table_.data() + size_t(x) * np, dqc.data(), np, r) > r)
            continue;
        const uint32_t d = pattern.within(words_[x], r);
        check_interrupt_every(++evaluations);
        if (d <= r)
            hits.push_back({x, d});
    }
    if (stats)
        *stats = MetricStats{evaluations, live_};
    detail::sort_hits(hits);
    return hits;
}

std::vector<MetricHit> SparseSpatialSelection::knn(WordView q, size_t k, MetricStats* stats) const
{
    if (k == 0) {
        if (stats)
            *stats = MetricStats{0, live_};
        return {};
    }
    const EditPattern pattern(q);
    std::vector<uint32_t> dq;
    std::vector<uint8_t> dqc;
    pivot_distances(pattern, dq, dqc);
    const size_t np = pivots_.size();
    uint64_t evaluations = np;
    TopK top(k);
    for (size_t p = 0; p < np; p++)
        if (!removed_[pivots_[p]])
            detail::knn_offer(top, pivots_[p], dq[p]);

    // The objects the filter keeps at the radius the pivots alone give (it
    // only shrinks from there), by their lower bound: a counting sort on its
    // byte, ids ascending within one bound.
    const uint32_t r0 = detail::knn_radius(top);
    std::vector<std::pair<uint8_t, uint32_t>> kept;
    std::vector<uint32_t> start(kTableMax + 2, 0);
    for (uint32_t x = 0; x < size(); x++) {
        check_interrupt_every(x);
        if (removed_[x] || pivot_flag_[x])
            continue;
        const uint32_t bound = row_bound(table_.data() + size_t(x) * np, dqc.data(), np, r0);
        if (bound > r0)
            continue;
        kept.emplace_back(uint8_t(bound), x);
        start[bound + 1]++;
    }
    for (size_t b = 1; b < start.size(); b++)
        start[b] += start[b - 1];
    std::vector<uint32_t> order(kept.size());
    for (const auto& [bound, x] : kept)
        order[start[bound]++] = x;  // start[b] ends as the end of bound b

    size_t next = 0;
    for (uint32_t b = 0; b <= kTableMax && next < order.size(); b++) {
        // Objects at exactly the k-th distance may still win on their id.
        if (b > detail::knn_radius(top))
            break;  // every later bound is larger still
        for (; next < start[b]; next++) {
            const uint32_t r = detail::knn_radius(top);
            const uint32_t x = order[next];
            const uint32_t d = pattern.within(words_[x], r);
            check_interrupt_every(++evaluations);
            if (d <= r)
                detail::knn_offer(top, x, d);
        }
    }
    if (stats)
        *stats = MetricStats{evaluations, live_};
    return detail::knn_hits(top);
}

}  // namespace gpuivfpq
