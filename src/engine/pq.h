// Product quantizer: m sub-quantizers of 256 centroids (8-bit codes) each.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kmeans.h"

namespace gpuivfpq {

constexpr size_t kPqCentroids = 256;  // 2^nbits, nbits = 8

class ProductQuantizer {
public:
    // d must be a multiple of m.
    ProductQuantizer(size_t d, size_t m);

    size_t d() const { return d_; }
    size_t m() const { return m_; }
    size_t dsub() const { return dsub_; }

    // Codebooks, m x 256 x dsub floats (sub-quantizer j, centroid c at
    // ((j * 256) + c) * dsub).
    const std::vector<float>& codebooks() const { return codebooks_; }
    void set_codebooks(const float* data);  // copies m * 256 * dsub floats

    // Trains each sub-quantizer by k-means on the corresponding slice of x
    // (sub-quantizer j with seed pq_subquantizer_seed(params.seed, j)).
    void train(const float* x, size_t n, const KMeansParams& params);

    // codes: n x m bytes.
    void encode(const float* x, size_t n, uint8_t* codes, int threads = 1) const;
    void decode(const uint8_t* codes, size_t n, float* x) const;

    // Distance tables for one query q (d floats), each m x 256:
    // l2_table[j*256+c] = ||q_j - C_jc||^2 ; ip_table[j*256+c] = <q_j, C_jc>.
    void l2_table(const float* q, float* table) const;
    void ip_table(const float* q, float* table) const;

private:
    size_t d_, m_, dsub_;
    std::vector<float> codebooks_;
    // What encode derives from the codebooks alone (per sub-quantizer the
    // transposed codebook of the small-dimension kernel, or the codewords'
    // squared norms), built again whenever the codebooks change: an encode
    // of one row (an insert) built it per call, which was more than half of
    // an insert's time. Shared by copies (it never changes once built);
    // null until set_codebooks or train (encode then builds its own).
    struct Encoder;
    std::shared_ptr<const Encoder> encoder_;
    std::shared_ptr<const Encoder> make_encoder() const;
};

// The k-means seed of sub-quantizer j, decorrelating the slices; the GPU
// training (gpu/) uses it too.
inline uint64_t pq_subquantizer_seed(uint64_t seed, size_t j)
{
    return seed + 0x9E3779B97F4A7C15ULL * (uint64_t(j) + 1);
}

// Sum of table lookups for one code: sum_j table[j*256 + code[j]].
inline float adc_lookup(const uint8_t* code, const float* table, size_t m)
{
    float s = 0.0f;
    for (size_t j = 0; j < m; j++)
        s += table[j * kPqCentroids + code[j]];
    return s;
}

// ADC over n codes laid out with a byte stride between consecutive codes
// (stride >= m, so codes may sit interleaved with other data):
// out[i] = base + sum_j table[j*256 + codes[i*stride + j]], as
// rank_distance gives it (a sum that overflowed: kOverflowDistance).
void adc_scan(const uint8_t* codes, size_t n, size_t stride, const float* table, size_t m,
              float base, float* out);

}  // namespace gpuivfpq
