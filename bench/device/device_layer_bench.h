// Helpers of the benchmarks that run through the GPU process's device layer
// (multi_gpu_bench.cpp, metric_bench.cpp): wall-clock timing and a device
// set over the first CUDA devices.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "gpu_process/cuda_device.h"
#include "gpu_process/device_set.h"

namespace gpuivfpq::bench {

// Wall-clock seconds of f (host waits included: device-layer calls return
// once their answers are on the host).
inline double seconds(const std::function<void()>& f)
{
    auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The best of reps runs of f, after one warm-up.
inline double best_of(int reps, const std::function<void()>& f)
{
    f();
    double best = 1e30;
    for (int i = 0; i < reps; i++)
        best = std::min(best, seconds(f));
    return best;
}

// CUDA devices 0 .. count-1 as one device set.
inline std::unique_ptr<DeviceSet> open_gpus(size_t count)
{
    std::vector<std::unique_ptr<ComputeDevice>> devs;
    std::vector<uint32_t> ordinals;
    for (size_t i = 0; i < count; i++) {
        devs.push_back(make_cuda_device(int(i), 0));
        ordinals.push_back(uint32_t(i));
    }
    return std::make_unique<DeviceSet>(std::move(devs), ordinals);
}

}  // namespace gpuivfpq::bench
