// Placing an index over several devices and merging what its shards find.
//
// A sharded mirror splits the inverted lists over the devices (every shard
// keeps the whole coarse quantizer and codebooks, so each computes the same
// probed lists for a query and scans the entries of those it holds); each
// shard's partial top-k is merged into the k the whole index would give, as
// the paper merges its shards. Rows are (distance, label), padded with
// (+inf, -1) after the found ones.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace gpuivfpq {

enum class Placement : uint32_t { Auto = 0, Replicate = 1, Shard = 2 };

// The list -> shard map: lists (by size, largest first, ties by list
// number) each go to the shard with the fewest entries so far (ties: the
// lower shard), so the shards hold about equal shares. Deterministic.
std::vector<int32_t> assign_lists(const std::vector<size_t>& list_sizes, size_t shards);

// A shard's rows of one search call: nq rows of k, labels -1 past the end.
template <typename D>
struct ShardRows {
    const D* dist = nullptr;
    const int64_t* labels = nullptr;
};

// Runs body(first, last) over ranges of nq queries whose merge handles
// `rows` rows in all: on several threads for large batches (a k-NN graph
// merges millions of rows), on the caller's alone for small ones.
void over_queries(size_t nq, size_t rows, const std::function<void(size_t, size_t)>& body);

// The k best of the shards' rows per query by (ADC distance, label).
void merge_adc(size_t nq, size_t k, const std::vector<ShardRows<float>>& parts, float* dist, int64_t* labels);

// The k best by exact distance (exact_less: NaN last, ties by label).
void merge_exact(size_t nq, size_t k, const std::vector<ShardRows<double>>& parts, double* dist,
                 int64_t* labels);

// What one device would give for search_exact over all lists: the k best
// candidates by ADC distance (adc[s], each shard's ADC rows), re-ranked by
// their exact distances (exact[s], the same shard's re-ranked rows of the
// same candidates), in exact order. A candidate missing from its shard's
// exact rows (a tie at the shard's k-th ADC distance chosen differently)
// is passed over for the next one.
void merge_reranked(size_t nq, size_t k, const std::vector<ShardRows<float>>& adc,
                    const std::vector<ShardRows<double>>& exact, double* dist, int64_t* labels);

}  // namespace gpuivfpq
