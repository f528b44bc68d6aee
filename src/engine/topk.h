// k-selection on the CPU: a bounded max-heap that keeps the k smallest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "distances.h"

namespace gpuivfpq {

// One candidate: a distance and a caller-defined 64-bit label.
struct Neighbor {
    float dist;
    int64_t label;
};

// Keeps the k candidates with the smallest distance (ties broken by the
// smaller label, so results are deterministic and comparable with the GPU).
class TopK {
public:
    explicit TopK(size_t k);

    size_t k() const { return k_; }
    size_t size() const { return heap_.size(); }

    // Distance a new candidate must beat to enter (+inf until k are held).
    float threshold() const
    {
        return heap_.size() < k_ ? std::numeric_limits<float>::infinity() : heap_.front().dist;
    }

    // Offers one candidate.
    void push(float dist, int64_t label);

    // Offers n candidates with labels label_base + i.
    void push_range(const float* dists, size_t n, int64_t label_base);

    // Empties the heap and returns the held candidates sorted ascending.
    std::vector<Neighbor> take_sorted();

private:
    size_t k_;
    std::vector<Neighbor> heap_;
};

// Strict weak order used everywhere for (dist, label): smaller dist first,
// then smaller label.
inline bool neighbor_less(const Neighbor& a, const Neighbor& b)
{
    return a.dist < b.dist || (a.dist == b.dist && a.label < b.label);
}

// Exact k-NN by brute force: for each of nq queries, the k nearest of the n
// base vectors under metric (ranking distance of metric_distance). Tiled so
// that the distance block stays within a fixed working set. Results are
// sorted ascending; rows with fewer than k base vectors are padded with
// (+inf, -1).
void brute_force_knn(const float* queries, size_t nq, const float* base, size_t n, size_t d,
                     Metric metric, size_t k, float* out_dist, int64_t* out_label);

}  // namespace gpuivfpq
