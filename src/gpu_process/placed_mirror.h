// One index's mirror over several devices: replicas (a whole copy on each,
// for throughput: a batch goes to the least busy one, a large batch is
// split over all) or shards (the lists spread over the devices, for
// capacity: every shard searches each query and the partial top-k are
// merged into what one device holding everything would answer).
//
// Thread-safe for searches: the GPU process runs batches of several
// connections at once, each on its own device (DeviceSet::Lease). Changes
// (add, remove) come only while no search runs (the process waits for its
// searches before any other call).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "gpu_process/compute_device.h"
#include "gpu_process/device_set.h"
#include "gpu_process/shard_merge.h"

namespace gpuivfpq {

class PlacedMirror final : public Mirror {
public:
    // Replicate: parts[j], on devices[j], each holds every entry; list_shard
    // empty. Shard: parts[j] holds the entries of the lists l with
    // list_shard[l] == j.
    // d, m: the index's dimension and code size.
    PlacedMirror(DeviceSet& set, Placement mode, size_t d, size_t m, std::vector<size_t> devices,
                 std::vector<std::unique_ptr<Mirror>> parts, std::vector<int32_t> list_shard);
    ~PlacedMirror() override;

    Placement placement() const { return mode_; }
    const std::vector<size_t>& devices() const { return devices_; }
    // Device memory this mirror holds on device i (0 where it has no part).
    size_t bytes_on(size_t device) const;
    // Whether it still answers as a whole: false once a shard's device
    // failed (replicas go on while one is left).
    bool whole() const;
    // Forgets the parts on failed devices (no search may run).
    void drop_failed();

    void add(size_t n, const int32_t* list_ids, const uint8_t* codes, const int64_t* labels,
             const float* vectors, const int64_t* keys) override;
    bool has_vectors() const override { return parts_[0]->has_vectors(); }
    bool has_keys() const override { return parts_[0]->has_keys(); }
    bool lower_bounds() const override { return parts_[0]->lower_bounds(); }
    void search(const float* queries, size_t nq, size_t k, size_t nprobe, float* dist, int64_t* labels,
                const KeyRanges* ranges) override;
    void search_exact(const float* queries, size_t nq, size_t k, size_t nprobe, double* dist,
                      int64_t* labels, const KeyRanges* ranges) override;
    void brute_force(const float* queries, size_t nq, size_t k, double* dist, int64_t* labels) override;
    size_t remove(size_t n, const int64_t* labels) override;
    size_t entries() const override;
    size_t bytes() const override;

    // Batches of at least this many queries are split over the replicas.
    static constexpr size_t kSplitQueries = 256;
    // Queries per device call of a large batch (bounds the device's scratch
    // space); each replica runs its whole share in such tiles.
    static constexpr size_t kTile = 4096;

private:
    using Call = std::function<void(Mirror&, size_t first, size_t count)>;
    // call(mirror, first, count) over [0, nq): one replica, or a share each;
    // within a share in tiles of tile queries (0: one call).
    // hand_over: a share of one call lets go of its device while that call
    // waits (searches: each Mirror call is one device call that hands over
    // at most at its end).
    void on_replicas(size_t nq, size_t tile, const Call& call, bool hand_over = false);
    void on_shards(size_t nq, const std::function<void(Mirror&, size_t shard)>& call);
    // hand_over: call makes one search call, the lease's last use of the
    // device, which lets go of it while it waits (DeviceSet::Lease).
    void run_on(size_t part, const std::function<void(Mirror&)>& call, bool hand_over = false);
    void shard_search(const float* queries, size_t nq, size_t k, size_t nprobe, float* dist, int64_t* labels,
                      const KeyRanges* ranges);
    void shard_search_exact(const float* queries, size_t nq, size_t k, size_t nprobe, double* dist,
                            int64_t* labels, const KeyRanges* ranges);

    DeviceSet& set_;
    Placement mode_;
    size_t d_, m_;
    std::vector<size_t> devices_;
    std::vector<std::unique_ptr<Mirror>> parts_;
    std::vector<int32_t> list_shard_;
};

}  // namespace gpuivfpq
