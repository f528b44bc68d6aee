// Helpers shared by the GPU benchmarks (gpu_bench.cpp, wide_bench.cpp).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "gpu_ivfpq/gpu_context.h"
#include "../../tools/common.h"  // read_fvecs: the tools' reader of the generator's files

namespace gpuivfpq::bench {

inline void ck(cudaError_t e, const char* what)
{
    if (e != cudaSuccess) {
        std::fprintf(stderr, "CUDA error in %s: %s\n", what, cudaGetErrorString(e));
        std::exit(2);
    }
}

// Reads the base and query vectors (.fvecs from tools/gen_synthetic) before
// any GPU work, so that a bad file costs no benchmarking; returns their
// dimension, or 0 after saying why (prog names the program).
inline size_t read_base_and_queries(const char* prog, const std::string& base_path,
                                    const std::string& queries_path, std::vector<float>& base,
                                    std::vector<float>& queries)
{
    if (base_path.empty() || queries_path.empty()) {
        std::fprintf(stderr, "%s: --base and --queries are required (.fvecs, from tools/gen_synthetic)\n", prog);
        return 0;
    }
    const size_t d = tools::read_fvecs(base_path, base);
    if (tools::read_fvecs(queries_path, queries) != d) {
        std::fprintf(stderr, "%s: %s and %s differ in dimension\n", prog, base_path.c_str(),
                     queries_path.c_str());
        return 0;
    }
    return d;
}

// Median device time (ms) of reps runs of f on the context's stream.
inline double time_ms(gpu::GpuContext& ctx, const std::function<void()>& f, int reps, int warmup = 1)
{
    cudaStream_t st = static_cast<cudaStream_t>(ctx.stream());
    for (int i = 0; i < warmup; ++i)
        f();
    ctx.synchronize();
    cudaEvent_t a, b;
    ck(cudaEventCreate(&a), "event");
    ck(cudaEventCreate(&b), "event");
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
        ck(cudaEventRecord(a, st), "record");
        f();
        ck(cudaEventRecord(b, st), "record");
        ck(cudaEventSynchronize(b), "sync");
        float ms = 0;
        ck(cudaEventElapsedTime(&ms, a, b), "elapsed");
        t.push_back(ms);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

// Fraction of queries whose true nearest neighbour (gt[i]) is among the
// first r of their k labels (labels: gt.size() x k).
inline double recall_at(const std::vector<int64_t>& labels, size_t k, const std::vector<int64_t>& gt, size_t r)
{
    size_t hit = 0;
    for (size_t i = 0; i < gt.size(); ++i)
        for (size_t j = 0; j < std::min(r, k); ++j)
            if (labels[i * k + j] == gt[i]) {
                ++hit;
                break;
            }
    return double(hit) / double(gt.size());
}

}  // namespace gpuivfpq::bench
