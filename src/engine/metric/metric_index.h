// Metric-space search over words under edit distance: the word store, the
// result and statistics types, the interface the List of Clusters and SSS
// indexes share, brute force (the reference), and parallel batches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "edit_distance.h"
#include "engine/topk.h"

namespace gpuivfpq {

// Words as code points, back to back: word i is
// code_points()[offsets()[i], offsets()[i + 1]). Two flat arrays, decoded and
// validated once, which a page format or a GPU mirror copies as they are.
class WordList {
public:
    WordList() : offsets_{0} {}

    // n words of one UTF-8 buffer: word i is bytes[offsets[i], offsets[i + 1])
    // (n + 1 nondecreasing offsets). Invalid UTF-8, decreasing offsets or a
    // word past kMaxWordCodePoints throw Error(InvalidArgument) naming the word.
    static WordList from_utf8(const char* bytes, const uint64_t* offsets, size_t n);

    size_t size() const { return offsets_.size() - 1; }
    WordView operator[](size_t i) const
    {
        return WordView{cps_.data() + offsets_[i], size_t(offsets_[i + 1] - offsets_[i])};
    }
    const uint32_t* code_points() const { return cps_.data(); }
    const uint64_t* offsets() const { return offsets_.data(); }

    // Appends a word (w may point into this list).
    void push_back(WordView w);
    // Appends the code points of UTF-8 text (invalid: Error(InvalidArgument)).
    void push_back_utf8(std::string_view text);
    // Removes the last word.
    void pop_back();

private:
    std::vector<uint32_t> cps_;
    std::vector<uint64_t> offsets_;
};

// One answer: an object id (its position in the index's WordList) and its
// distance to the query.
struct MetricHit {
    uint32_t id;
    uint32_t dist;
};

// The one result order: distance, then id.
inline bool metric_hit_less(const MetricHit& a, const MetricHit& b)
{
    return a.dist < b.dist || (a.dist == b.dist && a.id < b.id);
}

// What one query cost. distance_evaluations counts every d(q, x) computed,
// bounded or not; live_objects is what brute force computes, so their ratio
// is the fraction of brute force's work.
struct MetricStats {
    uint64_t distance_evaluations = 0;
    uint64_t live_objects = 0;
};

// An index over words under edit distance. Objects are numbered in insertion
// order (ids never reused); a removed object keeps its word, because an index
// may still route through it (a centre, a pivot), but no query reports it.
// Queries are const and may run concurrently; insert and remove may not run
// beside anything else.
class MetricIndex {
public:
    virtual ~MetricIndex() = default;

    // Objects ever added (removed ones included): ids are [0, size()).
    size_t size() const { return words_.size(); }
    // Objects not removed.
    size_t live() const { return live_; }
    const WordList& words() const { return words_; }
    WordView word(uint32_t id) const { return words_[id]; }
    bool is_removed(uint32_t id) const { return removed_[id] != 0; }

    // Adds one word and returns its id; queries stay exact.
    uint32_t insert(WordView w);
    // Marks object id removed: false when it already was; an id past size()
    // throws Error(InvalidArgument).
    bool remove(uint32_t id);

    // Every live object within distance r of q, sorted by (distance, id).
    virtual std::vector<MetricHit> range(WordView q, uint32_t r,
                                         MetricStats* stats = nullptr) const = 0;
    // The k live objects nearest to q, ties broken by the smaller id, sorted
    // by (distance, id); fewer when fewer are live; none for k = 0.
    virtual std::vector<MetricHit> knn(WordView q, size_t k,
                                       MetricStats* stats = nullptr) const = 0;

protected:
    explicit MetricIndex(WordList words);
    // A stored index's words with their removed flags (one per word, nonzero:
    // removed); a count that differs from the words' throws
    // Error(InvalidArgument). For the restore functions of the indexes.
    MetricIndex(WordList words, std::vector<uint8_t> removed);
    // Adds the object just appended (id = size() - 1) to the index's structure.
    virtual void place(uint32_t id) = 0;
    // Appends w and has place_fn(id) add it to the structure, undoing the
    // append when place_fn throws: insert() with the index's own rule, and
    // the inserts at a placement the caller decided (insert_at), share it.
    uint32_t insert_with(WordView w, const std::function<void(uint32_t)>& place_fn);

    WordList words_;
    std::vector<uint8_t> removed_;
    size_t live_ = 0;
};

// Brute force: every live object's distance, computed in full (no cut-off),
// so that it is the reference the indexes are tested against.
class BruteForceIndex : public MetricIndex {
public:
    explicit BruteForceIndex(WordList words) : MetricIndex(std::move(words)) {}

    std::vector<MetricHit> range(WordView q, uint32_t r,
                                 MetricStats* stats = nullptr) const override;
    std::vector<MetricHit> knn(WordView q, size_t k, MetricStats* stats = nullptr) const override;

private:
    void place(uint32_t) override {}
};

// The answers of many queries, flat: query i's hits are
// hits[offsets[i], offsets[i + 1]), each sorted by (distance, id).
struct MetricBatchResult {
    std::vector<uint64_t> offsets;
    std::vector<MetricHit> hits;
    std::vector<MetricStats> stats;  // one per query
};

// Range queries in parallel (parallel_for over the queries): radii holds one
// radius per query, or one for all.
MetricBatchResult range_search_batch(const MetricIndex& index, const WordList& queries,
                                     const std::vector<uint32_t>& radii, int threads);

// k-NN queries in parallel, the same k for all.
MetricBatchResult knn_search_batch(const MetricIndex& index, const WordList& queries, size_t k,
                                   int threads);

namespace detail {

// a + b, saturating at UINT32_MAX (radius sums of the pruning rules).
inline uint32_t saturating_add(uint32_t a, uint32_t b)
{
    const uint64_t s = uint64_t(a) + b;
    return s > UINT32_MAX ? UINT32_MAX : uint32_t(s);
}

// The radius a k-NN search prunes with: the current k-th distance, or no
// limit (UINT32_MAX) until k candidates are held.
uint32_t knn_radius(const TopK& top);

// Offers object id at distance d to a k-NN search (ties: smaller id wins).
inline void knn_offer(TopK& top, uint32_t id, uint32_t d) { top.push(float(d), int64_t(id)); }

// The held candidates as hits, sorted by (distance, id).
std::vector<MetricHit> knn_hits(TopK& top);

// Sorts range answers into the result order.
void sort_hits(std::vector<MetricHit>& hits);

}  // namespace detail

}  // namespace gpuivfpq
