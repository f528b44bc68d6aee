// pin_host / unpin_host on the kind of memory the GPU process pins: a shared
// mapping of a memfd (the exchange with the service), written through a
// second mapping as the service writes it. Copies through the pinned mapping
// must carry exactly the bytes the other mapping wrote, both ways, and
// unpinning must leave the memory usable; null and empty ranges are refused
// quietly.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "gpu_ivfpq/device_buffer.h"
#include "gpu_ivfpq/gpu_context.h"
#include "gpu_test_util.h"

using namespace gputest;

TEST(PinnedHost, SharedMappingCopiesBothWays)
{
    GPU_REQUIRE_DEVICE();
    const size_t bytes = size_t(4) << 20;
    int fd = memfd_create("gpu_ivfpq-test-exchange", 0);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
    void* a = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    void* b = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT_NE(a, MAP_FAILED);
    ASSERT_NE(b, MAP_FAILED);
    const bool pinned = gpuivfpq::gpu::pin_host(a, bytes);
    EXPECT_TRUE(pinned) << "the driver refused to pin a shared memfd mapping";

    // The "service" writes through b; the device reads through a.
    auto* in = static_cast<uint32_t*>(b);
    for (size_t i = 0; i < bytes / 4; ++i)
        in[i] = static_cast<uint32_t>(i * 2654435761u);
    gpuivfpq::gpu::DeviceBuffer d(ctx(), bytes);
    d.upload(a, bytes);
    // From page-locked memory the copy is truly asynchronous: the source may
    // change only after the stream synchronises (copy_to_device's contract,
    // which the GPU process keeps by answering after a download).
    ctx().synchronize();
    // Back into the pinned mapping, over different contents.
    std::memset(a, 0, bytes);
    d.download(a, bytes);
    size_t bad = 0;
    for (size_t i = 0; i < bytes / 4; ++i)
        bad += in[i] != static_cast<uint32_t>(i * 2654435761u);
    EXPECT_EQ(bad, 0u);

    if (pinned)
        gpuivfpq::gpu::unpin_host(a);
    // Still ordinary memory.
    static_cast<char*>(a)[0] = 7;
    EXPECT_EQ(static_cast<char*>(b)[0], 7);
    EXPECT_FALSE(gpuivfpq::gpu::pin_host(nullptr, bytes));
    EXPECT_FALSE(gpuivfpq::gpu::pin_host(a, 0));
    munmap(a, bytes);
    munmap(b, bytes);
    close(fd);
}
