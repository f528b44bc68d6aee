// An engine index's state as a MetricSpec (metric_mirror.h), for the unit
// tests of metric mirrors and of the GPU process that serves them.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/metric/lc_index.h"
#include "engine/metric/metric_index.h"
#include "engine/metric/sss_index.h"
#include "gpu_process/metric_mirror.h"

namespace metricspec {

using namespace gpuivfpq;

// Each object's removed flag.
inline std::vector<uint8_t> removed_flags(const MetricIndex& index)
{
    std::vector<uint8_t> removed(index.size());
    for (uint32_t id = 0; id < index.size(); id++)
        removed[id] = index.is_removed(id);
    return removed;
}

// A label per object that is not its id, so that a mix-up shows.
inline int64_t label_of(uint32_t id) { return 1000003 + int64_t(id) * 7; }

// An engine index's state as a MetricSpec, with the arrays it points to.
struct SpecStore {
    MetricSpec spec;
    std::vector<uint32_t> cps;
    std::vector<uint64_t> offsets;
    std::vector<int64_t> labels;
    std::vector<uint8_t> removed;
    std::vector<uint32_t> centres, radii, cluster_of, pivots;
    std::vector<uint8_t> table;

    explicit SpecStore(const MetricIndex& index)
    {
        const size_t n = index.size();
        cps.assign(index.words().code_points(), index.words().code_points() + index.words().offsets()[n]);
        offsets.assign(index.words().offsets(), index.words().offsets() + n + 1);
        for (uint32_t id = 0; id < n; id++)
            labels.push_back(label_of(id));
        removed = removed_flags(index);
        spec.words = MetricWords{n, cps.data(), offsets.data()};
        spec.labels = labels.data();
        spec.removed = removed.data();
    }
    explicit SpecStore(const ListOfClusters& lc) : SpecStore(static_cast<const MetricIndex&>(lc))
    {
        for (size_t c = 0; c < lc.clusters(); c++) {
            centres.push_back(lc.centre(c));
            radii.push_back(lc.radius(c));
        }
        cluster_of = lc.cluster_assignment();
        spec.method = MetricMethod::ListOfClusters;
        spec.bucket = lc.bucket_size();
        spec.clusters = centres.size();
        spec.centres = centres.data();
        spec.radii = radii.data();
        spec.cluster_of = cluster_of.data();
    }
    explicit SpecStore(const SparseSpatialSelection& sss)
        : SpecStore(static_cast<const MetricIndex&>(sss))
    {
        for (size_t p = 0; p < sss.pivots(); p++)
            pivots.push_back(sss.pivot(p));
        table.assign(sss.table(), sss.table() + sss.size() * sss.pivots());
        spec.method = MetricMethod::SparseSpatialSelection;
        spec.alpha = sss.alpha();
        spec.max_distance = sss.max_distance();
        spec.pivots = pivots.size();
        spec.pivot_ids = pivots.data();
        spec.table = table.data();
    }
};

}  // namespace metricspec
