// Checks for CUDA runtime and cuBLAS calls: every failure becomes a thrown
// gpuivfpq::Error naming the call and its file:line (never an abort).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "engine/error.h"

namespace gpuivfpq::gpu {

[[noreturn]] void throw_cuda(cudaError_t err, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas(cublasStatus_t st, const char* call, const std::string& shapes,
                               const char* file, int line);

}  // namespace gpuivfpq::gpu

#define GPU_CUDA_CHECK(call)                                                        \
    do {                                                                            \
        cudaError_t err_ = (call);                                                  \
        if (err_ != cudaSuccess)                                                    \
            ::gpuivfpq::gpu::throw_cuda(err_, #call, __FILE__, __LINE__);          \
    } while (0)

// After every kernel launch: launch-configuration errors surface here,
// asynchronous faults at the next checked call.
#define GPU_KERNEL_CHECK() GPU_CUDA_CHECK(cudaGetLastError())

#define GPU_CUBLAS_CHECK(call, shapes)                                              \
    do {                                                                            \
        cublasStatus_t st_ = (call);                                                \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                           \
            ::gpuivfpq::gpu::throw_cublas(st_, #call, (shapes), __FILE__, __LINE__); \
    } while (0)
