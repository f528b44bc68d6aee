// One metric index's copy on the GPU: a List of Clusters or an SSS index
// (src/engine's state) over words held as code points and offsets, taking
// inserts at the placements the engine's rule chose and removals by id, and
// searched by the kernels of metric_search.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/metric/lc_index.h"
#include "engine/metric/metric_index.h"

namespace gpuivfpq::gpu {

class GpuContext;

class GpuMetricIndex {
public:
    // A List of Clusters from the state ListOfClusters::restore takes: the
    // words (ids 0..n-1), removed flags (n, null: none), the centres and
    // radii in creation order and each object's cluster. A state that is no
    // list of clusters (sizes that differ, an id or cluster out of range, a
    // centre not in its own cluster) throws Error(InvalidArgument), as
    // restore does; the radii are trusted.
    static std::unique_ptr<GpuMetricIndex> list_of_clusters(GpuContext& ctx, const WordList& words,
                                                            const uint8_t* removed,
                                                            const std::vector<uint32_t>& centres,
                                                            const std::vector<uint32_t>& radii,
                                                            const std::vector<uint32_t>& cluster_of);
    // An SSS index from the state SparseSpatialSelection::restore takes: the
    // words, removed flags (n, null: none), the pivots' ids in order (each
    // once) and the table as the engine keeps it (n rows of pivots bytes,
    // object-major; tiled on the device, see SssDeviceView).
    static std::unique_ptr<GpuMetricIndex> sparse_spatial_selection(
        GpuContext& ctx, const WordList& words, const uint8_t* removed,
        const std::vector<uint32_t>& pivots, const uint8_t* table);
    ~GpuMetricIndex();
    GpuMetricIndex(const GpuMetricIndex&) = delete;
    GpuMetricIndex& operator=(const GpuMetricIndex&) = delete;

    bool is_list_of_clusters() const;
    // Objects held (removed ones included): ids are [0, size()).
    size_t size() const;
    size_t clusters() const;  // LC
    size_t pivots() const;    // SSS

    // LC: appends words (ids size() ..) at placements[i], the engine's
    // insert rule for word i on the index in the state the earlier ones
    // left. Every placement is checked (check_lc_placement) before anything
    // changes: a bad one throws Error(InvalidArgument) and adds nothing.
    void add(const WordList& words, const LcPlacement* placements);
    // SSS: appends words with their table rows (words.size() x pivots()
    // bytes, SparseSpatialSelection::table_row of each).
    void add(const WordList& words, const uint8_t* rows);
    // Marks objects removed (ids below size(), else Error(InvalidArgument)).
    void remove(const std::vector<uint32_t>& ids);

    // metric_search.h's range and k-NN search over this index.
    MetricBatchResult range(const WordList& queries, const std::vector<uint32_t>& radii);
    MetricBatchResult knn(const WordList& queries, size_t k);

    // Device memory held.
    size_t bytes() const;

    struct State;

private:
    GpuMetricIndex(GpuContext& ctx, std::unique_ptr<State> state);
    GpuContext& ctx_;
    std::unique_ptr<State> s_;
};

}  // namespace gpuivfpq::gpu
