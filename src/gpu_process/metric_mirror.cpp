// MetricMirror's common part (labels, ids, removed flags, the checks of
// adds and removals) and the CPU emulation's mirror, an engine index
// restored from the stored state.
#include "gpu_process/metric_mirror.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>

#include "engine/error.h"
#include "engine/metric/sss_index.h"
#include "gpu_process/compute_device.h"

namespace gpuivfpq {

namespace {

[[noreturn]] void invalid(const std::string& msg) { throw Error(ErrorKind::InvalidArgument, msg); }

bool is_lc(MetricMethod m) { return m == MetricMethod::ListOfClusters; }

// Throws unless ids[0, n) increase strictly from at least `from`.
void check_ids(const uint32_t* ids, size_t n, uint64_t from)
{
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < from || ids[i] == UINT32_MAX) {
            char msg[200];
            std::snprintf(msg, sizeof msg,
                          "metric mirror: object id %u (object %zu) is not above the ids before "
                          "it; ids must increase and stay below 2^32 - 1",
                          ids[i], i);
            invalid(msg);
        }
        from = uint64_t(ids[i]) + 1;
    }
}

}  // namespace

WordList to_word_list(const MetricWords& words)
{
    WordList list;
    if (words.n == 0)
        return list;
    if (words.offsets == nullptr || (words.code_points == nullptr &&
                                     words.offsets[words.n] != words.offsets[0]))
        invalid("metric words: " + std::to_string(words.n) + " words without their arrays");
    for (size_t i = 0; i < words.n; i++) {
        if (words.offsets[i + 1] < words.offsets[i])
            invalid("metric words: offsets decrease at word " + std::to_string(i) +
                    "; offsets must be nondecreasing");
        list.push_back(WordView{words.code_points + words.offsets[i],
                                size_t(words.offsets[i + 1] - words.offsets[i])});
    }
    return list;
}

MetricMirror::MetricMirror(const MetricSpec& spec) : method_(spec.method)
{
    const size_t n = spec.words.n;
    if (!is_lc(spec.method) && spec.method != MetricMethod::SparseSpatialSelection)
        invalid("metric mirror: unknown method " + std::to_string(uint32_t(spec.method)));
    if (n >= UINT32_MAX)
        invalid("metric mirror: " + std::to_string(n) + " objects; at most 2^32 - 2");
    if (n > 0 && spec.labels == nullptr)
        invalid("metric mirror: objects need their labels");
    labels_.assign(spec.labels, spec.labels + n);
    if (spec.ids != nullptr) {
        check_ids(spec.ids, n, 0);
        ids_.assign(spec.ids, spec.ids + n);
    } else {
        ids_.resize(n);
        std::iota(ids_.begin(), ids_.end(), 0u);
    }
    removed_.assign(n, 0);
    for (size_t x = 0; spec.removed != nullptr && x < n; x++)
        removed_[x] = spec.removed[x] != 0;
    live_ = size_t(std::count(removed_.begin(), removed_.end(), uint8_t(0)));
    // The arrays of the structure, and the parameters both devices refuse
    // alike (the engine's restore checks the rest, as the GPU index does).
    if (is_lc(method_)) {
        if (spec.bucket < 1)
            invalid("metric mirror: a list of clusters needs a bucket size of at least 1");
        if (spec.clusters > 0 && (spec.centres == nullptr || spec.radii == nullptr))
            invalid("metric mirror: " + std::to_string(spec.clusters) +
                    " clusters without their centres and radii");
        if (n > 0 && spec.cluster_of == nullptr)
            invalid("metric mirror: objects without their clusters");
        radii_.assign(spec.radii, spec.radii + spec.clusters);
    } else {
        if (!(spec.alpha > 0.0 && spec.alpha <= 1.0))
            invalid("metric mirror: SSS alpha " + std::to_string(spec.alpha) +
                    " outside (0, 1]");
        if (spec.pivots > 0 && (spec.pivot_ids == nullptr || (n > 0 && spec.table == nullptr)))
            invalid("metric mirror: " + std::to_string(spec.pivots) +
                    " pivots without their ids and table");
        pivots_ = spec.pivots;
    }
}

void MetricMirror::check_usable() const
{
    if (broken_)
        throw Error(ErrorKind::Internal,
                    "metric mirror: an earlier change failed halfway; drop the mirror and load it "
                    "again");
}

void MetricMirror::add(const MetricWords& words, const int64_t* labels,
                       const MetricPlacements& placements, const uint32_t* ids)
{
    check_usable();
    const size_t n = words.n;
    if (n == 0)
        return;
    if (labels == nullptr)
        invalid("metric mirror: added objects need their labels");
    if (objects() + n >= UINT32_MAX)
        invalid("metric mirror: more than 2^32 - 2 objects");
    const WordList list = to_word_list(words);
    std::vector<uint32_t> new_ids(n);
    if (ids != nullptr) {
        check_ids(ids, n, next_id());
        new_ids.assign(ids, ids + n);
    } else {
        if (uint64_t(next_id()) + n >= UINT32_MAX)
            invalid("metric mirror: object ids past 2^32 - 2");
        std::iota(new_ids.begin(), new_ids.end(), next_id());
    }
    // Every placement checked against the state the earlier ones leave.
    std::vector<uint32_t> radii = radii_;
    if (is_lc(method_)) {
        if (placements.clusters == nullptr)
            invalid("metric mirror: inserts into a list of clusters need their clusters");
        for (size_t i = 0; i < n; i++) {
            const LcPlacement p = placements.clusters[i];
            check_lc_placement(radii.size(), p, p.cluster < radii.size() ? radii[p.cluster] : 0);
            if (p.cluster == radii.size())
                radii.push_back(0);
            else
                radii[p.cluster] = p.radius;
        }
    } else if (pivots_ > 0 && placements.table_rows == nullptr) {
        invalid("metric mirror: inserts into an SSS index need their table rows");
    }
    try {
        append(list, labels, placements);
    } catch (...) {
        broken_ = true;
        throw;
    }
    labels_.insert(labels_.end(), labels, labels + n);
    ids_.insert(ids_.end(), new_ids.begin(), new_ids.end());
    removed_.resize(removed_.size() + n, 0);
    live_ += n;
    radii_.swap(radii);
}

bool MetricMirror::catch_up(const MetricSpec& newer)
{
    check_usable();
    const size_t old = objects(), n = newer.words.n;
    if (newer.method != method_ || newer.ids != nullptr || n < old || (n > 0 && newer.labels == nullptr))
        return false;
    if (ids_.size() != old || (old > 0 && ids_.back() != old - 1))
        return false;  // a part of a placed mirror: its ids are not 0..n-1
    if (!std::equal(labels_.begin(), labels_.end(), newer.labels))
        return false;
    std::vector<uint32_t> gone;
    for (size_t x = 0; x < old; x++) {
        const bool now = newer.removed != nullptr && newer.removed[x] != 0;
        if (removed_[x] && !now)
            return false;  // removed objects stay removed
        if (now && !removed_[x])
            gone.push_back(uint32_t(x));
    }
    for (size_t x = old; x < n; x++)
        if (newer.removed != nullptr && newer.removed[x] != 0)
            return false;  // appended and removed between the states: load afresh
    std::vector<LcPlacement> where;
    if (is_lc(method_)) {
        if (newer.clusters < radii_.size() || (n > old && newer.cluster_of == nullptr) ||
            (newer.clusters > 0 && (newer.centres == nullptr || newer.radii == nullptr)))
            return false;
        // Clusters before the last never change radius; the last may grow.
        for (size_t c = 0; c < radii_.size(); c++)
            if (c + 1 < radii_.size() ? newer.radii[c] != radii_[c] : newer.radii[c] < radii_[c])
                return false;
        size_t clusters = radii_.size();
        for (size_t x = old; x < n; x++) {
            const uint32_t c = newer.cluster_of[x];
            if (c > clusters || c >= newer.clusters)
                return false;
            if (c == clusters) {
                // A new cluster is opened by its centre, the object that made it.
                if (newer.centres[c] != x)
                    return false;
                where.push_back(LcPlacement{c, 0});
                clusters++;
            } else {
                where.push_back(LcPlacement{c, newer.radii[c]});
            }
        }
        if (clusters != newer.clusters)
            return false;
        // The placements the insert rule can make, in order (add() would
        // refuse any other, after the removals below).
        std::vector<uint32_t> radii = radii_;
        for (const LcPlacement& p : where) {
            try {
                check_lc_placement(radii.size(), p, p.cluster < radii.size() ? radii[p.cluster] : 0);
            } catch (const Error&) {
                return false;
            }
            if (p.cluster == radii.size())
                radii.push_back(0);
            else
                radii[p.cluster] = p.radius;
        }
        if (!std::equal(radii.begin(), radii.end(), newer.radii))
            return false;
    } else if (newer.pivots != pivots_ || (pivots_ > 0 && n > old && newer.table == nullptr)) {
        return false;
    }

    if (!gone.empty())
        remove_positions(gone);
    if (n > old) {
        const uint64_t first = newer.words.offsets[old];
        std::vector<uint64_t> offsets(n - old + 1);
        for (size_t x = old; x <= n; x++)
            offsets[x - old] = newer.words.offsets[x] - first;
        const MetricWords added{n - old, newer.words.code_points + first, offsets.data()};
        MetricPlacements placements;
        placements.clusters = where.empty() ? nullptr : where.data();
        placements.table_rows = pivots_ > 0 ? newer.table + old * pivots_ : nullptr;
        add(added, newer.labels + old, placements);
    }
    return true;
}

size_t MetricMirror::remove(size_t n, const int64_t* labels)
{
    check_usable();
    if (n == 0)
        return 0;
    if (labels == nullptr)
        invalid("metric mirror: no labels to remove");
    std::vector<int64_t> gone(labels, labels + n);
    std::sort(gone.begin(), gone.end());
    std::vector<uint32_t> positions;
    for (uint32_t x = 0; x < labels_.size(); x++)
        if (!removed_[x] && std::binary_search(gone.begin(), gone.end(), labels_[x]))
            positions.push_back(x);
    if (positions.empty())
        return 0;
    remove_positions(positions);
    return positions.size();
}

void MetricMirror::remove_positions(const std::vector<uint32_t>& positions)
{
    try {
        mark_removed(positions);
    } catch (...) {
        broken_ = true;
        throw;
    }
    for (uint32_t x : positions)
        removed_[x] = 1;
    live_ -= positions.size();
}

void MetricMirror::range_batch(const MetricWords& queries, const uint32_t* radii, size_t nradii,
                               MetricHits& out)
{
    check_usable();
    if ((nradii != queries.n && nradii != 1) || (nradii > 0 && radii == nullptr)) {
        char msg[160];
        std::snprintf(msg, sizeof msg,
                      "metric range search: %zu radii for %zu queries; give one radius per "
                      "query, or one for all",
                      nradii, queries.n);
        invalid(msg);
    }
    to_hits(search_range(to_word_list(queries), std::vector<uint32_t>(radii, radii + nradii)),
            out);
}

void MetricMirror::knn_batch(const MetricWords& queries, size_t k, MetricHits& out)
{
    check_usable();
    to_hits(search_knn(to_word_list(queries), k), out);
}

void MetricMirror::to_hits(const MetricBatchResult& result, MetricHits& out) const
{
    out.offsets = result.offsets;
    const size_t nq = result.offsets.empty() ? 0 : result.offsets.size() - 1;
    out.evaluations.assign(nq, 0);
    for (size_t q = 0; q < nq && q < result.stats.size(); q++)
        out.evaluations[q] = result.stats[q].distance_evaluations;
    const size_t n = result.hits.size();
    out.ids.resize(n);
    out.labels.resize(n);
    out.distances.resize(n);
    for (size_t i = 0; i < n; i++) {
        const MetricHit& h = result.hits[i];
        if (h.id >= labels_.size())
            throw Error(ErrorKind::Internal, "metric mirror: the device answered object " +
                                                 std::to_string(h.id) + " of " +
                                                 std::to_string(labels_.size()));
        out.ids[i] = ids_[h.id];
        out.labels[i] = labels_[h.id];
        out.distances[i] = h.dist;
    }
}

namespace {

// The CPU emulation's mirror: the engine's index, restored from the state
// and searched on one thread (as the emulation runs everything).
class EngineMetricMirror final : public MetricMirror {
public:
    explicit EngineMetricMirror(const MetricSpec& spec) : MetricMirror(spec)
    {
        const size_t n = spec.words.n;
        WordList words = to_word_list(spec.words);
        std::vector<uint8_t> removed(n, 0);
        if (spec.removed != nullptr)
            removed.assign(spec.removed, spec.removed + n);
        if (method() == MetricMethod::ListOfClusters) {
            lc_ = ListOfClusters::restore(
                std::move(words), std::move(removed), spec.bucket,
                std::vector<uint32_t>(spec.centres, spec.centres + spec.clusters),
                std::vector<uint32_t>(spec.radii, spec.radii + spec.clusters),
                std::vector<uint32_t>(spec.cluster_of, spec.cluster_of + n));
        } else {
            sss_ = SparseSpatialSelection::restore(
                std::move(words), std::move(removed), spec.alpha, spec.max_distance,
                std::vector<uint32_t>(spec.pivot_ids, spec.pivot_ids + spec.pivots),
                std::vector<uint8_t>(spec.table, spec.table + n * spec.pivots));
        }
    }

    size_t bytes() const override
    {
        const MetricIndex& idx = index();
        size_t total = size_t(idx.words().offsets()[idx.size()]) * sizeof(uint32_t) +
                       (idx.size() + 1) * sizeof(uint64_t) + idx.size();
        if (lc_)
            total += lc_->clusters() * 2 * sizeof(uint32_t) + lc_->size() * sizeof(uint32_t);
        else
            total += sss_->size() * (sss_->pivots() + 1) + sss_->pivots() * sizeof(uint32_t);
        return total;
    }

protected:
    void append(const WordList& words, const int64_t*, const MetricPlacements& placements) override
    {
        for (size_t i = 0; i < words.size(); i++) {
            if (lc_)
                lc_->insert_at(words[i], placements.clusters[i]);
            else
                sss_->insert_at(words[i], placements.table_rows
                                              ? placements.table_rows + i * sss_->pivots()
                                              : nullptr);
        }
    }
    void mark_removed(const std::vector<uint32_t>& positions) override
    {
        for (uint32_t x : positions)
            index().remove(x);
    }
    MetricBatchResult search_range(const WordList& queries,
                                   const std::vector<uint32_t>& radii) override
    {
        return range_search_batch(index(), queries, radii, 1);
    }
    MetricBatchResult search_knn(const WordList& queries, size_t k) override
    {
        return knn_search_batch(index(), queries, k, 1);
    }

private:
    const MetricIndex& index() const
    {
        return lc_ ? static_cast<const MetricIndex&>(*lc_) : *sss_;
    }
    MetricIndex& index() { return lc_ ? static_cast<MetricIndex&>(*lc_) : *sss_; }

    std::unique_ptr<ListOfClusters> lc_;
    std::unique_ptr<SparseSpatialSelection> sss_;
};

}  // namespace

std::unique_ptr<MetricMirror> make_engine_metric_mirror(const MetricSpec& spec)
{
    return std::make_unique<EngineMetricMirror>(spec);
}

size_t metric_mirror_bytes(const MetricSpec& spec)
{
    const size_t n = spec.words.n;
    const size_t cps =
        n > 0 && spec.words.offsets ? size_t(spec.words.offsets[n] - spec.words.offsets[0]) : 0;
    // Words, offsets and removed flags; the LC's centres, radii and
    // buckets, or the SSS's table (in tiles of 64 objects), pivot flags
    // and ids; a quarter more for the room inserts grow into.
    size_t total = cps * sizeof(uint32_t) + (n + 1) * sizeof(uint64_t) + n;
    if (is_lc(spec.method))
        total += spec.clusters * 3 * sizeof(uint32_t) + (n + 1) * sizeof(uint32_t);
    else
        total += (n + 63) / 64 * 64 * spec.pivots + n + spec.pivots * sizeof(uint32_t);
    return total + total / 4;
}

std::unique_ptr<MetricMirror> ComputeDevice::create_metric_mirror(const MetricSpec&)
{
    throw Error(ErrorKind::Unsupported, description() + ": this device keeps no metric mirrors");
}

}  // namespace gpuivfpq
