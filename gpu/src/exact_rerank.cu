// Exact re-rank (GpuIvfPqIndex::search_exact, search_brute_force): a block
// per query computes each candidate's exact distance, one thread per
// candidate, by the header the SQL operators and the CPU engine compile too,
// then sorts the row in shared memory (bitonic) by exact_less. Also the
// gather of the inverted lists' stored vectors into one contiguous base
// (search_brute_force).
#include "exact_rerank.h"

#include <algorithm>
#include <sstream>

#include "engine/exact_distance.h"
#include "engine/search_limits.h"
#include "cuda_check.h"
#include "search_parts.cuh"

namespace gpuivfpq::gpu {

namespace {

constexpr int kRerankMaxThreads = 256;

// Shared memory per block: a (distance, label, present) triple per entry of
// the power-of-two sort, within the 48 KiB a block gets without opting in.
constexpr size_t kRerankEntryBytes = sizeof(double) + sizeof(int64_t) + sizeof(bool);
constexpr size_t next_pow2(size_t x)
{
    size_t p = 1;
    while (p < x)
        p <<= 1;
    return p;
}
static_assert(next_pow2(kMaxSelectK) * kRerankEntryBytes <= 48 * 1024,
              "re-rank sort of kMaxSelectK entries does not fit in shared memory");

// Candidates as (list << 32 | offset) into the inverted lists (search_exact).
struct ListOffsetCandidates {
    const float* const* list_vectors;
    const int64_t* const* list_ids;
    __device__ __forceinline__ const float* vector(int64_t c, int d) const
    {
        return list_vectors[c >> 32] + (c & 0xffffffff) * d;
    }
    __device__ __forceinline__ int64_t id(int64_t c) const { return list_ids[c >> 32][c & 0xffffffff]; }
};

// Candidates as row numbers of one contiguous base (search_brute_force).
struct RowCandidates {
    const float* base;
    const int64_t* ids;
    __device__ __forceinline__ const float* vector(int64_t c, int d) const { return base + c * d; }
    __device__ __forceinline__ int64_t id(int64_t c) const { return ids[c]; }
};

// Block q reads the k_in candidates cand[q * k_in ..] (-1 = none) and writes
// the first k_out (<= k_in) of them in exact_less order to
// out[q * k_out ..].
template <typename Cand>
__global__ void __launch_bounds__(kRerankMaxThreads)
    exact_rerank_kernel(const float* queries, int d, int k_in, int k_out, int n2, Metric metric,
                        const int64_t* cand, Cand src, double* out_dist, int64_t* out_labels)
{
    extern __shared__ __align__(16) unsigned char rerank_smem[];
    double* sd = reinterpret_cast<double*>(rerank_smem);
    int64_t* sl = reinterpret_cast<int64_t*>(rerank_smem + static_cast<size_t>(n2) * sizeof(double));
    bool* sp = reinterpret_cast<bool*>(rerank_smem +
                                       static_cast<size_t>(n2) * (sizeof(double) + sizeof(int64_t)));
    const int64_t row = static_cast<int64_t>(blockIdx.x) * k_in;
    const int64_t orow = static_cast<int64_t>(blockIdx.x) * k_out;
    const float* q = queries + static_cast<int64_t>(blockIdx.x) * d;
    // One thread per candidate runs exact_distance itself, so the operations
    // and their order are the header's (a warp-split sum would reassociate
    // it and differ from the SQL operator in the last bits).
    for (int j = threadIdx.x; j < n2; j += blockDim.x) {
        double dist = INFINITY;
        int64_t label = -1;
        const int64_t c = j < k_in ? cand[row + j] : -1;
        if (c >= 0) {
            dist = exact_distance(metric, q, src.vector(c, d), static_cast<size_t>(d));
            label = src.id(c);
        }
        sd[j] = dist;
        sl[j] = label;
        sp[j] = c >= 0;
    }
    // Bitonic sort of the n2 (a power of two) entries; the entries past k_in
    // are missing candidates and sort last.
    for (int size = 2; size <= n2; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            __syncthreads();
            for (int t = threadIdx.x; t < (n2 >> 1); t += blockDim.x) {
                const int a = 2 * t - (t & (stride - 1));
                const int b = a + stride;
                // Ascending runs where bit `size` of a is clear (all of the last merge).
                const bool swap = (a & size) == 0
                                      ? rerank_before(sp[b], sd[b], sl[b], sp[a], sd[a], sl[a])
                                      : rerank_before(sp[a], sd[a], sl[a], sp[b], sd[b], sl[b]);
                if (swap) {
                    const double td = sd[a];
                    sd[a] = sd[b];
                    sd[b] = td;
                    const int64_t tl = sl[a];
                    sl[a] = sl[b];
                    sl[b] = tl;
                    const bool tp = sp[a];
                    sp[a] = sp[b];
                    sp[b] = tp;
                }
            }
        }
    __syncthreads();  // also: the whole candidate row is read before it is written (aliasing)
    // Missing candidates hold (+inf, -1) already.
    for (int j = threadIdx.x; j < k_out; j += blockDim.x) {
        out_dist[orow + j] = sd[j];
        out_labels[orow + j] = sl[j];
    }
}

// A warp per base row: finds the row's list in the prefix offsets (lists + 1
// entries, offsets[0] = 0), copies its d floats and its id.
__global__ void gather_lists_kernel(const float* const* list_vectors, const int64_t* const* list_ids,
                                    const int64_t* offsets, int64_t lists, int64_t n, int d,
                                    float* base, int64_t* ids)
{
    const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= n)
        return;
    // The last list l with offsets[l] <= row (empty lists share their
    // offset with the next one and are skipped by taking the last).
    int64_t lo = 0, hi = lists;  // offsets[lo] <= row < offsets[hi]
    while (hi - lo > 1) {
        const int64_t mid = (lo + hi) >> 1;
        if (offsets[mid] <= row)
            lo = mid;
        else
            hi = mid;
    }
    const int64_t off = row - offsets[lo];
    const float* src = list_vectors[lo] + off * d;
    float* dst = base + row * d;
    for (int j = lane; j < d; j += 32)
        dst[j] = src[j];
    if (lane == 0)
        ids[row] = list_ids[lo][off];
}

void check_rerank_shape(int64_t nq, int d, int k_in, int k_out)
{
    if (k_in < 1 || static_cast<size_t>(k_in) > kMaxSelectK || k_out < 1 || k_out > k_in || d < 1) {
        std::ostringstream os;
        os << "exact re-rank: k = " << k_in << " (keeping " << k_out << ") outside [1, " << kMaxSelectK
           << "] or d = " << d;
        throw Error(ErrorKind::InvalidArgument, os.str());
    }
    require(nq < (int64_t(1) << 31), "exact re-rank: more than 2^31 queries");
}

template <typename Cand>
void launch_rerank(const float* queries, int64_t nq, int d, int k_in, int k_out, Metric metric,
                   const int64_t* cand, Cand src, double* out_dist, int64_t* out_labels, cudaStream_t st)
{
    const int n2 = static_cast<int>(next_pow2(static_cast<size_t>(k_in)));
    const int threads = std::min(kRerankMaxThreads, std::max(32, n2));
    const size_t smem = static_cast<size_t>(n2) * kRerankEntryBytes;
    exact_rerank_kernel<Cand><<<static_cast<unsigned>(nq), threads, smem, st>>>(
        queries, d, k_in, k_out, n2, metric, cand, src, out_dist, out_labels);
    GPU_KERNEL_CHECK();
}

}  // namespace

void launch_exact_rerank(const float* queries, int64_t nq, int d, int k, Metric metric,
                         const int64_t* cand, const float* const* list_vectors,
                         const int64_t* const* list_ids, double* out_dist, int64_t* out_labels,
                         cudaStream_t st)
{
    if (nq <= 0)
        return;
    check_rerank_shape(nq, d, k, k);
    launch_rerank(queries, nq, d, k, k, metric, cand, ListOffsetCandidates{list_vectors, list_ids},
                  out_dist, out_labels, st);
}

void launch_exact_rerank_rows(const float* queries, int64_t nq, int d, int k_in, int k_out,
                              Metric metric, const int64_t* cand, const float* base,
                              const int64_t* base_ids, double* out_dist, int64_t* out_labels,
                              cudaStream_t st)
{
    if (nq <= 0)
        return;
    check_rerank_shape(nq, d, k_in, k_out);
    launch_rerank(queries, nq, d, k_in, k_out, metric, cand, RowCandidates{base, base_ids}, out_dist,
                  out_labels, st);
}

void launch_gather_lists(const float* const* list_vectors, const int64_t* const* list_ids,
                         const int64_t* offsets, int64_t lists, int64_t n, int d, float* base,
                         int64_t* ids, cudaStream_t st)
{
    if (n <= 0)
        return;
    require(lists >= 1 && d >= 1, "gather of the stored vectors: needs lists >= 1 and d >= 1");
    const int64_t blocks = (n + 7) / 8;  // 8 warps of 256 threads, a warp per row
    require(blocks <= 0x7fffffff, "gather of the stored vectors: too many rows");
    gather_lists_kernel<<<static_cast<unsigned>(blocks), 256, 0, st>>>(list_vectors, list_ids, offsets,
                                                                       lists, n, d, base, ids);
    GPU_KERNEL_CHECK();
}

}  // namespace gpuivfpq::gpu
