// RAII device allocation, move-only, charged to a GpuContext's budget.
#pragma once

#include <cstddef>

namespace gpuivfpq::gpu {

class GpuContext;

// Device memory from a plain stream-ordered allocation (never managed
// memory). Allocation beyond the context's budget, or a failing cudaMalloc,
// throws Error(OutOfMemory). Freed on the context's stream, so work already
// queued that reads it completes first.
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    DeviceBuffer(GpuContext& ctx, size_t bytes);
    ~DeviceBuffer();
    DeviceBuffer(DeviceBuffer&& o) noexcept;
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    void* data() const { return ptr_; }
    template <typename T>
    T* as() const { return static_cast<T*>(ptr_); }
    size_t bytes() const { return bytes_; }
    bool empty() const { return ptr_ == nullptr; }

    // Host <-> device copies on the context's stream; download() waits.
    void upload(const void* host, size_t bytes, size_t offset = 0);
    void download(void* host, size_t bytes, size_t offset = 0) const;
    void fill_zero();
    void reset();  // frees now (stream-ordered)

private:
    GpuContext* ctx_ = nullptr;
    void* ptr_ = nullptr;
    size_t bytes_ = 0;
};

// Copies between host and device pointers on the context's stream. A
// pageable source may be reused when copy_to_device returns; a page-locked
// one (pin_host) only after the stream synchronises.
void copy_to_device(GpuContext& ctx, void* dst, const void* host, size_t bytes);
void copy_to_host(GpuContext& ctx, void* host, const void* src, size_t bytes);  // waits

}  // namespace gpuivfpq::gpu
