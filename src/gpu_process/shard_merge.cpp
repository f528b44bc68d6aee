// Shard assignment and the merge of shards' partial top-k.
#include "gpu_process/shard_merge.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <thread>
#include <numeric>
#include <utility>

#include "engine/error.h"
#include "engine/exact_distance.h"
#include "engine/parallel.h"

namespace gpuivfpq {

std::vector<int32_t> assign_lists(const std::vector<size_t>& list_sizes, size_t shards)
{
    if (shards == 0)
        throw Error(ErrorKind::InvalidArgument, "assign_lists: no shard");
    std::vector<size_t> order(list_sizes.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return list_sizes[a] > list_sizes[b]; });
    std::vector<size_t> load(shards, 0);
    std::vector<int32_t> shard_of(list_sizes.size(), 0);
    for (size_t l : order) {
        size_t best = 0;
        for (size_t s = 1; s < shards; s++)
            if (load[s] < load[best])
                best = s;
        shard_of[l] = (int32_t)best;
        // An empty list still counts one, so that empty lists spread too.
        load[best] += std::max<size_t>(list_sizes[l], 1);
    }
    return shard_of;
}

namespace {

// Candidates of one query from every shard, found ones only.
template <typename D>
void gather(size_t q, size_t k, const std::vector<ShardRows<D>>& parts, std::vector<std::pair<D, int64_t>>& out)
{
    out.clear();
    for (const auto& p : parts)
        for (size_t j = 0; j < k; j++) {
            int64_t l = p.labels[q * k + j];
            if (l >= 0)
                out.emplace_back(p.dist[q * k + j], l);
        }
}

template <typename D, typename Less>
void write_best(size_t q, size_t k, std::vector<std::pair<D, int64_t>>& c, Less less, D* dist, int64_t* labels)
{
    size_t n = std::min(k, c.size());
    std::partial_sort(c.begin(), c.begin() + n, c.end(), less);
    for (size_t j = 0; j < k; j++) {
        dist[q * k + j] = j < n ? c[j].first : std::numeric_limits<D>::infinity();
        labels[q * k + j] = j < n ? c[j].second : -1;
    }
}

bool adc_less(const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b)
{
    return a.first != b.first ? a.first < b.first : a.second < b.second;
}

bool exact_pair_less(const std::pair<double, int64_t>& a, const std::pair<double, int64_t>& b)
{
    return exact_less(a.first, a.second, b.first, b.second);
}

}  // namespace

void over_queries(size_t nq, size_t rows, const std::function<void(size_t, size_t)>& body)
{
    int threads = rows < (size_t(1) << 16) ? 1 : int(std::min<unsigned>(8, std::max(1u, std::thread::hardware_concurrency())));
    parallel_for(nq, threads, body);
}

void merge_adc(size_t nq, size_t k, const std::vector<ShardRows<float>>& parts, float* dist, int64_t* labels)
{
    over_queries(nq, nq * k, [&](size_t first, size_t last) {
        std::vector<std::pair<float, int64_t>> c;
        for (size_t q = first; q < last; q++) {
            gather(q, k, parts, c);
            write_best(q, k, c, adc_less, dist, labels);
        }
    });
}

void merge_exact(size_t nq, size_t k, const std::vector<ShardRows<double>>& parts, double* dist,
                 int64_t* labels)
{
    over_queries(nq, nq * k, [&](size_t first, size_t last) {
        std::vector<std::pair<double, int64_t>> c;
        for (size_t q = first; q < last; q++) {
            gather(q, k, parts, c);
            write_best(q, k, c, exact_pair_less, dist, labels);
        }
    });
}

void merge_reranked(size_t nq, size_t k, const std::vector<ShardRows<float>>& adc,
                    const std::vector<ShardRows<double>>& exact, double* dist, int64_t* labels)
{
    if (adc.size() != exact.size())
        throw Error(ErrorKind::Internal, "merge_reranked: shards' rows do not pair up");
    struct Cand {
        float adc;
        int64_t label;
        double exact;
    };
    over_queries(nq, nq * k, [&](size_t first, size_t last) {
        std::vector<Cand> c;
        std::vector<std::pair<int64_t, double>> by_label;
        std::vector<std::pair<double, int64_t>> chosen;
        for (size_t q = first; q < last; q++) {
            c.clear();
            for (size_t s = 0; s < adc.size(); s++) {
                // The same shard's re-ranked row holds the same candidates: by label, for lookup.
                by_label.clear();
                for (size_t j = 0; j < k; j++)
                    if (exact[s].labels[q * k + j] >= 0)
                        by_label.emplace_back(exact[s].labels[q * k + j], exact[s].dist[q * k + j]);
                std::sort(by_label.begin(), by_label.end());
                for (size_t j = 0; j < k; j++) {
                    int64_t l = adc[s].labels[q * k + j];
                    if (l < 0)
                        continue;
                    auto at = std::lower_bound(by_label.begin(), by_label.end(), std::make_pair(l, -HUGE_VAL));
                    if (at != by_label.end() && at->first == l)
                        c.push_back({adc[s].dist[q * k + j], l, at->second});
                }
            }
            size_t n = std::min(k, c.size());
            std::partial_sort(c.begin(), c.begin() + n, c.end(), [](const Cand& a, const Cand& b) {
                return a.adc != b.adc ? a.adc < b.adc : a.label < b.label;
            });
            chosen.clear();
            for (size_t j = 0; j < n; j++)
                chosen.emplace_back(c[j].exact, c[j].label);
            write_best(q, k, chosen, exact_pair_less, dist, labels);
        }
    });
}

}  // namespace gpuivfpq
