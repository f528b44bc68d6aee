// List of Clusters (Chávez & Navarro) over words under edit distance.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "metric_index.h"

namespace gpuivfpq {

// Where an insert puts an object: the cluster whose bucket takes it
// (clusters() for a new last cluster centred on it) and that cluster's
// radius after the insert. A copy of the index elsewhere (a GPU mirror)
// takes the object at the same placement without computing a distance.
struct LcPlacement {
    uint32_t cluster = 0;
    uint32_t radius = 0;
};

// Throws Error(InvalidArgument) unless p is a placement the insert rule can
// make in a list of `clusters` clusters whose cluster p.cluster has radius
// `radius` (ignored for a new cluster): what ListOfClusters::insert_at and
// a mirror of the index check before they take p.
void check_lc_placement(size_t clusters, LcPlacement p, uint32_t radius);

// A list of clusters, each a centre, a covering radius and a bucket, in
// creation order. Two invariants make queries exact (docs/metric-search.md):
//  (1) every object of cluster c's bucket is within radius(c) of centre(c);
//  (2) every object of a later cluster (its centre or bucket) is at distance
//      >= radius(c) from centre(c).
// Build: the first centre is object 0; each next centre is the remaining
// object with the largest sum of distances to the centres so far (ties: the
// smaller id); it takes the `bucket` remaining objects nearest to it (ties:
// the smaller id) and its radius is the largest of their distances (0 when
// it takes none).
class ListOfClusters : public MetricIndex {
public:
    // Builds over words (ids 0..n-1); bucket >= 1, else Error(InvalidArgument).
    // threads parallelise each centre's distances to the remaining objects;
    // the index is the same for any thread count.
    ListOfClusters(WordList words, size_t bucket, int threads = 1);

    size_t bucket_size() const { return bucket_; }
    size_t clusters() const { return clusters_.size(); }
    uint32_t centre(size_t c) const { return clusters_[c].centre; }
    uint32_t radius(size_t c) const { return clusters_[c].radius; }
    // The ids of cluster c's bucket (the centre not included).
    const std::vector<uint32_t>& members(size_t c) const { return clusters_[c].bucket; }
    // Distance evaluations of the build (the inserts not included).
    uint64_t build_evaluations() const { return build_evaluations_; }

    // The cluster of every object, by id: its own for a centre, else the one
    // whose bucket holds it. With bucket_size(), centre(c) and radius(c) it
    // is all of the index's state besides the words (what restore takes).
    std::vector<uint32_t> cluster_assignment() const;

    // An index restored from the state another one exposed: its words and
    // removed flags (one per word, nonzero: removed), its bucket size, the
    // centres and radii in creation order, and cluster_assignment(). Buckets
    // come back in ascending id order, as builds and inserts keep them, so
    // the restored index answers and takes inserts exactly as the original.
    // A state that is not a list of clusters (sizes that differ, an id or a
    // cluster out of range, a centre assigned to another cluster or centring
    // two) throws Error(InvalidArgument); invariants (1) and (2) are trusted,
    // since checking them costs a build's distances.
    static std::unique_ptr<ListOfClusters> restore(WordList words, std::vector<uint8_t> removed,
                                                   size_t bucket,
                                                   const std::vector<uint32_t>& centres,
                                                   const std::vector<uint32_t>& radii,
                                                   const std::vector<uint32_t>& cluster_of);

    // Scans the centres in creation order: reports a centre within r, scans
    // its bucket only when d(q, c) <= radius + r, stops after a centre with
    // d(q, c) < radius - r (no later object can be within r).
    std::vector<MetricHit> range(WordView q, uint32_t r,
                                 MetricStats* stats = nullptr) const override;
    // The range search with r = the current k-th distance, shrinking.
    std::vector<MetricHit> knn(WordView q, size_t k, MetricStats* stats = nullptr) const override;

    // Where insert(w) would put w now (the insert rule below), without
    // inserting it.
    LcPlacement placement(WordView w) const;
    // Inserts w at p, a placement the insert rule chose for w on an index in
    // this state (placement(), on this index or a copy of it); returns its
    // id. The distances behind p are trusted; a placement no insert makes
    // throws Error(InvalidArgument): a cluster past clusters(), a new
    // cluster with a radius other than 0, a radius that shrinks, or one
    // that grows on a cluster other than the last (invariant 2).
    uint32_t insert_at(WordView w, LcPlacement p);

private:
    // An index with words and removed flags and no clusters yet (restore).
    ListOfClusters(WordList words, std::vector<uint8_t> removed, size_t bucket);

    // Insert rule: the bucket of the first centre c with d <= radius(c);
    // else the last cluster's bucket (growing its radius) while it holds
    // fewer than `bucket` objects; else a new last cluster, centred on it.
    void place(uint32_t id) override;
    // Puts object id where p says (p checked by insert_at).
    void place_at(uint32_t id, LcPlacement p);

    struct Cluster {
        uint32_t centre;
        uint32_t radius;
        std::vector<uint32_t> bucket;
    };

    size_t bucket_;
    std::vector<Cluster> clusters_;
    uint64_t build_evaluations_ = 0;
};

}  // namespace gpuivfpq
