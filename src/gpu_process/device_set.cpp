// The GPU process's devices: locks, budgets, counters, health.
#include "gpu_process/device_set.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "engine/error.h"
#include "engine/parallel.h"

namespace gpuivfpq {
namespace {

uint64_t now_ns()
{
    return (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

}  // namespace

DeviceSet::DeviceSet(std::vector<std::unique_ptr<ComputeDevice>> devices, std::vector<uint32_t> ordinals)
{
    if (devices.empty())
        throw Error(ErrorKind::InvalidArgument, "a device set needs at least one device");
    for (size_t i = 0; i < devices.size(); i++) {
        auto slot = std::make_unique<Slot>();
        slot->owned = std::move(devices[i]);
        slot->dev = slot->owned.get();
        slot->ordinal = i < ordinals.size() ? ordinals[i] : (uint32_t)i;
        slots_.push_back(std::move(slot));
    }
    set_budget(0);
}

DeviceSet::DeviceSet(ComputeDevice& only)
{
    auto slot = std::make_unique<Slot>();
    slot->dev = &only;
    slots_.push_back(std::move(slot));
    set_budget(0);
}

size_t DeviceSet::alive_count() const
{
    size_t n = 0;
    for (size_t i = 0; i < slots_.size(); i++)
        n += alive(i) ? 1 : 0;
    return n;
}

std::vector<size_t> DeviceSet::alive_devices() const
{
    std::vector<size_t> out;
    for (size_t i = 0; i < slots_.size(); i++)
        if (alive(i))
            out.push_back(i);
    return out;
}

bool DeviceSet::check_health(size_t i)
{
    if (alive(i) && !slots_[i]->dev->healthy())
        mark_failed(i);
    return alive(i);
}

void DeviceSet::mark_failed(size_t i) { slots_[i]->alive = false; }

std::string DeviceSet::description() const
{
    std::string first = slots_[0]->dev->description();
    if (slots_.size() == 1)
        return first;
    bool same = true;
    std::string ordinals;
    for (size_t i = 0; i < slots_.size(); i++) {
        same &= slots_[i]->dev->description() == first;
        ordinals += (i ? ", " : "") + std::to_string(slots_[i]->ordinal);
    }
    if (same)
        return std::to_string(slots_.size()) + " x " + first + " (devices " + ordinals + ")";
    std::string all;
    for (size_t i = 0; i < slots_.size(); i++)
        all += (i ? "; " : "") + std::to_string(slots_[i]->ordinal) + ": " + slots_[i]->dev->description();
    return all;
}

size_t DeviceSet::capacity() const
{
    size_t c = SIZE_MAX;
    for (const auto& s : slots_)
        c = std::min(c, s->dev->memory_capacity());
    return c;
}

void DeviceSet::set_budget(size_t bytes)
{
    for (auto& s : slots_) {
        size_t cap = s->dev->memory_capacity();
        // A device listed n times (n contexts on one GPU) shares its budget.
        size_t sharing = 0;
        for (const auto& o : slots_)
            sharing += o->ordinal == s->ordinal ? 1 : 0;
        s->budget = (bytes == 0 ? cap / 4 * 3 : std::min(bytes, cap)) / std::max<size_t>(sharing, 1);
    }
}

DeviceSet::Lease::Lease(DeviceSet& set, size_t i) : set_(set), i_(i)
{
    Slot& s = *set_.slots_[i];
    s.waiting++;
    lock_ = std::unique_lock<std::mutex>(s.mu);
    std::lock_guard<std::mutex> g(s.acct);
    if (s.active++ == 0)
        s.active_since_ns = now_ns();
}

DeviceSet::Lease::~Lease()
{
    Slot& s = *set_.slots_[i_];
    if (held() && installed_)
        s.dev->set_wait_handover(nullptr, nullptr, nullptr);
    {
        std::lock_guard<std::mutex> g(s.acct);
        if (--s.active == 0)
            s.busy_ns += now_ns() - s.active_since_ns;
    }
    s.waiting--;
}

void DeviceSet::Lease::hand_over_at_wait()
{
    if (!held() || installed_)
        return;
    set_.slots_[i_]->dev->set_wait_handover(&Lease::yield, &Lease::keep_away, this);
    installed_ = true;
}

void DeviceSet::Lease::yield(void* lease)
{
    Lease& l = *static_cast<Lease*>(lease);
    // The next holder installs its own handover, or none.
    l.set_.slots_[l.i_]->dev->set_wait_handover(nullptr, nullptr, nullptr);
    l.lock_.unlock();
}

void DeviceSet::Lease::keep_away(void*)
{
    // The call has its answers: the device stays with whoever holds it now.
}

size_t DeviceSet::least_busy(const std::vector<size_t>& candidates) const
{
    if (candidates.empty())
        throw Error(ErrorKind::Internal, "no device to choose from");
    size_t best = candidates[0];
    for (size_t i : candidates) {
        const Slot& a = *slots_[i];
        const Slot& b = *slots_[best];
        if (a.waiting < b.waiting || (a.waiting == b.waiting && a.queries < b.queries))
            best = i;
    }
    return best;
}

void DeviceSet::count_search(size_t i, size_t queries)
{
    slots_[i]->queries += queries;
    slots_[i]->batches++;
}

void DeviceSet::in_parallel(size_t parts, const std::function<void(size_t)>& fn)
{
    if (parts == 1) {
        fn(0);
        return;
    }
    // One chunk per thread: parallel_for gives each of `parts` threads one part.
    parallel_for(parts, (int)parts, [&](size_t begin, size_t end) {
        for (size_t j = begin; j < end; j++)
            fn(j);
    });
}

std::vector<DeviceInfo> DeviceSet::info(const std::vector<size_t>& bytes_per_device) const
{
    std::vector<DeviceInfo> out;
    for (size_t i = 0; i < slots_.size(); i++) {
        const Slot& s = *slots_[i];
        DeviceInfo d;
        d.ordinal = s.ordinal;
        d.alive = s.alive ? 1 : 0;
        d.capacity = s.dev->memory_capacity();
        d.budget = s.budget;
        d.bytes = i < bytes_per_device.size() ? bytes_per_device[i] : 0;
        d.queries = s.queries;
        d.batches = s.batches;
        d.busy_ns = s.busy_ns;
        std::snprintf(d.description, sizeof(d.description), "%s", s.dev->description().c_str());
        out.push_back(d);
    }
    return out;
}

}  // namespace gpuivfpq
