// k-selection (bounded max-heap) and the exact brute-force k-NN built on it.
#include "topk.h"
#include "interrupt.h"

#include <algorithm>
#include <cmath>

#include "error.h"
#include "internal.h"
#include "search_limits.h"

namespace gpuivfpq {

TopK::TopK(size_t k) : k_(k)
{
    require(k >= 1, "top-k: k must be at least 1");
    heap_.reserve(std::min<size_t>(k, 4096));
}

void TopK::push(float dist, int64_t label)
{
    // NaN breaks the strict weak order the heap relies on; rank it last.
    if (std::isnan(dist))
        dist = std::numeric_limits<float>::infinity();
    const Neighbor nb{dist, label};
    if (heap_.size() < k_) {
        heap_.push_back(nb);
        std::push_heap(heap_.begin(), heap_.end(), neighbor_less);
        return;
    }
    if (!neighbor_less(nb, heap_.front()))
        return;
    // Replace the current worst and sift it down (cheaper than pop + push).
    const size_t n = heap_.size();
    size_t i = 0;
    for (;;) {
        const size_t l = 2 * i + 1;
        if (l >= n)
            break;
        const size_t r = l + 1;
        const size_t c = (r < n && neighbor_less(heap_[l], heap_[r])) ? r : l;
        if (!neighbor_less(nb, heap_[c]))
            break;
        heap_[i] = heap_[c];
        i = c;
    }
    heap_[i] = nb;
}

void TopK::push_range(const float* dists, size_t n, int64_t label_base)
{
    for (size_t i = 0; i < n; i++) {
        // Cheap reject first: most candidates lose once the heap is full.
        if (heap_.size() == k_ && dists[i] > heap_.front().dist)
            continue;
        push(dists[i], label_base + int64_t(i));
    }
}

std::vector<Neighbor> TopK::take_sorted()
{
    std::sort_heap(heap_.begin(), heap_.end(), neighbor_less);
    std::vector<Neighbor> out;
    out.swap(heap_);
    return out;
}

void brute_force_knn(const float* queries, size_t nq, const float* base, size_t n, size_t d,
                     Metric metric, size_t k, float* out_dist, int64_t* out_label)
{
    require(d >= 1, "brute_force_knn: dimension must be at least 1");
    require(k >= 1, "brute_force_knn: k must be at least 1");
    require(metric == Metric::L2 || metric == Metric::InnerProduct || metric == Metric::Cosine,
            "brute_force_knn: unknown metric");
    if (nq == 0)
        return;
    require(queries && out_dist && out_label, "brute_force_knn: null pointer");
    require(n == 0 || base, "brute_force_knn: null base");

    // Tiles bound the distance block to kQ x kB floats (2 MiB).
    constexpr size_t kQ = 256, kB = 2048;
    const bool cosine = metric == Metric::Cosine;
    std::vector<float> block(kQ * std::min(kB, std::max<size_t>(n, 1)));
    std::vector<float> qbuf, bbuf, qnorm(kQ), bnorm(kB);

    for (size_t q0 = 0; q0 < nq; q0 += kQ) {
        const size_t nqb = std::min(kQ, nq - q0);
        const float* qp = queries + q0 * d;
        if (cosine) {
            qbuf.assign(qp, qp + nqb * d);
            normalize_rows(qbuf.data(), nqb, d);
            qp = qbuf.data();
        }
        if (metric == Metric::L2)
            for (size_t i = 0; i < nqb; i++)
                qnorm[i] = norm_sqr(qp + i * d, d);
        std::vector<TopK> heaps(nqb, TopK(k));

        for (size_t b0 = 0; b0 < n; b0 += kB) {
            check_interrupt();
            const size_t nbb = std::min(kB, n - b0);
            const float* bp = base + b0 * d;
            if (cosine) {
                bbuf.assign(bp, bp + nbb * d);
                normalize_rows(bbuf.data(), nbb, d);
                bp = bbuf.data();
            }
            if (metric == Metric::L2)
                for (size_t j = 0; j < nbb; j++)
                    bnorm[j] = norm_sqr(bp + j * d, d);
            detail::gemm_nt(nqb, nbb, d, qp, d, bp, d, block.data(), nbb);
            for (size_t i = 0; i < nqb; i++) {
                float* row = block.data() + i * nbb;
                // Turn inner products into the metric's ranking distance
                // (one that overflowed still competes: rank_distance, as
                // the GPU's selection ranks it).
                if (metric == Metric::L2) {
                    for (size_t j = 0; j < nbb; j++)
                        row[j] = std::max(0.0f, rank_distance(qnorm[i] + bnorm[j] - 2.0f * row[j]));
                } else if (metric == Metric::InnerProduct) {
                    for (size_t j = 0; j < nbb; j++)
                        row[j] = rank_distance(-row[j]);
                } else {
                    for (size_t j = 0; j < nbb; j++)
                        row[j] = rank_distance(1.0f - row[j]);
                }
                heaps[i].push_range(row, nbb, int64_t(b0));
            }
        }

        for (size_t i = 0; i < nqb; i++) {
            const std::vector<Neighbor> res = heaps[i].take_sorted();
            float* od = out_dist + (q0 + i) * k;
            int64_t* ol = out_label + (q0 + i) * k;
            for (size_t r = 0; r < k; r++) {
                od[r] = r < res.size() ? res[r].dist : std::numeric_limits<float>::infinity();
                ol[r] = r < res.size() ? res[r].label : -1;
            }
        }
    }
}

}  // namespace gpuivfpq
