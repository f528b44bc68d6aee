// Benchmark of wide PQ codes with the exact re-rank on the GPU, for
// sentence-embedding sizes (d = 768): per m in {32, 48, 64, 96, 128} at 8
// bits, an IVFPQ index that stores the vectors (GpuIvfPqOptions::
// store_vectors), searched through search_exact (ADC candidates re-ranked by
// exact distance), against the exact top 10 computed on the GPU. Prints
// markdown tables (bench/gpu/wide_bench.sh makes the data and runs it).
//   wide_bench --base BASE.fvecs --queries QUERIES.fvecs [--lists L] [--quick]
// recall@10 = |returned top 10 ∩ exact top 10| / 10, averaged over queries.
// `--quick` trims m, nprobe, k-means iterations and the batch-1 sample for a
// smoke run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "engine/error.h"
#include "engine/search_limits.h"
#include "gpu_ivfpq/device_buffer.h"
#include "gpu_ivfpq/exact_search.h"
#include "gpu_ivfpq/gpu_context.h"
#include "gpu_ivfpq/ivfpq_index.h"
#include "../../tools/common.h"  // read_fvecs: the tools' reader of the generator's files
#include "bench_util.h"          // time_ms

using namespace gpuivfpq;
using namespace gpuivfpq::gpu;
using namespace gpuivfpq::bench;

namespace {

constexpr size_t kGt = 10;  // ground-truth depth and the recall's cut

double seconds_since(std::chrono::steady_clock::time_point t0)
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Mean over queries of |first 10 of labels (nq x k) ∩ gt (nq x kGt)| / kGt.
double recall10(const std::vector<int64_t>& labels, size_t k, const std::vector<int64_t>& gt, size_t nq)
{
    size_t hit = 0;
    const size_t r = std::min(k, kGt);
    for (size_t i = 0; i < nq; ++i)
        for (size_t j = 0; j < r; ++j) {
            const int64_t l = labels[i * k + j];
            if (l < 0)
                continue;
            for (size_t g = 0; g < kGt; ++g)
                if (gt[i * kGt + g] == l) {
                    ++hit;
                    break;
                }
        }
    return double(hit) / double(nq * kGt);
}

struct Row {
    size_t m, nprobe, k;
    double recall, qps;
};

// Default lists: 1024 (200k rows), fewer for small sets (n / 64, a power of two).
size_t default_lists(size_t n)
{
    size_t l = 1;
    while (l * 2 <= 1024 && l * 2 <= n / 64)
        l *= 2;
    return l;
}

}  // namespace

int main(int argc, char** argv)
{
    bool quick = false;
    size_t lists = 0;
    std::string base_path, queries_path;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--quick"))
            quick = true;
        else if (!std::strcmp(argv[i], "--base") && i + 1 < argc)
            base_path = argv[++i];
        else if (!std::strcmp(argv[i], "--queries") && i + 1 < argc)
            queries_path = argv[++i];
        else if (!std::strcmp(argv[i], "--lists") && i + 1 < argc)
            lists = std::strtoull(argv[++i], nullptr, 10);
        else {
            std::fprintf(stderr, "usage: wide_bench --base BASE.fvecs --queries QUERIES.fvecs [--lists L] [--quick]\n");
            return 2;
        }
    }
    std::vector<float> hbase, hq;
    const size_t d = bench::read_base_and_queries("wide_bench", base_path, queries_path, hbase, hq);
    if (d == 0)
        return 2;
    const size_t n = hbase.size() / d, nq = hq.size() / d;
    if (lists == 0)
        lists = default_lists(n);
    if (n < kGt) {
        std::fprintf(stderr, "wide_bench: the base needs at least %zu vectors\n", kGt);
        return 2;
    }
    if (device_count() <= 0) {
        std::printf("no CUDA device: benchmark skipped\n");
        return 0;
    }
    try {
        GpuContext ctx(0);
        std::printf("# wide_bench on %s, budget %.1f GiB%s\n\n", device_description(0).c_str(),
                    ctx.budget() / double(1 << 30), quick ? " [quick]" : "");
        std::printf("n = %zu, nq = %zu, d = %zu, lists = %zu (base %s, queries %s)\n\n", n, nq, d, lists,
                    base_path.c_str(), queries_path.c_str());
        std::printf("recall@10 = |returned top 10 ∩ exact top 10| / 10, mean over the %zu queries; "
                    "K = candidates re-ranked (k of search_exact); QPS (batch) = %zu queries / batch time\n\n",
                    nq, nq);
        std::fflush(stdout);

        DeviceBuffer queries(ctx, nq * d * 4);
        queries.upload(hq.data(), nq * d * 4);

        // 1. Ground truth: exact top 10 (L2) on the GPU.
        std::vector<int64_t> gt(nq * kGt);
        {
            DeviceBuffer base(ctx, n * d * 4), norms(ctx, n * 4);
            base.upload(hbase.data(), n * d * 4);
            row_norms(ctx, base.as<float>(), n, d, norms.as<float>());
            DeviceBuffer od(ctx, nq * kGt * 4), ol(ctx, nq * kGt * 8);
            const double ms = time_ms(ctx, [&] {
                exact_knn(ctx, queries.as<float>(), nq, base.as<float>(), n, d, Metric::L2, kGt,
                          od.as<float>(), ol.as<int64_t>(), norms.as<float>());
            }, 3);
            ol.download(gt.data(), gt.size() * 8);
            std::printf("ground truth: exact top %zu (L2) of %zu queries over %zu vectors: %.2f ms "
                        "(median of 3, %.0f queries/s)\n\n", kGt, nq, n, ms, nq / (ms * 1e-3));
            std::fflush(stdout);
        }  // the base leaves the device: the indexes keep their own copies

        const std::vector<size_t> ms_all = quick ? std::vector<size_t>{32, 128}
                                                 : std::vector<size_t>{32, 48, 64, 96, 128};
        const std::vector<size_t> probes = quick ? std::vector<size_t>{8, 32, 128}
                                                 : std::vector<size_t>{8, 16, 32, 64, 128};
        const std::vector<size_t> ks = {10, 100};
        const size_t kmax = 100;
        const size_t b1 = std::min<size_t>(nq, quick ? 50 : 200);
        std::vector<int64_t> ids(n);
        for (size_t i = 0; i < n; ++i)
            ids[i] = int64_t(i);
        DeviceBuffer od(ctx, nq * kmax * 8), ol(ctx, nq * kmax * 8), oadc(ctx, nq * kmax * 4);
        std::vector<int64_t> lab(nq * kmax);
        std::vector<Row> rows;
        std::vector<size_t> done;

        for (size_t m : ms_all) {
            if (d % m != 0 || m > kMaxGpuSubQuantizers) {
                std::printf("m = %zu skipped (%s)\n\n", m,
                            d % m ? "does not divide d" : "above the GPU scan's limit");
                continue;
            }
            // 2. Training (coarse and PQ k-means on the GPU), as gpu_bench trains.
            std::vector<float> cents(lists * d), cb(m * 256 * (d / m));
            KMeansParams kc;
            kc.iterations = quick ? 3 : 10;
            kc.seed = 1234;
            kc.max_points_per_centroid = 256;
            KMeansParams pq;
            pq.iterations = quick ? 3 : 10;
            pq.seed = 99;
            auto t0 = std::chrono::steady_clock::now();
            train_ivfpq_gpu(ctx, hbase.data(), n, d, lists, m, Metric::L2, kc, pq, 65536, cents.data(), cb.data());
            const double train_s = seconds_since(t0);

            // 3. Index with the vectors: GPU encoding, then add_encoded.
            GpuIvfPqOptions opt;
            opt.store_vectors = true;
            GpuIvfPqIndex idx(ctx, d, lists, m, Metric::L2, cents.data(), cb.data(), opt);
            std::vector<int32_t> enc_l(n);
            std::vector<uint8_t> enc_c(n * m);
            t0 = std::chrono::steady_clock::now();
            idx.encode(hbase.data(), n, enc_l.data(), enc_c.data());
            const double enc_s = seconds_since(t0);
            t0 = std::chrono::steady_clock::now();
            idx.add_encoded(n, enc_l.data(), enc_c.data(), ids.data(), hbase.data());
            ctx.synchronize();
            const double add_s = seconds_since(t0);
            const GpuMemoryUse mem = idx.memory_use();
            std::printf("## IVF%zu,PQ%zux8 (%zu-byte codes, %zu dims per sub-quantizer), exact re-rank on the GPU\n\n",
                        lists, m, m, d / m);
            std::printf("training %.2f s (k-means %d coarse / %d PQ iterations); encoding %.2f s; "
                        "add_encoded with vectors %.2f s\n", train_s, kc.iterations, pq.iterations, enc_s, add_s);
            std::printf("device memory: codes %.1f MiB, vectors %.1f MiB, total %.1f MiB (%zu vectors)\n\n",
                        mem.codes / 1048576.0, mem.vectors / 1048576.0, mem.total() / 1048576.0, idx.ntotal());
            std::printf("| nprobe | K | recall@10 exact | recall@10 ADC-only | batch ms | QPS (batch) | batch-1 µs |\n");
            std::printf("|---|---|---|---|---|---|---|\n");
            std::fflush(stdout);

            // 4. nprobe x K.
            for (size_t np : probes) {
                if (np > lists)
                    continue;
                // ADC alone: top 10 of a k = 100 search, no re-rank.
                idx.search_device(queries.as<float>(), nq, kmax, np, oadc.as<float>(), ol.as<int64_t>());
                ol.download(lab.data(), nq * kmax * 8);
                const double r_adc = recall10(lab, kmax, gt, nq);
                for (size_t k : ks) {
                    const double ms = time_ms(ctx, [&] {
                        idx.search_exact_device(queries.as<float>(), nq, k, np, od.as<double>(), ol.as<int64_t>());
                    }, 3);
                    ol.download(lab.data(), nq * k * 8);
                    const double r = recall10(lab, k, gt, nq);
                    // Batch 1: queries one at a time, each waited for.
                    const double b1_ms = time_ms(ctx, [&] {
                        for (size_t i = 0; i < b1; ++i) {
                            idx.search_exact_device(queries.as<float>() + i * d, 1, k, np, od.as<double>(),
                                                    ol.as<int64_t>());
                            ctx.synchronize();
                        }
                    }, 1, 0);
                    const double qps = nq / (ms * 1e-3);
                    std::printf("| %zu | %zu | %.4f | %.4f | %.2f | %.0f | %.1f |\n", np, k, r, r_adc, ms, qps,
                                b1_ms * 1e3 / double(b1));
                    std::fflush(stdout);
                    rows.push_back({m, np, k, r, qps});
                }
            }
            std::printf("\n(recall@10 ADC-only: the first 10 of a k = 100 ADC search without re-rank, the same "
                        "for both K; K = 10 re-ranks the ADC top 10 itself, so its set and recall@10 equal "
                        "ADC's; batch-1: mean over %zu queries)\n\n", b1);
            done.push_back(m);
        }

        // 5. Summary: best QPS (batch) at a recall@10 floor, per m.
        std::printf("## summary: best batch QPS at recall@10 >= 0.95 and >= 0.90 (exact re-rank; nprobe, K, recall)\n\n");
        std::printf("| m | code bytes | QPS @ R >= 0.95 | QPS @ R >= 0.90 |\n|---|---|---|---|\n");
        for (size_t m : done) {
            std::printf("| %zu | %zu |", m, m);
            for (double floor : {0.95, 0.90}) {
                const Row* best = nullptr;
                for (const Row& r : rows)
                    if (r.m == m && r.recall >= floor && (!best || r.qps > best->qps))
                        best = &r;
                if (best)
                    std::printf(" %.0f (nprobe %zu, K %zu, %.4f) |", best->qps, best->nprobe, best->k, best->recall);
                else
                    std::printf(" — (not reached) |");
            }
            std::printf("\n");
        }
        std::printf("\npeak device memory through the context: %.2f GiB\n", ctx.bytes_peak() / double(1 << 30));
    } catch (const Error& e) {
        std::fprintf(stderr, "wide_bench: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
