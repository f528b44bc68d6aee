// One GPU against several: batch k-NN, the k-NN graph and exact k-NN
// through the GPU process's own device layer (DeviceSet, MirrorStore,
// PlacedMirror over CUDA devices), as the service runs them: replicas split
// a batch over the GPUs; shards spread the lists and merge the partial
// top-k, and must answer exactly what one GPU holding everything answers.
//
//   multi_gpu_bench --base BASE.fvecs --queries QUERIES.fvecs [--gpus N]
//                   [--lists L] [--m M] [--graph-rows R]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/error.h"
#include "engine/exact_distance.h"
#include "gpu_process/cuda_device.h"
#include "gpu_process/device_set.h"
#include "gpu_process/mirror_store.h"
#include "../../tools/common.h"
#include "device_layer_bench.h"

using namespace gpuivfpq;
using bench::best_of;
using bench::open_gpus;
using bench::seconds;

namespace {

// search_exact over nq queries in one call, as the GPU process makes it
// (the placed mirror splits and tiles).
void search_all(Mirror& m, const float* q, size_t nq, size_t, size_t k, size_t nprobe, double* dist,
                int64_t* labels)
{
    m.search_exact(q, nq, k, nprobe, dist, labels, nullptr);
}

}  // namespace

int main(int argc, char** argv)
{
    std::string base_path, queries_path;
    size_t gpus = 0, lists = 4096, m = 32, graph_rows = 0;
    for (int i = 1; i < argc; i++) {
        auto next = [&](size_t& v) { v = size_t(std::atoll(argv[++i])); };
        if (!std::strcmp(argv[i], "--base") && i + 1 < argc)
            base_path = argv[++i];
        else if (!std::strcmp(argv[i], "--queries") && i + 1 < argc)
            queries_path = argv[++i];
        else if (!std::strcmp(argv[i], "--gpus") && i + 1 < argc)
            next(gpus);
        else if (!std::strcmp(argv[i], "--lists") && i + 1 < argc)
            next(lists);
        else if (!std::strcmp(argv[i], "--m") && i + 1 < argc)
            next(m);
        else if (!std::strcmp(argv[i], "--graph-rows") && i + 1 < argc)
            next(graph_rows);
        else {
            std::fprintf(stderr, "usage: multi_gpu_bench --base B.fvecs --queries Q.fvecs [--gpus N] [--lists L] "
                                 "[--m M] [--graph-rows R]\n");
            return 64;
        }
    }
    std::vector<float> base, queries;
    const size_t d = tools::read_fvecs(base_path, base);
    if (d == 0 || tools::read_fvecs(queries_path, queries) != d) {
        std::fprintf(stderr, "multi_gpu_bench: --base and --queries: .fvecs files of one dimension\n");
        return 2;
    }
    const size_t n = base.size() / d, nq = queries.size() / d;
    const int visible = cuda_device_count();
    if (gpus == 0)
        gpus = size_t(visible);
    if (visible < 1) {
        std::printf("no CUDA device: benchmark skipped\n");
        return 0;
    }
    if (graph_rows == 0 || graph_rows > n)
        graph_rows = n;
    try {
        // The model: trained and encoded once, on the first GPU.
        std::vector<float> centroids(lists * d), codebooks(256 * d);
        std::vector<int32_t> list_ids(n);
        std::vector<uint8_t> codes(n * m);
        std::vector<int64_t> labels(n);
        for (size_t i = 0; i < n; i++)
            labels[i] = int64_t(i);
        MirrorSpec spec;
        {
            auto one = open_gpus(1);
            ComputeDevice& dev = one->device(0);
            std::printf("# multi_gpu_bench: %zu x %zu base, %zu queries, lists %zu, m %zu; %d GPU(s) visible: %s\n\n",
                        n, d, nq, lists, m, visible, dev.description().c_str());
            IvfPqTrainParams params;
            size_t sample = std::min(n, lists * 64);
            double t = seconds([&] {
                dev.train(base.data(), sample, d, lists, m, Metric::L2, params, centroids.data(), codebooks.data());
            });
            spec.d = d;
            spec.lists = lists;
            spec.m = m;
            spec.metric = Metric::L2;
            spec.centroids = centroids.data();
            spec.codebooks = codebooks.data();
            spec.vectors = true;
            double te = seconds([&] { dev.encode(spec, base.data(), n, list_ids.data(), codes.data()); });
            std::printf("training (%zu rows) %.2f s, encoding %.2f s on one GPU\n\n", sample, t, te);
        }

        const size_t k = 100, nprobe = 32, graph_probe = 64;
        // A large batch too: the queries ten times over (a 10,000-query batch
        // takes ~10 ms on one GPU, where fixed costs weigh).
        const size_t big_n = nq * 10;
        std::vector<float> big;
        for (int rep = 0; rep < 10; rep++)
            big.insert(big.end(), queries.begin(), queries.end());
        struct Run {
            double batch_s = 0, big_s = 0, graph_s = 0, exact_s = 0, load_s = 0;
            std::vector<int64_t> batch_labels;
            std::vector<double> batch_dist;
        };
        std::vector<Run> runs;
        std::vector<std::string> names;
        auto measure = [&](size_t count, Placement placement, const char* name) {
            auto set = open_gpus(count);
            MirrorStore store(*set);
            Run r;
            MirrorKey key{1, 1, 1, 1};
            Mirror* mirror = nullptr;
            r.load_s = seconds([&] {
                mirror = store.load(key, spec, n, list_ids.data(), codes.data(), labels.data(), base.data(), nullptr,
                                    placement);
            });
            r.batch_labels.resize(nq * k);
            r.batch_dist.resize(nq * k);
            r.batch_s = best_of(3, [&] {
                search_all(*mirror, queries.data(), nq, d, k, nprobe, r.batch_dist.data(), r.batch_labels.data());
            });
            {
                std::vector<int64_t> bl(big_n * k);
                std::vector<double> bd(big_n * k);
                r.big_s = best_of(2, [&] { search_all(*mirror, big.data(), big_n, d, k, nprobe, bd.data(), bl.data()); });
            }
            std::vector<int64_t> gl(graph_rows * k);
            std::vector<double> gd(graph_rows * k);
            r.graph_s = best_of(1, [&] {
                search_all(*mirror, base.data(), graph_rows, d, k, graph_probe, gd.data(), gl.data());
            });
            // Exact k-NN of the queries over every stored vector.
            std::vector<int64_t> el(nq * 10);
            std::vector<double> ed(nq * 10);
            r.exact_s = best_of(3, [&] { mirror->brute_force(queries.data(), nq, 10, ed.data(), el.data()); });
            std::printf("%s: load %.2f s, batch %.3f s, batch x10 %.3f s, graph %.2f s, exact %.3f s\n", name,
                        r.load_s, r.batch_s, r.big_s, r.graph_s, r.exact_s);
            std::fflush(stdout);
            runs.push_back(std::move(r));
            names.push_back(name);
        };
        measure(1, Placement::Replicate, "1 GPU");
        for (size_t g = 2; g <= gpus; g++) {
            std::string rn = std::to_string(g) + " GPUs, replicas", sn = std::to_string(g) + " GPUs, shards";
            measure(g, Placement::Replicate, rn.c_str());
            measure(g, Placement::Shard, sn.c_str());
        }

        std::printf("\n## Batch k-NN (%zu queries, and x10; %zu candidates re-ranked, nprobe %zu), k-NN graph (%zu "
                    "rows, nprobe %zu), exact k-NN (%zu queries x %zu rows)\n\n",
                    nq, k, nprobe, graph_rows, graph_probe, nq, n);
        std::printf("| devices | batch s | queries/s | speed-up | batch x10 s | queries/s | speed-up | graph s | "
                    "speed-up | exact s | speed-up | answers = 1 GPU |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        for (size_t i = 0; i < runs.size(); i++) {
            const Run& r = runs[i];
            size_t diff = 0;
            for (size_t j = 0; j < r.batch_labels.size(); j++)
                diff += r.batch_labels[j] != runs[0].batch_labels[j] || r.batch_dist[j] != runs[0].batch_dist[j];
            std::printf("| %s | %.3f | %.0f | %.2fx | %.3f | %.0f | %.2fx | %.2f | %.2fx | %.3f | %.2fx | %s |\n",
                        names[i].c_str(), r.batch_s, nq / r.batch_s, runs[0].batch_s / r.batch_s, r.big_s,
                        big_n / r.big_s, runs[0].big_s / r.big_s, r.graph_s,
                        runs[0].graph_s / r.graph_s, r.exact_s, runs[0].exact_s / r.exact_s,
                        diff == 0 ? "yes" : (std::to_string(diff) + " of " + std::to_string(r.batch_labels.size()) +
                                             " differ")
                                                .c_str());
        }
    } catch (const Error& e) {
        std::fprintf(stderr, "multi_gpu_bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
