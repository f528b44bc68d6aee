// The CUDA implementation of the service's compute device (cuda_device.cpp,
// compiled only when the extension links the kernels).
#pragma once

#include <memory>

#include "gpu_process/compute_device.h"

namespace gpuivfpq {

// CUDA devices visible to this process, 0 without a driver (never throws).
int cuda_device_count();

// How host threads wait for the work of device, before it is opened: "auto"
// (the CUDA runtime's choice: a spin while the process has fewer contexts
// than the host has cores), "spin", "yield" or "block" (asleep until the
// device's interrupt). Returns false, changing nothing, for another word;
// throws gpuivfpq::Error on CUDA errors.
bool cuda_set_host_wait(int device, const char* mode);

// Opens device (a CUDA context, stream and cuBLAS handle); budget 0 = the
// device's free memory less a reserve. Throws gpuivfpq::Error on failure.
std::unique_ptr<ComputeDevice> make_cuda_device(int device, size_t budget);

}  // namespace gpuivfpq
