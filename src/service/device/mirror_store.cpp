// Mirror bookkeeping of the GPU service: budget, LRU eviction, versions.
#include "service/device/mirror_store.h"

#include "engine/error.h"

namespace gpuivfpq {

size_t MirrorStore::bytes() const
{
    size_t total = 0;
    for (const auto& kv : mirrors_)
        total += kv.second.mirror->bytes();
    return total;
}

Mirror* MirrorStore::find(const MirrorKey& key)
{
    auto it = mirrors_.find(key);
    if (it == mirrors_.end())
        return nullptr;
    it->second.last_used = ++clock_;
    return it->second.mirror.get();
}

bool MirrorStore::shape(const MirrorKey& key, size_t* d, size_t* m) const
{
    auto it = mirrors_.find(key);
    if (it == mirrors_.end())
        return false;
    *d = it->second.d;
    *m = it->second.m;
    return true;
}

bool MirrorStore::evict_one(const MirrorKey* keep)
{
    auto victim = mirrors_.end();
    for (auto it = mirrors_.begin(); it != mirrors_.end(); ++it) {
        if (keep != nullptr && it->first == *keep)
            continue;
        if (victim == mirrors_.end() || it->second.last_used < victim->second.last_used)
            victim = it;
    }
    if (victim == mirrors_.end())
        return false;
    mirrors_.erase(victim);
    evictions_++;
    return true;
}

void MirrorStore::enforce_budget()
{
    while (bytes() > budget_ && evict_one(nullptr)) {
    }
}

Mirror* MirrorStore::load(const MirrorKey& key, const MirrorSpec& given, size_t n,
                          const int32_t* list_ids, const uint8_t* codes, const int64_t* labels,
                          const float* vectors, const int64_t* keys)
{
    MirrorSpec spec = given;
    size_t need = device_.mirror_bytes(spec, n);

    drop_index(key.db, key.index);
    if (spec.vectors && need > budget_) {
        // The vectors take most of the room: without them the index still
        // searches on the device, and its scans re-rank from the heap.
        spec.vectors = false;
        vectors = nullptr;
        need = device_.mirror_bytes(spec, n);
    }
    if (need > budget_)
        throw Error(ErrorKind::OutOfMemory,
                    "the index mirror needs " + std::to_string(need >> 20) +
                        " MiB, more than the GPU memory budget of " + std::to_string(budget_ >> 20) +
                        " MiB");
    while (bytes() + need > budget_ && evict_one(nullptr)) {
    }
    for (;;) {
        try {
            std::unique_ptr<Mirror> mirror = device_.create_mirror(spec);
            mirror->add(n, list_ids, codes, labels, spec.vectors ? vectors : nullptr,
                        spec.filter_keys ? keys : nullptr);
            Entry& e = mirrors_[key];
            e.mirror = std::move(mirror);
            e.last_used = ++clock_;
            e.queries = 0;
            e.d = spec.d;
            e.m = spec.m;
            return e.mirror.get();
        } catch (const Error& err) {
            // The device ran out before the budget did (other users of the
            // GPU, scratch space): make room and try again while there is any.
            if (err.kind() != ErrorKind::OutOfMemory || !evict_one(&key))
                throw;
        }
    }
}

size_t MirrorStore::drop_index(uint32_t db, uint32_t index)
{
    size_t dropped = 0;
    for (auto it = mirrors_.begin(); it != mirrors_.end();) {
        if (it->first.db == db && it->first.index == index) {
            it = mirrors_.erase(it);
            dropped++;
        } else {
            ++it;
        }
    }
    return dropped;
}

void MirrorStore::drop_all() { mirrors_.clear(); }

void MirrorStore::count_queries(const MirrorKey& key, size_t n)
{
    auto it = mirrors_.find(key);
    if (it != mirrors_.end())
        it->second.queries += n;
}

std::vector<MirrorInfo> MirrorStore::list() const
{
    std::vector<MirrorInfo> out;
    for (const auto& kv : mirrors_) {
        MirrorInfo info;
        info.key = kv.first;
        info.entries = kv.second.mirror->entries();
        info.bytes = kv.second.mirror->bytes();
        info.queries = kv.second.queries;
        info.vectors = kv.second.mirror->has_vectors();
        info.filter_keys = kv.second.mirror->has_keys();
        out.push_back(info);
    }
    return out;
}

}  // namespace gpuivfpq
