// Limits shared by the engine, the GPU kernels, the service and the SQL
// layer: defined once here, and every message that states one is built from
// these values.
#pragma once

#include <cstddef>

namespace gpuivfpq {

// Largest k one k-selection pass takes: WarpSelect/BlockSelect keep at most
// this many candidates per row in registers and shared memory (gpu/), and the
// CPU emulation refuses the same k so both devices behave alike.
constexpr size_t kMaxSelectK = 2048;

// Most PQ sub-quantizers the GPU list scan handles (its lookup tables live
// in shared memory; wider codes run on the CPU engine).
constexpr size_t kMaxGpuSubQuantizers = 128;

}  // namespace gpuivfpq
