// Replicas and shards of one index's mirror.
#include "gpu_process/placed_mirror.h"

#include <algorithm>
#include <functional>

#include "engine/error.h"

namespace gpuivfpq {

PlacedMirror::PlacedMirror(DeviceSet& set, Placement mode, size_t d, size_t m, std::vector<size_t> devices,
                           std::vector<std::unique_ptr<Mirror>> parts, std::vector<int32_t> list_shard)
    : set_(set), mode_(mode), d_(d), m_(m), devices_(std::move(devices)), parts_(std::move(parts)),
      list_shard_(std::move(list_shard))
{
    if (parts_.empty() || parts_.size() != devices_.size() || mode_ == Placement::Auto ||
        (mode_ == Placement::Shard) == list_shard_.empty())
        throw Error(ErrorKind::Internal, "a placed mirror's parts do not match its placement");
}

PlacedMirror::~PlacedMirror()
{
    // Each part frees its device memory while no other thread uses that device.
    for (size_t j = 0; j < parts_.size(); j++) {
        DeviceSet::Lease lease(set_, devices_[j]);
        parts_[j].reset();
    }
}

size_t PlacedMirror::bytes_on(size_t device) const
{
    size_t total = 0;
    for (size_t j = 0; j < parts_.size(); j++)
        if (devices_[j] == device)
            total += parts_[j]->bytes();
    return total;
}

bool PlacedMirror::whole() const
{
    bool any = false, all = true;
    for (size_t dev : devices_) {
        any |= set_.alive(dev);
        all &= set_.alive(dev);
    }
    return mode_ == Placement::Shard ? all : any;
}

void PlacedMirror::drop_failed()
{
    if (mode_ != Placement::Replicate)
        return;  // a sharded mirror is whole or dropped
    for (size_t j = parts_.size(); j-- > 0;)
        if (!set_.alive(devices_[j]) && parts_.size() > 1) {
            parts_.erase(parts_.begin() + (long)j);
            devices_.erase(devices_.begin() + (long)j);
        }
}

// Runs call on part j's device; a failure that left the device unusable
// marks it failed (the caller may retry elsewhere).
void PlacedMirror::run_on(size_t j, const std::function<void(Mirror&)>& call, bool hand_over)
{
    DeviceSet::Lease lease(set_, devices_[j]);
    if (hand_over)
        lease.hand_over_at_wait();
    try {
        call(*parts_[j]);
    } catch (const Error& e) {
        if (e.kind() == ErrorKind::Internal) {
            // The health check waits on the device's stream: not while
            // another thread may be using it.
            if (lease.held()) {
                (void)set_.check_health(devices_[j]);
            } else {
                DeviceSet::Lease again(set_, devices_[j]);
                (void)set_.check_health(devices_[j]);
            }
        }
        throw;
    }
}

void PlacedMirror::on_replicas(size_t nq, size_t tile, const Call& call, bool hand_over)
{
    // A share of queries in tiles (bounded device scratch), on one replica.
    auto run_share = [&](size_t j, size_t first, size_t count) {
        const size_t step = tile == 0 ? std::max<size_t>(count, 1) : tile;
        // A share of one call hands the device over while it waits; one of
        // several tiles keeps it for the next.
        run_on(j, [&](Mirror& m) {
            for (size_t t = 0; t < count; t += step)
                call(m, first + t, std::min(step, count - t));
        }, hand_over && count <= step);
        set_.count_search(devices_[j], count);
    };
    for (;;) {
        std::vector<size_t> live;
        for (size_t j = 0; j < parts_.size(); j++)
            if (set_.alive(devices_[j]))
                live.push_back(j);
        if (live.empty())
            throw Error(ErrorKind::Internal, "every GPU holding this index's mirror failed");
        try {
            if (nq < kSplitQueries || live.size() == 1) {
                std::vector<size_t> devs;
                for (size_t j : live)
                    devs.push_back(devices_[j]);
                size_t dev = set_.least_busy(devs);
                run_share(live[size_t(std::find(devs.begin(), devs.end(), dev) - devs.begin())], 0, nq);
                return;
            }
            // A large batch: one contiguous share per replica, all at once.
            size_t r = live.size();
            DeviceSet::in_parallel(r, [&](size_t i) {
                size_t first = nq * i / r, last = nq * (i + 1) / r;
                if (last > first)
                    run_share(live[i], first, last - first);
            });
            return;
        } catch (const Error&) {
            // A replica's device failed: the others answer (the call is idempotent).
            bool lost = false;
            for (size_t j : live)
                lost |= !set_.alive(devices_[j]);
            if (!lost)
                throw;
        }
    }
}

void PlacedMirror::on_shards(size_t nq, const std::function<void(Mirror&, size_t)>& call)
{
    if (!whole())
        throw Error(ErrorKind::Internal, "a GPU holding a shard of this index's mirror failed");
    DeviceSet::in_parallel(parts_.size(), [&](size_t j) {
        run_on(j, [&](Mirror& m) { call(m, j); });
        set_.count_search(devices_[j], nq);  // every shard searched every query
    });
}

void PlacedMirror::add(size_t n, const int32_t* list_ids, const uint8_t* codes, const int64_t* labels,
                       const float* vectors, const int64_t* keys)
{
    if (mode_ == Placement::Replicate) {
        for (size_t j = 0; j < parts_.size(); j++)
            if (set_.alive(devices_[j]))
                run_on(j, [&](Mirror& m) { m.add(n, list_ids, codes, labels, vectors, keys); });
        return;
    }
    // Each shard takes the entries of its lists, in their order.
    for (size_t i = 0; i < n; i++)
        if (list_ids[i] < 0 || size_t(list_ids[i]) >= list_shard_.size())
            throw Error(ErrorKind::InvalidArgument, "mirror: list out of range");
    for (size_t j = 0; j < parts_.size(); j++) {
        std::vector<int32_t> l;
        std::vector<int64_t> lab, key;
        std::vector<float> vec;
        std::vector<uint8_t> c;
        for (size_t i = 0; i < n; i++) {
            if (size_t(list_shard_[size_t(list_ids[i])]) != j)
                continue;
            l.push_back(list_ids[i]);
            lab.push_back(labels[i]);
            c.insert(c.end(), codes + i * m_, codes + (i + 1) * m_);
            if (keys != nullptr)
                key.push_back(keys[i]);
            if (vectors != nullptr)
                vec.insert(vec.end(), vectors + i * d_, vectors + (i + 1) * d_);
        }
        if (l.empty())
            continue;
        run_on(j, [&](Mirror& mirror) {
            mirror.add(l.size(), l.data(), c.data(), lab.data(), vectors != nullptr ? vec.data() : nullptr,
                       keys != nullptr ? key.data() : nullptr);
        });
    }
}

namespace {

// Each query's count of in-range entries over the shards (shard j's counts at
// matched[j * nq ..]): the shards' lists partition the probed lists'
// entries, so their counts add up.
void add_matched(const std::vector<int64_t>& matched, size_t shards, size_t nq, const KeyRanges* ranges)
{
    if (ranges == nullptr || ranges->matched == nullptr)
        return;
    for (size_t q = 0; q < nq; q++) {
        int64_t sum = 0;
        for (size_t j = 0; j < shards; j++)
            sum += matched[j * nq + q];
        ranges->matched[q] = sum;
    }
}

// The per-query key ranges of queries [first, first + count).
const KeyRanges* sub_ranges(const KeyRanges* r, size_t first, KeyRanges& out)
{
    if (r == nullptr)
        return nullptr;
    out.lo = r->lo + first;
    out.hi = r->hi + first;
    out.matched = r->matched != nullptr ? r->matched + first : nullptr;
    return &out;
}

}  // namespace

void PlacedMirror::search(const float* queries, size_t nq, size_t k, size_t nprobe, float* dist,
                          int64_t* labels, const KeyRanges* ranges)
{
    if (mode_ == Placement::Replicate) {
        on_replicas(nq, kTile, [&](Mirror& m, size_t first, size_t count) {
            KeyRanges r;
            m.search(queries + first * d_, count, k, nprobe, dist + first * k, labels + first * k,
                     sub_ranges(ranges, first, r));
        }, true);
        return;
    }
    for (size_t t = 0; t < nq; t += kTile) {
        KeyRanges r;
        shard_search(queries + t * d_, std::min(kTile, nq - t), k, nprobe, dist + t * k, labels + t * k,
                     sub_ranges(ranges, t, r));
    }
}

// One tile of a sharded search: every shard at once, merged by ADC distance.
void PlacedMirror::shard_search(const float* queries, size_t nq, size_t k, size_t nprobe, float* dist,
                                int64_t* labels, const KeyRanges* ranges)
{
    size_t s = parts_.size();
    std::vector<float> pd(s * nq * k);
    std::vector<int64_t> pl(s * nq * k), matched(ranges != nullptr ? s * nq : 0);
    on_shards(nq, [&](Mirror& m, size_t j) {
        KeyRanges r;
        if (ranges != nullptr)
            r = {ranges->lo, ranges->hi, matched.data() + j * nq};
        m.search(queries, nq, k, nprobe, pd.data() + j * nq * k, pl.data() + j * nq * k,
                 ranges != nullptr ? &r : nullptr);
    });
    std::vector<ShardRows<float>> rows;
    for (size_t j = 0; j < s; j++)
        rows.push_back({pd.data() + j * nq * k, pl.data() + j * nq * k});
    merge_adc(nq, k, rows, dist, labels);
    add_matched(matched, s, nq, ranges);
}

void PlacedMirror::search_exact(const float* queries, size_t nq, size_t k, size_t nprobe, double* dist,
                                int64_t* labels, const KeyRanges* ranges)
{
    if (mode_ == Placement::Replicate) {
        on_replicas(nq, kTile, [&](Mirror& m, size_t first, size_t count) {
            KeyRanges r;
            m.search_exact(queries + first * d_, count, k, nprobe, dist + first * k, labels + first * k,
                           sub_ranges(ranges, first, r));
        }, true);
        return;
    }
    for (size_t t = 0; t < nq; t += kTile) {
        KeyRanges r;
        shard_search_exact(queries + t * d_, std::min(kTile, nq - t), k, nprobe, dist + t * k, labels + t * k,
                           sub_ranges(ranges, t, r));
    }
}

// One tile of a sharded re-ranked search.
void PlacedMirror::shard_search_exact(const float* queries, size_t nq, size_t k, size_t nprobe, double* dist,
                                      int64_t* labels, const KeyRanges* ranges)
{
    // Each shard's ADC top-k and the same candidates re-ranked: the merge
    // takes the k best by ADC over all shards (the candidates one device
    // would re-rank), then orders them by exact distance.
    size_t s = parts_.size();
    std::vector<float> ad(s * nq * k);
    std::vector<int64_t> al(s * nq * k), el(s * nq * k), matched(ranges != nullptr ? s * nq : 0);
    std::vector<double> ed(s * nq * k);
    on_shards(nq, [&](Mirror& m, size_t j) {
        KeyRanges r;
        if (ranges != nullptr)
            r = {ranges->lo, ranges->hi, matched.data() + j * nq};
        const KeyRanges* rp = ranges != nullptr ? &r : nullptr;
        m.search(queries, nq, k, nprobe, ad.data() + j * nq * k, al.data() + j * nq * k, rp);
        m.search_exact(queries, nq, k, nprobe, ed.data() + j * nq * k, el.data() + j * nq * k, rp);
    });
    std::vector<ShardRows<float>> adc;
    std::vector<ShardRows<double>> exact;
    for (size_t j = 0; j < s; j++) {
        adc.push_back({ad.data() + j * nq * k, al.data() + j * nq * k});
        exact.push_back({ed.data() + j * nq * k, el.data() + j * nq * k});
    }
    merge_reranked(nq, k, adc, exact, dist, labels);
    add_matched(matched, s, nq, ranges);
}

void PlacedMirror::brute_force(const float* queries, size_t nq, size_t k, double* dist, int64_t* labels)
{
    if (mode_ == Placement::Replicate) {
        // Untiled: the device gathers the stored vectors once and tiles the queries itself.
        on_replicas(nq, 0, [&](Mirror& m, size_t first, size_t count) {
            m.brute_force(queries + first * d_, count, k, dist + first * k, labels + first * k);
        });
        return;
    }
    size_t s = parts_.size();
    std::vector<double> pd(s * nq * k);
    std::vector<int64_t> pl(s * nq * k);
    on_shards(nq, [&](Mirror& m, size_t j) {
        m.brute_force(queries, nq, k, pd.data() + j * nq * k, pl.data() + j * nq * k);
    });
    std::vector<ShardRows<double>> rows;
    for (size_t j = 0; j < s; j++)
        rows.push_back({pd.data() + j * nq * k, pl.data() + j * nq * k});
    merge_exact(nq, k, rows, dist, labels);
}

size_t PlacedMirror::remove(size_t n, const int64_t* labels)
{
    // A label's entries may lie in any shard: each part removes what it holds.
    size_t removed = 0;
    for (size_t j = 0; j < parts_.size(); j++) {
        if (!set_.alive(devices_[j]))
            continue;
        size_t here = 0;
        run_on(j, [&](Mirror& m) { here = m.remove(n, labels); });
        removed = mode_ == Placement::Replicate ? std::max(removed, here) : removed + here;
    }
    return removed;
}

size_t PlacedMirror::entries() const
{
    if (mode_ == Placement::Replicate) {
        for (size_t j = 0; j < parts_.size(); j++)
            if (set_.alive(devices_[j]))
                return parts_[j]->entries();
        return 0;
    }
    size_t total = 0;
    for (const auto& p : parts_)
        total += p->entries();
    return total;
}

size_t PlacedMirror::bytes() const
{
    size_t total = 0;
    for (const auto& p : parts_)
        total += p->bytes();
    return total;
}

}  // namespace gpuivfpq
