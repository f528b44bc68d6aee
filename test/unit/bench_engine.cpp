// Micro-benchmarks of the engine's hot paths; disabled by default, run with
// engine_tests --gtest_also_run_disabled_tests --gtest_filter='*Bench*'.
#include <time.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "engine/ivfpq.h"
#include "engine/rabitq.h"
#include "engine/topk.h"
#include "test_util.h"

using namespace gpuivfpq;

namespace {

// Wall and process-CPU seconds of one call (CPU time is robust on a busy box);
// returns the CPU seconds.
template <class F>
double timed(const char* what, F&& f)
{
    timespec c0, c1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    const auto w0 = std::chrono::steady_clock::now();
    f();
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    const double cpu = double(c1.tv_sec - c0.tv_sec) + 1e-9 * double(c1.tv_nsec - c0.tv_nsec);
    std::printf("%-58s wall %9.4f s  cpu %9.4f s\n", what, wall, cpu);
    return cpu;
}

}  // namespace

TEST(EngineBench, DISABLED_AssignAndAdc)
{
    const size_t d = 128, k = 1024, n = 100000;
    const auto x = testutil::clustered_vectors(n, d, 1000, 1.0f, 1);
    const auto c = testutil::gaussian_vectors(k, d, 2);
    std::vector<int32_t> as(n);
    std::vector<float> dist(n);
    for (int threads : {1, 2})
        timed(threads == 1 ? "assign_nearest 100k x 128 -> 1024, 1 thread"
                           : "assign_nearest 100k x 128 -> 1024, 2 threads",
              [&] { assign_nearest(x.data(), n, c.data(), k, d, as.data(), dist.data(), threads); });

    std::mt19937_64 gen(3);
    const size_t nc = 1000000;
    for (size_t m : {8, 16, 32, 64}) {
        std::vector<uint8_t> codes(nc * m);
        for (auto& b : codes)
            b = uint8_t(gen());
        const auto table = testutil::uniform_vectors(m * 256, 1, 4);
        std::vector<float> out(nc);
        char name[96];
        std::snprintf(name, sizeof name, "adc_scan 1M codes m=%zu (x10)", m);
        timed(name, [&] {
            for (int r = 0; r < 10; r++)
                adc_scan(codes.data(), nc, m, table.data(), m, 0.0f, out.data());
        });
    }
}

TEST(EngineBench, DISABLED_BuildAndQuery1M)
{
    const size_t d = 128, lists = 1024, m = 16, n = 1000000, nq = 200, nprobe = 32;
    const auto x = testutil::clustered_vectors(n + nq, d, 4000, 1.0f, 5);
    IvfPqModel model(d, lists, m, Metric::L2);
    std::vector<int32_t> ids(n);
    std::vector<uint8_t> codes(n * m);
    std::vector<float> radius(n);
    // Threads from GPU_IVFPQ_BENCH_THREADS (default 2, the target box).
    const char* env = std::getenv("GPU_IVFPQ_BENCH_THREADS");
    const int threads = env ? std::atoi(env) : 2;
    IvfPqTrainParams p;
    p.threads = threads;
    char name[96];
    std::snprintf(name, sizeof name, "train 1M x 128, lists=1024 m=16, %d thr", threads);
    timed(name, [&] { model.train(x.data(), n, p); });
    std::snprintf(name, sizeof name, "encode 1M x 128, %d thr", threads);
    timed(name, [&] { model.encode(x.data(), n, ids.data(), codes.data(), radius.data(), threads); });
    timed("precompute_tables (64 MiB budget)", [&] { model.precompute_tables(size_t(64) << 20); });

    // Per query: prepare, then for each probed list its table and a scan
    // of ~1000 codes (the typical list length at 1M / 1024).
    std::vector<uint8_t> list_codes(1000 * m);
    std::copy(codes.begin(), codes.begin() + list_codes.size(), list_codes.begin());
    std::vector<float> table(m * 256), out(1000);
    IvfPqQuery query;
    for (bool pre : {true, false}) {
        if (!pre)
            model.precompute_tables(0);
        std::snprintf(name, sizeof name, "%zu queries, nprobe=%zu x 1000 codes, precomputed=%d",
                      nq, nprobe, int(pre));
        timed(name, [&] {
            for (size_t qi = 0; qi < nq; qi++) {
                model.prepare_query(x.data() + (n + qi) * d, nprobe, query);
                TopK top(100);
                for (size_t pr = 0; pr < query.lists.size(); pr++) {
                    float base;
                    model.list_table(query, pr, table.data(), &base);
                    adc_scan(list_codes.data(), 1000, m, table.data(), m, base, out.data());
                    top.push_range(out.data(), 1000, int64_t(pr * 1000));
                }
                top.take_sorted();
            }
        });
    }

    std::vector<float> bd(100 * 10);
    std::vector<int64_t> bl(100 * 10);
    timed("brute_force_knn 100 queries x 1M x 128, k=10", [&] {
        brute_force_knn(x.data() + n * d, 100, x.data(), n, d, Metric::L2, 10, bd.data(),
                        bl.data());
    });
}

// RaBitQ encoding, one thread: microseconds per row (CPU time) for the
// whole encode (rotation, grid search, factors, packing) and for the grid
// search alone, at the dimensions and widths of docs/rabitq-codes.md.
TEST(EngineBench, DISABLED_RabitqEncode)
{
    for (size_t d : {128, 768}) {
        const size_t n = d <= 128 ? 4000 : 1000, lists = 4;
        const auto x = testutil::gaussian_vectors(n, d, 11);
        const auto cent = testutil::gaussian_vectors(lists, d, 12);
        std::vector<int32_t> ids(n);
        for (size_t i = 0; i < n; i++)
            ids[i] = int32_t(i % lists);
        const RabitqRotation rot = RabitqRotation::generate(d, 13, 2);
        // Unit directions for the grid search alone.
        std::vector<double> o(n * d);
        for (size_t i = 0; i < n; i++) {
            double nrm = 0;
            for (size_t t = 0; t < d; t++)
                nrm += double(x[i * d + t]) * double(x[i * d + t]);
            for (size_t t = 0; t < d; t++)
                o[i * d + t] = double(x[i * d + t]) / std::sqrt(nrm);
        }
        std::vector<uint8_t> xs(d);
        for (int bits : {1, 4, 5, 7, 8}) {
            RabitqModel m(d, lists, bits, Metric::L2, rot);
            m.set_centroids(cent.data());
            std::vector<uint8_t> codes(n * m.code_bytes());
            std::vector<RabitqFactors> f(n);
            char name[96];
            std::snprintf(name, sizeof name, "rabitq encode %zu x %zu, B=%d, 1 thread", n, d, bits);
            const double enc =
                timed(name, [&] { m.encode(x.data(), n, ids.data(), codes.data(), f.data(), 1); });
            std::snprintf(name, sizeof name, "rabitq grid search %zu x %zu, B=%d", n, d, bits);
            const double grid = timed(name, [&] {
                for (size_t i = 0; i < n; i++)
                    rabitq_best_grid_point(o.data() + i * d, d, bits, xs.data());
            });
            std::printf("  d=%zu B=%d: encode %.1f us/row, grid search %.1f us/row\n", d, bits,
                        1e6 * enc / double(n), 1e6 * grid / double(n));
        }
    }
}

// A RaBitQ build's CPU work per row at 1M x 128, lists 4096: the nearest
// list (assign) against the code (encode, 4 bits), one thread each.
TEST(EngineBench, DISABLED_RabitqAssignAndEncode)
{
    const size_t d = 128, n = 8192, lists = 4096;
    const auto x = testutil::gaussian_vectors(n, d, 21);
    const auto cent = testutil::gaussian_vectors(lists, d, 22);
    const RabitqRotation rot = RabitqRotation::generate(d, 13, 2);
    RabitqModel m(d, lists, 4, Metric::L2, rot);
    m.set_centroids(cent.data());
    std::vector<int32_t> ids(n);
    std::vector<uint8_t> codes(n * m.code_bytes());
    std::vector<RabitqFactors> f(n);
    const double as = timed("rabitq assign 8192 x 128 into 4096 lists, 1 thread",
                            [&] { m.assign(x.data(), n, ids.data(), 1); });
    const double enc = timed("rabitq encode 8192 x 128, B=4, 1 thread",
                             [&] { m.encode(x.data(), n, ids.data(), codes.data(), f.data(), 1); });
    std::printf("  assign %.1f us/row, encode %.1f us/row\n", 1e6 * as / double(n), 1e6 * enc / double(n));
}
