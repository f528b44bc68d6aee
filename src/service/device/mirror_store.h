// The service's set of index mirrors: lookup by index identity, a device
// memory budget with least-recently-used eviction, and what the status view
// lists about each mirror.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "service/device/compute_device.h"

namespace gpuivfpq {

// An index version: database, index, its storage (relfilenode) and build.
// REINDEX, TRUNCATE and VACUUM FULL change relnode or build, so a mirror of
// an older version is never found for a newer one.
struct MirrorKey {
    uint32_t db = 0, index = 0, relnode = 0, build = 0;
    bool operator<(const MirrorKey& o) const
    {
        return std::tie(db, index, relnode, build) < std::tie(o.db, o.index, o.relnode, o.build);
    }
    bool operator==(const MirrorKey& o) const
    {
        return db == o.db && index == o.index && relnode == o.relnode && build == o.build;
    }
};

struct MirrorInfo {
    MirrorKey key;
    size_t entries = 0, bytes = 0;
    uint64_t queries = 0;
    bool vectors = false;  // holds the exact vectors (re-ranks on the device)
    bool filter_keys = false;  // holds filter keys (filters on the device)
};

class MirrorStore {
public:
    explicit MirrorStore(ComputeDevice& device) : device_(device) {}

    void set_budget(size_t bytes) { budget_ = bytes; }
    size_t budget() const { return budget_; }
    size_t bytes() const;
    size_t evictions() const { return evictions_; }

    // The mirror of key, or null; a hit counts as a use for LRU.
    Mirror* find(const MirrorKey& key);
    // The dimension and code size the mirror of key was loaded with (false
    // without one): callers check requests against them, since Mirror reads
    // its own shape from the arrays it is given.
    bool shape(const MirrorKey& key, size_t* d, size_t* m) const;

    // Creates the mirror of key from n entries, replacing any mirror of an
    // older version of the same index, evicting the least recently used
    // others to stay within the budget. With spec.vectors, vectors holds n
    // x d floats; when the mirror with vectors cannot fit the budget even
    // alone, it is made without them (codes only: the backends re-rank from
    // the heap; MirrorInfo::vectors says which). With spec.filter_keys, keys
    // holds n filter keys (always kept: 8 bytes an entry). Throws
    // Error(OutOfMemory) when even that cannot fit.
    Mirror* load(const MirrorKey& key, const MirrorSpec& spec, size_t n, const int32_t* list_ids,
                 const uint8_t* codes, const int64_t* labels, const float* vectors,
                 const int64_t* keys);

    // Forgets every mirror of (db, index), whatever its version.
    size_t drop_index(uint32_t db, uint32_t index);
    void drop_all();
    // Evicts least recently used mirrors until bytes() <= budget().
    void enforce_budget();

    void count_queries(const MirrorKey& key, size_t n);
    std::vector<MirrorInfo> list() const;

private:
    struct Entry {
        std::unique_ptr<Mirror> mirror;
        uint64_t last_used = 0;
        uint64_t queries = 0;
        size_t d = 0, m = 0;
    };
    bool evict_one(const MirrorKey* keep);

    ComputeDevice& device_;
    std::map<MirrorKey, Entry> mirrors_;
    size_t budget_ = SIZE_MAX;
    uint64_t clock_ = 0;
    size_t evictions_ = 0;
};

}  // namespace gpuivfpq
