// Shard assignment and the merge of shards' partial top-k.
#include "service/device/shard_merge.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <utility>

#include "engine/error.h"
#include "engine/exact_distance.h"

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

void merge_adc(size_t nq, size_t k, const std::vector<ShardRows<float>>& parts, float* dist, int64_t* labels)
{
    std::vector<std::pair<float, int64_t>> c;
    for (size_t q = 0; q < nq; q++) {
        gather(q, k, parts, c);
        write_best(q, k, c, adc_less, dist, labels);
    }
}

void merge_exact(size_t nq, size_t k, const std::vector<ShardRows<double>>& parts, double* dist,
                 int64_t* labels)
{
    std::vector<std::pair<double, int64_t>> c;
    for (size_t q = 0; q < nq; q++) {
        gather(q, k, parts, c);
        write_best(q, k, c, exact_pair_less, dist, labels);
    }
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
    std::vector<Cand> c;
    std::vector<std::pair<double, int64_t>> chosen;
    for (size_t q = 0; q < nq; q++) {
        c.clear();
        for (size_t s = 0; s < adc.size(); s++)
            for (size_t j = 0; j < k; j++) {
                int64_t l = adc[s].labels[q * k + j];
                if (l < 0)
                    continue;
                // The same shard's re-ranked row holds the same candidates (k is small: a scan).
                const int64_t* row = exact[s].labels + q * k;
                const int64_t* at = std::find(row, row + k, l);
                if (at != row + k)
                    c.push_back({adc[s].dist[q * k + j], l, exact[s].dist[q * k + size_t(at - row)]});
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
}

}  // namespace gpuivfpq
