// Exact distances between float vectors: single pairs and GEMM-backed blocks.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gpuivfpq {

// Metric ids are stored on disk (metapage): never renumber.
enum class Metric : uint8_t { L2 = 0, InnerProduct = 1, Cosine = 2 };

// Squared Euclidean distance ||a - b||^2.
float l2_sqr(const float* a, const float* b, size_t d);

// Dot product <a, b>.
float inner_product(const float* a, const float* b, size_t d);

// ||a||^2.
float norm_sqr(const float* a, size_t d);

// The ranking distance of a metric, smaller is closer:
// L2 -> ||a-b||^2, InnerProduct -> -<a,b>, Cosine -> 1 - cos(a,b).
// (The SQL operators return sqrt for L2; ranking by the square is the same.)
float metric_distance(Metric metric, const float* a, const float* b, size_t d);

// Scales each of the n rows of x (n x d, row-major) to unit length in place;
// zero rows stay zero.
void normalize_rows(float* x, size_t n, size_t d);

// out[i*ny + j] = <x_i, y_j> for x (nx x d) and y (ny x d): one GEMM.
void inner_products(const float* x, size_t nx, const float* y, size_t ny, size_t d, float* out);

// out[i*ny + j] = ||x_i - y_j||^2 via norms + GEMM (clamped at 0).
// y_norms (ny values of ||y_j||^2) may be null; it is computed then.
void l2_sqr_pairwise(const float* x, size_t nx, const float* y, size_t ny, size_t d,
                     float* out, const float* y_norms = nullptr);

}  // namespace gpuivfpq
