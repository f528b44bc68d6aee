// Metric-space search over words on the GPU: the bit-parallel edit distance
// (Myers/Hyyrö on code points) of a batch of queries against stored words,
// and range and k-NN search with List of Clusters and SSS
// (docs/metric-search.md), exact and equal to src/engine's answers.
//
// Words are two flat device arrays, as the engine's WordList holds them.
// The queries' patterns (Peq rows and symbol tables) are built on the host
// and uploaded once per batch. Range search follows the paper: every
// query's distances to all pivots or centres in one pass, the pruning rules
// on those distances, then the bounded distances of the candidates left,
// the hits compacted and sorted by (query, distance, id) on the device.
// k-NN runs range searches of growing radii until each query holds k hits.
// Host entry points; they return host results and synchronise the stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/metric/metric_index.h"
#include "gpu_ivfpq/device_buffer.h"

namespace gpuivfpq::gpu {

class GpuContext;

// Words on the device: word i is code_points[offsets[i], offsets[i + 1]),
// at most kMaxWordCodePoints long (device pointers).
struct DeviceWords {
    const uint32_t* code_points = nullptr;
    const uint64_t* offsets = nullptr;
    size_t n = 0;
};

// A batch of queries preprocessed for the distance, on the device: each
// query's Peq rows (one per distinct symbol, ceil(m / 64) words each) and
// its symbol table (code point -> row, open addressing). The patterns of a
// batch may take at most 1 GiB (Error(OutOfMemory) beyond).
class QueryPatterns {
public:
    QueryPatterns(GpuContext& ctx, const WordList& queries);

    size_t size() const { return lengths_.size(); }
    uint32_t length(size_t q) const { return lengths_[q]; }
    uint32_t max_length() const { return max_length_; }
    // The most 64-bit words of column state any query needs.
    uint32_t max_blocks() const { return max_blocks_; }
    // Device arrays in the kernels' layout (gpu/src/metric/edit_distance.cuh).
    const void* info() const { return info_.data(); }
    const uint64_t* peq() const { return peq_.as<uint64_t>(); }
    const void* table() const { return table_.data(); }
    size_t bytes() const { return info_.bytes() + peq_.bytes() + table_.bytes(); }

private:
    std::vector<uint32_t> lengths_;
    uint32_t max_length_ = 0, max_blocks_ = 1;
    DeviceBuffer info_, peq_, table_;
};

// out[q * ntargets + j] = min(d, bound + 1), d the edit distance of query q
// and word targets[j] (targets null: word j), bound = target_radius[j] +
// query_bound[q] saturated at UINT32_MAX (target_radius null: 0); a bound
// of UINT32_MAX gives the exact distance. Device arrays; out holds
// patterns.size() x ntargets values.
void edit_distance_matrix(GpuContext& ctx, const QueryPatterns& patterns, const DeviceWords& words,
                          const uint32_t* targets, size_t ntargets, const uint32_t* target_radius,
                          const uint32_t* query_bound, uint32_t* out);

// The same from host words: queries x targets distances bounded by
// bounds (one per query, or one for all), row-major.
std::vector<uint32_t> edit_distance_matrix(GpuContext& ctx, const WordList& queries,
                                           const WordList& targets,
                                           const std::vector<uint32_t>& bounds);

// An SSS index on the device (SparseSpatialSelection's state): words,
// removed flags, pivot flags (n bytes each), the pivots' ids in order and
// the table in tiles (the device layout; the engine keeps rows):
// ceil(n / 64) tiles of pivot_count columns of 64 bytes, min(d(pivot p, x),
// 255) at tile x / 64, column p, byte x % 64, so that a warp's 32
// consecutive objects read a column coalesced.
struct SssDeviceView {
    DeviceWords words;
    const uint8_t* removed = nullptr;
    const uint8_t* is_pivot = nullptr;
    const uint32_t* pivots = nullptr;
    size_t pivot_count = 0;
    const uint8_t* table = nullptr;
    uint32_t max_word_length = 0;  // an upper bound of the words' lengths
};

// A List of Clusters on the device (ListOfClusters' state): words, removed
// flags, the clusters in creation order (centre ids, covering radii) and
// their buckets, cluster c's members being members[member_offsets[c],
// member_offsets[c + 1]) (the centre not among them).
struct LcDeviceView {
    DeviceWords words;
    const uint8_t* removed = nullptr;
    const uint32_t* centres = nullptr;
    const uint32_t* radii = nullptr;
    size_t clusters = 0;
    const uint32_t* member_offsets = nullptr;  // clusters + 1
    const uint32_t* members = nullptr;
    uint32_t max_word_length = 0;  // an upper bound of the words' lengths
};

// Range search: for every query, the live objects within its radius (radii:
// one per query, or one for all), each query's hits sorted by (distance,
// id) as MetricIndex::range gives them; result.stats holds each query's
// distance evaluations (live_objects left 0): every pivot or centre (the
// device computes all, where the engine's List of Clusters stops early)
// plus the candidates the rules left; k-NN adds each round's candidates. Too many hits or candidates for the
// buffers grows them and reruns the step; device memory beyond the
// context's budget is Error(OutOfMemory).
MetricBatchResult sss_range(GpuContext& ctx, const SssDeviceView& index, const WordList& queries,
                            const std::vector<uint32_t>& radii);
MetricBatchResult lc_range(GpuContext& ctx, const LcDeviceView& index, const WordList& queries,
                           const std::vector<uint32_t>& radii);

// k-NN: the k live objects nearest to each query, ties at the k-th distance
// broken by the smaller id (MetricIndex::knn's answer); fewer when fewer are
// live, none for k = 0. Range searches over growing radii, each query until
// it holds k hits or its radius covers every word.
MetricBatchResult sss_knn(GpuContext& ctx, const SssDeviceView& index, const WordList& queries,
                          size_t k);
MetricBatchResult lc_knn(GpuContext& ctx, const LcDeviceView& index, const WordList& queries,
                         size_t k);

// Test aid: at most max_queries queries per tile of a search (0: the
// default), so that tests cross tiles with small batches. Process-wide.
void set_metric_tile_queries(size_t max_queries);

}  // namespace gpuivfpq::gpu
