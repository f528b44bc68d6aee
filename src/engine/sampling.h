// Seeded, platform-independent randomness for training: the one generator
// the CPU engine and the GPU k-means (gpu/) both draw from on the host, so
// that one seed gives both the same training rows and initial centroids.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gpuivfpq {

// Deterministic 64-bit generator (splitmix64): the same stream on every
// platform and compiler, unlike std:: distributions.
class Rng {
public:
    explicit Rng(uint64_t seed) : state_(seed) {}
    uint64_t next();
    // Uniform-ish integer in [0, n) for n >= 1 (multiply-shift; bias < 2^-32).
    size_t below(size_t n);
    // Uniform float in [0, 1).
    float unit();

private:
    uint64_t state_;
};

// k distinct indices of [0, n) (k <= n), ascending, drawn from rng.
std::vector<size_t> sample_indices(size_t n, size_t k, Rng& rng);

}  // namespace gpuivfpq
