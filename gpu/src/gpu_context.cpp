// GpuContext, DeviceBuffer, scratch arena and the error helpers.
#include <algorithm>
#include <sstream>
#include <utility>

#include "context_impl.h"
#include "cuda_check.h"
#include "gpu_ivfpq/device_buffer.h"

namespace gpuivfpq::gpu {

void throw_cuda(cudaError_t err, const char* call, const char* file, int line)
{
    std::ostringstream os;
    os << "CUDA error " << cudaGetErrorName(err) << " (" << cudaGetErrorString(err) << ") in "
       << call << " at " << file << ":" << line;
    ErrorKind kind = err == cudaErrorMemoryAllocation ? ErrorKind::OutOfMemory
                     : (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver)
                         ? ErrorKind::Unsupported
                         : ErrorKind::Internal;
    // Clear a sticky-free error so the context stays usable after e.g. OOM.
    (void)cudaGetLastError();
    throw Error(kind, os.str());
}

void throw_cublas(cublasStatus_t st, const char* call, const std::string& shapes, const char* file,
                  int line)
{
    std::ostringstream os;
    os << "cuBLAS error " << cublasGetStatusName(st) << " in " << call << " [" << shapes << "] at "
       << file << ":" << line;
    throw Error(st == CUBLAS_STATUS_ALLOC_FAILED ? ErrorKind::OutOfMemory : ErrorKind::Internal,
                os.str());
}

int device_count()
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

bool pin_host(void* p, size_t bytes)
{
    if (p == nullptr || bytes == 0)
        return false;
    // Portable: pinned for every device's context (a process may serve several GPUs).
    if (cudaHostRegister(p, bytes, cudaHostRegisterPortable) != cudaSuccess) {
        (void)cudaGetLastError();  // a refusal is not sticky: clear it
        return false;
    }
    return true;
}

void unpin_host(void* p)
{
    if (p != nullptr && cudaHostUnregister(p) != cudaSuccess)
        (void)cudaGetLastError();
}

std::string device_description(int device)
{
    cudaDeviceProp prop;
    GPU_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    size_t free_bytes = 0, total_bytes = 0;
    GPU_CUDA_CHECK(cudaSetDevice(device));
    GPU_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    std::ostringstream os;
    os << prop.name << " (sm_" << prop.major << prop.minor << ", " << prop.multiProcessorCount
       << " SMs, " << (total_bytes >> 20) << " MiB)";
    return os.str();
}

void set_host_wait(int device, HostWait wait)
{
    unsigned flags = cudaDeviceScheduleAuto;
    switch (wait) {
    case HostWait::Spin:
        flags = cudaDeviceScheduleSpin;
        break;
    case HostWait::Yield:
        flags = cudaDeviceScheduleYield;
        break;
    case HostWait::Block:
        flags = cudaDeviceScheduleBlockingSync;
        break;
    case HostWait::Auto:
        break;
    }
    GPU_CUDA_CHECK(cudaSetDevice(device));
    GPU_CUDA_CHECK(cudaSetDeviceFlags(flags));
}

GpuContext::GpuContext(int device, size_t budget_bytes) : impl_(new Impl)
{
    int n = device_count();
    if (n <= 0)
        throw Error(ErrorKind::Unsupported, "no CUDA device available");
    require(device >= 0 && device < n, "GPU device index out of range");
    Impl& c = *impl_;
    c.device = device;
    GPU_CUDA_CHECK(cudaSetDevice(device));
    GPU_CUDA_CHECK(cudaGetDeviceProperties(&c.props, device));
    int pools = 0;
    GPU_CUDA_CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device));
    c.async_alloc = pools != 0;
    if (c.async_alloc) {
        // Freed blocks stay in the device's pool up to this many bytes, for
        // the next allocation (the default keeps none past a wait, so that
        // every list an append grows mapped fresh memory for its five
        // buffers).
        cudaMemPool_t pool = nullptr;
        GPU_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
        uint64_t keep = uint64_t(256) << 20;
        GPU_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    }
    GPU_CUDA_CHECK(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
    GPU_CUDA_CHECK(cudaStreamCreateWithFlags(&c.aux, cudaStreamNonBlocking));
    cublasStatus_t st = cublasCreate(&c.cublas);
    if (st != CUBLAS_STATUS_SUCCESS) {
        cudaStreamDestroy(c.aux);
        cudaStreamDestroy(c.stream);
        throw_cublas(st, "cublasCreate", "", __FILE__, __LINE__);
    }
    GPU_CUBLAS_CHECK(cublasSetStream(c.cublas, c.stream), "");
    size_t free_b = 0, total_b = 0;
    GPU_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    const size_t margin = size_t(256) << 20;
    c.budget = budget_bytes ? budget_bytes : (free_b > margin ? free_b - margin : free_b / 2);
}

GpuContext::~GpuContext()
{
    Impl& c = *impl_;
    cudaSetDevice(c.device);
    if (c.arena)
        c.release(c.arena, c.arena_bytes);
    if (c.cublas_workspace)
        c.release(c.cublas_workspace, c.cublas_workspace_bytes);
    cudaStreamSynchronize(c.stream);
    cudaStreamSynchronize(c.aux);
    cublasDestroy(c.cublas);
    cudaStreamDestroy(c.aux);
    cudaStreamDestroy(c.stream);
}

int GpuContext::device() const { return impl_->device; }
void GpuContext::make_current() const { GPU_CUDA_CHECK(cudaSetDevice(impl_->device)); }
void* GpuContext::stream() const { return impl_->stream; }
void GpuContext::synchronize() const { GPU_CUDA_CHECK(cudaStreamSynchronize(impl_->stream)); }
void GpuContext::set_wait_handover(const WaitHandover& h) { impl_->handover = h; }
GpuContext::WaitHandover GpuContext::wait_handover() const { return impl_->handover; }
size_t GpuContext::budget() const { return impl_->budget; }
size_t GpuContext::bytes_in_use() const { return impl_->in_use; }
size_t GpuContext::bytes_peak() const { return impl_->peak; }
int GpuContext::multiprocessors() const { return impl_->props.multiProcessorCount; }

void* GpuContext::Impl::allocate(size_t bytes)
{
    if (bytes == 0)
        return nullptr;
    if (bytes > budget || in_use > budget - bytes) {
        std::ostringstream os;
        os << "GPU memory budget exceeded: requested " << bytes << " bytes with " << in_use
           << " of " << budget << " in use";
        throw Error(ErrorKind::OutOfMemory, os.str());
    }
    void* p = nullptr;
    if (async_alloc)
        GPU_CUDA_CHECK(cudaMallocAsync(&p, bytes, stream));
    else
        GPU_CUDA_CHECK(cudaMalloc(&p, bytes));
    in_use += bytes;
    peak = std::max(peak, in_use);
    return p;
}

void GpuContext::Impl::own_cublas_workspace(size_t bytes)
{
    if (cublas_workspace)
        return;
    void* p = allocate(bytes);
    cublasStatus_t st = cublasSetWorkspace(cublas, p, bytes);
    if (st != CUBLAS_STATUS_SUCCESS) {
        release(p, bytes);
        throw_cublas(st, "cublasSetWorkspace", "", __FILE__, __LINE__);
    }
    cublas_workspace = p;
    cublas_workspace_bytes = bytes;
}

void GpuContext::Impl::release(void* p, size_t bytes)
{
    if (!p)
        return;
    // Destructors must not throw: a failed free is reported by the next check.
    if (async_alloc)
        cudaFreeAsync(p, stream);
    else
        cudaFree(p);
    in_use -= std::min(in_use, bytes);
}

Scratch::Scratch(GpuContext& ctx, size_t bytes) : ctx_(ctx.impl())
{
    bytes = (bytes + 255) / 256 * 256;
    bytes_ = bytes;
    if (ctx_.capturing && !(ctx_.arena && ctx_.arena_top + bytes <= ctx_.arena_bytes))
        throw Error(ErrorKind::Internal, "scratch beyond the arena while capturing a CUDA graph");
    saved_top_ = ctx_.arena_top;
    ctx_.arena_depth++;
    ctx_.arena_high = std::max(ctx_.arena_high, ctx_.arena_top + bytes);
    if (ctx_.arena && ctx_.arena_top + bytes <= ctx_.arena_bytes) {
        ptr_ = static_cast<char*>(ctx_.arena) + ctx_.arena_top;
        ctx_.arena_top += bytes;
        return;
    }
    try {
        ptr_ = ctx_.allocate(bytes);
    } catch (...) {
        ctx_.arena_depth--;
        throw;
    }
    own_ = true;
    // Charge the arena's mark too, so nested scopes see a consistent stack.
    ctx_.arena_top += bytes;
}

Scratch::~Scratch()
{
    if (own_)
        ctx_.release(ptr_, bytes_);
    ctx_.arena_top = saved_top_;
    if (--ctx_.arena_depth == 0 && ctx_.arena_high > ctx_.arena_bytes && !ctx_.capturing) {
        // Grow once no scratch is live; stream order keeps queued users safe.
        size_t want = ctx_.arena_high;
        if (ctx_.arena)
            ctx_.release(ctx_.arena, ctx_.arena_bytes);
        ctx_.arena = nullptr;
        ctx_.arena_bytes = 0;
        try {
            ctx_.arena = ctx_.allocate(want);
            ctx_.arena_bytes = want;
            ctx_.arena_generation++;
        } catch (...) {
            // No room for a larger arena: later scratch falls back to own allocations.
        }
        ctx_.arena_high = 0;
    }
}

DeviceBuffer::DeviceBuffer(GpuContext& ctx, size_t bytes) : ctx_(&ctx), bytes_(bytes)
{
    ptr_ = ctx.impl().allocate(bytes);
}

DeviceBuffer::~DeviceBuffer() { reset(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ctx_(o.ctx_), ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0))
{
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept
{
    if (this != &o) {
        reset();
        ctx_ = o.ctx_;
        ptr_ = std::exchange(o.ptr_, nullptr);
        bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
}

void DeviceBuffer::reset()
{
    if (ptr_ && ctx_)
        ctx_->impl().release(ptr_, bytes_);
    ptr_ = nullptr;
    bytes_ = 0;
}

void DeviceBuffer::upload(const void* host, size_t bytes, size_t offset)
{
    require(offset + bytes <= bytes_, "DeviceBuffer::upload out of range");
    copy_to_device(*ctx_, static_cast<char*>(ptr_) + offset, host, bytes);
}

void DeviceBuffer::download(void* host, size_t bytes, size_t offset) const
{
    require(offset + bytes <= bytes_, "DeviceBuffer::download out of range");
    copy_to_host(*ctx_, host, static_cast<const char*>(ptr_) + offset, bytes);
}

void DeviceBuffer::fill_zero()
{
    if (bytes_)
        GPU_CUDA_CHECK(cudaMemsetAsync(ptr_, 0, bytes_, ctx_->impl().stream));
}

void copy_to_device(GpuContext& ctx, void* dst, const void* host, size_t bytes)
{
    if (!bytes)
        return;
    // Pageable source: the copy is staged, and returns once the source may
    // be reused, so callers can free host memory right after. A page-locked
    // source (pin_host, the GPU process's exchange) is read by DMA later:
    // it must stay unchanged until the stream synchronises.
    GPU_CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, ctx.impl().stream));
}

void copy_to_host_async(GpuContext& ctx, void* host, const void* src, size_t bytes)
{
    if (bytes)
        GPU_CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, ctx.impl().stream));
}

void copy_to_host(GpuContext& ctx, void* host, const void* src, size_t bytes)
{
    copy_to_host_async(ctx, host, src, bytes);
    GPU_CUDA_CHECK(cudaStreamSynchronize(ctx.impl().stream));
}

}  // namespace gpuivfpq::gpu
