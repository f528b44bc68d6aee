// WarpSelect / BlockSelect and the fused IVF scan for warp queues of 128 (k <= 128).
#include "../ivf_scan.cuh"
#include "../select_kernel.cuh"

namespace gpuivfpq::gpu {

template <>
void launch_select_bucket<128>(const SelectArgs& a, bool block_per_row, cudaStream_t stream)
{
    launch_select_impl<128>(a, block_per_row, stream);
}

template <>
void launch_ivf_fused_bucket<128>(const IvfScanArgs& a, bool half, cudaStream_t stream)
{
    launch_ivf_fused_impl<128>(a, half, stream);
}

}  // namespace gpuivfpq::gpu
