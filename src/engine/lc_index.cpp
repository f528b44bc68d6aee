// List of Clusters: the build by sum of distances, exact range and k-NN
// queries with the early stop, and the insert rule that keeps them exact.
#include "lc_index.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "error.h"
#include "parallel.h"

namespace gpuivfpq {

namespace {

// Below this many distances a parallel_for costs more than it saves.
constexpr size_t kParallelMin = 2048;

// The bucket size, refused when 0 (a list of clusters needs buckets).
size_t checked_bucket(size_t bucket)
{
    require(bucket >= 1, "list of clusters: bucket size must be at least 1");
    return bucket;
}

}  // namespace

ListOfClusters::ListOfClusters(WordList words, size_t bucket, int threads)
    : MetricIndex(std::move(words)), bucket_(checked_bucket(bucket))
{
    // rem: the remaining objects, ascending, so a first maximum or minimum
    // found in order is the one with the smaller id.
    std::vector<uint32_t> rem(size());
    std::iota(rem.begin(), rem.end(), 0u);
    std::vector<uint64_t> sum(size(), 0);
    std::vector<uint32_t> dist, order;
    std::vector<uint8_t> taken;
    bool first = true;
    while (!rem.empty()) {
        size_t pick = 0;
        if (!first) {
            for (size_t i = 1; i < rem.size(); i++)
                if (sum[rem[i]] > sum[rem[pick]])
                    pick = i;
        }
        first = false;
        const uint32_t c = rem[pick];
        rem.erase(rem.begin() + long(pick));

        const size_t nr = rem.size();
        const EditPattern pattern(words_[c]);
        dist.resize(nr);
        parallel_for(nr, nr >= kParallelMin ? threads : 1, [&](size_t begin, size_t end) {
            for (size_t j = begin; j < end; j++)
                dist[j] = pattern.distance(words_[rem[j]]);
        });
        build_evaluations_ += nr;

        // The bucket: the `bucket_` remaining objects nearest to c, by
        // (distance, id); positions j index rem and dist.
        const size_t take = std::min(bucket_, nr);
        order.resize(nr);
        std::iota(order.begin(), order.end(), 0u);
        auto nearer = [&](uint32_t a, uint32_t b) {
            return dist[a] < dist[b] || (dist[a] == dist[b] && rem[a] < rem[b]);
        };
        if (take < nr)
            std::nth_element(order.begin(), order.begin() + long(take), order.end(), nearer);
        Cluster cluster{c, 0, {}};
        cluster.bucket.reserve(take);
        taken.assign(nr, 0);
        for (size_t t = 0; t < take; t++) {
            cluster.bucket.push_back(rem[order[t]]);
            cluster.radius = std::max(cluster.radius, dist[order[t]]);
            taken[order[t]] = 1;
        }
        std::sort(cluster.bucket.begin(), cluster.bucket.end());
        clusters_.push_back(std::move(cluster));

        // The rest stays, each adding its distance to c to its sum.
        size_t kept = 0;
        for (size_t j = 0; j < nr; j++) {
            if (taken[j])
                continue;
            sum[rem[j]] += dist[j];
            rem[kept++] = rem[j];
        }
        rem.resize(kept);
    }
}

ListOfClusters::ListOfClusters(WordList words, std::vector<uint8_t> removed, size_t bucket)
    : MetricIndex(std::move(words), std::move(removed)), bucket_(checked_bucket(bucket))
{
}

std::vector<uint32_t> ListOfClusters::cluster_assignment() const
{
    std::vector<uint32_t> cluster_of(size(), 0);
    for (size_t c = 0; c < clusters_.size(); c++) {
        cluster_of[clusters_[c].centre] = uint32_t(c);
        for (uint32_t x : clusters_[c].bucket)
            cluster_of[x] = uint32_t(c);
    }
    return cluster_of;
}

std::unique_ptr<ListOfClusters> ListOfClusters::restore(WordList words,
                                                        std::vector<uint8_t> removed,
                                                        size_t bucket,
                                                        const std::vector<uint32_t>& centres,
                                                        const std::vector<uint32_t>& radii,
                                                        const std::vector<uint32_t>& cluster_of)
{
    std::unique_ptr<ListOfClusters> lc(
        new ListOfClusters(std::move(words), std::move(removed), bucket));
    const size_t n = lc->size();
    const size_t nc = centres.size();
    char msg[200];
    if (radii.size() != nc || cluster_of.size() != n || (n == 0) != (nc == 0) || nc > n) {
        std::snprintf(msg, sizeof msg,
                      "list of clusters: cannot restore %zu centres, %zu radii and %zu cluster "
                      "numbers over %zu objects",
                      nc, radii.size(), cluster_of.size(), n);
        throw Error(ErrorKind::InvalidArgument, msg);
    }
    lc->clusters_.resize(nc);
    for (size_t c = 0; c < nc; c++) {
        const uint32_t x = centres[c];
        if (x >= n || cluster_of[x] != c) {
            std::snprintf(msg, sizeof msg,
                          "list of clusters: centre %u of cluster %zu is %s", x, c,
                          x >= n ? "not an object of the index" : "assigned to another cluster");
            throw Error(ErrorKind::InvalidArgument, msg);
        }
        lc->clusters_[c].centre = x;
        lc->clusters_[c].radius = radii[c];
    }
    // Ascending ids: the order the build sorts buckets in and inserts append in.
    for (uint32_t x = 0; x < n; x++) {
        const uint32_t c = cluster_of[x];
        if (c >= nc) {
            std::snprintf(msg, sizeof msg,
                          "list of clusters: object %u is in cluster %u of %zu", x, c, nc);
            throw Error(ErrorKind::InvalidArgument, msg);
        }
        if (lc->clusters_[c].centre != x)
            lc->clusters_[c].bucket.push_back(x);
    }
    return lc;
}

LcPlacement ListOfClusters::placement(WordView w) const
{
    const EditPattern pattern(w);
    // Invariant (2) holds for every cluster passed over: the object is
    // farther than its radius from each such centre.
    for (size_t c = 0; c < clusters_.size(); c++) {
        const Cluster& cluster = clusters_[c];
        if (pattern.within(words_[cluster.centre], cluster.radius) <= cluster.radius)
            return LcPlacement{uint32_t(c), cluster.radius};
    }
    // No later cluster exists to break (2) when the last radius grows.
    if (!clusters_.empty() && clusters_.back().bucket.size() < bucket_) {
        const Cluster& last = clusters_.back();
        return LcPlacement{uint32_t(clusters_.size() - 1),
                           std::max(last.radius, pattern.distance(words_[last.centre]))};
    }
    return LcPlacement{uint32_t(clusters_.size()), 0};
}

void ListOfClusters::place(uint32_t id) { place_at(id, placement(words_[id])); }

void ListOfClusters::place_at(uint32_t id, LcPlacement p)
{
    if (p.cluster == clusters_.size()) {
        clusters_.push_back(Cluster{id, 0, {}});
        return;
    }
    Cluster& cluster = clusters_[p.cluster];
    cluster.bucket.push_back(id);
    cluster.radius = p.radius;
}

void check_lc_placement(size_t clusters, LcPlacement p, uint32_t radius)
{
    const char* why = nullptr;
    if (p.cluster > clusters)
        why = "there is no such cluster";
    else if (p.cluster == clusters && p.radius != 0)
        why = "a new cluster starts with radius 0";
    else if (p.cluster < clusters && p.radius < radius)
        why = "a radius never shrinks (its bucket must stay covered)";
    else if (size_t(p.cluster) + 1 < clusters && p.radius != radius)
        why = "only the last cluster's radius grows (invariant 2 of the later clusters)";
    if (why == nullptr)
        return;
    char msg[240];
    std::snprintf(msg, sizeof msg,
                  "list of clusters: cannot insert into cluster %u with radius %u (%zu clusters): "
                  "%s",
                  p.cluster, p.radius, clusters, why);
    throw Error(ErrorKind::InvalidArgument, msg);
}

uint32_t ListOfClusters::insert_at(WordView w, LcPlacement p)
{
    const size_t nc = clusters_.size();
    check_lc_placement(nc, p, p.cluster < nc ? clusters_[p.cluster].radius : 0);
    return insert_with(w, [this, p](uint32_t id) { place_at(id, p); });
}

std::vector<MetricHit> ListOfClusters::range(WordView q, uint32_t r, MetricStats* stats) const
{
    const EditPattern pattern(q);
    std::vector<MetricHit> hits;
    uint64_t evaluations = 0;
    for (const Cluster& cluster : clusters_) {
        // Exact up to radius + r, all the rules below need.
        const uint32_t reach = detail::saturating_add(cluster.radius, r);
        const uint32_t d = pattern.within(words_[cluster.centre], reach);
        evaluations++;
        if (d <= r && !removed_[cluster.centre])
            hits.push_back({cluster.centre, d});
        if (d <= reach) {
            for (uint32_t x : cluster.bucket) {
                if (removed_[x])
                    continue;
                const uint32_t dx = pattern.within(words_[x], r);
                evaluations++;
                if (dx <= r)
                    hits.push_back({x, dx});
            }
        }
        // d < radius - r: the query ball lies inside this cluster's ball,
        // and every later object is at >= radius from the centre.
        if (uint64_t(d) + r < cluster.radius)
            break;
    }
    if (stats)
        *stats = MetricStats{evaluations, live_};
    detail::sort_hits(hits);
    return hits;
}

std::vector<MetricHit> ListOfClusters::knn(WordView q, size_t k, MetricStats* stats) const
{
    if (k == 0) {
        if (stats)
            *stats = MetricStats{0, live_};
        return {};
    }
    const EditPattern pattern(q);
    TopK top(k);
    uint64_t evaluations = 0;
    for (const Cluster& cluster : clusters_) {
        // The pruning radius is the current k-th distance: an object at
        // exactly that distance may still win on its smaller id, so only
        // objects known to be farther are skipped.
        uint32_t r = detail::knn_radius(top);
        const uint32_t d =
            pattern.within(words_[cluster.centre], detail::saturating_add(cluster.radius, r));
        evaluations++;
        if (d <= r && !removed_[cluster.centre])
            detail::knn_offer(top, cluster.centre, d);
        r = detail::knn_radius(top);
        if (d <= detail::saturating_add(cluster.radius, r)) {
            for (uint32_t x : cluster.bucket) {
                if (removed_[x])
                    continue;
                const uint32_t dx = pattern.within(words_[x], r);
                evaluations++;
                if (dx <= r) {
                    detail::knn_offer(top, x, dx);
                    r = detail::knn_radius(top);
                }
            }
        }
        if (uint64_t(d) + r < cluster.radius)
            break;
    }
    if (stats)
        *stats = MetricStats{evaluations, live_};
    return detail::knn_hits(top);
}

}  // namespace gpuivfpq
