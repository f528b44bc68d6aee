// Shared helpers for the engine unit tests: seeded data and float64 references.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "engine/distances.h"
#include "engine/error.h"
#include "engine/internal.h"

namespace testutil {

// The seed a test uses: GPU_IVFPQ_TEST_SEED overrides the default, so a
// failure's printed seed can be replayed.
inline uint64_t test_seed(uint64_t fallback)
{
    const char* env = std::getenv("GPU_IVFPQ_TEST_SEED");
    return env ? std::strtoull(env, nullptr, 10) : fallback;
}

// n x d floats uniform in [lo, hi).
inline std::vector<float> uniform_vectors(size_t n, size_t d, uint64_t seed, float lo = -1.0f,
                                          float hi = 1.0f)
{
    std::mt19937_64 gen(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n * d);
    for (float& x : v)
        x = u(gen);
    return v;
}

// n x d standard normal floats.
inline std::vector<float> gaussian_vectors(size_t n, size_t d, uint64_t seed)
{
    std::mt19937_64 gen(seed);
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<float> v(n * d);
    for (float& x : v)
        x = g(gen);
    return v;
}

// n points around `clusters` gaussian centres (centres ~ N(0, spread^2),
// points = centre + N(0, 1)): overlapping when spread is small.
inline std::vector<float> clustered_vectors(size_t n, size_t d, size_t clusters, float spread,
                                            uint64_t seed)
{
    std::mt19937_64 gen(seed);
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<float> centres(clusters * d);
    for (float& x : centres)
        x = spread * g(gen);
    std::uniform_int_distribution<size_t> pick(0, clusters - 1);
    std::vector<float> v(n * d);
    for (size_t i = 0; i < n; i++) {
        const size_t c = pick(gen);
        for (size_t t = 0; t < d; t++)
            v[i * d + t] = centres[c * d + t] + g(gen);
    }
    return v;
}

inline double ip_ref(const float* a, const float* b, size_t d)
{
    double s = 0.0;
    for (size_t i = 0; i < d; i++)
        s += double(a[i]) * double(b[i]);
    return s;
}

inline double l2_ref(const float* a, const float* b, size_t d)
{
    double s = 0.0;
    for (size_t i = 0; i < d; i++) {
        const double t = double(a[i]) - double(b[i]);
        s += t * t;
    }
    return s;
}

// Float64 ranking distance of a metric (same conventions as metric_distance).
inline double metric_ref(gpuivfpq::Metric metric, const float* a, const float* b, size_t d)
{
    switch (metric) {
    case gpuivfpq::Metric::L2:
        return l2_ref(a, b, d);
    case gpuivfpq::Metric::InnerProduct:
        return -ip_ref(a, b, d);
    case gpuivfpq::Metric::Cosine: {
        const double na = ip_ref(a, a, d), nb = ip_ref(b, b, d);
        if (na == 0.0 || nb == 0.0)
            return 1.0;
        return 1.0 - ip_ref(a, b, d) / std::sqrt(na * nb);
    }
    }
    return 0.0;
}

inline const char* metric_name(gpuivfpq::Metric metric)
{
    switch (metric) {
    case gpuivfpq::Metric::L2: return "L2";
    case gpuivfpq::Metric::InnerProduct: return "IP";
    case gpuivfpq::Metric::Cosine: return "Cosine";
    }
    return "?";
}

// Forces the portable GEMM for the lifetime of the object (tests only).
class ScopedPortableGemm {
public:
    ScopedPortableGemm() { gpuivfpq::detail::set_force_portable_gemm(true); }
    ~ScopedPortableGemm() { gpuivfpq::detail::set_force_portable_gemm(false); }
    ScopedPortableGemm(const ScopedPortableGemm&) = delete;
    ScopedPortableGemm& operator=(const ScopedPortableGemm&) = delete;
};

}  // namespace testutil
