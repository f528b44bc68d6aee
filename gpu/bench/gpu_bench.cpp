// Benchmark of the GPU kernels: copy bandwidth, k-selection, exact search,
// k-means and IVFPQ search on vectors from .fvecs files: tools/gen_synthetic's
// SIFT-like set, the data the SQL benchmarks load (bench/gpu/run_on_device.sh
// makes them). Prints markdown tables.
//   gpu_bench --base BASE.fvecs --queries QUERIES.fvecs [--quick] [--stages]
//   gpu_bench --rabitq
// `--quick` shrinks the copy, k-selection and IVF sizes for a smoke run.
// `--rabitq` times the RaBitQ list scan alone and the GPU mirror's whole
// search (GpuRabitqIndex::search) over random codes (their speed does not
// depend on the values) and needs no files.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <string>
#include <map>
#include <vector>

#include "engine/error.h"
#include "gpu_ivfpq/device_buffer.h"
#include "gpu_ivfpq/exact_search.h"
#include "gpu_ivfpq/gpu_context.h"
#include "gpu_ivfpq/ivfpq_index.h"
#include "gpu_ivfpq/k_select.h"
#include "gpu_ivfpq/kmeans_gpu.h"
#include "gpu_ivfpq/rabitq_index.h"
#include "gpu_ivfpq/rabitq_scan.h"
#include "engine/rabitq.h"
#include "../../tools/common.h"  // read_fvecs: the tools' reader of the generator's files
#include "bench_util.h"  // ck, time_ms, recall_at
#include "uniform.h"

using namespace gpuivfpq;
using namespace gpuivfpq::gpu;
using namespace gpuivfpq::bench;

namespace {

// The last component of a path, for the log.
const char* file_name(const std::string& path)
{
    const size_t slash = path.rfind('/');
    return path.c_str() + (slash == std::string::npos ? 0 : slash + 1);
}

// Page-locked queries (the first b rows of hq), distances and labels (k
// per query) for search_exact calls, as the GPU process's exchange holds them.
struct PinnedCall {
    float* q = nullptr;
    double* dist = nullptr;
    int64_t* labels = nullptr;
    PinnedCall(const std::vector<float>& hq, size_t b, size_t d, size_t k)
    {
        ck(cudaHostAlloc(reinterpret_cast<void**>(&q), b * d * sizeof(float), 0), "pinned");
        ck(cudaHostAlloc(reinterpret_cast<void**>(&dist), b * k * sizeof(double), 0), "pinned");
        ck(cudaHostAlloc(reinterpret_cast<void**>(&labels), b * k * sizeof(int64_t), 0), "pinned");
        std::copy(hq.begin(), hq.begin() + b * d, q);
    }
    ~PinnedCall()
    {
        cudaFreeHost(q);
        cudaFreeHost(dist);
        cudaFreeHost(labels);
    }
    PinnedCall(const PinnedCall&) = delete;
    PinnedCall& operator=(const PinnedCall&) = delete;
};

// The GPU mirror of an index with RaBitQ codes (GpuRabitqIndex::search, as
// the service calls it): coarse step, tables, scan and k-selection of k =
// 100 candidates per query through nprobe 32 lists, host to host; random
// rows spread evenly over the lists, or (skewed) row i in list
// lists x u^1.5 for a uniform u: the longest list 16 times the mean, as
// clustered data gives.
// Ranked by lower bounds (eps0 kRabitqLowerEps0) as the GPU service's
// searches are. profile_batch > 0 (`--rabitq-profile B`, for a profiler):
// the skewed shapes only, then 5 calls of B queries at nprobe 32 and 5 at
// 80, no table, by the staged kernels and again in one launch.
void rabitq_index_bench(GpuContext& ctx, size_t profile_batch = 0)
{
    std::printf("\n# RaBitQ mirror search (GpuRabitqIndex::search, host to host), k 100, ranked by lower bounds\n"
                "# (eps0 %.1f, as the GPU service asks), nprobe 32 (80 too for the skewed 128-d lists); ms\n"
                "# per call as it runs by default (the radix k-selections of set_radix_select, CUDA graphs\n"
                "# for batches up to 128), without the graphs, with WarpSelect instead of the radix\n"
                "# selections, and in one launch (set_small_batch_max: batches up to 256)\n\n",
                double(gpuivfpq::kRabitqLowerEps0));
    std::printf("| d | bits | rows | lists | spread | nprobe | batch | ms | ms, no graphs | ms, WarpSelect | "
                "ms, one launch | queries/s |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    struct Shape {
        size_t d, n, lists;
        bool skewed;
        std::vector<int> bits;
    };
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    auto next = [&rng] {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        return rng;
    };
    auto unit = [&] { return float(next() >> 40) / float(1 << 24) * 2.0f - 1.0f; };
    const std::vector<Shape> shapes = {Shape{128, 1000000, 4096, false, {2, 4}},
                                       Shape{128, 1000000, 4096, true, {4}},
                                       Shape{768, 200000, 1024, false, {2, 4}},
                                       Shape{768, 200000, 1024, true, {4}}};
    for (const Shape& sh : shapes)
        for (int bits : sh.bits) {
            if (profile_batch && !sh.skewed)
                continue;
            const size_t rb = rabitq_row_bytes(sh.d, bits), cb = rabitq_code_bytes(sh.d, bits);
            std::vector<float> cent(sh.lists * sh.d);
            for (float& v : cent)
                v = unit();
            std::vector<uint8_t> blob(rabitq_model_bytes(sh.d, sh.lists));
            float* rot = reinterpret_cast<float*>(blob.data());
            for (size_t i = 0; i < sh.d * sh.d; i++)
                rot[i] = unit() / std::sqrt(float(sh.d));
            double* pc = reinterpret_cast<double*>(blob.data() + rabitq_rotated_offset(sh.d));
            for (size_t i = 0; i < sh.lists * sh.d; i++)
                pc[i] = unit();
            GpuRabitqIndex index(ctx, sh.d, sh.lists, bits, Metric::L2, cent.data(), blob.data());
            const size_t step = 100000;
            std::vector<uint8_t> rows(step * rb);
            std::vector<int32_t> lists(step);
            std::vector<int64_t> ids(step);
            for (size_t a = 0; a < sh.n; a += step) {
                const size_t nb = std::min(step, sh.n - a);
                for (size_t i = 0; i < nb; i++) {
                    uint8_t* r = rows.data() + i * rb;
                    for (size_t b = 0; b < cb; b++)
                        r[b] = uint8_t(next());
                    const float f[3] = {1.0f + unit(), 1.0f + unit(), 0.1f};
                    std::memcpy(r + cb, f, sizeof(f));
                    if (sh.skewed) {
                        const double u = double(next() >> 11) / double(uint64_t(1) << 53);
                        lists[i] = int32_t(std::min(sh.lists - 1, size_t(double(sh.lists) * std::pow(u, 1.5))));
                    } else {
                        lists[i] = int32_t((a + i) % sh.lists);
                    }
                    ids[i] = int64_t(a + i);
                }
                index.add(nb, lists.data(), rows.data(), ids.data());
            }
            if (profile_batch) {
                std::vector<float> q(profile_batch * sh.d), dist(profile_batch * 100);
                std::vector<int64_t> labels(profile_batch * 100);
                for (float& v : q)
                    v = unit();
                // The staged kernels, then the one launch (rabitq_small_kernel).
                for (size_t small : {size_t(0), size_t(256)})
                    for (size_t nprobe : {size_t(32), size_t(80)})
                        for (int rep = 0; rep < 5; rep++) {
                            index.set_small_batch_max(small);
                            index.search(q.data(), profile_batch, 100, nprobe, dist.data(), labels.data(), nullptr,
                                         gpuivfpq::kRabitqLowerEps0);
                        }
                index.set_small_batch_max(0);
                continue;
            }
            for (size_t nprobe : {size_t(32), size_t(80)})
                for (size_t nq : {size_t(1), size_t(8), size_t(16), size_t(24), size_t(64), size_t(1000), size_t(10000)}) {
                    if (nprobe != 32 && !(sh.skewed && sh.d == 128))
                        continue;
                    std::vector<float> q(nq * sh.d), dist(nq * 100);
                    std::vector<int64_t> labels(nq * 100);
                    for (float& v : q)
                        v = unit();
                    // {radix, graphs, one launch}: the default, no graphs,
                    // WarpSelect, one launch (small batches only).
                    const bool runs[4][3] = {{true, true, false}, {true, false, false}, {false, true, false},
                                             {true, true, true}};
                    double ms[4] = {0, 0, 0, 0};
                    for (int r = 0; r < 4; r++) {
                        if (runs[r][2] && nq > 256)
                            continue;
                        set_radix_select(ctx, runs[r][0]);
                        index.set_search_graphs(runs[r][1]);
                        index.set_small_batch_max(runs[r][2] ? 256 : 0);
                        ms[r] = time_ms(ctx, [&] {
                            index.search(q.data(), nq, 100, nprobe, dist.data(), labels.data(), nullptr,
                                         gpuivfpq::kRabitqLowerEps0);
                        }, nq >= 1000 ? 3 : 20, 2);
                    }
                    set_radix_select(ctx, true);
                    index.set_search_graphs(true);
                    index.set_small_batch_max(0);
                    char one[32] = "-";
                    if (ms[3] > 0)
                        std::snprintf(one, sizeof one, "%.3f", ms[3]);
                    std::printf("| %zu | %d | %zu | %zu | %s | %zu | %zu | %.3f | %.3f | %.3f | %s | %.0f |\n", sh.d,
                                bits, sh.n, sh.lists, sh.skewed ? "skewed" : "even", nprobe, nq, ms[0], ms[1], ms[2],
                                one, double(nq) / (ms[0] * 1e-3));
                    std::fflush(stdout);
                }
        }
}

// The GPU mirror's RaBitQ search over real lists (`--rabitq-data`): the
// base's k-means lists (on the GPU, as a build trains them), a RaBitQ
// model with a random rotation (the CPU engine's), every row assigned and
// encoded on the GPU. Clustered data's queries fall in its dense regions:
// they probe long lists, and a batch's queries probe many lists in common.
// Printed: the rows a query probes against lists of even length, then ms
// per call of k 100 candidates by lower bounds, as the service asks, by
// batch: the staged kernels and the one launch (set_small_batch_max).
// profile_batch > 0 (`--profile B`, for a profiler): no table; three calls
// of B queries at nprobe 32 by the staged kernels.
void rabitq_data_bench(GpuContext& ctx, const std::vector<float>& hbase, const std::vector<float>& hq, size_t d,
                       size_t lists, int bits, const char* what, size_t profile_batch = 0)
{
    const size_t n = hbase.size() / d, nq = hq.size() / d;
    KMeansParams kp;
    kp.iterations = 10;
    kp.seed = 1234;
    kp.max_points_per_centroid = 256;
    std::vector<float> cent(lists * d);
    kmeans_train_gpu_host(ctx, hbase.data(), n, d, lists, kp, cent.data());
    std::printf("\n# RaBitQ mirror search over %s: %zu x %zu, %zu k-means lists (GPU), %zu queries; k 100 ranked by\n"
                "# lower bounds (eps0 %.1f), ms per call (host to host, CUDA graphs up to 128), by the staged\n"
                "# kernels and in one launch\n\n",
                what, n, d, lists, nq, double(gpuivfpq::kRabitqLowerEps0));
    std::printf("| bits | nprobe | rows probed a query (even lists) | batch | ms | ms, one launch | queries/s |\n"
                "|---|---|---|---|---|---|---|\n");
    {
        RabitqModel model(d, lists, bits, Metric::L2, RabitqRotation::generate(d, 4242, 8));
        model.set_centroids(cent.data(), 8);
        std::vector<uint8_t> blob(rabitq_model_bytes(d, lists));
        std::memcpy(blob.data(), model.rotation().matrix().data(), d * d * sizeof(float));
        std::memcpy(blob.data() + rabitq_rotated_offset(d), model.rotated_centroids().data(),
                    lists * d * sizeof(double));
        GpuRabitqIndex index(ctx, d, lists, bits, Metric::L2, cent.data(), blob.data());
        const size_t step = 100000, rb = rabitq_row_bytes(d, bits);
        std::vector<int32_t> lid(step);
        std::vector<uint8_t> rows(step * rb);
        std::vector<int64_t> ids(step);
        for (size_t a = 0; a < n; a += step) {
            const size_t nb = std::min(step, n - a);
            index.assign(hbase.data() + a * d, nb, lid.data());
            index.encode(hbase.data() + a * d, nb, lid.data(), rows.data());
            for (size_t i = 0; i < nb; i++)
                ids[i] = int64_t(a + i);
            index.add(nb, lid.data(), rows.data(), ids.data());
        }
        if (profile_batch) {
            const size_t b = std::min(profile_batch, nq);
            std::vector<float> dist(b * 100);
            std::vector<int64_t> labels(b * 100);
            for (int rep = 0; rep < 3; rep++)
                index.search(hq.data(), b, 100, 32, dist.data(), labels.data(), nullptr, gpuivfpq::kRabitqLowerEps0);
            return;
        }
        // GPU_BENCH_ROWS_PER_BLOCK="512 1024 ...": the table again at each
        // (set_rows_per_block; 0: the default).
        std::vector<int> rows_per_block = {0};
        if (const char* v = std::getenv("GPU_BENCH_ROWS_PER_BLOCK")) {
            rows_per_block.clear();
            for (char* e = const_cast<char*>(v); *e;) {
                char* next = nullptr;
                const long r = std::strtol(e, &next, 10);
                if (next == e)
                    break;
                rows_per_block.push_back(int(r));
                e = next;
            }
        }
        for (int rpb : rows_per_block)
        for (size_t nprobe : {size_t(32), size_t(80)}) {
            if (nprobe == 80 && d > 256)
                continue;
            if (rpb > 0) {
                index.set_rows_per_block(rpb);
                std::printf("| rows a block: %d | | | | | | |\n", rpb);
            }
            std::vector<int32_t> pl(nq * nprobe);
            index.probe_lists(hq.data(), nq, nprobe, pl.data());
            double probed = 0;
            for (int32_t l : pl)
                probed += double(index.list_size(size_t(l)));
            char rows_probed[64];
            std::snprintf(rows_probed, sizeof rows_probed, "%.0f (%.0f)", probed / double(nq),
                          double(nprobe) * double(n) / double(lists));
            for (size_t b : {size_t(1), size_t(8), size_t(16), size_t(32), size_t(64), size_t(1000), nq}) {
                if (b > nq)
                    continue;
                std::vector<float> dist(b * 100);
                std::vector<int64_t> labels(b * 100);
                double ms[2] = {0, 0};
                for (int r = 0; r < 2; r++) {
                    if (r == 1 && b > 256)
                        continue;
                    index.set_small_batch_max(r == 1 ? 256 : 0);
                    // Successive calls take successive queries (a batch's
                    // lists differ from call to call, as under load).
                    size_t at = 0;
                    ms[r] = time_ms(ctx, [&] {
                        if (at + b > nq)
                            at = 0;
                        index.search(hq.data() + at * d, b, 100, nprobe, dist.data(), labels.data(), nullptr,
                                     gpuivfpq::kRabitqLowerEps0);
                        at += b;
                    }, b >= 1000 ? 3 : 20, 2);
                }
                index.set_small_batch_max(0);
                const double best = ms[1] > 0 ? std::min(ms[0], ms[1]) : ms[0];
                char one[32] = "-";
                if (ms[1] > 0)
                    std::snprintf(one, sizeof one, "%.3f", ms[1]);
                std::printf("| %d | %zu | %s | %zu | %.3f | %s | %.0f |\n", bits, nprobe, rows_probed, b, ms[0], one,
                            double(b) / (best * 1e-3));
                std::fflush(stdout);
            }
        }
    }
}

// The RaBitQ list scan (rabitq_scan): n rows in `lists` lists of equal
// size, nq queries probing nprobe lists each (spread over the lists), every
// row's estimate and bound; random codes, factors and tables.
int rabitq_bench()
{
    if (device_count() <= 0) {
        std::printf("no CUDA device: benchmark skipped\n");
        return 0;
    }
    GpuContext ctx(0);
    cudaDeviceProp prop{};
    ck(cudaGetDeviceProperties(&prop, 0), "props");
    std::printf("# RaBitQ list scan on %s (%d SMs): a block per (query, list) pair, a thread per row\n\n",
                prop.name, prop.multiProcessorCount);
    std::printf("| d | bits | rows | lists | queries | nprobe | rows scanned | ms | rows/s | code+factor GB/s |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
    struct Shape {
        size_t d, n, lists;
    };
    for (const Shape sh : {Shape{128, 1000000, 4096}, Shape{768, 200000, 1024}})
        for (int bits : {4, 7}) {
            const size_t cb = rabitq_code_bytes(sh.d, bits), per = sh.n / sh.lists;
            const size_t lut_floats = rabitq_plane_words(sh.d) * 4 * 256;
            DeviceBuffer codes(ctx, sh.n * cb), factors(ctx, sh.n * sizeof(RabitqFactors));
            fill_uniform(codes.as<float>(), int64_t(sh.n * cb / 4), 11, ctx.stream());
            fill_uniform(factors.as<float>(), int64_t(sh.n * 3), 12, ctx.stream());
            for (size_t nq : {size_t(1), size_t(32), size_t(1000)}) {
                const size_t nprobe = 32, npairs = nq * nprobe;
                std::vector<RabitqPair> pairs(npairs);
                for (size_t i = 0; i < npairs; i++) {
                    const size_t list = (i * 2654435761u) % sh.lists;  // spread over the lists
                    pairs[i].first = list * per;
                    pairs[i].count = uint32_t(per);
                    pairs[i].out = i * per;
                    pairs[i].base = 1.0f;
                    pairs[i].add_scale = 1.0f;
                    pairs[i].ip_scale = -2.0f;
                    pairs[i].bound_scale = 1.0f;
                }
                DeviceBuffer dpairs(ctx, npairs * sizeof(RabitqPair)), luts(ctx, npairs * lut_floats * 4);
                dpairs.upload(pairs.data(), npairs * sizeof(RabitqPair));
                fill_uniform(luts.as<float>(), int64_t(npairs * lut_floats), 13, ctx.stream());
                DeviceBuffer est(ctx, npairs * per * 4), bound(ctx, npairs * per * 4);
                const double ms = time_ms(ctx, [&] {
                    rabitq_scan(ctx, dpairs.as<RabitqPair>(), npairs, luts.as<float>(), sh.d, bits,
                                codes.as<uint8_t>(), cb, factors.as<RabitqFactors>(), kRabitqDefaultEps0,
                                est.as<float>(), bound.as<float>());
                }, 10, 2);
                const double rows = double(npairs * per);
                std::printf("| %zu | %d | %zu | %zu | %zu | %zu | %.0f | %.3f | %.2fG | %.0f |\n", sh.d, bits, sh.n,
                            sh.lists, nq, nprobe, rows, ms, rows / (ms * 1e-3) / 1e9,
                            rows * (cb + sizeof(RabitqFactors)) / (ms * 1e-3) / 1e9);
                std::fflush(stdout);
            }
        }
    rabitq_index_bench(ctx);
    return 0;
}

}  // namespace

int main(int argc, char** argv)
{
    if (argc == 3 && !std::strcmp(argv[1], "--rabitq-profile")) {
        try {
            GpuContext ctx(0);
            rabitq_index_bench(ctx, std::max<size_t>(1, std::strtoul(argv[2], nullptr, 10)));
            return 0;
        } catch (const std::exception& e) {
            std::fprintf(stderr, "gpu_bench: %s\n", e.what());
            return 1;
        }
    }
    if (argc == 2 && !std::strcmp(argv[1], "--rabitq")) {
        try {
            return rabitq_bench();
        } catch (const std::exception& e) {
            std::fprintf(stderr, "gpu_bench: %s\n", e.what());
            return 1;
        }
    }
    bool quick = false, stages_only = false;
    size_t stage_nprobe = 32, profile_batch = 0, stage_m = 32, lists_arg = 0;
    bool small_ab = false, rabitq_data = false;
    size_t rabitq_bits = 4;
    std::string base_path, queries_path;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--quick"))
            quick = true;
        else if (!std::strcmp(argv[i], "--stages"))
            stages_only = true;  // only the search_exact stage table (a short device call)
        else if (!std::strcmp(argv[i], "--nprobe") && i + 1 < argc)
            stage_nprobe = std::strtoul(argv[++i], nullptr, 10);  // the stage tables' probes (default 32)
        else if (!std::strcmp(argv[i], "--small-ab")) {
            // only the one-launch variants table (a short device call)
            small_ab = true;
            stages_only = true;
        } else if (!std::strcmp(argv[i], "--profile") && i + 1 < argc) {
            // for a profiler: the stage section's index, then 50 one-launch
            // calls at this batch, nothing else
            profile_batch = std::strtoul(argv[++i], nullptr, 10);
            stages_only = true;
        }
        else if (!std::strcmp(argv[i], "--m") && i + 1 < argc)
            stage_m = std::strtoul(argv[++i], nullptr, 10);  // the stage tables' code bytes (default 32)
        else if (!std::strcmp(argv[i], "--lists") && i + 1 < argc)
            lists_arg = std::strtoul(argv[++i], nullptr, 10);  // default 4096 (--quick: 256)
        else if (!std::strcmp(argv[i], "--rabitq-data"))
            rabitq_data = true;  // only the RaBitQ search over the files' k-means lists
        else if (!std::strcmp(argv[i], "--bits") && i + 1 < argc)
            rabitq_bits = std::strtoul(argv[++i], nullptr, 10);  // --rabitq-data's code bits (default 4)
        else if (!std::strcmp(argv[i], "--base") && i + 1 < argc)
            base_path = argv[++i];
        else if (!std::strcmp(argv[i], "--queries") && i + 1 < argc)
            queries_path = argv[++i];
        else {
            std::fprintf(stderr, "usage: gpu_bench --base BASE.fvecs --queries QUERIES.fvecs [--quick] [--stages] [--nprobe N] [--m M] [--lists L] [--profile BATCH] [--small-ab]\n"
                                 "       gpu_bench --rabitq\n"
                                 "       gpu_bench --rabitq-profile BATCH\n"
                                 "       gpu_bench --rabitq-data --base BASE.fvecs --queries QUERIES.fvecs [--lists L] [--bits B]\n");
            return 2;
        }
    }
    std::vector<float> hbase, hq;
    const size_t d = bench::read_base_and_queries("gpu_bench", base_path, queries_path, hbase, hq);
    if (d == 0)
        return 2;
    const size_t n = hbase.size() / d, nq = hq.size() / d;
    if ((!rabitq_data && (stage_m == 0 || d % stage_m != 0)) || (lists_arg != 0 && lists_arg > n)) {
        std::fprintf(stderr, "gpu_bench: --m must divide the dimension (%zu) and --lists be at most the rows (%zu)\n",
                     d, n);
        return 2;
    }
    if (device_count() <= 0) {
        std::printf("no CUDA device: benchmark skipped\n");
        return 0;
    }
    try {
        GpuContext ctx(0);
        cudaDeviceProp prop{};
        ck(cudaGetDeviceProperties(&prop, 0), "props");
        std::printf("# gpu_bench on %s (%d SMs, %.1f GiB), budget %.1f GiB%s\n\n", prop.name,
                    prop.multiProcessorCount, prop.totalGlobalMem / double(1 << 30),
                    ctx.budget() / double(1 << 30), quick ? " [quick]" : "");
        std::fflush(stdout);
        if (rabitq_data) {
            const size_t l = lists_arg ? lists_arg : std::max<size_t>(1, std::min<size_t>(4096, n / 200));
            rabitq_data_bench(ctx, hbase, hq, d, l, int(std::max<size_t>(1, std::min<size_t>(8, rabitq_bits))),
                              file_name(base_path), profile_batch);
            return 0;
        }

        // Copy bandwidth: (bytes read + bytes written) / time of a D2D copy.
        const size_t cbytes = quick ? (size_t(256) << 20) : (size_t(2) << 30);
        double bw;
        {
            DeviceBuffer a(ctx, cbytes), b(ctx, cbytes);
            ck(cudaMemsetAsync(a.data(), 1, cbytes, static_cast<cudaStream_t>(ctx.stream())), "memset");
            double ms = time_ms(ctx, [&] {
                ck(cudaMemcpyAsync(b.data(), a.data(), cbytes, cudaMemcpyDeviceToDevice,
                                   static_cast<cudaStream_t>(ctx.stream())), "copy");
            }, 10, 2);
            bw = 2.0 * cbytes / (ms * 1e-3);
            std::printf("copy bandwidth (read+write): %.0f GB/s (%.2f GB copied in %.3f ms)\n\n", bw / 1e9,
                        cbytes / 1e9, ms);
        }

        // k-selection on a rows x cols uniform matrix.
        if (!stages_only) {
            const size_t rows = quick ? 1000 : 10000, cols = quick ? 12800 : 128000;
            DeviceBuffer m(ctx, rows * cols * 4);
            fill_uniform(m.as<float>(), int64_t(rows * cols), 7, ctx.stream());
            const double floor_ms = rows * cols * 4.0 / bw * 1e3;
            std::printf("## k-selection, %zu x %zu float32 (%.2f GB read; floor %.3f ms at copy bandwidth)\n\n",
                        rows, cols, rows * cols * 4 / 1e9, floor_ms);
            std::printf("| k | algorithm | ms | %% of bandwidth floor |\n|---|---|---|---|\n");
            DeviceBuffer od(ctx, rows * 2048 * 4), oi(ctx, rows * 2048 * 4);
            for (size_t k : {1, 10, 100, 1000, 2048})
                for (SelectAlgo algo : {SelectAlgo::Warp, SelectAlgo::Block}) {
                    if (k == 2048 && algo == SelectAlgo::Warp)
                        continue;  // runs as BlockSelect
                    double ms = time_ms(ctx, [&] {
                        k_select(ctx, m.as<float>(), rows, cols, cols, k, false, od.as<float>(),
                                 oi.as<int32_t>(), algo);
                    }, 5);
                    std::printf("| %zu | %s | %.3f | %.1f%% |\n", k,
                                algo == SelectAlgo::Warp ? "WarpSelect" : "BlockSelect", ms,
                                100.0 * floor_ms / ms);
                    std::fflush(stdout);
                }
            std::printf("\n");
        }

        // The data set.
        const size_t lists = lists_arg ? lists_arg : quick ? 256 : 4096;
        DeviceBuffer base(ctx, n * d * 4), queries(ctx, nq * d * 4);
        base.upload(hbase.data(), n * d * 4);
        queries.upload(hq.data(), nq * d * 4);
        std::printf("data: %zu x %zu base (%s), %zu queries (%s)\n\n", n, d, file_name(base_path), nq,
                    file_name(queries_path));

        // Exact search.
        std::vector<int64_t> gt(nq);
        if (!stages_only) {
            std::printf("## exact search, %zu queries x %zu base, d = %zu, L2 (fp32 SGEMM, 1 GiB tiles)\n\n", nq, n, d);
            std::printf("| k | exact_knn ms | GEMM tiles alone ms | selection overhead | queries/s |\n|---|---|---|---|---|\n");
            DeviceBuffer norms(ctx, n * 4);
            row_norms(ctx, base.as<float>(), n, d, norms.as<float>());
            const double gemm = time_ms(ctx, [&] {
                gemm_tiles_only(ctx, queries.as<float>(), nq, base.as<float>(), n, d);
            }, 3);
            DeviceBuffer od(ctx, nq * 100 * 4), ol(ctx, nq * 100 * 8);
            for (size_t k : {10, 100})
                for (bool overlap : {true, false}) {
                    set_exact_overlap(ctx, overlap);
                    double ms = time_ms(ctx, [&] {
                        exact_knn(ctx, queries.as<float>(), nq, base.as<float>(), n, d, Metric::L2, k,
                                  od.as<float>(), ol.as<int64_t>(), norms.as<float>());
                    }, 3);
                    std::printf("| %zu%s | %.2f | %.2f | %.0f%% | %.0f |\n", k,
                                overlap ? " (GEMM/selection overlapped)" : " (serial)", ms, gemm,
                                100.0 * (ms - gemm) / gemm, nq / (ms * 1e-3));
                    std::fflush(stdout);
                }
            set_exact_overlap(ctx, true);
            std::vector<int64_t> l(nq * 100);
            ol.download(l.data(), l.size() * 8);
            for (size_t i = 0; i < nq; ++i)
                gt[i] = l[i * 100];
            std::printf("\n");
        }

        // k-means timing (the IVF section trains its own quantizers the same way).
        std::vector<float> cents(lists * d);
        if (!stages_only) {
            KMeansParams kp;
            kp.iterations = quick ? 3 : 10;
            kp.seed = 1234;
            kp.max_points_per_centroid = 256;
            DeviceBuffer dc(ctx, lists * d * 4);
            KMeansGpuStats st;
            kmeans_train_gpu(ctx, base.as<float>(), n, d, lists, kp, dc.as<float>(), &st);
            dc.download(cents.data(), cents.size() * 4);
            std::printf("## k-means: %zu x %zu into %zu centroids: %.1f ms per iteration (%d iterations, "
                        "%zu points used, %zu empty-cluster splits, objective %.4g)\n\n",
                        n, d, lists, st.seconds_per_iteration * 1e3, st.iterations, st.points_used,
                        st.empty_splits, st.objective);
            std::fflush(stdout);
        }

        // IVFPQ.
        const size_t k = 100;
        std::vector<size_t> probes = {1, 2, 4, 8, 16, 32, 64, 128, 256};
        std::vector<int64_t> ids(n);
        for (size_t i = 0; i < n; ++i)
            ids[i] = int64_t(i);
        // The quantizers of IVF<lists>,PQ<m> on the base, the same draws each time.
        auto train = [&](size_t m, std::vector<float>& centroids, std::vector<float>& codebooks) {
            KMeansParams pq;
            pq.iterations = 10;
            pq.seed = 99;
            KMeansParams kc;
            kc.iterations = quick ? 3 : 10;
            kc.seed = 1234;
            kc.max_points_per_centroid = 256;
            train_ivfpq_gpu(ctx, hbase.data(), n, d, lists, m, Metric::L2, kc, pq, 65536, centroids.data(),
                            codebooks.data());
        };
        for (size_t m : {16, 64}) {
            if (stages_only)
                break;
            std::vector<float> cb(m * 256 * (d / m)), c2(lists * d);
            train(m, c2, cb);
            // Default index (term 1 folded per vector) and the paper's layout
            // (per-list term-1 tables) over the same GPU-encoded codes.
            GpuIvfPqIndex idx(ctx, d, lists, m, Metric::L2, c2.data(), cb.data());
            std::vector<int32_t> enc_l(n);
            std::vector<uint8_t> enc_c(n * m);
            idx.encode(hbase.data(), n, enc_l.data(), enc_c.data());
            idx.add_encoded(n, enc_l.data(), enc_c.data(), ids.data());
            GpuIvfPqOptions paper;
            paper.term1_per_vector = false;
            GpuIvfPqIndex idx_paper(ctx, d, lists, m, Metric::L2, c2.data(), cb.data(), paper);
            idx_paper.add_encoded(n, enc_l.data(), enc_c.data(), ids.data());
            auto mem = idx.memory_use();
            auto memp = idx_paper.memory_use();
            std::printf("## IVF%zu,PQ%zu: %zu vectors, device memory %.1f MiB (codes %.1f, ids %.1f, "
                        "per-vector term 1 %.1f); paper layout %.1f MiB (per-list term-1 tables %.1f)\n\n",
                        lists, m, idx.ntotal(), mem.total() / 1048576.0, mem.codes / 1048576.0,
                        mem.ids / 1048576.0, mem.vector_terms / 1048576.0, memp.total() / 1048576.0,
                        memp.term1 / 1048576.0);
            // Probed code bytes need the lists this index probes.
            std::vector<int64_t> plab(nq * 256);
            {
                DeviceBuffer dc(ctx, lists * d * 4), pd(ctx, nq * 256 * 4), pl(ctx, nq * 256 * 8);
                dc.upload(c2.data(), c2.size() * 4);
                exact_knn(ctx, queries.as<float>(), nq, dc.as<float>(), lists, d, Metric::L2,
                          std::min<size_t>(256, lists), pd.as<float>(), pl.as<int64_t>());
                pl.download(plab.data(), plab.size() * 8);
            }
            std::printf("| nprobe | batch %zu ms | QPS batch %zu | QPS batch 1 | R@1 | R@10 | R@100 | probed codes GB | %% of code-read floor |\n",
                        nq, nq);
            std::printf("|---|---|---|---|---|---|---|---|---|\n");
            DeviceBuffer od(ctx, nq * k * 4), ol(ctx, nq * k * 8);
            std::vector<int64_t> lab(nq * k);
            for (size_t np : probes) {
                if (np > lists)
                    continue;
                double bytes = 0;
                for (size_t i = 0; i < nq; ++i)
                    for (size_t p = 0; p < np; ++p)
                        bytes += double(idx.list_size(plab[i * 256 + p])) * m;
                const double ms = time_ms(ctx, [&] {
                    idx.search_device(queries.as<float>(), nq, k, np, od.as<float>(), ol.as<int64_t>());
                }, 3);
                ol.download(lab.data(), lab.size() * 8);
                // Batch 1: queries one at a time, each waited for (latency-bound).
                const size_t b1 = quick ? 50 : (np <= 32 ? 500 : 200);
                double b1_ms = time_ms(ctx, [&] {
                    for (size_t i = 0; i < b1; ++i) {
                        idx.search_device(queries.as<float>() + i * d, 1, k, np, od.as<float>(), ol.as<int64_t>());
                        ctx.synchronize();
                    }
                }, 1);
                const double floor_ms = bytes / bw * 1e3;
                std::printf("| %zu | %.2f | %.0f | %.0f | %.3f | %.3f | %.3f | %.2f | %.1f%% |\n", np, ms,
                            nq / (ms * 1e-3), b1 / (b1_ms * 1e-3), recall_at(lab, k, gt, 1), recall_at(lab, k, gt, 10),
                            recall_at(lab, k, gt, 100), bytes / 1e9, 100.0 * floor_ms / ms);
                std::fflush(stdout);
            }
            // Variants at a few nprobe: term-1 layout, fused vs two-pass
            // selection, fp32 vs fp16 tables.
            std::printf("\nvariants (batch %zu, ms; pv = term 1 per vector, pl = per-list term-1 tables "
                        "as in the paper):\n\n| nprobe | k | pv fused fp32 | pv two-pass fp32 | pv fused fp16 | "
                        "pl fused fp32 | pl two-pass fp32 | pl fused fp16 | pl two-pass fp16 | pv fp16 R@10 |\n"
                        "|---|---|---|---|---|---|---|---|---|---|\n", nq);
            for (size_t np : {8, 32, 128}) {
                for (size_t kk : {10, 100}) {
                    struct V { GpuIvfPqIndex* ix; ScanAlgo a; bool half; };
                    const V vs[] = {{&idx, ScanAlgo::Fused, false},       {&idx, ScanAlgo::TwoPass, false},
                                    {&idx, ScanAlgo::Fused, true},        {&idx_paper, ScanAlgo::Fused, false},
                                    {&idx_paper, ScanAlgo::TwoPass, false}, {&idx_paper, ScanAlgo::Fused, true},
                                    {&idx_paper, ScanAlgo::TwoPass, true}};
                    std::printf("| %zu | %zu |", np, kk);
                    double r10 = 0;
                    for (const V& v : vs) {
                        v.ix->set_float16_tables(v.half);
                        v.ix->set_scan_algo(v.a);
                        const double t = time_ms(ctx, [&] {
                            v.ix->search_device(queries.as<float>(), nq, kk, np, od.as<float>(), ol.as<int64_t>());
                        }, 3);
                        if (v.ix == &idx && v.half) {
                            std::vector<int64_t> l2(nq * kk);
                            ol.download(l2.data(), l2.size() * 8);
                            r10 = recall_at(l2, kk, gt, 10);
                        }
                        v.ix->set_float16_tables(false);
                        v.ix->set_scan_algo(ScanAlgo::Auto);
                        std::printf(" %.2f |", t);
                    }
                    std::printf(" %.3f |\n", r10);
                    std::fflush(stdout);
                }
            }
            std::printf("\n");
        }

        // Where one search_exact call's time goes, by batch size: the
        // service's scan rounds (IVF4096,PQ32 with vectors, nprobe 32, 100
        // candidates re-ranked). Device stages by CUDA events; "host" is the
        // call's wall time not covered by them (launches, waits).
        {
            const size_t m = stage_m, kk = 100, np = std::max<size_t>(1, std::min(stage_nprobe, lists));
            std::vector<float> cb(m * 256 * (d / m)), c2(lists * d);
            train(m, c2, cb);
            GpuIvfPqOptions with_vectors;
            with_vectors.store_vectors = true;
            GpuIvfPqIndex idx(ctx, d, lists, m, Metric::L2, c2.data(), cb.data(), with_vectors);
            std::vector<int32_t> enc_l(n);
            std::vector<uint8_t> enc_c(n * m);
            idx.encode(hbase.data(), n, enc_l.data(), enc_c.data());
            idx.add_encoded(n, enc_l.data(), enc_c.data(), ids.data(), hbase.data());
            if (profile_batch > 0) {
                const size_t b = std::min(profile_batch, nq);
                std::vector<double> od(b * kk);
                std::vector<int64_t> ol(b * kk);
                idx.set_small_batch_max(256);
                for (int c = 0; c < 50; ++c)
                    idx.search_exact(hq.data() + (c % (nq / b)) * b * d, b, kk, np, od.data(), ol.data());
                std::printf("profile: 50 calls at batch %zu, nprobe %zu, one launch %s\n", b, np,
                            idx.small_batch_path(b, kk, np) ? "yes" : "no");
                return 0;
            }
            auto print_occupancy = [&] {
                std::printf("## one-launch clusters resident at once (cudaOccupancyMaxActiveClusters; k %zu, nprobe "
                            "%zu)\n\n| blocks per query | shared memory per block | clusters resident | with 32 KiB "
                            "less | with half | registers per thread |\n|---|---|---|---|---|---|\n", kk, np);
                for (const auto& row : idx.small_batch_occupancy(kk, np))
                    std::printf("| %d | %zu | %d | %d | %d | %d |\n", row.cluster, row.smem, row.active,
                                row.active_less_32k, row.active_half, row.registers);
                std::printf("\n");
            };
            if (small_ab) {
                print_occupancy();
                // The one-launch kernel's variants, wall us per call (graphs
                // on; each call a different slice of the queries, as a
                // service's batches are), two rounds alternating; answers
                // compared with the first column's on one slice.
                idx.set_small_batch_max(256);
                auto variants = [&](const char* title, const std::vector<int>& values,
                                    const std::function<void(int, size_t)>& set) {
                    std::printf("## one launch by %s (wall us per call, means of 200 calls in two rounds; nprobe %zu)"
                                "\n\n| batch |", title, np);
                    for (int v : values)
                        std::printf(" %d |", v);
                    std::printf("\n|---|");
                    for (size_t v = 0; v < values.size(); ++v)
                        std::printf("---|");
                    std::printf("\n");
                    for (size_t b : {size_t(1), size_t(8), size_t(10), size_t(12), size_t(14), size_t(16), size_t(20),
                                     size_t(24), size_t(32), size_t(64)}) {
                        if (b > nq)
                            continue;
                        std::vector<double> od(b * kk), want_d;
                        std::vector<int64_t> ol(b * kk), want_l;
                        std::vector<double> us(values.size(), 0.0);
                        std::vector<char> same(values.size(), 1);
                        for (int round = 0; round < 2; ++round)
                            for (size_t v = 0; v < values.size(); ++v) {
                                set(values[v], b);
                                idx.search_exact(hq.data(), b, kk, np, od.data(), ol.data());
                                if (round == 0 && v == 0) {
                                    want_d = od;
                                    want_l = ol;
                                }
                                same[v] = same[v] && ol == want_l &&
                                          std::memcmp(od.data(), want_d.data(), od.size() * sizeof(double)) == 0;
                                for (int w = 0; w < 3; ++w)
                                    idx.search_exact(hq.data() + ((w + 1) % (nq / b)) * b * d, b, kk, np,
                                                     od.data(), ol.data());
                                const auto t0 = std::chrono::steady_clock::now();
                                for (int c = 0; c < 100; ++c)
                                    idx.search_exact(hq.data() + (c % (nq / b)) * b * d, b, kk, np, od.data(),
                                                     ol.data());
                                us[v] += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() -
                                                                                    t0).count() / 200.0;
                            }
                        std::printf("| %zu |", b);
                        for (size_t v = 0; v < values.size(); ++v)
                            std::printf(" %.1f%s |", us[v], same[v] ? "" : " (answers differ!)");
                        std::printf("\n");
                        std::fflush(stdout);
                    }
                    std::printf("\n");
                };
                variants("scan prefetch (0 share to L1 before the scan, 1 none, 2 share to L2, 3 two steps ahead)",
                         {0, 1, 2, 3}, [&](int v, size_t) { idx.set_small_scan_prefetch(v); });
                idx.set_small_scan_prefetch(GpuIvfPqOptions().small_scan_prefetch);
                variants("zero copy (0 copies, 1 answers in place, 2 queries and answers in place)", {0, 1, 2},
                         [&](int v, size_t) { idx.set_small_zero_copy(v); });
                idx.set_small_zero_copy(GpuIvfPqOptions().small_zero_copy);
                // Blocks per query: the default choice (0), or the most that
                // keeps the batch's blocks at one per multiprocessor (1: at
                // most 16, the multiprocessors over the batch).
                variants("blocks per query (0 the default, 1 the multiprocessors over the batch, at most 16)", {0, 1},
                         [&](int v, size_t b) {
                             idx.set_small_cluster(v == 0 ? 0
                                                          : static_cast<int>(std::max<size_t>(
                                                                1, std::min<size_t>(16, prop.multiProcessorCount / b))));
                         });
                idx.set_small_cluster(GpuIvfPqOptions().small_cluster);
                variants("coarse keys (0 each query's blocks, 1 a kernel for the batch first)", {0, 1},
                         [&](int v, size_t) { idx.set_small_shared_coarse_from(v == 0 ? 0 : 1); });
                idx.set_small_shared_coarse_from(GpuIvfPqOptions().small_shared_coarse_from);
                // Blocks per query forced around the default's choice at
                // batches of 20 to 40 (clusters of 7 at 32), three times:
                // whether a size whose clusters only just all fit at once
                // sometimes takes two rounds.
                for (int t = 0; t < 3; ++t)
                    variants("blocks per query (0 the default, else forced)", {0, 5, 6, 7, 8},
                             [&](int v, size_t) { idx.set_small_cluster(v); });
                idx.set_small_cluster(GpuIvfPqOptions().small_cluster);
                return 0;
            }
            // Twice: the staged pipeline forced (small_batch_max 0), then the
            // one-launch path (forced up to 256 to find where it stops paying;
            // its single kernel shows as "scan").
            const size_t default_small = GpuIvfPqOptions().small_batch_max;
            std::vector<std::vector<double>> traces;
            std::vector<std::vector<unsigned long long>> block_times;
            std::vector<size_t> trace_batches;
            for (int path = 0; path < 2; ++path) {
            idx.set_small_batch_max(path == 0 ? 0 : 256);
            std::printf("## search_exact stages, IVF%zu,PQ%zu with vectors, nprobe %zu, %zu candidates, %s "
                        "(us per call, means of %d calls)\n\n", lists, m, np, kk,
                        path == 0 ? "staged pipeline (small_batch_max 0)"
                                  : "one launch (small_batch_max 256; the kernel is the scan column)",
                        quick ? 20 : 200);
            std::printf("| batch | upload | coarse | prefix | scan | merge | decode | rerank | download | "
                        "device | wall | host |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
            for (size_t b : {size_t(1), size_t(8), size_t(16), size_t(24), size_t(32), size_t(64), size_t(128),
                             size_t(256)}) {
                if (b > nq)
                    continue;
                if (path == 1 && !idx.small_batch_path(b, kk, np))
                    continue;
                std::vector<double> od(b * kk);
                std::vector<int64_t> ol(b * kk);
                idx.search_exact(hq.data(), b, kk, np, od.data(), ol.data());  // warm-up
                SearchStages st;
                idx.set_stage_timing(&st);
                const int calls = quick ? 20 : 200;
                for (int c = 0; c < calls; ++c)
                    idx.search_exact(hq.data() + (c % (nq / b)) * b * d, b, kk, np, od.data(), ol.data());
                idx.set_stage_timing(nullptr);
                const double per = 1000.0 / double(st.calls);
                const double dev = st.upload + st.coarse + st.prefix + st.scan + st.merge + st.decode +
                                   st.rerank + st.download;
                std::printf("| %zu | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n",
                            b, st.upload * per, st.coarse * per, st.prefix * per, st.scan * per, st.merge * per,
                            st.decode * per, st.rerank * per, st.download * per, dev * per, st.wall * per,
                            (st.wall - dev) * per);
                std::fflush(stdout);
                if (path == 1) {
                    idx.set_small_batch_trace(true);
                    idx.search_exact(hq.data(), b, kk, np, od.data(), ol.data());
                    traces.push_back(idx.small_batch_trace());
                    block_times.push_back(idx.small_batch_blocks());
                    trace_batches.push_back(b);
                    idx.set_small_batch_trace(false);
                }
            }
            std::printf("\n");
            }
            // Block 0's clock at the one-launch kernel's phase ends (one call
            // per batch; cycles / 1000).
            std::printf("## one-launch phases, block 0 of query 0 (kcycles)\n\n| batch | start | table | coarse "
                        "| coarse select | sync | probes | sync | prefix | scan | scan select | sync | rank | "
                        "rerank | sync | order | select: radix | pick | rank | broadcast | rerank: positions | staging | "
                        "distances | block 0 GHz |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
            for (size_t t = 0; t < traces.size(); ++t) {
                std::printf("| %zu |", trace_batches[t]);
                for (size_t i = 0; i < traces[t].size(); ++i) {
                    const double c = traces[t][i];
                    if (c < 0)
                        std::printf(" - |");
                    else if (i + 1 == traces[t].size())
                        std::printf(" %.2f |", c);  // GHz, not cycles
                    else
                        std::printf(" %.2f |", c / 1000.0);
                }
                std::printf("\n");
            }
            std::printf("\n");
            // Every block's start and end (global timer) in the traced call:
            // whether the clusters run at once or in waves, and how long a
            // block takes when the batch fills the GPU.
            std::printf("## one-launch blocks in time (us from the first block's start; the traced call of each "
                        "batch)\n\n| batch | blocks | SMs used | most blocks on one SM | starts: last | ends: "
                        "first | median | last | block time: min | median | max |\n|---|---|---|---|---|---|---|---|"
                        "---|---|---|\n");
            for (size_t t = 0; t < block_times.size(); ++t) {
                const auto& w = block_times[t];
                const size_t nb = w.size() / 3;
                if (nb == 0)
                    continue;
                unsigned long long t0 = w[0];
                std::map<unsigned long long, int> per_sm;
                std::vector<double> starts, ends, spans;
                for (size_t i = 0; i < nb; ++i)
                    t0 = std::min(t0, w[3 * i]);
                for (size_t i = 0; i < nb; ++i) {
                    starts.push_back((w[3 * i] - t0) / 1000.0);
                    ends.push_back(w[3 * i + 1] > w[3 * i] ? (w[3 * i + 1] - t0) / 1000.0 : -1.0);
                    spans.push_back(w[3 * i + 1] > w[3 * i] ? (w[3 * i + 1] - w[3 * i]) / 1000.0 : -1.0);
                    per_sm[w[3 * i + 2]]++;
                }
                int most = 0;
                for (const auto& kv : per_sm)
                    most = std::max(most, kv.second);
                std::sort(starts.begin(), starts.end());
                std::sort(ends.begin(), ends.end());
                std::sort(spans.begin(), spans.end());
                std::printf("| %zu | %zu | %zu | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n",
                            trace_batches[t], nb, per_sm.size(), most, starts.back(), ends.front(), ends[nb / 2],
                            ends.back(), spans.front(), spans[nb / 2], spans.back());
            }
            std::printf("\n");
            print_occupancy();
            idx.set_small_batch_max(default_small);
            // Large batches keep the staged pipeline: device throughput of one
            // search_exact_device call over every query (CUDA events, median
            // of 5), the default dispatch and the staged path forced, alternated.
            {
                DeviceBuffer dq(ctx, nq * d * sizeof(float)), dd(ctx, nq * kk * sizeof(double)),
                    dl(ctx, nq * kk * sizeof(int64_t));
                dq.upload(hq.data(), nq * d * sizeof(float));
                double ms[2][2];
                for (int round = 0; round < 2; ++round)
                    for (int path = 0; path < 2; ++path) {
                        idx.set_small_batch_max(path == 0 ? default_small : 0);
                        ms[round][path] = time_ms(ctx, [&] {
                            idx.search_exact_device(dq.as<float>(), nq, kk, np, dd.as<double>(), dl.as<int64_t>());
                        }, quick ? 2 : 5);
                    }
                idx.set_small_batch_max(default_small);
                std::printf("search_exact_device batch %zu (device ms, median of %d, two rounds): default dispatch "
                            "(small_batch_max %zu) %.2f / %.2f ms = %.0f queries/s; staged path forced %.2f / %.2f ms "
                            "= %.0f queries/s\n\n",
                            nq, quick ? 2 : 5, default_small, ms[0][0], ms[1][0],
                            nq / (std::min(ms[0][0], ms[1][0]) * 1e-3), ms[0][1], ms[1][1],
                            nq / (std::min(ms[0][1], ms[1][1]) * 1e-3));
            }
            // The service's calls read and write page-locked memory (the GPU
            // process pins its exchange); small batches replay a CUDA graph
            // of their device work: the same calls from pinned buffers,
            // graphs off and on.
            std::printf("## search_exact wall time per call from page-locked memory: CUDA graphs off / on "
                        "(us, means of %d calls)\n\n| batch | graphs off | graphs on | speed-up |\n|---|---|---|---|\n",
                        quick ? 20 : 200);
            const int calls = quick ? 20 : 200;
            // Mean wall time (us) of calls from call's buffers, after the
            // calls that see a shape first, capture it, and replay it.
            auto timed = [&](PinnedCall& call, size_t b) {
                for (int w = 0; w < 4; ++w)
                    idx.search_exact(call.q, b, kk, np, call.dist, call.labels);
                const auto t0 = std::chrono::steady_clock::now();
                for (int c = 0; c < calls; ++c)  // the same query rows: the same buffers, the same key
                    idx.search_exact(call.q, b, kk, np, call.dist, call.labels);
                return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
                       calls;
            };
            const size_t batches[] = {1, 8, 32, 128};
            for (size_t b : batches) {
                if (b > nq)
                    continue;
                PinnedCall call(hq, b, d, kk);
                double us[2];
                std::vector<int64_t> first;
                for (int g = 0; g < 2; ++g) {
                    idx.set_search_graphs(g == 1);
                    us[g] = timed(call, b);
                    if (g == 0)
                        first.assign(call.labels, call.labels + b * kk);
                }
                const bool same = std::equal(first.begin(), first.end(), call.labels);
                std::printf("| %zu | %.1f | %.1f | %.2fx%s |\n", b, us[0], us[1], us[0] / us[1],
                            same ? "" : " (answers differ!)");
                std::fflush(stdout);
            }
            std::printf("graph launches: %zu\n\n", idx.search_graph_launches());
            // The fused scan's split of each query's probes: blocks per SM
            // aimed at (default 4) against the call's wall time (graphs on,
            // pinned memory) and the ADC candidates' overlap with the default's.
            std::printf("## search_exact wall time per call by fused_blocks_per_sm (us, graphs on, pinned; "
                        "means of %d calls; a mark where the candidates differ from the first column's)\n\n| batch | 8 | 4 | 2 | 1 |\n|---|---|---|---|---|\n", calls);
            for (size_t b : batches) {
                if (b > nq)
                    continue;
                PinnedCall call(hq, b, d, kk);
                std::printf("| %zu |", b);
                std::vector<int64_t> want;
                for (int per_sm : {8, 4, 2, 1}) {
                    idx.set_fused_blocks_per_sm(per_sm);
                    const double us = timed(call, b);
                    std::vector<int64_t> got(call.labels, call.labels + b * kk), both;
                    std::sort(got.begin(), got.end());
                    if (want.empty())
                        want = got;
                    std::set_intersection(want.begin(), want.end(), got.begin(), got.end(), std::back_inserter(both));
                    std::printf(" %.1f%s |", us, both.size() == want.size() ? "" : " (other candidates)");
                }
                std::printf("\n");
                std::fflush(stdout);
                idx.set_fused_blocks_per_sm(GpuIvfPqOptions().fused_blocks_per_sm);
            }
            std::printf("\n");
            // The one-launch path by blocks per query (forced; "auto" is the
            // default choice) with each block on a multiprocessor of its own
            // where the batch leaves some idle (spread) or not: the wall time
            // per call (graphs on, pinned) and whether the answers equal the
            // first column's (they must, bit for bit).
            idx.set_small_batch_max(64);
            std::printf("## one launch by blocks per query, spread off but in the last column (us per call, graphs on, "
                        "pinned; means of %d calls; a mark where answers differ from the first column's)\n\n"
                        "| batch | auto | 2 | 4 | 6 | 8 | 10 | 12 | 14 | 16 | auto, spread |\n"
                        "|---|---|---|---|---|---|---|---|---|---|---|\n", calls);
            const std::pair<int, bool> shapes[] = {{0, false},  {2, false},  {4, false},  {6, false},
                                                   {8, false},  {10, false}, {12, false}, {14, false},
                                                   {16, false}, {0, true}};
            for (size_t b : {size_t(1), size_t(2), size_t(4), size_t(8), size_t(16), size_t(24), size_t(32),
                             size_t(48), size_t(64)}) {
                if (b > nq)
                    continue;
                PinnedCall call(hq, b, d, kk);
                std::printf("| %zu |", b);
                std::vector<int64_t> want_l;
                std::vector<double> want_d;
                for (const auto& sh : shapes) {
                    idx.set_small_cluster(sh.first);
                    idx.set_small_spread(sh.second);
                    const double us = timed(call, b);
                    std::vector<int64_t> got_l(call.labels, call.labels + b * kk);
                    std::vector<double> got_d(call.dist, call.dist + b * kk);
                    if (want_l.empty()) {
                        want_l = got_l;
                        want_d = got_d;
                    }
                    const bool same = got_l == want_l &&
                                      std::memcmp(got_d.data(), want_d.data(), got_d.size() * sizeof(double)) == 0;
                    std::printf(" %.1f%s |", us, same ? "" : " (answers differ!)");
                }
                std::printf("\n");
                std::fflush(stdout);
            }
            idx.set_small_cluster(GpuIvfPqOptions().small_cluster);
            idx.set_small_spread(GpuIvfPqOptions().small_spread);
            std::printf("\n");
            // The batch's coarse keys computed once for all its queries
            // (forced from one query on) or by each
            // query's blocks: wall time per call, and the same answers.
            idx.set_small_batch_max(256);
            std::printf("## one launch, coarse keys shared by the batch / per query (us per call, graphs on, "
                        "pinned; means of %d calls)\n\n| batch | shared | per query | same answers |\n"
                        "|---|---|---|---|\n", calls);
            for (size_t b : {size_t(16), size_t(24), size_t(32), size_t(48), size_t(64), size_t(96), size_t(128)}) {
                if (b > nq)
                    continue;
                PinnedCall call(hq, b, d, kk);
                double us[2];
                std::vector<int64_t> l[2];
                std::vector<double> dd[2];
                for (int shared = 1; shared >= 0; --shared) {
                    idx.set_small_shared_coarse_from(shared == 1 ? 1 : 0);
                    us[shared] = timed(call, b);
                    l[shared].assign(call.labels, call.labels + b * kk);
                    dd[shared].assign(call.dist, call.dist + b * kk);
                }
                const bool same = l[0] == l[1] &&
                                  std::memcmp(dd[0].data(), dd[1].data(), dd[0].size() * sizeof(double)) == 0;
                std::printf("| %zu | %.1f | %.1f | %s |\n", b, us[1], us[0], same ? "yes" : "NO");
                std::fflush(stdout);
            }
            idx.set_small_shared_coarse_from(GpuIvfPqOptions().small_shared_coarse_from);
            idx.set_small_batch_max(default_small);
            std::printf("\n");
            // What a change-log append costs the device: add_encoded of n
            // rows (codes, ids, vectors; rows of the base under new ids) into
            // this 1M index, wall time per call. Twice over the same rows:
            // the first pass grows most lists it touches (a freshly loaded
            // list has no room), the second finds room in them.
            std::printf("## appends to the index (add_encoded with vectors, wall us per call, means of %d calls; "
                        "pass 1 grows the lists it touches, pass 2 appends the same rows again)\n\n"
                        "| rows | pass 1 us per call | pass 2 us per call | pass 2 us per row |\n|---|---|---|---|\n",
                        quick ? 20 : 200);
            int64_t next_id = int64_t(n) + 1;
            for (size_t rows : {size_t(1), size_t(4), size_t(16), size_t(64)}) {
                const int reps = quick ? 20 : 200;
                std::vector<int64_t> aid(rows);
                double total[2] = {0, 0};
                for (int pass = 0; pass < 2; ++pass)
                    for (int c = 0; c < reps; ++c) {
                        const size_t at = (size_t(c) * rows * 7919 + rows * 104729) % (n - rows);
                        for (size_t i = 0; i < rows; ++i)
                            aid[i] = next_id++;
                        const auto t0 = std::chrono::steady_clock::now();
                        idx.add_encoded(rows, enc_l.data() + at, enc_c.data() + at * m, aid.data(),
                                        hbase.data() + at * d);
                        total[pass] +=
                            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
                    }
                std::printf("| %zu | %.1f | %.1f | %.2f |\n", rows, total[0] / reps, total[1] / reps,
                            total[1] / reps / rows);
                std::fflush(stdout);
            }
            std::printf("\n");
        }
        std::printf("peak device memory through the context: %.2f GiB\n", ctx.bytes_peak() / double(1 << 30));
    } catch (const Error& e) {
        std::fprintf(stderr, "gpu_bench: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
