// set_host_wait: each way a host thread can wait for the device (the GPU
// process's GPU_IVFPQ_HOST_WAIT) is accepted on the active context of the
// tests, and a copy and a k-selection waited for that way carry the same
// bytes; the runtime's choice (Auto) is restored at the end.
#include <vector>

#include "gpu_ivfpq/device_buffer.h"
#include "gpu_ivfpq/gpu_context.h"
#include "gpu_ivfpq/k_select.h"
#include "gpu_test_util.h"

using namespace gputest;
using gpuivfpq::gpu::HostWait;

TEST(HostWait, EveryModeWaitsForTheSameAnswers)
{
    GPU_REQUIRE_DEVICE();
    const size_t rows = 8, n = 4096, k = 16;
    std::vector<float> x(rows * n);
    for (size_t i = 0; i < x.size(); ++i)
        x[i] = static_cast<float>((i * 2654435761u) % 100003u);
    std::vector<float> first_d;
    std::vector<int32_t> first_l;
    for (HostWait w : {HostWait::Spin, HostWait::Yield, HostWait::Block, HostWait::Auto}) {
        SCOPED_TRACE(static_cast<int>(w));
        gpuivfpq::gpu::set_host_wait(ctx().device(), w);
        DeviceBuffer din = to_device(x);
        EXPECT_EQ(to_host<float>(din, x.size()), x);
        DeviceBuffer dd(ctx(), rows * k * sizeof(float)), di(ctx(), rows * k * sizeof(int32_t));
        gpuivfpq::gpu::k_select(ctx(), din.as<float>(), rows, n, n, k, false, dd.as<float>(), di.as<int32_t>());
        ctx().synchronize();
        const std::vector<float> d = to_host<float>(dd, rows * k);
        const std::vector<int32_t> l = to_host<int32_t>(di, rows * k);
        if (first_d.empty()) {
            first_d = d;
            first_l = l;
        }
        EXPECT_EQ(d, first_d);
        EXPECT_EQ(l, first_l);
        EXPECT_LE(d[0], d[k - 1]);
    }
}
