// GPU_IVFPQ_HOST_DEVICE: marks engine functions that the CUDA kernels run
// too (__host__ __device__ under nvcc, nothing for the host compiler), so
// that the CPU engine and the GPU compute them with the very same code.
#pragma once

#ifdef __CUDACC__
#define GPU_IVFPQ_HOST_DEVICE __host__ __device__
#else
#define GPU_IVFPQ_HOST_DEVICE
#endif
