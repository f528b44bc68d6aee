// A metric index's mirror spread over several devices (1-stage: every part
// searches every query) and the merge of the parts' answers.
#include "gpu_process/placed_metric_mirror.h"

#include <algorithm>
#include <functional>
#include <string>

#include "engine/error.h"
#include "gpu_process/shard_merge.h"

namespace gpuivfpq {

namespace {

[[noreturn]] void invalid(const std::string& msg) { throw Error(ErrorKind::InvalidArgument, msg); }

// One part's share of an index as a MetricSpec, with the arrays it points
// to; its objects keep their positions in the whole index as ids.
struct PartState {
    std::vector<uint32_t> cps;
    std::vector<uint64_t> offsets{0};
    std::vector<int64_t> labels;
    std::vector<uint8_t> removed;
    std::vector<uint32_t> ids;
    std::vector<uint32_t> centres, radii, cluster_of;  // LC
    std::vector<uint32_t> pivots;                      // SSS
    std::vector<uint8_t> table;

    // Appends object x of whole (removed as it is, or anyway), returns its
    // position in the part.
    uint32_t take(const MetricSpec& whole, uint32_t x, bool removed_anyway)
    {
        const uint64_t begin = whole.words.offsets[x], end = whole.words.offsets[x + 1];
        if (end < begin)
            invalid("metric mirror: offsets decrease at word " + std::to_string(x));
        cps.insert(cps.end(), whole.words.code_points + begin, whole.words.code_points + end);
        offsets.push_back(cps.size());
        labels.push_back(whole.labels[x]);
        removed.push_back(removed_anyway || (whole.removed != nullptr && whole.removed[x] != 0));
        ids.push_back(x);
        return uint32_t(ids.size() - 1);
    }

    MetricSpec spec(const MetricSpec& whole) const
    {
        MetricSpec s;
        s.method = whole.method;
        s.words = MetricWords{ids.size(), cps.data(), offsets.data()};
        s.labels = labels.data();
        s.removed = removed.data();
        s.ids = ids.data();
        s.bucket = whole.bucket;
        s.clusters = centres.size();
        s.centres = centres.data();
        s.radii = radii.data();
        s.cluster_of = cluster_of.data();
        s.alpha = whole.alpha;
        s.max_distance = whole.max_distance;
        s.pivots = pivots.size();
        s.pivot_ids = pivots.data();
        s.table = table.data();
        return s;
    }
};

// LC: cluster c and its objects to part c % parts, as local cluster c / parts.
void split_clusters(const MetricSpec& whole, std::vector<PartState>& parts,
                    std::vector<uint32_t>& owner)
{
    const size_t n = whole.words.n, nc = whole.clusters, np = parts.size();
    std::vector<uint32_t> local(n);
    for (uint32_t x = 0; x < n; x++) {
        const uint32_t c = whole.cluster_of[x];
        if (c >= nc)
            invalid("metric mirror: object " + std::to_string(x) + " is in cluster " +
                    std::to_string(c) + " of " + std::to_string(nc));
        PartState& part = parts[c % np];
        local[x] = part.take(whole, x, false);
        part.cluster_of.push_back(uint32_t(c / np));
        owner[x] = uint32_t(c % np);
    }
    for (uint32_t c = 0; c < nc; c++) {
        const uint32_t x = whole.centres[c];
        if (x >= n || whole.cluster_of[x] != c)
            invalid("metric mirror: centre " + std::to_string(x) + " of cluster " +
                    std::to_string(c) + " is not an object of that cluster");
        parts[c % np].centres.push_back(local[x]);
        parts[c % np].radii.push_back(whole.radii[c]);
    }
}

// SSS: object x to part x % parts; every pivot to every part, removed on
// the parts that do not own it.
void split_objects(const MetricSpec& whole, std::vector<PartState>& parts,
                   std::vector<uint32_t>& owner)
{
    const size_t n = whole.words.n, npiv = whole.pivots, np = parts.size();
    std::vector<uint32_t> pivot_of(n, UINT32_MAX);
    for (uint32_t p = 0; p < npiv; p++) {
        if (whole.pivot_ids[p] >= n)
            invalid("metric mirror: pivot " + std::to_string(p) + " is object " +
                    std::to_string(whole.pivot_ids[p]) + " of " + std::to_string(n));
        pivot_of[whole.pivot_ids[p]] = p;
    }
    for (PartState& part : parts)
        part.pivots.assign(npiv, 0);
    for (uint32_t x = 0; x < n; x++) {
        owner[x] = uint32_t(x % np);
        for (size_t j = 0; j < np; j++) {
            if (j != owner[x] && pivot_of[x] == UINT32_MAX)
                continue;
            PartState& part = parts[j];
            const uint32_t at = part.take(whole, x, j != owner[x]);
            part.table.insert(part.table.end(), whole.table + size_t(x) * npiv,
                              whole.table + size_t(x + 1) * npiv);
            if (pivot_of[x] != UINT32_MAX)
                part.pivots[pivot_of[x]] = at;
        }
    }
}

}  // namespace

PlacedMetricMirror::PlacedMetricMirror(DeviceSet& set, std::vector<size_t> devices,
                                       const MetricSpec& spec)
    : MetricMirror(spec), set_(set), devices_(std::move(devices))
{
    if (devices_.empty())
        invalid("metric mirror: no devices to place it on");
    for (size_t d : devices_)
        if (d >= set_.size())
            invalid("metric mirror: no device " + std::to_string(d));
    std::vector<PartState> parts(devices_.size());
    owner_.assign(spec.words.n, 0);
    if (method() == MetricMethod::ListOfClusters)
        split_clusters(spec, parts, owner_);
    else
        split_objects(spec, parts, owner_);
    parts_.resize(parts.size());
    try {
        for (size_t j = 0; j < parts.size(); j++) {
            DeviceSet::Lease lease(set_, devices_[j]);
            parts_[j] = lease.device().create_metric_mirror(parts[j].spec(spec));
        }
    } catch (...) {
        for (size_t j = 0; j < parts_.size(); j++) {
            DeviceSet::Lease lease(set_, devices_[j]);
            parts_[j].reset();
        }
        throw;
    }
}

PlacedMetricMirror::~PlacedMetricMirror()
{
    // Each part frees its device memory while no other thread uses that device.
    for (size_t j = 0; j < parts_.size(); j++) {
        DeviceSet::Lease lease(set_, devices_[j]);
        parts_[j].reset();
    }
}

size_t PlacedMetricMirror::bytes_on(size_t device) const
{
    size_t total = 0;
    for (size_t j = 0; j < parts_.size(); j++)
        if (devices_[j] == device)
            total += parts_[j]->bytes();
    return total;
}

bool PlacedMetricMirror::whole() const
{
    for (size_t d : devices_)
        if (!set_.alive(d))
            return false;
    return true;
}

size_t PlacedMetricMirror::bytes() const
{
    size_t total = 0;
    for (const auto& part : parts_)
        total += part->bytes();
    return total;
}

void PlacedMetricMirror::on_parts(const std::function<void(MetricMirror&, size_t)>& call)
{
    if (!whole())
        throw Error(ErrorKind::Internal,
                    "a GPU holding part of this metric index's mirror failed; load it again");
    DeviceSet::in_parallel(parts_.size(), [&](size_t j) {
        DeviceSet::Lease lease(set_, devices_[j]);
        try {
            call(*parts_[j], j);
        } catch (const Error& e) {
            if (e.kind() == ErrorKind::Internal)
                (void)set_.check_health(devices_[j]);
            throw;
        }
    });
}

void PlacedMetricMirror::append(const WordList& words, const int64_t* labels,
                                const MetricPlacements& placements)
{
    const size_t np = parts_.size(), first = objects();
    const size_t npiv = pivots();
    std::vector<WordList> part_words(np);
    std::vector<std::vector<int64_t>> part_labels(np);
    std::vector<std::vector<uint32_t>> part_ids(np);
    std::vector<std::vector<LcPlacement>> part_clusters(np);
    std::vector<std::vector<uint8_t>> part_rows(np);
    std::vector<uint32_t> owners(words.size());
    for (size_t i = 0; i < words.size(); i++) {
        size_t j;
        if (method() == MetricMethod::ListOfClusters) {
            // The placements were checked against the whole index: a new
            // cluster is clusters() plus the new ones before it, and lands
            // on its part as that part's next cluster.
            const LcPlacement p = placements.clusters[i];
            j = p.cluster % np;
            part_clusters[j].push_back(LcPlacement{uint32_t(p.cluster / np), p.radius});
        } else {
            j = (first + i) % np;
            if (npiv > 0)
                part_rows[j].insert(part_rows[j].end(), placements.table_rows + i * npiv,
                                    placements.table_rows + (i + 1) * npiv);
        }
        part_words[j].push_back(words[i]);
        part_labels[j].push_back(labels[i]);
        part_ids[j].push_back(uint32_t(first + i));
        owners[i] = uint32_t(j);
    }
    on_parts([&](MetricMirror& part, size_t j) {
        if (part_ids[j].empty())
            return;
        const WordList& w = part_words[j];
        part.add(MetricWords{w.size(), w.code_points(), w.offsets()}, part_labels[j].data(),
                 MetricPlacements{part_clusters[j].data(), part_rows[j].data()},
                 part_ids[j].data());
    });
    owner_.insert(owner_.end(), owners.begin(), owners.end());
}

void PlacedMetricMirror::mark_removed(const std::vector<uint32_t>& positions)
{
    std::vector<std::vector<int64_t>> labels(parts_.size());
    for (uint32_t x : positions)
        labels[owner_[x]].push_back(label_at(x));
    on_parts([&](MetricMirror& part, size_t j) {
        if (!labels[j].empty())
            part.remove(labels[j].size(), labels[j].data());
    });
}

MetricBatchResult PlacedMetricMirror::merge(const std::vector<MetricHits>& answers, size_t nq,
                                            size_t keep) const
{
    // Each query's place in the answer first, then the queries merged on
    // several threads for large answers (a range at radius 3 over a million
    // words holds hundreds of hits a query).
    MetricBatchResult out;
    out.offsets.assign(nq + 1, 0);
    out.stats.resize(nq);
    size_t rows = 0;
    for (size_t q = 0; q < nq; q++) {
        uint64_t n = 0;
        for (const MetricHits& a : answers)
            n += a.offsets[q + 1] - a.offsets[q];
        rows += n;
        out.offsets[q + 1] = out.offsets[q] + std::min<uint64_t>(n, keep);
    }
    out.hits.resize(out.offsets[nq]);
    over_queries(nq, rows, [&](size_t first, size_t last) {
        std::vector<MetricHit> row;
        for (size_t q = first; q < last; q++) {
            row.clear();
            for (const MetricHits& a : answers) {
                for (uint64_t i = a.offsets[q]; i < a.offsets[q + 1]; i++)
                    row.push_back(MetricHit{a.ids[i], a.distances[i]});
                // Every part searched every query: the distances add up.
                if (q < a.evaluations.size())
                    out.stats[q].distance_evaluations += a.evaluations[q];
            }
            const size_t n = size_t(out.offsets[q + 1] - out.offsets[q]);
            std::partial_sort(row.begin(), row.begin() + long(n), row.end(), metric_hit_less);
            std::copy(row.begin(), row.begin() + long(n), out.hits.begin() + long(out.offsets[q]));
        }
    });
    return out;
}

MetricBatchResult PlacedMetricMirror::search_range(const WordList& queries,
                                                   const std::vector<uint32_t>& radii)
{
    std::vector<MetricHits> answers(parts_.size());
    const MetricWords q{queries.size(), queries.code_points(), queries.offsets()};
    on_parts([&](MetricMirror& part, size_t j) {
        part.range_batch(q, radii.data(), radii.size(), answers[j]);
        set_.count_search(devices_[j], queries.size());
    });
    return merge(answers, queries.size(), SIZE_MAX);
}

MetricBatchResult PlacedMetricMirror::search_knn(const WordList& queries, size_t k)
{
    // Each part's k nearest among its objects hold the whole index's k.
    std::vector<MetricHits> answers(parts_.size());
    const MetricWords q{queries.size(), queries.code_points(), queries.offsets()};
    on_parts([&](MetricMirror& part, size_t j) {
        part.knn_batch(q, k, answers[j]);
        set_.count_search(devices_[j], queries.size());
    });
    return merge(answers, queries.size(), k);
}

}  // namespace gpuivfpq
