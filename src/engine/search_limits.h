// Limits shared by the engine, the GPU kernels, the service and the SQL
// layer: defined once here, and every message that states one is built from
// these values.
#pragma once

#include <cfloat>
#include <cstddef>

#include "host_device.h"

namespace gpuivfpq {

// Largest k one k-selection pass takes: WarpSelect/BlockSelect keep at most
// this many candidates per row in registers and shared memory (gpu/), and the
// CPU emulation refuses the same k so both devices behave alike.
constexpr size_t kMaxSelectK = 2048;

// Most PQ sub-quantizers the GPU list scan handles (its lookup tables live
// in shared memory; wider codes run on the CPU engine).
constexpr size_t kMaxGpuSubQuantizers = 128;

// The approximate (float) distance of a candidate whose ranking distance
// overflowed: components of about 1e19 and more square past the float
// range, and the ADC and GEMM forms then give +inf or NaN (inf - inf). Such
// a candidate still competes, after every finite distance, and its exact
// distance (double, exact_distance.h) decides where it really goes. It is
// the largest finite float, not +inf, because +inf marks what is no
// candidate at all: the padding of a k-selection and the entries a filter
// leaves out.
constexpr float kOverflowDistance = FLT_MAX;

// The largest squared norm of a query that the quantizers rank: their float
// forms (||q - c||^2, -2<q, C>, the GEMM's ||q||^2 + ||c||^2 - 2<q, c>) sum
// squares of its size and of the centroids near it, which overflow past
// about FLT_MAX / 16. A longer query (components of about 5e18 and more)
// gets no useful approximate distance from any list: index scans and batch
// search re-rank every entry of the index by exact distance instead.
constexpr double kMaxRankedNormSqr = double(FLT_MAX) / 16;

// An approximate distance as every k-selection ranks it, on the CPU and the
// GPU alike: NaN and +inf become kOverflowDistance, anything else (-inf
// included: an inner product past the float range, the nearest there is)
// stays as it is.
GPU_IVFPQ_HOST_DEVICE inline float rank_distance(float d)
{
    return d <= kOverflowDistance ? d : kOverflowDistance;
}

}  // namespace gpuivfpq
