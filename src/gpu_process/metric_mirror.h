// One metric index's mirror on a compute device: the words of a List of
// Clusters or SSS index (code points and offsets), each object's label (its
// heap TID, as IVFPQ mirrors keep labels) and removed flag, and the index's
// structure, searched by range and k-NN in batches (docs/metric-search.md).
// Inserts come with the placement the engine's insert rule chose (the
// access method decides it; the mirror computes no distance to take it).
//
// MetricMirror keeps what every device keeps alike (labels, object ids,
// removed flags, the checks); a device implements the structure and the
// searches: the CPU emulation restores an engine index from the state and
// searches with it, the CUDA device holds a gpu::GpuMetricIndex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/metric/lc_index.h"
#include "engine/metric/metric_index.h"

namespace gpuivfpq {

enum class MetricMethod : uint32_t { ListOfClusters = 1, SparseSpatialSelection = 2 };

// Words as two flat arrays (host pointers, borrowed): word i is
// code_points[offsets[i], offsets[i + 1]), offsets nondecreasing.
struct MetricWords {
    size_t n = 0;
    const uint32_t* code_points = nullptr;
    const uint64_t* offsets = nullptr;
};

// An index's state as the access method keeps it (host pointers, borrowed):
// what ListOfClusters::restore or SparseSpatialSelection::restore takes.
struct MetricSpec {
    MetricMethod method = MetricMethod::ListOfClusters;
    MetricWords words;
    const int64_t* labels = nullptr;   // words.n
    const uint8_t* removed = nullptr;  // words.n flags (nonzero: removed), null: none
    // The objects' ids as answers report them, strictly increasing; null:
    // 0..n-1. A shard of an index holds some of its objects and answers
    // with their ids in the whole index (PlacedMetricMirror).
    const uint32_t* ids = nullptr;

    // List of Clusters: bucket size, then per cluster in creation order its
    // centre and radius, and each object's cluster (cluster_assignment()).
    size_t bucket = 0;
    size_t clusters = 0;
    const uint32_t* centres = nullptr;     // clusters
    const uint32_t* radii = nullptr;       // clusters
    const uint32_t* cluster_of = nullptr;  // words.n

    // SSS: alpha and M (for a restored engine index; searches ignore
    // them), the pivots' ids in order and the table, words.n rows of
    // pivots bytes (SparseSpatialSelection::table()).
    double alpha = 0.5;
    uint32_t max_distance = 0;
    size_t pivots = 0;
    const uint32_t* pivot_ids = nullptr;  // pivots
    const uint8_t* table = nullptr;       // words.n x pivots
};

// Where added objects go, as the engine's insert rule decided for each on
// the index as the earlier ones left it: LC, clusters[i]
// (ListOfClusters::placement); SSS, table_rows[i * pivots ..]
// (SparseSpatialSelection::table_row).
struct MetricPlacements {
    const LcPlacement* clusters = nullptr;
    const uint8_t* table_rows = nullptr;
};

// Answers of a batch: query q's hits are [offsets[q], offsets[q + 1]) of
// the other arrays, sorted by (distance, id).
struct MetricHits {
    std::vector<uint64_t> offsets;
    std::vector<uint32_t> ids;
    std::vector<int64_t> labels;
    std::vector<uint32_t> distances;
    // Per query: the distances the search computed (the device's count,
    // see gpu::lc_range; 0 where a search does not count).
    std::vector<uint64_t> evaluations;
};

class MetricMirror {
public:
    virtual ~MetricMirror() = default;
    MetricMirror(const MetricMirror&) = delete;
    MetricMirror& operator=(const MetricMirror&) = delete;

    MetricMethod method() const { return method_; }
    // Objects held, removed ones included, and the live ones.
    size_t objects() const { return labels_.size(); }
    size_t entries() const { return live_; }
    // The LC's clusters or the SSS's pivots.
    size_t clusters() const { return radii_.size(); }
    size_t pivots() const { return pivots_; }
    // The id the next added object gets when add() is given none.
    uint32_t next_id() const { return ids_.empty() ? 0 : ids_.back() + 1; }

    // Appends words.n objects with their labels at their placements; ids:
    // strictly increasing, above every id held (null: from next_id() on).
    // A missing or impossible placement (check_lc_placement), or ids out of
    // order, throw Error(InvalidArgument) and add nothing. Any other failure
    // leaves the mirror unusable (every later call throws Error(Internal):
    // drop it and load it again).
    void add(const MetricWords& words, const int64_t* labels, const MetricPlacements& placements,
             const uint32_t* ids = nullptr);
    // Marks removed every live object whose label is in labels[0, n)
    // (unknown labels and duplicates allowed); returns how many.
    size_t remove(size_t n, const int64_t* labels);

    // Brings the mirror to `newer`, a later state of the same index (its
    // first objects() objects the same, in order, with the same labels):
    // marks removed the objects newer removes, then appends newer's further
    // objects at the placements newer's structure gives them (LC: their
    // clusters and radii, a new cluster's centre opening it; SSS: their
    // table rows), and checks that the structure then equals newer's.
    // Returns false, changing nothing, when newer is not such a state (fewer
    // objects, other labels, an object no longer removed, other pivots, a
    // cluster newer's order cannot have made): the caller loads newer
    // afresh. A failure while changing leaves the mirror unusable, as add()
    // does. Top-level mirrors only (newer.ids null).
    bool catch_up(const MetricSpec& newer);

    // Range search: radii holds one radius per query, or one for all
    // (nradii = 1); else Error(InvalidArgument).
    void range_batch(const MetricWords& queries, const uint32_t* radii, size_t nradii,
                     MetricHits& out);
    // k-NN, ties at the k-th distance broken by the smaller id.
    void knn_batch(const MetricWords& queries, size_t k, MetricHits& out);

    // Memory the device holds for the mirror.
    virtual size_t bytes() const = 0;

protected:
    // Keeps the labels, ids and removed flags of spec, checked (sizes,
    // ids increasing; Error(InvalidArgument)); the device restores the
    // structure itself.
    explicit MetricMirror(const MetricSpec& spec);

    // The device's part. Objects are numbered 0..objects()-1 there (the
    // appended ones from objects() on, counted before the append); the
    // placements were checked, and the removed positions are live.
    virtual void append(const WordList& words, const int64_t* labels,
                        const MetricPlacements& placements) = 0;
    virtual void mark_removed(const std::vector<uint32_t>& positions) = 0;
    virtual MetricBatchResult search_range(const WordList& queries,
                                           const std::vector<uint32_t>& radii) = 0;
    virtual MetricBatchResult search_knn(const WordList& queries, size_t k) = 0;

    // The label of the object at a position.
    int64_t label_at(uint32_t position) const { return labels_[position]; }

private:
    void check_usable() const;
    // Marks live positions removed on the device, then here (a failure on
    // the device leaves the mirror unusable).
    void remove_positions(const std::vector<uint32_t>& positions);
    // The answers with the positions mapped to ids and labels.
    void to_hits(const MetricBatchResult& result, MetricHits& out) const;

    MetricMethod method_;
    std::vector<int64_t> labels_;
    std::vector<uint32_t> ids_;
    std::vector<uint8_t> removed_;
    size_t live_ = 0;
    // The LC's radii, to check placements against; the SSS's pivots.
    std::vector<uint32_t> radii_;
    size_t pivots_ = 0;
    bool broken_ = false;
};

// Words of a MetricWords as a WordList (lengths and offsets checked).
WordList to_word_list(const MetricWords& words);

// The CPU emulation's mirror: an engine index restored from spec.
std::unique_ptr<MetricMirror> make_engine_metric_mirror(const MetricSpec& spec);

// Device memory a GPU mirror of spec takes, about (for budgets).
size_t metric_mirror_bytes(const MetricSpec& spec);

}  // namespace gpuivfpq
