// Mirror bookkeeping of the GPU service: placement, budgets, LRU eviction,
// versions.
#include "gpu_process/mirror_store.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "engine/error.h"

namespace gpuivfpq {

namespace {

// A mirror that does not fit: its need and the budget, in MiB with a
// decimal (a budget of kilobytes would read "0 MiB" in whole ones).
Error over_budget(const char* what, size_t need, size_t budget, bool per_gpu)
{
    char msg[200];
    std::snprintf(msg, sizeof(msg), "%s needs %.1f MiB on a GPU, more than the GPU memory budget of %.1f MiB%s",
                  what, double(need) / (1024.0 * 1024.0), double(budget) / (1024.0 * 1024.0),
                  per_gpu ? " per GPU" : "");
    return Error(ErrorKind::OutOfMemory, msg);
}

}  // namespace

// Where a mirror goes: its parts' devices, the list -> shard map (shards),
// whether it keeps vectors, and the bytes each part needs.
struct MirrorStore::Plan {
    Placement mode = Placement::Replicate;
    bool vectors = false;
    std::vector<size_t> devices;
    std::vector<int32_t> list_shard;
    std::vector<size_t> need;  // per part
};

MirrorStore::MirrorStore(ComputeDevice& device)
    : own_(std::make_unique<DeviceSet>(device)), devices_(*own_)
{
}

size_t MirrorStore::budget() const
{
    size_t total = 0;
    for (size_t i : devices_.alive_devices())
        total += devices_.budget(i);
    return total;
}

size_t MirrorStore::bytes() const
{
    size_t total = 0;
    for (const auto& kv : mirrors_)
        total += kv.second.mirror->bytes();
    for (const auto& kv : metrics_)
        total += kv.second.mirror->bytes();
    return total;
}

size_t MirrorStore::bytes_on(size_t device) const
{
    size_t total = 0;
    for (const auto& kv : mirrors_)
        total += kv.second.mirror->bytes_on(device);
    for (const auto& kv : metrics_)
        total += kv.second.mirror->bytes_on(device);
    return total;
}

PlacedMirror* MirrorStore::find(const MirrorKey& key)
{
    auto it = mirrors_.find(key);
    if (it == mirrors_.end())
        return nullptr;
    // Searches may still run on it: drop_failed erases it between them.
    if (!it->second.mirror->whole())
        return nullptr;
    it->second.last_used = ++clock_;
    return it->second.mirror.get();
}

bool MirrorStore::servable(const MirrorKey& key) const
{
    auto it = mirrors_.find(key);
    return it != mirrors_.end() && !it->second.hidden;
}

void MirrorStore::reveal(const MirrorKey& key)
{
    auto it = mirrors_.find(key);
    if (it != mirrors_.end())
        it->second.hidden = false;
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

PlacedMetricMirror* MirrorStore::find_metric(const MirrorKey& key)
{
    auto it = metrics_.find(key);
    if (it == metrics_.end() || !it->second.mirror->whole())
        return nullptr;
    it->second.last_used = ++clock_;
    return it->second.mirror.get();
}

// Evicts the least recently used mirror of either kind holding memory on
// device (any device: SIZE_MAX), never keep.
bool MirrorStore::evict_one(const MirrorKey* keep, size_t device)
{
    auto victim = mirrors_.end();
    auto metric_victim = metrics_.end();
    uint64_t oldest = UINT64_MAX;
    for (auto it = mirrors_.begin(); it != mirrors_.end(); ++it) {
        if (keep != nullptr && it->first == *keep)
            continue;
        if (device != SIZE_MAX && it->second.mirror->bytes_on(device) == 0)
            continue;
        if (it->second.last_used < oldest) {
            victim = it;
            oldest = it->second.last_used;
        }
    }
    for (auto it = metrics_.begin(); it != metrics_.end(); ++it) {
        if (keep != nullptr && it->first == *keep)
            continue;
        if (device != SIZE_MAX && it->second.mirror->bytes_on(device) == 0)
            continue;
        if (it->second.last_used < oldest) {
            metric_victim = it;
            oldest = it->second.last_used;
        }
    }
    if (metric_victim != metrics_.end())
        metrics_.erase(metric_victim);
    else if (victim != mirrors_.end())
        mirrors_.erase(victim);
    else
        return false;
    evictions_++;
    return true;
}

void MirrorStore::enforce_budget()
{
    for (size_t i = 0; i < devices_.size(); i++)
        while (bytes_on(i) > devices_.budget(i) && evict_one(nullptr, i)) {
        }
}

bool MirrorStore::fits(const Plan& plan) const
{
    for (size_t j = 0; j < plan.devices.size(); j++)
        if (plan.need[j] > devices_.budget(plan.devices[j]))
            return false;
    return true;
}

std::unique_ptr<PlacedMirror> MirrorStore::build(const Plan& plan, const MirrorSpec& given, size_t n,
                                                 const int32_t* list_ids, const uint8_t* codes,
                                                 const int64_t* labels, const float* vectors,
                                                 const int64_t* keys)
{
    MirrorSpec spec = given;
    spec.vectors = plan.vectors;
    std::vector<std::unique_ptr<Mirror>> parts(plan.devices.size());
    for (size_t j = 0; j < plan.devices.size(); j++) {
        DeviceSet::Lease lease(devices_, plan.devices[j]);
        parts[j] = lease.device().create_mirror(spec);
    }
    // The parts are filled through the placed mirror: it routes shards' entries.
    auto placed = std::make_unique<PlacedMirror>(devices_, plan.mode, spec.d, spec.m, plan.devices,
                                                 std::move(parts), plan.list_shard);
    placed->add(n, list_ids, codes, labels, plan.vectors ? vectors : nullptr, spec.filter_keys ? keys : nullptr);
    return placed;
}

Mirror* MirrorStore::load(const MirrorKey& key, const MirrorSpec& spec, size_t n, const int32_t* list_ids,
                          const uint8_t* codes, const int64_t* labels, const float* vectors,
                          const int64_t* keys, Placement asked, bool hidden)
{
    std::vector<size_t> alive = devices_.alive_devices();
    if (alive.empty())
        throw Error(ErrorKind::Internal, "no working GPU is left in this process");
    drop_index(key.db, key.index);

    // The candidate plans in order of preference (fewer devices: nothing to choose).
    std::vector<size_t> list_sizes(spec.lists, 0);
    for (size_t i = 0; i < n; i++)
        if (list_ids[i] >= 0 && size_t(list_ids[i]) < spec.lists)
            list_sizes[size_t(list_ids[i])]++;
    auto plan_for = [&](Placement mode, bool with_vectors) {
        Plan p;
        p.mode = alive.size() == 1 ? Placement::Replicate : mode;
        p.vectors = with_vectors;
        MirrorSpec s = spec;
        s.vectors = with_vectors;
        if (p.mode == Placement::Replicate) {
            p.devices = alive;
            for (size_t dev : alive)
                p.need.push_back(devices_.device(dev).mirror_bytes(s, n));
            return p;
        }
        p.devices = alive;
        p.list_shard = assign_lists(list_sizes, alive.size());
        std::vector<size_t> count(alive.size(), 0);
        for (size_t l = 0; l < spec.lists; l++)
            count[size_t(p.list_shard[l])] += list_sizes[l];
        for (size_t j = 0; j < alive.size(); j++)
            p.need.push_back(devices_.device(alive[j]).mirror_bytes(s, count[j]));
        return p;
    };
    std::vector<Plan> plans;
    std::vector<bool> vector_choices = spec.vectors ? std::vector<bool>{true, false} : std::vector<bool>{false};
    for (bool v : vector_choices) {
        if (asked != Placement::Shard)
            plans.push_back(plan_for(Placement::Replicate, v));
        if (asked != Placement::Replicate)
            plans.push_back(plan_for(Placement::Shard, v));
    }
    const Plan* chosen = nullptr;
    for (const Plan& p : plans)
        if (fits(p)) {
            chosen = &p;
            break;
        }
    if (chosen == nullptr) {
        const Plan& last = plans.back();
        size_t need = *std::max_element(last.need.begin(), last.need.end());
        throw over_budget("the index mirror", need, devices_.budget(last.devices[0]), alive.size() > 1);
    }
    for (size_t j = 0; j < chosen->devices.size(); j++) {
        size_t dev = chosen->devices[j];
        while (bytes_on(dev) + chosen->need[j] > devices_.budget(dev) && evict_one(nullptr, dev)) {
        }
    }
    for (;;) {
        try {
            std::unique_ptr<PlacedMirror> mirror =
                build(*chosen, spec, n, list_ids, codes, labels, vectors, keys);
            Entry& e = mirrors_[key];
            e.mirror = std::move(mirror);
            e.last_used = ++clock_;
            e.queries = 0;
            e.d = spec.d;
            e.m = spec.m;
            e.hidden = hidden;
            return e.mirror.get();
        } catch (const Error& err) {
            // The device ran out before the budget did (other users of the
            // GPU, scratch space): make room and try again while there is any.
            if (err.kind() != ErrorKind::OutOfMemory || !evict_one(&key, SIZE_MAX))
                throw;
        }
    }
}

PlacedMetricMirror* MirrorStore::load_metric(const MirrorKey& key, const MetricSpec& spec, bool* updated)
{
    std::vector<size_t> alive = devices_.alive_devices();
    if (alive.empty())
        throw Error(ErrorKind::Internal, "no working GPU is left in this process");
    if (updated != nullptr)
        *updated = false;
    if (PlacedMetricMirror* m = catch_up_metric(key, spec)) {
        if (updated != nullptr)
            *updated = true;
        return m;
    }
    drop_index(key.db, key.index);

    // Each device holds about its share of the index (SSS parts also keep the pivots: few).
    const size_t need = metric_mirror_bytes(spec) / alive.size() + 1;
    for (size_t dev : alive)
        if (need > devices_.budget(dev))
            throw over_budget("the metric index mirror", need, devices_.budget(dev), alive.size() > 1);
    for (size_t dev : alive)
        while (bytes_on(dev) + need > devices_.budget(dev) && evict_one(nullptr, dev)) {
        }
    for (;;) {
        try {
            auto mirror = std::make_unique<PlacedMetricMirror>(devices_, alive, spec);
            MetricEntry& e = metrics_[key];
            e.mirror = std::move(mirror);
            e.last_used = ++clock_;
            e.queries = 0;
            return e.mirror.get();
        } catch (const Error& err) {
            // As for load(): the device ran out before the budget did.
            if (err.kind() != ErrorKind::OutOfMemory || !evict_one(&key, SIZE_MAX))
                throw;
        }
    }
}

// The mirror of an earlier change of key's index version brought to spec
// and filed under key, or null (none, or spec does not extend it).
PlacedMetricMirror* MirrorStore::catch_up_metric(const MirrorKey& key, const MetricSpec& spec)
{
    auto it = metrics_.begin();
    for (; it != metrics_.end(); ++it) {
        const MirrorKey& k = it->first;
        if (k.db == key.db && k.index == key.index && k.relnode == key.relnode && k.build == key.build &&
            k.change < key.change && it->second.mirror->whole())
            break;
    }
    if (it == metrics_.end())
        return nullptr;
    bool done = false;
    try {
        done = it->second.mirror->catch_up(spec);
    } catch (const Error& e) {
        // A refused change adds nothing, but the device's part of a failed
        // one is unknown: the caller drops the mirror and loads afresh.
        if (e.kind() == ErrorKind::OutOfMemory || e.kind() == ErrorKind::InvalidArgument ||
            e.kind() == ErrorKind::Internal)
            return nullptr;
        throw;
    }
    if (!done)
        return nullptr;
    MetricEntry entry = std::move(it->second);
    metrics_.erase(it);
    entry.last_used = ++clock_;
    MetricEntry& e = metrics_[key];
    e = std::move(entry);
    // The appended objects may push a device past its budget: others go first.
    for (size_t dev : e.mirror->devices())
        while (bytes_on(dev) > devices_.budget(dev) && evict_one(&key, dev)) {
        }
    return e.mirror.get();
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
    for (auto it = metrics_.begin(); it != metrics_.end();) {
        if (it->first.db == db && it->first.index == index) {
            it = metrics_.erase(it);
            dropped++;
        } else {
            ++it;
        }
    }
    return dropped;
}

void MirrorStore::drop_all()
{
    mirrors_.clear();
    metrics_.clear();
}

void MirrorStore::drop_failed()
{
    // A metric mirror that lost a part loses answers: it reloads over the devices left.
    for (auto it = metrics_.begin(); it != metrics_.end();) {
        if (!it->second.mirror->whole())
            it = metrics_.erase(it);
        else
            ++it;
    }
    for (auto it = mirrors_.begin(); it != mirrors_.end();) {
        if (!it->second.mirror->whole()) {
            it = mirrors_.erase(it);
            continue;
        }
        it->second.mirror->drop_failed();
        ++it;
    }
}

void MirrorStore::count_queries(const MirrorKey& key, size_t n)
{
    auto it = mirrors_.find(key);
    if (it != mirrors_.end())
        it->second.queries += n;
    auto mt = metrics_.find(key);
    if (mt != metrics_.end())
        mt->second.queries += n;
}

std::vector<MirrorInfo> MirrorStore::list() const
{
    std::vector<MirrorInfo> out;
    for (const auto& kv : mirrors_) {
        const PlacedMirror& m = *kv.second.mirror;
        MirrorInfo info;
        info.key = kv.first;
        info.entries = m.entries();
        info.bytes = m.bytes();
        info.queries = kv.second.queries;
        info.vectors = m.has_vectors();
        info.filter_keys = m.has_keys();
        info.placement = static_cast<uint32_t>(m.placement());
        for (size_t dev : m.devices())
            if (dev < 32)
                info.device_mask |= 1u << dev;
        out.push_back(info);
    }
    for (const auto& kv : metrics_) {
        const PlacedMetricMirror& m = *kv.second.mirror;
        MirrorInfo info;
        info.key = kv.first;
        info.entries = m.entries();
        info.bytes = m.bytes();
        info.queries = kv.second.queries;
        info.kind = static_cast<uint32_t>(MirrorKind::Metric);
        // Every part searches every query over its share of the objects: shards.
        info.placement = static_cast<uint32_t>(m.devices().size() > 1 ? Placement::Shard : Placement::Replicate);
        for (size_t dev : m.devices())
            if (dev < 32)
                info.device_mask |= 1u << dev;
        out.push_back(info);
    }
    return out;
}

std::vector<DeviceInfo> MirrorStore::device_info() const
{
    std::vector<size_t> used;
    for (size_t i = 0; i < devices_.size(); i++)
        used.push_back(bytes_on(i));
    return devices_.info(used);
}

}  // namespace gpuivfpq
