// GpuMetricIndex: a List of Clusters or SSS index on the device. The words,
// removed flags and the SSS table grow in place (capacity half again, what
// they hold kept); an LC's buckets are laid out flat, cluster by cluster,
// and uploaded again after the inserts of a call (the host keeps each
// object's cluster to lay them out). Every allocation of a change is made
// before anything is copied, so a change that runs out of memory changes
// nothing.
#include "gpu_ivfpq/metric_index.h"

#include <algorithm>
#include <cstdio>

#include "engine/error.h"
#include "../context_impl.h"
#include "../cuda_check.h"
#include "gpu_ivfpq/device_buffer.h"
#include "gpu_ivfpq/gpu_context.h"
#include "gpu_ivfpq/metric_search.h"
#include "metric_kernels.h"

namespace gpuivfpq::gpu {

namespace {

// A device array of bytes that grows, keeping what it holds.
class DeviceArray {
public:
    size_t size() const { return used_; }
    size_t capacity() const { return buf_.bytes(); }
    template <typename T>
    T* as() const
    {
        return buf_.as<T>();
    }
    // Room for `bytes` in all (at least half again the capacity when it
    // must grow), the contents kept.
    void reserve(GpuContext& ctx, size_t bytes)
    {
        if (bytes <= buf_.bytes())
            return;
        DeviceBuffer grown(ctx, std::max(bytes, buf_.bytes() + buf_.bytes() / 2));
        if (used_ > 0)
            GPU_CUDA_CHECK(cudaMemcpyAsync(grown.data(), buf_.data(), used_,
                                           cudaMemcpyDeviceToDevice, stream_of(ctx)));
        buf_ = std::move(grown);  // freed in stream order, after the copy
    }
    // Appends host bytes within the room reserved.
    void append(GpuContext& ctx, const void* host, size_t bytes)
    {
        require(used_ + bytes <= buf_.bytes(), "metric index: append past the room reserved");
        copy_to_device(ctx, buf_.as<char>() + used_, host, bytes);
        used_ += bytes;
    }
    // Appends zero bytes within the room reserved.
    void append_zeros(GpuContext& ctx, size_t bytes)
    {
        require(used_ + bytes <= buf_.bytes(), "metric index: append past the room reserved");
        if (bytes > 0)
            GPU_CUDA_CHECK(cudaMemsetAsync(buf_.as<char>() + used_, 0, bytes, stream_of(ctx)));
        used_ += bytes;
    }
    // Replaces the contents with host bytes within the room reserved.
    void assign(GpuContext& ctx, const void* host, size_t bytes)
    {
        used_ = 0;
        append(ctx, host, bytes);
    }

private:
    DeviceBuffer buf_;
    size_t used_ = 0;
};

__global__ void scatter_rows_kernel(uint8_t* table, uint32_t pivots, uint32_t first,
                                    uint64_t count, const uint8_t* rows)
{
    const uint64_t threads = uint64_t(gridDim.x) * blockDim.x;
    const uint64_t total = count * pivots;
    for (uint64_t t = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += threads)
        table[metric::table_at(first + uint32_t(t / pivots), uint32_t(t % pivots), pivots)] =
            rows[t];
}

__global__ void set_flags_kernel(uint8_t* flags, const uint32_t* ids, uint64_t n)
{
    const uint64_t threads = uint64_t(gridDim.x) * blockDim.x;
    for (uint64_t t = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < n; t += threads)
        flags[ids[t]] = 1;
}

[[noreturn]] void invalid_state(const char* msg) { throw Error(ErrorKind::InvalidArgument, msg); }

// Bytes of a tiled SSS table of n objects and `pivots` columns.
size_t tiled_table_bytes(size_t n, size_t pivots)
{
    return (n + metric::kTableTile - 1) / metric::kTableTile * metric::kTableTile * pivots;
}

}  // namespace

struct GpuMetricIndex::State {
    bool lc = true;
    size_t n = 0;
    uint64_t code_points = 0;
    uint32_t max_length = 0;
    DeviceArray cps, offsets, removed;
    // List of Clusters: the host's copy of the structure, the device's
    // flat buckets.
    std::vector<uint32_t> centres, radii, cluster_of;
    DeviceArray d_centres, d_radii, member_offsets, members;
    // SSS.
    size_t pivots = 0;
    DeviceArray d_pivots, is_pivot, table;

    // Reserves the room words need in the arrays every index has.
    void reserve_words(GpuContext& ctx, const WordList& w)
    {
        const uint64_t more = w.offsets()[w.size()];
        cps.reserve(ctx, size_t((code_points + more) * sizeof(uint32_t)));
        offsets.reserve(ctx, (n + 1 + w.size()) * sizeof(uint64_t));
        removed.reserve(ctx, n + w.size());
    }
    // Appends words (room reserved), live.
    void append_words(GpuContext& ctx, const WordList& w)
    {
        const size_t count = w.size();
        const uint64_t more = w.offsets()[count];
        if (offsets.size() == 0) {
            const uint64_t zero = 0;
            offsets.append(ctx, &zero, sizeof zero);
        }
        std::vector<uint64_t> shifted(count);
        for (size_t i = 0; i < count; i++) {
            shifted[i] = code_points + w.offsets()[i + 1];
            max_length = std::max(max_length, uint32_t(w[i].size));
        }
        cps.append(ctx, w.code_points(), size_t(more * sizeof(uint32_t)));
        offsets.append(ctx, shifted.data(), count * sizeof(uint64_t));
        removed.append_zeros(ctx, count);
        code_points += more;
        n += count;
    }
    // Room for an LC structure of nc clusters and `flat` bucket members.
    void reserve_clusters(GpuContext& ctx, size_t nc, size_t flat)
    {
        d_centres.reserve(ctx, nc * sizeof(uint32_t));
        d_radii.reserve(ctx, nc * sizeof(uint32_t));
        member_offsets.reserve(ctx, (nc + 1) * sizeof(uint32_t));
        members.reserve(ctx, flat * sizeof(uint32_t));
    }
    // Uploads an LC structure within the room reserved.
    void assign_clusters(GpuContext& ctx, const std::vector<uint32_t>& offs,
                         const std::vector<uint32_t>& flat)
    {
        d_centres.assign(ctx, centres.data(), centres.size() * sizeof(uint32_t));
        d_radii.assign(ctx, radii.data(), radii.size() * sizeof(uint32_t));
        member_offsets.assign(ctx, offs.data(), offs.size() * sizeof(uint32_t));
        members.assign(ctx, flat.data(), flat.size() * sizeof(uint32_t));
    }
    // Sets removed flags of ids (each below n).
    void set_removed(GpuContext& ctx, const std::vector<uint32_t>& ids)
    {
        if (ids.empty())
            return;
        DeviceBuffer d(ctx, ids.size() * sizeof(uint32_t));
        d.upload(ids.data(), ids.size() * sizeof(uint32_t));
        set_flags_kernel<<<metric::plain_grid(ctx, ids.size()), metric::kMetricThreads, 0,
                           stream_of(ctx)>>>(removed.as<uint8_t>(), d.as<uint32_t>(), ids.size());
        GPU_KERNEL_CHECK();
    }
    DeviceWords words() const { return DeviceWords{cps.as<uint32_t>(), offsets.as<uint64_t>(), n}; }
    LcDeviceView lc_view() const
    {
        return LcDeviceView{words(),
                            removed.as<uint8_t>(),
                            d_centres.as<uint32_t>(),
                            d_radii.as<uint32_t>(),
                            centres.size(),
                            member_offsets.as<uint32_t>(),
                            members.as<uint32_t>(),
                            max_length};
    }
    SssDeviceView sss_view() const
    {
        return SssDeviceView{words(),    removed.as<uint8_t>(), is_pivot.as<uint8_t>(),
                             d_pivots.as<uint32_t>(), pivots, table.as<uint8_t>(),
                             max_length};
    }
};

namespace {

// An LC's buckets flat, cluster by cluster, ids ascending (as restore and
// inserts keep them), each centre left out of its own: offs (clusters + 1)
// and flat.
void lay_out_buckets(const std::vector<uint32_t>& centres, const std::vector<uint32_t>& cluster_of,
                     std::vector<uint32_t>& offs, std::vector<uint32_t>& flat)
{
    const size_t nc = centres.size();
    offs.assign(nc + 1, 0);
    for (uint32_t x = 0; x < cluster_of.size(); x++)
        if (centres[cluster_of[x]] != x)
            offs[cluster_of[x] + 1]++;
    for (size_t c = 0; c < nc; c++)
        offs[c + 1] += offs[c];
    flat.assign(offs[nc], 0);
    std::vector<uint32_t> next(offs.begin(), offs.end() - 1);
    for (uint32_t x = 0; x < cluster_of.size(); x++)
        if (centres[cluster_of[x]] != x)
            flat[next[cluster_of[x]]++] = x;
}

}  // namespace

GpuMetricIndex::GpuMetricIndex(GpuContext& ctx, std::unique_ptr<State> state)
    : ctx_(ctx), s_(std::move(state))
{
}

GpuMetricIndex::~GpuMetricIndex() = default;

namespace {

// Removed flags as ids, for State::set_removed.
std::vector<uint32_t> removed_ids(const uint8_t* removed, size_t n)
{
    std::vector<uint32_t> ids;
    for (size_t x = 0; removed != nullptr && x < n; x++)
        if (removed[x])
            ids.push_back(uint32_t(x));
    return ids;
}

}  // namespace

std::unique_ptr<GpuMetricIndex> GpuMetricIndex::list_of_clusters(
    GpuContext& ctx, const WordList& words, const uint8_t* removed,
    const std::vector<uint32_t>& centres, const std::vector<uint32_t>& radii,
    const std::vector<uint32_t>& cluster_of)
{
    const size_t n = words.size(), nc = centres.size();
    metric::check_metric_sizes(0, n, "GPU list of clusters");
    char msg[200];
    if (radii.size() != nc || cluster_of.size() != n || (n == 0) != (nc == 0) || nc > n) {
        std::snprintf(msg, sizeof msg,
                      "GPU list of clusters: %zu centres, %zu radii and %zu cluster numbers over "
                      "%zu objects",
                      nc, radii.size(), cluster_of.size(), n);
        invalid_state(msg);
    }
    for (size_t c = 0; c < nc; c++)
        if (centres[c] >= n || cluster_of[centres[c]] != c) {
            std::snprintf(msg, sizeof msg, "GPU list of clusters: centre %u of cluster %zu is %s",
                          centres[c], c,
                          centres[c] >= n ? "not an object of the index"
                                          : "assigned to another cluster");
            invalid_state(msg);
        }
    for (size_t x = 0; x < n; x++)
        if (cluster_of[x] >= nc) {
            std::snprintf(msg, sizeof msg,
                          "GPU list of clusters: object %zu is in cluster %u of %zu", x,
                          cluster_of[x], nc);
            invalid_state(msg);
        }
    auto s = std::make_unique<State>();
    s->lc = true;
    s->centres = centres;
    s->radii = radii;
    s->cluster_of = cluster_of;
    std::vector<uint32_t> offs, flat;
    lay_out_buckets(centres, cluster_of, offs, flat);
    s->reserve_words(ctx, words);
    s->reserve_clusters(ctx, nc, flat.size());
    s->append_words(ctx, words);
    s->assign_clusters(ctx, offs, flat);
    s->set_removed(ctx, removed_ids(removed, n));
    return std::unique_ptr<GpuMetricIndex>(new GpuMetricIndex(ctx, std::move(s)));
}

std::unique_ptr<GpuMetricIndex> GpuMetricIndex::sparse_spatial_selection(
    GpuContext& ctx, const WordList& words, const uint8_t* removed,
    const std::vector<uint32_t>& pivots, const uint8_t* table)
{
    const size_t n = words.size(), np = pivots.size();
    metric::check_metric_sizes(np, n, "GPU sparse spatial selection");
    char msg[200];
    std::vector<uint8_t> flag(n, 0);
    for (size_t p = 0; p < np; p++) {
        if (pivots[p] >= n || flag[pivots[p]]) {
            std::snprintf(msg, sizeof msg,
                          "GPU sparse spatial selection: pivot %zu (object %u) is %s", p,
                          pivots[p], pivots[p] >= n ? "not an object of the index" : "a pivot twice");
            invalid_state(msg);
        }
        flag[pivots[p]] = 1;
    }
    if (table == nullptr && n * np > 0)
        invalid_state("GPU sparse spatial selection: no table for the pivots");
    // The engine's rows, tiled for the device.
    std::vector<uint8_t> tiled(tiled_table_bytes(n, np), 0);
    for (size_t x = 0; x < n; x++)
        for (size_t p = 0; p < np; p++)
            tiled[metric::table_at(uint32_t(x), uint32_t(p), uint32_t(np))] = table[x * np + p];
    auto s = std::make_unique<State>();
    s->lc = false;
    s->pivots = np;
    s->reserve_words(ctx, words);
    s->d_pivots.reserve(ctx, np * sizeof(uint32_t));
    s->is_pivot.reserve(ctx, n);
    s->table.reserve(ctx, tiled.size());
    s->append_words(ctx, words);
    s->set_removed(ctx, removed_ids(removed, n));
    s->d_pivots.assign(ctx, pivots.data(), np * sizeof(uint32_t));
    s->is_pivot.assign(ctx, flag.data(), n);
    s->table.assign(ctx, tiled.data(), tiled.size());
    return std::unique_ptr<GpuMetricIndex>(new GpuMetricIndex(ctx, std::move(s)));
}

bool GpuMetricIndex::is_list_of_clusters() const { return s_->lc; }
size_t GpuMetricIndex::size() const { return s_->n; }
size_t GpuMetricIndex::clusters() const { return s_->centres.size(); }
size_t GpuMetricIndex::pivots() const { return s_->pivots; }

void GpuMetricIndex::add(const WordList& words, const LcPlacement* placements)
{
    State& s = *s_;
    require(s.lc, "GPU metric index: LC placements for an SSS index");
    const size_t count = words.size();
    metric::check_metric_sizes(0, s.n + count, "GPU list of clusters");
    require(count == 0 || placements != nullptr, "GPU list of clusters: inserts need placements");
    // Every placement checked against the state the earlier ones leave,
    // on copies: a refused one changes nothing.
    std::vector<uint32_t> centres = s.centres, radii = s.radii;
    std::vector<uint32_t> assigned(count);
    for (size_t i = 0; i < count; i++) {
        const LcPlacement p = placements[i];
        check_lc_placement(centres.size(), p, p.cluster < radii.size() ? radii[p.cluster] : 0);
        if (p.cluster == centres.size()) {
            centres.push_back(uint32_t(s.n + i));
            radii.push_back(0);
        } else {
            radii[p.cluster] = p.radius;
        }
        assigned[i] = p.cluster;
    }
    if (count == 0)
        return;
    std::vector<uint32_t> cluster_of = s.cluster_of;
    cluster_of.insert(cluster_of.end(), assigned.begin(), assigned.end());
    std::vector<uint32_t> offs, flat;
    lay_out_buckets(centres, cluster_of, offs, flat);
    // All the room first: nothing changes when it cannot be had.
    s.reserve_words(ctx_, words);
    s.reserve_clusters(ctx_, centres.size(), flat.size());
    s.centres.swap(centres);
    s.radii.swap(radii);
    s.cluster_of.swap(cluster_of);
    s.append_words(ctx_, words);
    s.assign_clusters(ctx_, offs, flat);
}

void GpuMetricIndex::add(const WordList& words, const uint8_t* rows)
{
    State& s = *s_;
    require(!s.lc, "GPU metric index: SSS table rows for a list of clusters");
    const size_t count = words.size();
    metric::check_metric_sizes(0, s.n + count, "GPU sparse spatial selection");
    require(count == 0 || s.pivots == 0 || rows != nullptr,
            "GPU sparse spatial selection: inserts need their table rows");
    if (count == 0)
        return;
    const size_t table_bytes = tiled_table_bytes(s.n + count, s.pivots);
    s.reserve_words(ctx_, words);
    s.is_pivot.reserve(ctx_, s.n + count);
    s.table.reserve(ctx_, table_bytes);
    DeviceBuffer drows(ctx_, std::max<size_t>(1, count * s.pivots));
    drows.upload(rows, count * s.pivots);
    const uint32_t first = uint32_t(s.n);
    s.append_words(ctx_, words);
    s.is_pivot.append_zeros(ctx_, count);
    s.table.append_zeros(ctx_, table_bytes - s.table.size());
    if (s.pivots > 0) {
        scatter_rows_kernel<<<metric::plain_grid(ctx_, uint64_t(count) * s.pivots),
                              metric::kMetricThreads, 0, stream_of(ctx_)>>>(
            s.table.as<uint8_t>(), uint32_t(s.pivots), first, count, drows.as<uint8_t>());
        GPU_KERNEL_CHECK();
    }
}

void GpuMetricIndex::remove(const std::vector<uint32_t>& ids)
{
    for (uint32_t id : ids)
        if (id >= s_->n) {
            char msg[160];
            std::snprintf(msg, sizeof msg,
                          "GPU metric index: cannot remove object %u, the index holds %zu", id,
                          s_->n);
            throw Error(ErrorKind::InvalidArgument, msg);
        }
    s_->set_removed(ctx_, ids);
}

MetricBatchResult GpuMetricIndex::range(const WordList& queries, const std::vector<uint32_t>& radii)
{
    return s_->lc ? lc_range(ctx_, s_->lc_view(), queries, radii)
                  : sss_range(ctx_, s_->sss_view(), queries, radii);
}

MetricBatchResult GpuMetricIndex::knn(const WordList& queries, size_t k)
{
    return s_->lc ? lc_knn(ctx_, s_->lc_view(), queries, k) : sss_knn(ctx_, s_->sss_view(), queries, k);
}

size_t GpuMetricIndex::bytes() const
{
    const State& s = *s_;
    return s.cps.capacity() + s.offsets.capacity() + s.removed.capacity() +
           s.d_centres.capacity() + s.d_radii.capacity() + s.member_offsets.capacity() +
           s.members.capacity() + s.d_pivots.capacity() + s.is_pivot.capacity() +
           s.table.capacity();
}

}  // namespace gpuivfpq::gpu
