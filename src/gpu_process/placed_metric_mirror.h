// One metric index's mirror over several devices, the paper's 1-stage
// scheme: the index is spread over the devices, every device searches every
// query over its share, and the shares' answers are merged into what one
// device holding the whole index answers.
//
// List of Clusters: cluster c (its centre and bucket) lives on part
// c % parts. A part's clusters keep the creation order and both invariants,
// so its own scan (stop rule included) finds exactly the hits among its
// objects. SSS: object x lives on part x % parts, and every part keeps the
// words and table rows of all pivots (those of other parts marked removed:
// they filter but never answer), so each part filters its objects as the
// whole index does. Parts number objects by their position in the whole
// index, so the merge orders hits by (distance, id) and k-NN breaks ties
// as one device does.
//
// Changes (add, remove) come only while no search runs, as for
// PlacedMirror; searches run the parts at once, one thread per device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "gpu_process/device_set.h"
#include "gpu_process/metric_mirror.h"

namespace gpuivfpq {

class PlacedMetricMirror final : public MetricMirror {
public:
    // Spreads spec over devices (indices into set, one part each, in this
    // order), each part created by its device's create_metric_mirror.
    PlacedMetricMirror(DeviceSet& set, std::vector<size_t> devices, const MetricSpec& spec);
    ~PlacedMetricMirror() override;

    const std::vector<size_t>& devices() const { return devices_; }
    // Device memory this mirror holds on device i (0 where it has no part).
    size_t bytes_on(size_t device) const;
    // Whether every part's device still works (a part lost loses answers:
    // drop the mirror and load it again over the devices left).
    bool whole() const;
    size_t bytes() const override;

protected:
    void append(const WordList& words, const int64_t* labels,
                const MetricPlacements& placements) override;
    void mark_removed(const std::vector<uint32_t>& positions) override;
    MetricBatchResult search_range(const WordList& queries,
                                   const std::vector<uint32_t>& radii) override;
    MetricBatchResult search_knn(const WordList& queries, size_t k) override;

private:
    // Runs call on every part at once (part j on devices_[j]); a failure
    // that left a device unusable marks it failed.
    void on_parts(const std::function<void(MetricMirror&, size_t part)>& call);
    // The parts' answers merged per query by (distance, position), each
    // query's first `keep` (SIZE_MAX: all).
    MetricBatchResult merge(const std::vector<MetricHits>& answers, size_t nq, size_t keep) const;

    DeviceSet& set_;
    std::vector<size_t> devices_;
    std::vector<std::unique_ptr<MetricMirror>> parts_;
    // The part of each object (SSS: its own; a pivot is on every part).
    std::vector<uint32_t> owner_;
};

}  // namespace gpuivfpq
