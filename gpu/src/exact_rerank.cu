// Exact re-rank (GpuIvfPqIndex::search_exact): a block per query computes
// each ADC candidate's exact distance, one thread per candidate, by the
// header the SQL operators and the CPU engine compile too, then sorts the row
// in shared memory (bitonic) by exact_less.
#include "exact_rerank.h"

#include <algorithm>
#include <sstream>

#include "../../src/engine/exact_distance.h"
#include "../../src/engine/search_limits.h"
#include "cuda_check.h"

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

// The row's order: present candidates before missing ones (the padding
// follows every real result, NaN distances included), then exact_less.
__device__ __forceinline__ bool rerank_before(bool pa, double da, int64_t la, bool pb, double db,
                                              int64_t lb)
{
    if (pa != pb)
        return pa;
    return exact_less(da, la, db, lb);
}

__global__ void __launch_bounds__(kRerankMaxThreads)
    exact_rerank_kernel(const float* queries, int d, int k, int n2, Metric metric, const int64_t* cand,
                        const float* const* list_vectors, const int64_t* const* list_ids,
                        double* out_dist, int64_t* out_labels)
{
    extern __shared__ __align__(16) unsigned char rerank_smem[];
    double* sd = reinterpret_cast<double*>(rerank_smem);
    int64_t* sl = reinterpret_cast<int64_t*>(rerank_smem + static_cast<size_t>(n2) * sizeof(double));
    bool* sp = reinterpret_cast<bool*>(rerank_smem +
                                       static_cast<size_t>(n2) * (sizeof(double) + sizeof(int64_t)));
    const int64_t row = static_cast<int64_t>(blockIdx.x) * k;
    const float* q = queries + static_cast<int64_t>(blockIdx.x) * d;
    // One thread per candidate runs exact_distance itself, so the operations
    // and their order are the header's (a warp-split sum would reassociate
    // it and differ from the SQL operator in the last bits).
    for (int j = threadIdx.x; j < n2; j += blockDim.x) {
        double dist = INFINITY;
        int64_t label = -1;
        const int64_t c = j < k ? cand[row + j] : -1;
        if (c >= 0) {
            const int list = static_cast<int>(c >> 32);
            const int64_t off = c & 0xffffffff;
            dist = exact_distance(metric, q, list_vectors[list] + off * d, static_cast<size_t>(d));
            label = list_ids[list][off];
        }
        sd[j] = dist;
        sl[j] = label;
        sp[j] = c >= 0;
    }
    // Bitonic sort of the n2 (a power of two) entries; the entries past k
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
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        out_dist[row + j] = sd[j];
        out_labels[row + j] = sl[j];
    }
}

}  // namespace

void launch_exact_rerank(const float* queries, int64_t nq, int d, int k, Metric metric,
                         const int64_t* cand, const float* const* list_vectors,
                         const int64_t* const* list_ids, double* out_dist, int64_t* out_labels,
                         cudaStream_t st)
{
    if (nq <= 0)
        return;
    if (k < 1 || static_cast<size_t>(k) > kMaxSelectK || d < 1) {
        std::ostringstream os;
        os << "exact re-rank: k = " << k << " outside [1, " << kMaxSelectK << "] or d = " << d;
        throw Error(ErrorKind::InvalidArgument, os.str());
    }
    const int n2 = static_cast<int>(next_pow2(static_cast<size_t>(k)));
    const int threads = std::min(kRerankMaxThreads, std::max(32, n2));
    const size_t smem = static_cast<size_t>(n2) * kRerankEntryBytes;
    exact_rerank_kernel<<<static_cast<unsigned>(nq), threads, smem, st>>>(
        queries, d, k, n2, metric, cand, list_vectors, list_ids, out_dist, out_labels);
    GPU_KERNEL_CHECK();
}

}  // namespace gpuivfpq::gpu
