// Arguments of the generic k-selection kernel, shared by k_select, exact
// search (fused with the distance tile) and the IVF scan's merge pass.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/search_limits.h"

namespace gpuivfpq::gpu {

// How a raw input value becomes a key (smaller = better).
enum SelectTransform : int {
    kTransformNone = 0,
    kTransformNegate = 1,  // largest-first
    kTransformL2 = 2,      // max(row_norm + col_norm - 2x, 0): x is <q, y>
    kTransformIP = 3,      // -x
    kTransformCosine = 4,  // 1 - x / sqrt(row_norm * col_norm)
};

struct SelectArgs {
    const float* in = nullptr;  // rows x ld
    int64_t ld = 0;
    int64_t n = 0;                   // columns per row
    const int32_t* row_len = nullptr;  // optional valid length of row r: row_len[r * row_len_stride]
    int64_t row_len_stride = 1;
    const int32_t* in_labels = nullptr;  // optional labels, same layout as in
    int32_t label_base = 0;              // else label = label_base + column
    int64_t rows = 0;
    int chunks = 1;          // each row split in chunks of chunk_len columns;
    int64_t chunk_len = 0;   // output row = row * chunks + chunk
    // Chunks split each row's own length (row_len) evenly instead, in
    // multiples of 4 columns (chunk_len unused).
    bool chunks_split_len = false;
    int k = 0;
    int transform = kTransformNone;
    float out_sign = 1.0f;  // -1 for largest-first
    const float* row_norms = nullptr;
    const float* col_norms = nullptr;  // indexed by column (before label_base)
    // Optional candidates fed before the row (to chunk 0): a running top-k.
    const float* prefix_dist = nullptr;
    const int32_t* prefix_idx = nullptr;
    int prefix_len = 0;
    int64_t prefix_ld = 0;
    float* out_dist = nullptr;  // (rows * chunks) x k
    int32_t* out_idx = nullptr;
    int64_t* out_idx64 = nullptr;  // alternative output labels (int64)
};

// Launches the selection for any 1 <= k <= kMaxSelectK (k = 1: an arg-min kernel).
void launch_select(const SelectArgs& a, bool block_per_row, cudaStream_t stream);

// The k best of each row of `a` (its rows, ld, n, row_len and k; labels are
// the columns) into out_dist / out_idx (rows x k): with a.chunks > 1, a warp
// per (row, chunk of a.chunk_len columns) into cdist / cidx ((rows x
// chunks) x k), then launch_select_merge; with one chunk, as k_select does.
// Which of several equal keys at the k-th place is kept may differ with the
// chunking (as between k_select's warp and block paths); the keys do not.
void launch_select_chunked(SelectArgs a, float* cdist, int32_t* cidx, float* out_dist, int32_t* out_idx,
                           int multiprocessors, cudaStream_t stream);
// The k best of each row's chunks x k candidates (cdist, labels cidx) into
// out_dist / out_idx (rows x k), by a block per row where the rows are fewer
// than 16 a multiprocessor.
void launch_select_merge(int64_t rows, int chunks, int k, const float* cdist, const int32_t* cidx,
                         float* out_dist, int32_t* out_idx, int multiprocessors, cudaStream_t stream);

// The radix k-selection (radix_select.cu): keys a block takes into shared
// memory at a time, and the largest k it serves.
constexpr int kRadixTileKeys = 4096;
constexpr int kRadixMaxK = 256;
// Columns (or estimated candidates) per block of the radix selection's
// first pass, for the callers that split rows into chunks for it.
constexpr int kRadixChunkKeys = 2048;

// As launch_select_chunked (chunks of chunk_len columns, or of each row's
// own length with chunks_split_len), by block radix select (a block per
// row and chunk, then a block per row merging the chunks' k best) for 1 <=
// k <= kRadixMaxK and no prefix candidates: WarpSelect's keys (the same
// transform), equal keys ordered by column, out_idx or out_idx64. Meant
// for few rows, where WarpSelect's chains of queue merges on few SMs are
// latency.
void launch_select_radix(SelectArgs a, float* cdist, int32_t* cidx, float* out_dist, int32_t* out_idx,
                         cudaStream_t stream);

// Per warp-queue bucket launchers, one translation unit each (compile time).
template <int kQ>
void launch_select_bucket(const SelectArgs& a, bool block_per_row, cudaStream_t stream);
template <>
void launch_select_bucket<32>(const SelectArgs& a, bool block_per_row, cudaStream_t stream);
template <>
void launch_select_bucket<64>(const SelectArgs& a, bool block_per_row, cudaStream_t stream);
template <>
void launch_select_bucket<128>(const SelectArgs& a, bool block_per_row, cudaStream_t stream);
template <>
void launch_select_bucket<256>(const SelectArgs& a, bool block_per_row, cudaStream_t stream);
template <>
void launch_select_bucket<512>(const SelectArgs& a, bool block_per_row, cudaStream_t stream);
template <>
void launch_select_bucket<1024>(const SelectArgs& a, bool block_per_row, cudaStream_t stream);
template <>
void launch_select_bucket<2048>(const SelectArgs& a, bool block_per_row, cudaStream_t stream);

}  // namespace gpuivfpq::gpu
