// GPU context: device, stream, cuBLAS handle, device-memory budget, scratch.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace gpuivfpq::gpu {

// Number of CUDA devices, 0 where the runtime or driver is missing (never throws).
int device_count();

// "name (sm_XY, N SMs, M MiB)" of a device; throws gpuivfpq::Error on CUDA errors.
std::string device_description(int device);

// How a host thread waits for its device's work (cudaSetDeviceFlags'
// scheduling flags): Auto lets the runtime choose (it spins while the
// process has fewer contexts than the host has cores), Spin polls on the
// CPU, Yield polls but gives up the CPU between polls, Block sleeps until
// the device's interrupt wakes it.
enum class HostWait { Auto, Spin, Yield, Block };

// Sets how host threads wait for the work of device from now on (before
// its first context, or overwriting the flags of its active one); throws
// gpuivfpq::Error on CUDA errors.
void set_host_wait(int device, HostWait wait);

// Page-locks host memory the caller owns and keeps mapped (cudaHostRegister
// on the current device), so that copies to and from it go by DMA without a
// staging copy that blocks the host; false when the driver refuses (the
// memory stays usable, its copies are then staged). Never throws.
bool pin_host(void* p, size_t bytes);
// Undoes pin_host before the memory is unmapped. Never throws.
void unpin_host(void* p);

// Owns one CUDA stream and cuBLAS handle on one device, and accounts every
// device allocation made through it against a byte budget. All work of the
// library is queued on this stream; host entry points that return host data
// synchronise it. Not thread-safe: one context per host thread.
class GpuContext {
public:
    // budget_bytes = 0: the device's free memory at creation minus 256 MiB.
    explicit GpuContext(int device = 0, size_t budget_bytes = 0);
    ~GpuContext();
    GpuContext(const GpuContext&) = delete;
    GpuContext& operator=(const GpuContext&) = delete;

    int device() const;
    // Makes this context's device the calling thread's current one: a
    // process serving several GPUs calls it before any work on this one
    // (allocations and launches go to the current device).
    void make_current() const;
    void* stream() const;  // the cudaStream_t, as void* to keep CUDA out of this header
    void synchronize() const;

    // A search call whose inputs and answers are staged in page-locked
    // memory may let other host threads queue work on this context's
    // stream while it waits for its own: yield(arg) is called once the
    // call's device work is queued, before it waits, and reclaim(arg) once
    // it has read its answers (also when the wait fails). The caller's own
    // locking decides who may use the context in between (the GPU
    // process's device lease); the call touches nothing of the context but
    // its own staging and event meanwhile. None by default: the context is
    // one thread's. Set and read under the caller's exclusive use.
    struct WaitHandover {
        void (*yield)(void*) = nullptr;
        void (*reclaim)(void*) = nullptr;
        void* arg = nullptr;
    };
    void set_wait_handover(const WaitHandover& h);
    WaitHandover wait_handover() const;

    size_t budget() const;
    size_t bytes_in_use() const;   // live allocations, scratch included
    size_t bytes_peak() const;
    int multiprocessors() const;

    struct Impl;
    Impl& impl() { return *impl_; }

private:
    std::unique_ptr<Impl> impl_;
};

}  // namespace gpuivfpq::gpu
