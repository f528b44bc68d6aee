// The service's set of index mirrors: lookup by index identity, placement
// over the GPU process's devices (replicas or shards, shard_merge.h), a
// memory budget per device with least-recently-used eviction, and what the
// status view lists about each mirror and device. gpu_metric indexes have
// mirrors of their own kind (MetricMirror, spread over every device by
// PlacedMetricMirror) in the same budget and LRU order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "gpu_process/compute_device.h"
#include "gpu_process/device_set.h"
#include "gpu_process/placed_metric_mirror.h"
#include "gpu_process/placed_mirror.h"

namespace gpuivfpq {

// An index version: database, index, its storage (relfilenode) and build.
// REINDEX, TRUNCATE and VACUUM FULL change relnode or build, so a mirror of
// an older version is never found for a newer one. change: a gpu_metric
// index's metapage change count (every insert and VACUUM advances it, so
// its mirror is of one state of the pages); 0 for IVFPQ indexes, whose
// mirrors follow the change log instead.
struct MirrorKey {
    uint32_t db = 0, index = 0, relnode = 0, build = 0;
    uint64_t change = 0;
    bool operator<(const MirrorKey& o) const
    {
        return std::tie(db, index, relnode, build, change) < std::tie(o.db, o.index, o.relnode, o.build, o.change);
    }
    bool operator==(const MirrorKey& o) const
    {
        return db == o.db && index == o.index && relnode == o.relnode && build == o.build && change == o.change;
    }
};

// What a mirror mirrors: an IVFPQ index (Mirror) or a gpu_metric one (MetricMirror).
enum class MirrorKind : uint32_t { Ivfpq = 0, Metric = 1 };

struct MirrorInfo {
    MirrorKey key;
    size_t entries = 0, bytes = 0;
    uint64_t queries = 0;
    bool vectors = false;  // holds the exact vectors (re-ranks on the device)
    bool filter_keys = false;  // holds filter keys (filters on the device)
    uint32_t placement = 0;    // Placement: replicated (one copy per device) or sharded
    uint32_t device_mask = 0;  // the devices (bit i: the set's device i) holding a part
    uint32_t kind = 0;         // MirrorKind
};

class MirrorStore {
public:
    explicit MirrorStore(DeviceSet& devices) : devices_(devices) {}
    // Over one device the caller keeps.
    explicit MirrorStore(ComputeDevice& device);

    // The budget of each device (DeviceSet::set_budget: 0 is a share of it).
    void set_budget(size_t bytes) { devices_.set_budget(bytes); }
    // The budgets of the working devices together.
    size_t budget() const;
    size_t bytes() const;
    size_t bytes_on(size_t device) const;
    size_t evictions() const { return evictions_; }
    DeviceSet& devices() { return devices_; }

    // The mirror of key, or null; a hit counts as a use for LRU. A mirror
    // that lost a shard's device is not found (drop_failed frees it; it
    // reloads over the devices left).
    PlacedMirror* find(const MirrorKey& key);
    // Whether the direct path may search the mirror of key: a mirror
    // loaded hidden (load's hidden) is not, until reveal, so that the
    // changes logged while it loaded are in it before any search sees it.
    bool servable(const MirrorKey& key) const;
    void reveal(const MirrorKey& key);
    // The dimension and code size the mirror of key was loaded with (false
    // without one): callers check requests against them, since Mirror reads
    // its own shape from the arrays it is given.
    bool shape(const MirrorKey& key, size_t* d, size_t* m) const;

    // Creates the mirror of key from n entries, replacing any mirror of an
    // older version of the same index, evicting the least recently used
    // others to stay within each device's budget. Placement: Replicate puts
    // a copy on every working device, Shard spreads the lists over them,
    // Auto replicates when a copy fits one device's budget, else shards.
    // With spec.vectors, vectors holds n x d floats; when the mirror with
    // vectors cannot fit (the placement asked for, or under Auto either),
    // it is made without them (codes only: the backends re-rank from the
    // heap; MirrorInfo::vectors says which). With spec.filter_keys, keys
    // holds n filter keys (always kept: 8 bytes an entry). Throws
    // Error(OutOfMemory) when even that cannot fit.
    Mirror* load(const MirrorKey& key, const MirrorSpec& spec, size_t n, const int32_t* list_ids,
                 const uint8_t* codes, const int64_t* labels, const float* vectors,
                 const int64_t* keys, Placement placement = Placement::Auto, bool hidden = false);

    // The metric mirror of key, or null (a hit counts as a use for LRU); a
    // mirror that lost a part's device is not found.
    PlacedMetricMirror* find_metric(const MirrorKey& key);
    // Creates the metric mirror of key from spec, spread over every working
    // device (PlacedMetricMirror), replacing any mirror of another version
    // of the same index and evicting the least recently used mirrors of
    // either kind to stay within each device's budget (metric_mirror_bytes
    // shared out over the parts). Throws Error(OutOfMemory) when it cannot
    // fit, Error(InvalidArgument) for a state that is no index. A mirror of
    // an earlier change of the same index version (db, index, relnode,
    // build) whose state spec extends (MetricMirror::catch_up: appended
    // objects, newly removed ones) is brought up to date in place instead,
    // sending the GPUs only what changed; *updated (when given) says which.
    PlacedMetricMirror* load_metric(const MirrorKey& key, const MetricSpec& spec, bool* updated = nullptr);

    // Forgets every mirror of (db, index), whatever its version or kind.
    size_t drop_index(uint32_t db, uint32_t index);
    void drop_all();
    // Evicts least recently used mirrors until bytes() <= budget().
    void enforce_budget();

    // After a device failed: drops the mirrors that lost a shard, forgets
    // replicas there (no search may run).
    void drop_failed();

    void count_queries(const MirrorKey& key, size_t n);
    std::vector<MirrorInfo> list() const;
    std::vector<DeviceInfo> device_info() const;

private:
    struct Entry {
        std::unique_ptr<PlacedMirror> mirror;
        uint64_t last_used = 0;
        uint64_t queries = 0;
        size_t d = 0, m = 0;
        bool hidden = false;
    };
    struct MetricEntry {
        std::unique_ptr<PlacedMetricMirror> mirror;
        uint64_t last_used = 0;
        uint64_t queries = 0;
    };
    struct Plan;
    bool evict_one(const MirrorKey* keep, size_t device);
    PlacedMetricMirror* catch_up_metric(const MirrorKey& key, const MetricSpec& spec);
    bool fits(const Plan& plan) const;
    std::unique_ptr<PlacedMirror> build(const Plan& plan, const MirrorSpec& spec, size_t n,
                                        const int32_t* list_ids, const uint8_t* codes, const int64_t* labels,
                                        const float* vectors, const int64_t* keys);

    std::unique_ptr<DeviceSet> own_;  // the one-device set of MirrorStore(ComputeDevice&)
    DeviceSet& devices_;
    std::map<MirrorKey, Entry> mirrors_;
    std::map<MirrorKey, MetricEntry> metrics_;
    uint64_t clock_ = 0;
    size_t evictions_ = 0;
};

}  // namespace gpuivfpq
