// Small IVFPQ kernels (host launchers): term-1 tables, term-3 GEMM, PQ
// encoding, residuals, column slices, row gathers, label decoding and id
// removal.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace gpuivfpq::gpu {

class GpuContext;

// term1[l][j][c] = ||C_jc||^2 + 2 <c_l slice j, C_jc>, stored as float or half.
void launch_term1(const float* centroids, int64_t lists, const float* codebooks, int d, int m,
                  void* out, bool half, cudaStream_t st);

// out[i] = sum_j ||C_j,code_j||^2 + 2 <c_list slice j, C_j,code_j>: term 1 of
// vector i folded into one float (||r||^2 + 2<c, r> of its reconstruction).
void launch_vector_term1(const uint8_t* codes, const int32_t* list_ids, int64_t n, const float* centroids,
                         const float* codebooks, int d, int m, float* out, cudaStream_t st);

// term3[q][j][c] = scale * <q slice j, C_jc> by one strided-batched GEMM (m batches).
void compute_term3(GpuContext& ctx, const float* queries, int64_t nq, const float* codebooks, int d,
                   int m, float scale, float* out);

// out[i] = x[i] - centroids[assign[i]] (n x d).
void launch_residuals(const float* x, int64_t n, int d, const float* centroids,
                      const int32_t* assign, float* out, cudaStream_t st);

// codes[i][j] = argmin_c ||r_i slice j - C_jc||^2 (n x m bytes).
void launch_pq_encode(const float* resid, int64_t n, int d, int m, const float* codebooks,
                      uint8_t* codes, cudaStream_t st);

// out (n x w) = x[:, col0 .. col0 + w) of x (n x d).
void launch_column_slice(const float* x, int64_t n, int d, int col0, int w, float* out,
                         cudaStream_t st);

// out[i] = x[idx[i]] rows (n x d).
void launch_gather_rows(const float* x, const int64_t* idx, int64_t n, int d, float* out,
                        cudaStream_t st);

// probe_dist[q][p] = ||q - c||^2 (or -<q, c>) of list probe_lists[q][p],
// computed directly (a warp per pair).
void launch_exact_base(const float* queries, int64_t nq, int nprobe, int d, const float* centroids,
                       const int32_t* probe_lists, bool inner_product, float* probe_dist,
                       cudaStream_t st);

// Candidate positions -> labels: the probe is found by binary search in the
// query's offsets; label = ids[list][offset] or list << 32 | offset; -1 stays -1.
void launch_decode_labels(const int32_t* pos, int64_t nq, int k, int nprobe, const int32_t* prefix,
                          const int32_t* probe_lists, const int64_t* const* list_ids,
                          int64_t* out, cudaStream_t st);

// Removes from every list, in place and keeping order, the entries whose id
// is in sorted_ids[0..n) (ascending): codes (m bytes each), ids, where a
// list has one (list_vt[l] != null) its per-vector term 1, where
// list_vectors is not null the stored vectors (d floats each) and where
// list_keys is not null the filter keys. Device arrays of lists entries;
// new_len[l] receives the entries list l keeps. interleaved: the codes as
// list_layout.cuh interleaves them (m a multiple of 4).
void launch_remove_ids(uint8_t* const* list_codes, int64_t* const* list_ids, float* const* list_vt,
                       float* const* list_vectors, int64_t* const* list_keys, const int32_t* list_len,
                       int64_t lists, int m, int d, const int64_t* sorted_ids, int64_t n,
                       int32_t* new_len, bool interleaved, cudaStream_t st);

// Appends n staged entries in one launch: entry s goes to list lists[s] at
// position pos[s] (the list's size before the batch plus its rank in the
// batch) of each array the list keeps: its m code bytes, its id, where vt is
// not null its per-vector term, where vectors is not null its d floats, where
// keys is not null its filter key (the device arrays of per-list pointers
// must already name buffers large enough: interleaved, to the end of the
// position's block of 32). Then list_len[touched[i]] =
// new_len[i] for the nt touched lists (nt <= n). interleaved: the codes
// written as list_layout.cuh interleaves them (m a multiple of 4).
void launch_append_entries(uint8_t* const* list_codes, int64_t* const* list_ids, float* const* list_vt,
                           float* const* list_vectors, int64_t* const* list_keys, int32_t* list_len,
                           const int32_t* lists, const int32_t* pos, int64_t n, int m, int d,
                           const uint8_t* codes, const int64_t* ids, const float* vt, const float* vectors,
                           const int64_t* keys, const int32_t* touched, const int32_t* new_len, int64_t nt,
                           bool interleaved, cudaStream_t st);

}  // namespace gpuivfpq::gpu
