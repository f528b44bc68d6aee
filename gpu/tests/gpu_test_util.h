// Shared helpers for the GPU tests: device check/skip, a shared context,
// seeded data, host<->device copies, and a CPU IVFPQ reference search.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "engine/error.h"
#include "engine/ivfpq.h"
#include "engine/topk.h"
#include "gpu_ivfpq/device_buffer.h"
#include "gpu_ivfpq/gpu_context.h"

// Skips the test cleanly where no CUDA device (or driver) exists.
#define GPU_REQUIRE_DEVICE()                                                              \
    do {                                                                                  \
        if (::gpuivfpq::gpu::device_count() <= 0)                                         \
            GTEST_SKIP() << "no CUDA device: cudaGetDeviceCount failed or returned 0";    \
    } while (0)

namespace gputest {

// The kind of the gpuivfpq::Error that f throws (a test failure if none).
template <typename F>
gpuivfpq::ErrorKind kind_of(F&& f)
{
    try {
        f();
    } catch (const gpuivfpq::Error& e) {
        return e.kind();
    }
    ADD_FAILURE() << "no gpuivfpq::Error thrown";
    return gpuivfpq::ErrorKind::Internal;
}

using gpuivfpq::gpu::DeviceBuffer;
using gpuivfpq::gpu::GpuContext;

// One context for the whole test binary (cuBLAS handle creation is slow).
inline GpuContext& ctx()
{
    static GpuContext* c = new GpuContext(0);
    return *c;
}

// GPU_TEST_SEED replays a failing seed (each failure prints its seed).
inline uint64_t seed(uint64_t fallback)
{
    const char* env = std::getenv("GPU_TEST_SEED");
    return env ? std::strtoull(env, nullptr, 10) : fallback;
}

inline std::vector<float> uniform(size_t n, uint64_t s, float lo = -1.0f, float hi = 1.0f)
{
    std::mt19937_64 g(s);
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (float& x : v)
        x = u(g);
    return v;
}

// n x d points around `clusters` gaussian centres (spread) plus N(0, 1).
inline std::vector<float> clustered(size_t n, size_t d, size_t clusters, float spread, uint64_t s)
{
    std::mt19937_64 g(s);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> c(clusters * d);
    for (float& x : c)
        x = spread * nd(g);
    std::uniform_int_distribution<size_t> pick(0, clusters - 1);
    std::vector<float> v(n * d);
    for (size_t i = 0; i < n; ++i) {
        const size_t k = pick(g);
        for (size_t t = 0; t < d; ++t)
            v[i * d + t] = c[k * d + t] + nd(g);
    }
    return v;
}

template <typename T>
DeviceBuffer to_device(const std::vector<T>& v)
{
    DeviceBuffer b(ctx(), std::max<size_t>(v.size(), 1) * sizeof(T));
    b.upload(v.data(), v.size() * sizeof(T));
    return b;
}

template <typename T>
std::vector<T> to_host(const DeviceBuffer& b, size_t n)
{
    std::vector<T> v(n);
    b.download(v.data(), n * sizeof(T));
    return v;
}

inline std::string shape(const char* what, std::initializer_list<std::pair<const char*, double>> kv,
                         uint64_t s)
{
    std::ostringstream os;
    os << what << " seed=" << s;
    for (auto& p : kv)
        os << " " << p.first << "=" << p.second;
    return os.str();
}

// The bits of a value, to compare results bit for bit.
inline uint32_t bits_of(float v)
{
    uint32_t b;
    std::memcpy(&b, &v, sizeof b);
    return b;
}
inline uint64_t bits_of(double v)
{
    uint64_t b;
    std::memcpy(&b, &v, sizeof b);
    return b;
}

// check(d, bits, metric) for every metric, d = 100 (plane padding) and 128,
// and each of bits, under a trace naming the shape and the seed s.
template <typename Check>
void for_each_rabitq_shape(const char* what, uint64_t s, std::initializer_list<int> bits, Check check)
{
    for (gpuivfpq::Metric metric :
         {gpuivfpq::Metric::L2, gpuivfpq::Metric::InnerProduct, gpuivfpq::Metric::Cosine})
        for (size_t d : {size_t(100), size_t(128)})
            for (int b : bits) {
                SCOPED_TRACE(shape(what, {{"metric", double(int(metric))}, {"d", double(d)}, {"bits", double(b)}}, s));
                check(d, b, metric);
            }
}

// The inverted lists of a CPU-encoded database, and the CPU engine's
// IVFADC search over them (the reference the GPU must reproduce).
struct CpuIvf {
    const gpuivfpq::IvfPqModel* model = nullptr;
    std::vector<std::vector<uint8_t>> codes;
    std::vector<std::vector<int64_t>> ids;
    std::vector<int32_t> all_lists;   // per added vector
    std::vector<uint8_t> all_codes;

    void build(const gpuivfpq::IvfPqModel& mdl, const float* x, size_t n, const int64_t* id)
    {
        model = &mdl;
        const size_t m = mdl.m();
        codes.assign(mdl.lists(), {});
        ids.assign(mdl.lists(), {});
        all_lists.resize(n);
        all_codes.resize(n * m);
        mdl.encode(x, n, all_lists.data(), all_codes.data());
        for (size_t i = 0; i < n; ++i) {
            const int32_t l = all_lists[i];
            codes[l].insert(codes[l].end(), all_codes.begin() + i * m, all_codes.begin() + (i + 1) * m);
            ids[l].push_back(id[i]);
        }
    }

    std::vector<gpuivfpq::Neighbor> search(const float* q, size_t k, size_t nprobe) const
    {
        const size_t m = model->m();
        gpuivfpq::IvfPqQuery pq;
        model->prepare_query(q, nprobe, pq);
        gpuivfpq::TopK top(k);
        std::vector<float> table(m * 256);
        for (size_t p = 0; p < pq.lists.size(); ++p) {
            float base = 0;
            model->list_table(pq, p, table.data(), &base);
            const int32_t l = pq.lists[p];
            for (size_t i = 0; i < ids[l].size(); ++i)
                top.push(base + gpuivfpq::adc_lookup(codes[l].data() + i * m, table.data(), m), ids[l][i]);
        }
        return top.take_sorted();
    }
};

}  // namespace gputest
