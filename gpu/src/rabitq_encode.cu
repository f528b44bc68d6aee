// A build's RaBitQ codes on the GPU (GpuRabitqIndex::encode): per tile of
// rows, a thread per row forms its unit residual against its list's
// centroid (Cosine rows normalised first), the residuals are rotated (P r in
// double, rabitq_rotate.cuh), and a thread per row makes o' unit again, runs
// the grid sweep, and writes the row's bit planes and factors. Every step
// is engine/rabitq_row.h's host-device code or the rotation in its order, so
// the rows are RabitqModel::encode's, bit for bit. The sweep is the
// definition's (a heap of the levels' next steps): more work per row than
// the CPU engine's binned sweep, spread over thousands of rows at once.
#include <algorithm>
#include <cstring>
#include <string>

#include "context_impl.h"
#include "cuda_check.h"
#include "engine/error.h"
#include "engine/inner_product.h"
#include "engine/rabitq_row.h"
#include "gpu_ivfpq/device_buffer.h"
#include "gpu_ivfpq/gpu_context.h"
#include "gpu_ivfpq/rabitq_index.h"
#include "rabitq_encode.h"
#include "rabitq_rotate.cuh"

namespace gpuivfpq::gpu {

namespace {

// Device scratch of one tile, about this many bytes (whole rows).
constexpr size_t kTileBytes = size_t(256) << 20;
constexpr int kThreads = 128;

struct EncodeArgs {
    float* x;                // n x d rows (normalised in place for Cosine)
    const int32_t* lists;    // n
    const float* centroids;  // lists x d
    double* res;             // n x d: unit residuals (0 for a row not encoded as such)
    double* rot;             // n x d: their rotations
    double* rn;              // n: ||r||, 0 for a row not encoded as such
    double* add;             // n: the factor's add before rounding
    double* us;              // n x d scratch
    uint16_t* coord;         // n x d scratch
    uint8_t* xv;             // n x d: the grid point's values
    uint8_t* rows;           // n x row_bytes out
    int64_t n;
    int d, bits, metric, row_bytes;
};

__global__ void __launch_bounds__(kThreads) residual_kernel(EncodeArgs a)
{
    const int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (s >= a.n)
        return;
    const size_t d = size_t(a.d);
    float* v = a.x + s * a.d;
    const float* c = a.centroids + int64_t(a.lists[s]) * a.d;
    if (a.metric == int(Metric::Cosine))
        normalize_row(v, d);
    double* r = a.res + s * a.d;
    const double sq = rabitq_residual(v, c, d, r);
    const double rn = __dsqrt_rn(sq);
    if (!rabitq_residual_live(rn)) {
        for (size_t k = 0; k < d; k++)
            r[k] = 0.0;
        a.rn[s] = 0.0;
        a.add[s] = 0.0;
        return;
    }
    rabitq_scale_down(r, d, rn);
    a.rn[s] = rn;
    a.add[s] = a.metric == int(Metric::InnerProduct) ? rabitq_ip_add(c, v, d) : sq;
}

__global__ void __launch_bounds__(kThreads) grid_kernel(EncodeArgs a)
{
    const int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (s >= a.n)
        return;
    const size_t d = size_t(a.d);
    uint8_t* x = a.xv + s * a.d;
    uint8_t* row = a.rows + s * a.row_bytes;
    const size_t cb = rabitq_code_bytes(d, a.bits);
    const double rn = a.rn[s];
    RabitqFactors f{0.0f, 0.0f, 0.0f};
    if (rn > 0.0) {
        double* o = a.rot + s * a.d;
        // P is orthogonal to float precision: make o' unit again.
        rabitq_scale_down(o, d, __dsqrt_rn(rabitq_dot(o, o, d)));
        const RabitqGridPoint g = rabitq_grid_point_sweep(o, d, a.bits, a.us + s * a.d, a.coord + s * a.d, x);
        f = rabitq_factors(a.add[s], rn, g, d);
    } else {
        // The zero vector's code (every value at the middle).
        for (size_t k = 0; k < d; k++)
            x[k] = uint8_t(1u << (a.bits - 1));
    }
    rabitq_pack_into(x, d, a.bits, row);
    memcpy(row + cb, &f, sizeof f);
}

// rabitq_grid_point_sweep of n vectors o (a thread each), for the tests.
__global__ void __launch_bounds__(kThreads)
    grid_points_kernel(const double* o, int64_t n, int d, int bits, double* us, uint16_t* coord, uint8_t* x,
                       RabitqGridPoint* out)
{
    const int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (s >= n)
        return;
    out[s] = rabitq_grid_point_sweep(o + s * d, size_t(d), bits, us + s * d, coord + s * d, x + s * d);
}

unsigned blocks_for(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

}  // namespace

void rabitq_encode_rows(GpuContext& ctx, const float* centroids, const float* rotation_t, size_t d, size_t lists,
                        int bits, Metric metric, const float* x, size_t n, const int32_t* list_ids, uint8_t* rows)
{
    if (n == 0)
        return;
    require(x && list_ids && rows, "GPU RaBitQ: null pointer in encode");
    for (size_t i = 0; i < n; i++)
        require(list_ids[i] >= 0 && size_t(list_ids[i]) < lists, "GPU RaBitQ: list id out of range in encode");
    const size_t rb = rabitq_row_bytes(d, bits);
    // Per row: its floats, residual and rotation, sweep scratch and values,
    // list, norm, add and the row out.
    const size_t per_row = d * (sizeof(float) + 3 * sizeof(double) + sizeof(uint16_t) + 1) + sizeof(int32_t) +
                           2 * sizeof(double) + rb + 64;
    // Rows of the rotation's blocks: their doubles in 48 KiB of shared memory.
    const int rot_rows = d * 4 * sizeof(double) <= 48 * 1024 ? 4 : 2;
    const size_t tile = std::max<size_t>(256, std::min<size_t>({n, kTileBytes / per_row, 65535 * size_t(rot_rows)}));
    const size_t nt_max = std::min(tile, n);
    DeviceBuffer bx(ctx, nt_max * d * sizeof(float)), blist(ctx, nt_max * sizeof(int32_t));
    DeviceBuffer bres(ctx, nt_max * d * sizeof(double)), brot(ctx, nt_max * d * sizeof(double));
    DeviceBuffer bus(ctx, nt_max * d * sizeof(double)), bcoord(ctx, nt_max * d * sizeof(uint16_t));
    DeviceBuffer bxv(ctx, nt_max * d), brn(ctx, nt_max * sizeof(double)), badd(ctx, nt_max * sizeof(double));
    DeviceBuffer brows(ctx, nt_max * rb);
    cudaStream_t st = ctx.impl().stream;
    for (size_t r0 = 0; r0 < n; r0 += tile) {
        const size_t nt = std::min(tile, n - r0);
        EncodeArgs a;
        a.x = bx.as<float>();
        a.lists = blist.as<int32_t>();
        a.centroids = centroids;
        a.res = bres.as<double>();
        a.rot = brot.as<double>();
        a.rn = brn.as<double>();
        a.add = badd.as<double>();
        a.us = bus.as<double>();
        a.coord = bcoord.as<uint16_t>();
        a.xv = bxv.as<uint8_t>();
        a.rows = brows.as<uint8_t>();
        a.n = int64_t(nt);
        a.d = int(d);
        a.bits = bits;
        a.metric = int(metric);
        a.row_bytes = int(rb);
        copy_to_device(ctx, a.x, x + r0 * d, nt * d * sizeof(float));
        copy_to_device(ctx, blist.data(), list_ids + r0, nt * sizeof(int32_t));
        residual_kernel<<<blocks_for(a.n), kThreads, 0, st>>>(a);
        GPU_KERNEL_CHECK();
        const dim3 grid(unsigned((d + 127) / 128), unsigned((nt + rot_rows - 1) / rot_rows));
        const size_t smem = size_t(rot_rows) * d * sizeof(double);
        if (rot_rows == 4)
            rabitq_rotate_kernel<double, 4><<<grid, 128, smem, st>>>(rotation_t, int(d), a.res, a.n, a.rot);
        else
            rabitq_rotate_kernel<double, 2><<<grid, 128, smem, st>>>(rotation_t, int(d), a.res, a.n, a.rot);
        GPU_KERNEL_CHECK();
        grid_kernel<<<blocks_for(a.n), kThreads, 0, st>>>(a);
        GPU_KERNEL_CHECK();
        copy_to_host(ctx, rows + r0 * rb, a.rows, nt * rb);
    }
}

void rabitq_grid_points_gpu(GpuContext& ctx, const double* o, size_t n, size_t d, int bits, uint8_t* x,
                            RabitqGridPoint* out)
{
    require(bits >= kRabitqMinBits && bits <= kRabitqMaxBits, "rabitq_grid_points_gpu: bits outside [1, 8]");
    require(d >= 1 && d <= kRabitqMaxDims, "rabitq_grid_points_gpu: d outside [1, kRabitqMaxDims]");
    if (n == 0)
        return;
    require(o && x && out, "rabitq_grid_points_gpu: null pointer");
    DeviceBuffer bo(ctx, n * d * sizeof(double)), bus(ctx, n * d * sizeof(double));
    DeviceBuffer bcoord(ctx, n * d * sizeof(uint16_t)), bx(ctx, n * d), bout(ctx, n * sizeof(RabitqGridPoint));
    bo.upload(o, n * d * sizeof(double));
    grid_points_kernel<<<blocks_for(int64_t(n)), kThreads, 0, ctx.impl().stream>>>(
        bo.as<double>(), int64_t(n), int(d), bits, bus.as<double>(), bcoord.as<uint16_t>(), bx.as<uint8_t>(),
        bout.as<RabitqGridPoint>());
    GPU_KERNEL_CHECK();
    bx.download(x, n * d);
    bout.download(out, n * sizeof(RabitqGridPoint));
}

}  // namespace gpuivfpq::gpu
