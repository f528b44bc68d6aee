// The compute devices one GPU process serves: every GPU it was given (or
// several CPU emulations in the tests), each with its own memory budget,
// counters and a lock, so that a device runs one call at a time while the
// other devices run theirs (replicas answer different batches at once).
//
// A device whose context is lost (a sticky CUDA error) is marked failed:
// its mirrors go (the mirror store drops them; replicas elsewhere go on,
// sharded indexes reload over the survivors) and nothing is sent to it
// again. The process itself lives on while one device does.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gpu_process/compute_device.h"

namespace gpuivfpq {

// What the status view shows of one device.
struct DeviceInfo {
    uint32_t ordinal = 0;  // the device's number as the process opened it
    uint32_t alive = 0;
    uint64_t capacity = 0, budget = 0, bytes = 0;  // bytes: held by mirrors
    uint64_t queries = 0, batches = 0, busy_ns = 0;
    char description[96] = {0};
};

class DeviceSet {
public:
    // ordinals[i]: how device i is named (its CUDA ordinal), for the status.
    DeviceSet(std::vector<std::unique_ptr<ComputeDevice>> devices, std::vector<uint32_t> ordinals);
    // One device the caller keeps (the tests' single-device stores).
    explicit DeviceSet(ComputeDevice& only);

    size_t size() const { return slots_.size(); }
    ComputeDevice& device(size_t i) { return *slots_[i]->dev; }
    bool alive(size_t i) const { return slots_[i]->alive.load(); }
    std::vector<size_t> alive_devices() const;
    size_t alive_count() const;  // alive_devices().size(), with no allocation
    // After a failed call on device i: false (and the device marked failed)
    // when the device is no longer usable.
    bool check_health(size_t i);
    void mark_failed(size_t i);
    // A description of the set ("2 x NVIDIA H200 (0, 1)").
    std::string description() const;
    // The smallest capacity among the devices (what one replica may use).
    size_t capacity() const;

    // The mirror budget of each device: bytes, or when 0 three quarters of
    // the device's capacity (the rest is search scratch, builds, others);
    // never more than the capacity. A device opened n times (its ordinal
    // listed n times: n contexts, each with its stream) shares that budget
    // n ways.
    void set_budget(size_t bytes);
    size_t budget(size_t i) const { return slots_[i]->budget; }

    // Exclusive use of one device by the calling thread; counts the use
    // (busy time: the union of the leases, which overlap once one is
    // handed over).
    class Lease {
    public:
        Lease(DeviceSet& set, size_t i);
        ~Lease();
        Lease(const Lease&) = delete;
        Lease& operator=(const Lease&) = delete;
        size_t index() const { return i_; }
        ComputeDevice& device() { return set_.device(i_); }
        // The next search call under this lease lets go of the device for
        // good once its work is queued, before it waits for it
        // (ComputeDevice::set_wait_handover), so that another thread's
        // batch is queued behind it and starts as it ends; the call then
        // reads its answers and returns without the device. So it must be
        // the lease's last use of the device.
        void hand_over_at_wait();
        // Whether the lease still holds the device.
        bool held() const { return lock_.owns_lock(); }

    private:
        static void yield(void* lease);
        static void keep_away(void* lease);
        DeviceSet& set_;
        size_t i_;
        std::unique_lock<std::mutex> lock_;
        bool installed_ = false;
    };
    // The device among candidates with the fewest calls running or waiting
    // (ties: the one with fewer queries so far), for a replica's search.
    size_t least_busy(const std::vector<size_t>& candidates) const;
    void count_search(size_t i, size_t queries);

    // Runs fn(j) for j in [0, parts) on parts threads at once (the caller's
    // thread takes part 0); the first exception is rethrown after all end.
    static void in_parallel(size_t parts, const std::function<void(size_t)>& fn);

    std::vector<DeviceInfo> info(const std::vector<size_t>& bytes_per_device) const;

private:
    struct Slot {
        ComputeDevice* dev = nullptr;
        std::unique_ptr<ComputeDevice> owned;
        uint32_t ordinal = 0;
        std::mutex mu;
        std::atomic<bool> alive{true};
        std::atomic<int> waiting{0};
        std::atomic<uint64_t> queries{0}, batches{0}, busy_ns{0};
        // Leases under way and since when (under acct): busy time is
        // counted while at least one is.
        std::mutex acct;
        int active = 0;
        uint64_t active_since_ns = 0;
        size_t budget = 0;
    };
    std::vector<std::unique_ptr<Slot>> slots_;
};

}  // namespace gpuivfpq
