// The exact distance of the SQL operators, in double precision, written once
// for the CPU and the GPU: the operators, the CPU engine's re-rank and the
// GPU's re-rank kernel all compile this code, so an index scan served by
// either device orders rows by exactly the values a sequential scan
// computes (bit for bit: the same operations in the same order, never fused
// into an FMA; the host build passes -ffp-contract=off, the device code uses
// the round-to-nearest intrinsics, which nvcc never contracts).
#pragma once

#include <cmath>
#include <cstddef>
#include <type_traits>

#include "distances.h"

#include "host_device.h"

namespace gpuivfpq {
namespace exact_detail {

// Round-to-nearest operations in double or float, never fused into an FMA
// (the host build passes -ffp-contract=off; nvcc never contracts its _rn
// intrinsics): what both devices compute the same way.
template <typename T>
constexpr bool kExactFloat = std::is_same_v<T, float> || std::is_same_v<T, double>;

template <typename T>
GPU_IVFPQ_HOST_DEVICE inline T mul(T a, T b)
{
    static_assert(kExactFloat<T>, "exact_detail: float or double");
#ifdef __CUDA_ARCH__
    if constexpr (std::is_same_v<T, float>)
        return __fmul_rn(a, b);
    else
        return __dmul_rn(a, b);
#else
    return a * b;
#endif
}

template <typename T>
GPU_IVFPQ_HOST_DEVICE inline T add(T a, T b)
{
    static_assert(kExactFloat<T>, "exact_detail: float or double");
#ifdef __CUDA_ARCH__
    if constexpr (std::is_same_v<T, float>)
        return __fadd_rn(a, b);
    else
        return __dadd_rn(a, b);
#else
    return a + b;
#endif
}

template <typename T>
GPU_IVFPQ_HOST_DEVICE inline T sub(T a, T b)
{
    static_assert(kExactFloat<T>, "exact_detail: float or double");
#ifdef __CUDA_ARCH__
    if constexpr (std::is_same_v<T, float>)
        return __fsub_rn(a, b);
    else
        return __dsub_rn(a, b);
#else
    return a - b;
#endif
}

template <typename T>
GPU_IVFPQ_HOST_DEVICE inline T div(T a, T b)
{
    static_assert(kExactFloat<T>, "exact_detail: float or double");
#ifdef __CUDA_ARCH__
    if constexpr (std::is_same_v<T, float>)
        return __fdiv_rn(a, b);
    else
        return __ddiv_rn(a, b);
#else
    return a / b;
#endif
}

template <typename T>
GPU_IVFPQ_HOST_DEVICE inline T root(T x)
{
    static_assert(kExactFloat<T>, "exact_detail: float or double");
#ifdef __CUDA_ARCH__
    if constexpr (std::is_same_v<T, float>)
        return __fsqrt_rn(x);
    else
        return __dsqrt_rn(x);
#else
    return std::sqrt(x);
#endif
}

}  // namespace exact_detail

// The exact distance as the SQL operators return it (not the engine's
// float ranking distance of metric_distance): L2 -> ||a - b|| (the root),
// InnerProduct -> -<a, b>, Cosine -> 1 - cos(a, b) clamped to [0, 2], NaN
// when either vector is zero (NaN sorts after every number, as float8 does
// in SQL). L2 and InnerProduct sum in four interleaved partial sums (no
// single dependency chain), Cosine in one; any change here changes results
// on both devices at once.
GPU_IVFPQ_HOST_DEVICE inline double exact_distance(Metric metric, const float* a, const float* b,
                                                   size_t d)
{
    using namespace exact_detail;
    double p[4] = {0.0, 0.0, 0.0, 0.0};
    size_t i = 0;

    switch (metric) {
    case Metric::L2:
        for (; i + 4 <= d; i += 4)
            for (int j = 0; j < 4; j++) {
                const double diff = sub(double(a[i + j]), double(b[i + j]));
                p[j] = add(p[j], mul(diff, diff));
            }
        for (; i < d; i++) {
            const double diff = sub(double(a[i]), double(b[i]));
            p[0] = add(p[0], mul(diff, diff));
        }
        return root(add(add(p[0], p[1]), add(p[2], p[3])));
    case Metric::InnerProduct:
        for (; i + 4 <= d; i += 4)
            for (int j = 0; j < 4; j++)
                p[j] = add(p[j], mul(double(a[i + j]), double(b[i + j])));
        for (; i < d; i++)
            p[0] = add(p[0], mul(double(a[i]), double(b[i])));
        return -add(add(p[0], p[1]), add(p[2], p[3]));
    case Metric::Cosine: {
        double s = 0.0, na = 0.0, nb = 0.0;
        for (; i < d; i++) {
            s = add(s, mul(double(a[i]), double(b[i])));
            na = add(na, mul(double(a[i]), double(a[i])));
            nb = add(nb, mul(double(b[i]), double(b[i])));
        }
        if (na == 0.0 || nb == 0.0)
            return double(NAN);
        s = div(s, root(mul(na, nb)));
        // Rounding can push |cos| past 1.
        if (s > 1.0)
            s = 1.0;
        else if (s < -1.0)
            s = -1.0;
        return sub(1.0, s);
    }
    }
    return double(NAN);
}

// The total order of exact results: smaller distance first, NaN after every
// number, then the smaller label (a heap TID: equal distances come back in
// TID order on every path).
GPU_IVFPQ_HOST_DEVICE inline bool exact_less(double da, long long la, double db, long long lb)
{
    const bool an = da != da, bn = db != db;
    if (an != bn)
        return bn;
    if (!an && da != db)
        return da < db;
    return la < lb;
}

}  // namespace gpuivfpq
