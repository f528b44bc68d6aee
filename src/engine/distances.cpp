// Exact float distances: vectorisable single-pair kernels and GEMM-backed blocks.
#include "distances.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "error.h"
#include "inner_product.h"
#include "internal.h"

namespace gpuivfpq {

namespace {

// Independent lanes let GCC vectorise the reductions below without
// -ffast-math; 16 lanes = two AVX2 accumulators, enough to hide FMA latency
// at typical d without a long scalar tail.
constexpr size_t kLanes = 16;

// Sums the lanes in a fixed tree order (deterministic results).
inline float sum_lanes(float* acc)
{
    for (size_t w = kLanes / 2; w > 0; w /= 2)
        for (size_t l = 0; l < w; l++)
            acc[l] += acc[l + w];
    return acc[0];
}

}  // namespace

GPU_IVFPQ_HOT
float l2_sqr(const float* a, const float* b, size_t d)
{
    float acc[kLanes] = {};
    size_t i = 0;
    for (; i + kLanes <= d; i += kLanes) {
        for (size_t l = 0; l < kLanes; l++) {
            const float t = a[i + l] - b[i + l];
            acc[l] += t * t;
        }
    }
    float tail = 0.0f;
    for (; i < d; i++) {
        const float t = a[i] - b[i];
        tail += t * t;
    }
    return sum_lanes(acc) + tail;
}

GPU_IVFPQ_HOT
float inner_product(const float* a, const float* b, size_t d)
{
    return inner_product_lanes(a, b, d);
}

float norm_sqr(const float* a, size_t d)
{
    return inner_product(a, a, d);
}

float metric_distance(Metric metric, const float* a, const float* b, size_t d)
{
    switch (metric) {
    case Metric::L2:
        return l2_sqr(a, b, d);
    case Metric::InnerProduct:
        return -inner_product(a, b, d);
    case Metric::Cosine: {
        // A zero vector has no direction: treat it as orthogonal (cos = 0),
        // which is also what normalize_rows + inner product yields.
        const double na = norm_sqr(a, d), nb = norm_sqr(b, d);
        if (!(na > 0.0) || !(nb > 0.0))
            return 1.0f;
        return float(1.0 - double(inner_product(a, b, d)) / std::sqrt(na * nb));
    }
    }
    throw Error(ErrorKind::InvalidArgument, "metric_distance: unknown metric");
}

void normalize_rows(float* x, size_t n, size_t d)
{
    for (size_t i = 0; i < n; i++)
        normalize_row(x + i * d, d);
}

void inner_products(const float* x, size_t nx, const float* y, size_t ny, size_t d, float* out)
{
    require(d >= 1, "inner_products: dimension must be at least 1");
    if (nx == 0 || ny == 0)
        return;
    require(x && y && out, "inner_products: null pointer");
    detail::gemm_nt(nx, ny, d, x, d, y, d, out, ny);
}

void l2_sqr_pairwise(const float* x, size_t nx, const float* y, size_t ny, size_t d, float* out,
                     const float* y_norms)
{
    require(d >= 1, "l2_sqr_pairwise: dimension must be at least 1");
    if (nx == 0 || ny == 0)
        return;
    require(x && y && out, "l2_sqr_pairwise: null pointer");
    std::vector<float> own_norms;
    if (!y_norms) {
        own_norms.resize(ny);
        for (size_t j = 0; j < ny; j++)
            own_norms[j] = norm_sqr(y + j * d, d);
        y_norms = own_norms.data();
    }
    detail::gemm_nt(nx, ny, d, x, d, y, d, out, ny);
    for (size_t i = 0; i < nx; i++) {
        const float xn = norm_sqr(x + i * d, d);
        float* row = out + i * ny;
        // Cancellation can push tiny distances below zero; clamp them.
        for (size_t j = 0; j < ny; j++)
            row[j] = std::max(0.0f, xn + y_norms[j] - 2.0f * row[j]);
    }
}

}  // namespace gpuivfpq
