// Product quantizer: per-slice k-means training, encoding, tables and ADC scans.
#include "pq.h"
#include "interrupt.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "distances.h"
#include "error.h"
#include "internal.h"
#include "parallel.h"
#include "search_limits.h"

namespace gpuivfpq {

ProductQuantizer::ProductQuantizer(size_t d, size_t m) : d_(d), m_(m), dsub_(0)
{
    require(d >= 1, "product quantizer: dimension must be at least 1");
    require(m >= 1, "product quantizer: m must be at least 1");
    require(d % m == 0, "product quantizer: dimension " + std::to_string(d) +
                            " is not a multiple of m = " + std::to_string(m));
    dsub_ = d / m;
    codebooks_.assign(detail::checked_mul(m * kPqCentroids, dsub_, "PQ codebooks"), 0.0f);
}

struct ProductQuantizer::Encoder {
    std::vector<detail::SmallCodebook> small;  // dsub <= kSmallDimMax: one per sub-quantizer
    std::vector<float> norms;                  // else: m x 256 squared norms
};

std::shared_ptr<const ProductQuantizer::Encoder> ProductQuantizer::make_encoder() const
{
    auto e = std::make_shared<Encoder>();
    if (dsub_ <= detail::kSmallDimMax) {
        for (size_t j = 0; j < m_; j++)
            e->small.push_back(detail::make_small_codebook(codebooks_.data() + j * kPqCentroids * dsub_,
                                                           kPqCentroids, dsub_));
    } else {
        e->norms.resize(m_ * kPqCentroids);
        for (size_t c = 0; c < m_ * kPqCentroids; c++)
            e->norms[c] = norm_sqr(codebooks_.data() + c * dsub_, dsub_);
    }
    return e;
}

void ProductQuantizer::set_codebooks(const float* data)
{
    require(data != nullptr, "product quantizer: null codebooks");
    std::copy(data, data + codebooks_.size(), codebooks_.begin());
    encoder_ = make_encoder();
}

void ProductQuantizer::train(const float* x, size_t n, const KMeansParams& params)
{
    require(n >= 1, "product quantizer: need at least one training vector");
    require(x != nullptr, "product quantizer: null training data");
    detail::checked_mul(n, d_, "PQ training set");
    const int threads = std::max(params.threads, 1);
    // Sub-quantizers are independent: spread them over threads, and give any
    // threads left over to each k-means (deterministic per thread count).
    const int outer = int(std::min<size_t>(size_t(threads), m_));
    const int inner = std::max(1, threads / outer);
    parallel_for(m_, outer, [&](size_t j0, size_t j1) {
        std::vector<float> slice(n * dsub_);
        for (size_t j = j0; j < j1; j++) {
            for (size_t i = 0; i < n; i++)
                std::memcpy(slice.data() + i * dsub_, x + i * d_ + j * dsub_,
                            dsub_ * sizeof(float));
            KMeansParams kp = params;
            kp.threads = inner;
            kp.seed = pq_subquantizer_seed(params.seed, j);
            kmeans_train(slice.data(), n, dsub_, kPqCentroids, kp,
                         codebooks_.data() + j * kPqCentroids * dsub_);
        }
    });
    encoder_ = make_encoder();
}

void ProductQuantizer::encode(const float* x, size_t n, uint8_t* codes, int threads) const
{
    if (n == 0)
        return;
    require(x && codes, "product quantizer: null pointer in encode");
    constexpr size_t kRows = 1024;
    const size_t ntiles = (n + kRows - 1) / kRows;
    const std::shared_ptr<const Encoder> enc = encoder_ ? encoder_ : make_encoder();
    if (dsub_ <= detail::kSmallDimMax) {
        // Small sub-vectors: the fused kernel per sub-quantizer (BLAS is slow
        // with a tiny, strided inner dimension).
        const std::vector<detail::SmallCodebook>& cbs = enc->small;
        parallel_for(ntiles, threads, [&](size_t t0, size_t t1) {
            std::vector<int32_t> idx(std::min(kRows, n));
            for (size_t t = t0; t < t1; t++) {
                check_interrupt();
                const size_t r0 = t * kRows, nr = std::min(kRows, n - r0);
                for (size_t j = 0; j < m_; j++) {
                    const float* cb = codebooks_.data() + j * kPqCentroids * dsub_;
                    detail::nearest_small(x + r0 * d_ + j * dsub_, nr, d_, cbs[j], idx.data());
                    for (size_t i = 0; i < nr; i++) {
                        const float* xi = x + (r0 + i) * d_ + j * dsub_;
                        const size_t c = size_t(idx[i]);
                        codes[(r0 + i) * m_ + j] = uint8_t(detail::nearest_or_exact(
                            xi, cb, kPqCentroids, dsub_, c,
                            cbs[j].norms[c] - 2.0f * inner_product(xi, cb + c * dsub_, dsub_)));
                    }
                }
            }
        });
        return;
    }
    const std::vector<float>& norms = enc->norms;
    // Tiles of rows: per sub-quantizer one strided GEMM (lda = d) against its
    // 256 codewords, then the row argmin.
    parallel_for(ntiles, threads, [&](size_t t0, size_t t1) {
        std::vector<float> block(std::min(kRows, n) * kPqCentroids);
        for (size_t t = t0; t < t1; t++) {
            check_interrupt();
            const size_t r0 = t * kRows, nr = std::min(kRows, n - r0);
            for (size_t j = 0; j < m_; j++) {
                detail::gemm_nt(nr, kPqCentroids, dsub_, x + r0 * d_ + j * dsub_, d_,
                                codebooks_.data() + j * kPqCentroids * dsub_, dsub_,
                                block.data(), kPqCentroids);
                for (size_t i = 0; i < nr; i++) {
                    const float* row = block.data() + i * kPqCentroids;
                    const float* nj = norms.data() + j * kPqCentroids;
                    const size_t c = detail::argmin_l2(row, nj, kPqCentroids);
                    codes[(r0 + i) * m_ + j] = uint8_t(detail::nearest_or_exact(
                        x + (r0 + i) * d_ + j * dsub_, codebooks_.data() + j * kPqCentroids * dsub_,
                        kPqCentroids, dsub_, c, nj[c] - 2.0f * row[c]));
                }
            }
        }
    });
}

void ProductQuantizer::decode(const uint8_t* codes, size_t n, float* x) const
{
    if (n == 0)
        return;
    require(codes && x, "product quantizer: null pointer in decode");
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < m_; j++)
            std::memcpy(x + i * d_ + j * dsub_,
                        codebooks_.data() + (j * kPqCentroids + codes[i * m_ + j]) * dsub_,
                        dsub_ * sizeof(float));
}

namespace {

// One sub-quantizer's 256 squared distances (IP = false) or inner products
// (IP = true) to q_j, with the sub-dimension fixed at compile time so the
// inner loop unrolls completely.
template <size_t D, bool IP>
inline __attribute__((always_inline)) void sub_table_fixed(const float* qj, const float* C,
                                                           float* out)
{
    for (size_t c = 0; c < kPqCentroids; c++) {
        const float* w = C + c * D;
        float s = 0.0f;
        for (size_t t = 0; t < D; t++) {
            if (IP) {
                s += qj[t] * w[t];
            } else {
                const float diff = qj[t] - w[t];
                s += diff * diff;
            }
        }
        out[c] = s;
    }
}

// Table of all m sub-quantizers: common sub-dimensions get unrolled kernels,
// the rest use the general distance functions.
template <bool IP>
inline __attribute__((always_inline)) void build_table(const float* q, const float* codebooks,
                                                       size_t m, size_t dsub, float* table)
{
    for (size_t j = 0; j < m; j++) {
        const float* qj = q + j * dsub;
        const float* C = codebooks + j * kPqCentroids * dsub;
        float* out = table + j * kPqCentroids;
        switch (dsub) {
        case 1: sub_table_fixed<1, IP>(qj, C, out); break;
        case 2: sub_table_fixed<2, IP>(qj, C, out); break;
        case 4: sub_table_fixed<4, IP>(qj, C, out); break;
        case 8: sub_table_fixed<8, IP>(qj, C, out); break;
        case 16: sub_table_fixed<16, IP>(qj, C, out); break;
        default:
            for (size_t c = 0; c < kPqCentroids; c++)
                out[c] = IP ? inner_product(qj, C + c * dsub, dsub)
                            : l2_sqr(qj, C + c * dsub, dsub);
        }
    }
}

// Non-template entry points so each gets its own AVX2 clone.
GPU_IVFPQ_HOT void build_l2_table(const float* q, const float* cb, size_t m, size_t dsub,
                                  float* table)
{
    build_table<false>(q, cb, m, dsub, table);
}

GPU_IVFPQ_HOT void build_ip_table(const float* q, const float* cb, size_t m, size_t dsub,
                                  float* table)
{
    build_table<true>(q, cb, m, dsub, table);
}

}  // namespace

void ProductQuantizer::l2_table(const float* q, float* table) const
{
    require(q && table, "product quantizer: null pointer in l2_table");
    build_l2_table(q, codebooks_.data(), m_, dsub_, table);
}

void ProductQuantizer::ip_table(const float* q, float* table) const
{
    require(q && table, "product quantizer: null pointer in ip_table");
    build_ip_table(q, codebooks_.data(), m_, dsub_, table);
}

namespace {

// Codes read ahead of the one being summed: list pages come from shared
// buffers far apart in memory, where the hardware prefetcher starts late.
constexpr size_t kAdcPrefetchAhead = 8;

// ADC with lookups into two accumulators per code, for m a multiple of 8
// (fully unrolled when m is a compile-time constant). The code is read 8
// bytes at a time and taken apart with shifts (on a little-endian CPU; byte
// by byte elsewhere), so a lookup costs one load (the table's) instead of
// two: the loads set the pace. Two codes are summed side by side (four add
// chains; one chain, as adc_lookup sums, waits on each addition's latency:
// 3.5x slower at m = 96). Each code's sum is still base + (even-j sum +
// odd-j sum), each partial sum in j order, so the result is the same bits as
// one code at a time, whatever the code's place in the batch.
inline __attribute__((always_inline)) void adc_sums(const uint8_t* c, const float* table, size_t m,
                                                    float& s0, float& s1)
{
    for (size_t w = 0; w < m; w += 8) {
        uint64_t v;
        std::memcpy(&v, c + w, sizeof(v));
        const float* t = table + w * kPqCentroids;
        for (size_t b = 0; b < 8; b += 2) {
            s0 += t[b * kPqCentroids + ((v >> (8 * b)) & 255)];
            s1 += t[(b + 1) * kPqCentroids + ((v >> (8 * b + 8)) & 255)];
        }
    }
}

inline __attribute__((always_inline)) void adc_words(const uint8_t* codes, size_t n, size_t stride,
                                                     const float* table, size_t m, float base,
                                                     float* out)
{
    size_t i = 0;
    for (; i + 2 <= n; i += 2) {
        const uint8_t* c0 = codes + i * stride;
        __builtin_prefetch(c0 + kAdcPrefetchAhead * stride);
        __builtin_prefetch(c0 + (kAdcPrefetchAhead + 1) * stride);
        float a0 = 0.0f, b0 = 0.0f, a1 = 0.0f, b1 = 0.0f;
        adc_sums(c0, table, m, a0, b0);
        adc_sums(c0 + stride, table, m, a1, b1);
        out[i] = rank_distance(base + (a0 + b0));
        out[i + 1] = rank_distance(base + (a1 + b1));
    }
    for (; i < n; i++) {
        float s0 = 0.0f, s1 = 0.0f;
        adc_sums(codes + i * stride, table, m, s0, s1);
        out[i] = rank_distance(base + (s0 + s1));
    }
}

constexpr bool kLittleEndian = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;

template <size_t M>
inline __attribute__((always_inline)) void adc_fixed(const uint8_t* codes, size_t n,
                                                     size_t stride, const float* table,
                                                     float base, float* out)
{
    if constexpr (M % 8 == 0 && kLittleEndian) {
        adc_words(codes, n, stride, table, M, base, out);
    } else {
        for (size_t i = 0; i < n; i++) {
            const uint8_t* c = codes + i * stride;
            __builtin_prefetch(c + kAdcPrefetchAhead * stride);
            float s0 = 0.0f, s1 = 0.0f;
            for (size_t j = 0; j < M; j += 2) {
                s0 += table[j * kPqCentroids + c[j]];
                s1 += table[(j + 1) * kPqCentroids + c[j + 1]];
            }
            out[i] = rank_distance(base + (s0 + s1));
        }
    }
}

}  // namespace

void adc_scan(const uint8_t* codes, size_t n, size_t stride, const float* table, size_t m,
              float base, float* out)
{
    if (n == 0)
        return;
    require(m >= 1, "adc_scan: m must be at least 1");
    require(stride >= m, "adc_scan: stride must be at least m");
    require(codes && table && out, "adc_scan: null pointer");
    switch (m) {
    case 4: adc_fixed<4>(codes, n, stride, table, base, out); return;
    case 8: adc_fixed<8>(codes, n, stride, table, base, out); return;
    case 16: adc_fixed<16>(codes, n, stride, table, base, out); return;
    case 32: adc_fixed<32>(codes, n, stride, table, base, out); return;
    case 64: adc_fixed<64>(codes, n, stride, table, base, out); return;
    default:
        if (m % 8 == 0 && kLittleEndian) {
            adc_words(codes, n, stride, table, m, base, out);
            return;
        }
        for (size_t i = 0; i < n; i++) {
            __builtin_prefetch(codes + (i + kAdcPrefetchAhead) * stride);
            out[i] = rank_distance(base + adc_lookup(codes + i * stride, table, m));
        }
    }
}

}  // namespace gpuivfpq
