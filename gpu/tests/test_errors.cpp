// Failures the caller must be able to report: too large k, unsupported m,
// out of device memory (budget and real), never an abort.
#include "gpu_ivfpq/exact_search.h"
#include "gpu_ivfpq/ivfpq_index.h"
#include "gpu_ivfpq/k_select.h"
#include "gpu_test_util.h"

using namespace gputest;
using gpuivfpq::Error;
using gpuivfpq::ErrorKind;
using gpuivfpq::Metric;

namespace {

using gputest::kind_of;

}  // namespace

TEST(GpuErrors, NoDeviceIsAnError)
{
    if (gpuivfpq::gpu::device_count() > 0)
        GTEST_SKIP() << "a device exists; this checks the no-device path";
    EXPECT_EQ(kind_of([] { gpuivfpq::gpu::GpuContext c; }), ErrorKind::Unsupported);
}

TEST(GpuErrors, TooLargeK)
{
    GPU_REQUIRE_DEVICE();
    auto x = uniform(100 * 4, 1);
    DeviceBuffer dx = to_device(x);
    DeviceBuffer od(ctx(), 4096 * 4 * 100), oi(ctx(), 4096 * 8 * 100);
    EXPECT_EQ(kind_of([&] {
                  gpuivfpq::gpu::k_select(ctx(), dx.as<float>(), 4, 100, 100, 2049, false, od.as<float>(),
                                          oi.as<int32_t>());
              }),
              ErrorKind::InvalidArgument);
    EXPECT_EQ(kind_of([&] {
                  gpuivfpq::gpu::k_select(ctx(), dx.as<float>(), 4, 100, 100, 0, false, od.as<float>(),
                                          oi.as<int32_t>());
              }),
              ErrorKind::InvalidArgument);
    EXPECT_EQ(kind_of([&] {
                  gpuivfpq::gpu::exact_knn(ctx(), dx.as<float>(), 10, dx.as<float>(), 10, 4, Metric::L2,
                                           3000, od.as<float>(), oi.as<int64_t>());
              }),
              ErrorKind::InvalidArgument);
    std::vector<float> cents(4 * 8, 0.5f), cbs(2 * 256 * 4, 0.25f);
    gpuivfpq::gpu::GpuIvfPqIndex idx(ctx(), 8, 4, 2, Metric::L2, cents.data(), cbs.data());
    std::vector<float> q(8, 1.0f), d(5000);
    std::vector<int64_t> l(5000);
    EXPECT_EQ(kind_of([&] { idx.search(q.data(), 1, 5000, 1, d.data(), l.data()); }),
              ErrorKind::InvalidArgument);
}

TEST(GpuErrors, UnsupportedM)
{
    GPU_REQUIRE_DEVICE();
    // One above the limit, with a d it divides (so only the limit refuses it).
    const size_t m = gpuivfpq::kMaxGpuSubQuantizers + 1, d = 2 * m;
    std::vector<float> cents(4 * d, 0.0f), cbs(d * 256, 0.0f);
    EXPECT_EQ(kind_of([&] {
                  gpuivfpq::gpu::GpuIvfPqIndex idx(ctx(), d, 4, m, Metric::L2, cents.data(), cbs.data());
              }),
              ErrorKind::Unsupported);
    EXPECT_EQ(kind_of([&] {
                  // m = 3 does not divide d = 130.
                  gpuivfpq::gpu::GpuIvfPqIndex idx(ctx(), 130, 4, 3, Metric::L2, cents.data(), cbs.data());
              }),
              ErrorKind::Unsupported);
}

TEST(GpuErrors, OutOfDeviceMemory)
{
    GPU_REQUIRE_DEVICE();
    {
        // Budget: 1 MiB cannot hold 4096 x 128 centroids (2 MiB).
        gpuivfpq::gpu::GpuContext small(0, size_t(1) << 20);
        std::vector<float> cents(4096 * 128, 0.0f), cbs(16 * 256 * 8, 0.0f);
        EXPECT_EQ(kind_of([&] {
                      gpuivfpq::gpu::GpuIvfPqIndex idx(small, 128, 4096, 16, Metric::L2, cents.data(),
                                                       cbs.data());
                  }),
                  ErrorKind::OutOfMemory);
        EXPECT_EQ(small.bytes_in_use(), 0u);
    }
    {
        // A budget beyond the card: the allocation itself fails, reported as
        // OutOfMemory, and the context stays usable afterwards.
        gpuivfpq::gpu::GpuContext big(0, size_t(1) << 52);
        EXPECT_EQ(kind_of([&] { DeviceBuffer b(big, size_t(1) << 50); }), ErrorKind::OutOfMemory);
        auto x = uniform(64, 3);
        DeviceBuffer dx(big, 64 * 4), od(big, 8 * 4), oi(big, 8 * 4);
        dx.upload(x.data(), 64 * 4);
        gpuivfpq::gpu::k_select(big, dx.as<float>(), 1, 64, 64, 8, false, od.as<float>(), oi.as<int32_t>());
        std::vector<float> r(8);
        od.download(r.data(), 32);
        std::vector<float> s(x);
        std::sort(s.begin(), s.end());
        for (int i = 0; i < 8; ++i)
            EXPECT_EQ(r[i], s[i]);
    }
}
