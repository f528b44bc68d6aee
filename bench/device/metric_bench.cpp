// Metric range search over words on the GPU against the CPU engine, as the
// paper measures it: List of Clusters (bucket 32) and SSS (alpha 0.5) built
// by the engine; for radii 1, 2 and 3, the engine's parallel batch over all
// cores (queries/s and distance evaluations per query as a fraction of
// brute force, the paper's Figure 3a), and the same indexes as metric
// mirrors on CUDA devices through the device layer (ComputeDevice::
// create_metric_mirror; PlacedMetricMirror over several GPUs, the 1-stage
// split): all queries in one batch, and single queries one call each. The
// GPU's answers must equal the engine's for every query the engine ran.
// Brute force (BruteForceIndex) is the baseline row.
//
//   metric_bench --words W.txt --queries Q.txt [--name NAME] [--gpus N]
//                [--cpu-queries N] [--brute-queries N] [--single N]
//                [--bucket B] [--alpha A] [--max-pivots P] [--threads T]
//
// Files: UTF-8, one word a line (a line "kind<TAB>word" counts its last
// field; empty lines are skipped among the words and are the empty word
// among the queries). --cpu-queries runs the engine's LC and SSS on the first N queries
// only (0: all), --brute-queries brute force on the first N (default: as
// the engine); the GPU always runs every query, and answers are compared on
// the queries the engine ran. Without a CUDA device the GPU columns are
// skipped and the CPU rows still printed.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "engine/error.h"
#include "engine/metric/lc_index.h"
#include "engine/metric/metric_index.h"
#include "engine/metric/sss_index.h"
#include "gpu_process/cuda_device.h"
#include "gpu_process/device_set.h"
#include "gpu_process/metric_mirror.h"
#include "gpu_process/placed_metric_mirror.h"
#include "device_layer_bench.h"

using namespace gpuivfpq;
using bench::open_gpus;
using bench::seconds;

namespace {

// One word a line; keep_empty: an empty line is the empty word (a query
// that lost its only letter to an edit), else it is skipped.
WordList read_words(const std::string& path, bool keep_empty)
{
    std::ifstream in(path);
    if (!in)
        throw Error(ErrorKind::InvalidArgument, path + ": cannot open");
    WordList list;
    std::string line;
    size_t lineno = 0;
    while (std::getline(in, line)) {
        lineno++;
        if (!line.empty() && line.back() == '\r')
            line.pop_back();
        const size_t tab = line.rfind('\t');
        if (tab != std::string::npos)
            line.erase(0, tab + 1);
        if (line.empty() && !keep_empty)
            continue;
        try {
            list.push_back_utf8(line);
        } catch (const Error& e) {
            throw Error(ErrorKind::InvalidArgument, path + ":" + std::to_string(lineno) + ": " + e.what());
        }
    }
    return list;
}

WordList first(const WordList& all, size_t n)
{
    WordList out;
    for (size_t i = 0; i < std::min(n, all.size()); i++)
        out.push_back(all[i]);
    return out;
}

MetricWords as_metric_words(const WordList& w)
{
    MetricWords m;
    m.n = w.size();
    m.code_points = w.code_points();
    m.offsets = w.offsets();
    return m;
}

// An index's state as a MetricSpec, with the arrays it points into.
struct SpecHolder {
    MetricSpec spec;
    std::vector<int64_t> labels;
    std::vector<uint32_t> centres, radii, cluster_of, pivot_ids;
};

void fill_common(SpecHolder& h, const MetricIndex& index)
{
    h.labels.resize(index.size());
    std::iota(h.labels.begin(), h.labels.end(), int64_t(0));
    h.spec.words = as_metric_words(index.words());
    h.spec.labels = h.labels.data();
}

void make_spec(SpecHolder& h, const ListOfClusters& lc)
{
    fill_common(h, lc);
    h.spec.method = MetricMethod::ListOfClusters;
    h.spec.bucket = lc.bucket_size();
    h.spec.clusters = lc.clusters();
    for (size_t c = 0; c < lc.clusters(); c++) {
        h.centres.push_back(lc.centre(c));
        h.radii.push_back(lc.radius(c));
    }
    h.cluster_of = lc.cluster_assignment();
    h.spec.centres = h.centres.data();
    h.spec.radii = h.radii.data();
    h.spec.cluster_of = h.cluster_of.data();
}

void make_spec(SpecHolder& h, const SparseSpatialSelection& sss)
{
    fill_common(h, sss);
    h.spec.method = MetricMethod::SparseSpatialSelection;
    h.spec.alpha = sss.alpha();
    h.spec.max_distance = sss.max_distance();
    h.spec.pivots = sss.pivots();
    for (size_t p = 0; p < sss.pivots(); p++)
        h.pivot_ids.push_back(sss.pivot(p));
    h.spec.pivot_ids = h.pivot_ids.data();
    h.spec.table = sss.table();
}

// Queries (of the first n) whose GPU answers differ from the engine's.
size_t count_differing(const MetricBatchResult& cpu, const MetricHits& gpu, size_t n)
{
    size_t diff = 0;
    for (size_t q = 0; q < n; q++) {
        const uint64_t cb = cpu.offsets[q], ce = cpu.offsets[q + 1];
        const uint64_t gb = gpu.offsets[q], ge = gpu.offsets[q + 1];
        bool same = ce - cb == ge - gb;
        for (uint64_t j = 0; same && j < ce - cb; j++)
            same = cpu.hits[cb + j].id == gpu.ids[gb + j] && cpu.hits[cb + j].dist == gpu.distances[gb + j];
        diff += !same;
    }
    return diff;
}

size_t count_differing(const MetricBatchResult& a, const MetricBatchResult& b, size_t n)
{
    size_t diff = 0;
    for (size_t q = 0; q < n; q++) {
        const uint64_t ab = a.offsets[q], ae = a.offsets[q + 1], bb = b.offsets[q], be = b.offsets[q + 1];
        bool same = ae - ab == be - bb;
        for (uint64_t j = 0; same && j < ae - ab; j++)
            same = a.hits[ab + j].id == b.hits[bb + j].id && a.hits[ab + j].dist == b.hits[bb + j].dist;
        diff += !same;
    }
    return diff;
}

double mean_evaluations(const MetricBatchResult& r)
{
    double s = 0;
    for (const MetricStats& st : r.stats)
        s += double(st.distance_evaluations);
    return r.stats.empty() ? 0 : s / double(r.stats.size());
}

std::string fmt(const char* f, double v)
{
    char buf[64];
    std::snprintf(buf, sizeof buf, f, v);
    return buf;
}

// 1234567 -> "1,234,567"
std::string grouped(double v)
{
    std::string s = std::to_string(uint64_t(v + 0.5));
    for (int i = int(s.size()) - 3; i > 0; i -= 3)
        s.insert(size_t(i), ",");
    return s;
}

// The mean of a mirror's per-query counts over its first nq queries (those
// the engine ran too), with its fraction of brute force.
std::string mean_evaluations(const MetricHits& h, size_t live, size_t nq)
{
    nq = std::min(nq, h.evaluations.size());
    if (nq == 0)
        return "-";
    double s = 0;
    for (size_t q = 0; q < nq; q++)
        s += double(h.evaluations[q]);
    s /= double(nq);
    return grouped(s) + " (" + fmt("%.3f", s / double(std::max<size_t>(live, 1))) + ")";
}

std::string equal_cell(size_t diff, size_t n)
{
    return diff == 0 ? "yes (" + grouped(double(n)) + " q)" : std::to_string(diff) + " of " + grouped(double(n)) + " differ";
}

struct Row {
    uint32_t radius;
    std::string method, build, evals, cpu, gpu_evals, gpu_batch, gpu_single, equal;
};

}  // namespace

int main(int argc, char** argv)
{
    std::string words_path, queries_path, name;
    size_t gpus = 0, cpu_queries = 0, brute_queries = SIZE_MAX, single = 200, bucket = 32, max_pivots = 256;
    double alpha = 0.5;
    int threads = int(std::max(1u, std::thread::hardware_concurrency()));
    for (int i = 1; i < argc; i++) {
        auto next = [&](size_t& v) { v = size_t(std::atoll(argv[++i])); };
        if (!std::strcmp(argv[i], "--words") && i + 1 < argc)
            words_path = argv[++i];
        else if (!std::strcmp(argv[i], "--queries") && i + 1 < argc)
            queries_path = argv[++i];
        else if (!std::strcmp(argv[i], "--name") && i + 1 < argc)
            name = argv[++i];
        else if (!std::strcmp(argv[i], "--gpus") && i + 1 < argc)
            next(gpus);
        else if (!std::strcmp(argv[i], "--cpu-queries") && i + 1 < argc)
            next(cpu_queries);
        else if (!std::strcmp(argv[i], "--brute-queries") && i + 1 < argc)
            next(brute_queries);
        else if (!std::strcmp(argv[i], "--single") && i + 1 < argc)
            next(single);
        else if (!std::strcmp(argv[i], "--bucket") && i + 1 < argc)
            next(bucket);
        else if (!std::strcmp(argv[i], "--max-pivots") && i + 1 < argc)
            next(max_pivots);
        else if (!std::strcmp(argv[i], "--alpha") && i + 1 < argc)
            alpha = std::atof(argv[++i]);
        else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = std::max(1, std::atoi(argv[++i]));
        else {
            std::fprintf(stderr,
                         "usage: metric_bench --words W.txt --queries Q.txt [--name NAME] [--gpus N] "
                         "[--cpu-queries N] [--brute-queries N] [--single N] [--bucket B] [--alpha A] "
                         "[--max-pivots P] [--threads T]\n");
            return 64;
        }
    }
    if (words_path.empty() || queries_path.empty()) {
        std::fprintf(stderr, "metric_bench: --words and --queries are required\n");
        return 64;
    }
    if (name.empty())
        name = words_path;
    try {
        WordList words = read_words(words_path, false);
        const WordList queries = read_words(queries_path, true);
        const size_t n = words.size(), nq = queries.size();
        if (n == 0 || nq == 0)
            throw Error(ErrorKind::InvalidArgument, "no words or no queries");
        const size_t nc = cpu_queries == 0 ? nq : std::min(cpu_queries, nq);
        const size_t nb = std::min(brute_queries == SIZE_MAX ? nc : brute_queries, nq);
        const WordList cpu_q = first(queries, nc), brute_q = first(queries, nb);
        const int visible = cuda_device_count();
        if (gpus == 0)
            gpus = visible > 0 ? 1 : 0;
        gpus = std::min(gpus, size_t(std::max(visible, 0)));

        std::printf("# metric_bench: %s: %zu words, %zu queries; CPU engine on %zu queries, brute force on %zu, "
                    "%d threads; GPU on all %zu queries\n",
                    name.c_str(), n, nq, nc, nb, threads, nq);
        std::fflush(stdout);

        // Builds.
        std::unique_ptr<BruteForceIndex> brute;
        std::unique_ptr<ListOfClusters> lc;
        std::unique_ptr<SparseSpatialSelection> sss;
        brute = std::make_unique<BruteForceIndex>(words);
        const double lc_s = seconds([&] { lc = std::make_unique<ListOfClusters>(words, bucket, threads); });
        std::printf("LC (bucket %zu): %zu clusters, build %.2f s, %s distance evaluations (%.1f per object)\n", bucket,
                    lc->clusters(), lc_s, grouped(double(lc->build_evaluations())).c_str(),
                    double(lc->build_evaluations()) / double(n));
        std::fflush(stdout);
        const double sss_s = seconds([&] {
            sss = std::make_unique<SparseSpatialSelection>(words, alpha, threads, 0, max_pivots);
        });
        std::printf("SSS (alpha %.2f, max %zu pivots): %zu pivots, M = %u, build %.2f s, %s distance evaluations "
                    "(%.1f per object), table %.1f MB\n",
                    alpha, max_pivots, sss->pivots(), sss->max_distance(), sss_s,
                    grouped(double(sss->build_evaluations())).c_str(), double(sss->build_evaluations()) / double(n),
                    double(n) * double(sss->pivots()) / 1e6);
        std::fflush(stdout);

        // GPUs: one DeviceSet; the single-GPU mirror on device 0.
        std::unique_ptr<DeviceSet> set;
        if (gpus == 0) {
            std::printf("no CUDA device: GPU columns skipped\n");
        } else {
            set = open_gpus(gpus);
            std::printf("GPUs: %d visible, using %zu: %s\n", visible, gpus, set->description().c_str());
        }
        std::printf("\n");
        std::fflush(stdout);

        std::vector<Row> rows;
        std::vector<std::string> notes;
        const MetricWords all_q = as_metric_words(queries);
        const std::string cpu_label = std::to_string(threads) + " threads";

        struct Method {
            const char* label;
            const MetricIndex* index;
            double build_s;
            uint64_t build_evals;
            SpecHolder spec;
            std::unique_ptr<MetricMirror> one, many;
        };
        std::vector<Method> methods(2);
        methods[0].label = "LC";
        methods[0].index = lc.get();
        methods[0].build_s = lc_s;
        methods[0].build_evals = lc->build_evaluations();
        make_spec(methods[0].spec, *lc);
        methods[1].label = "SSS";
        methods[1].index = sss.get();
        methods[1].build_s = sss_s;
        methods[1].build_evals = sss->build_evaluations();
        make_spec(methods[1].spec, *sss);
        if (set) {
            for (Method& m : methods) {
                double t = seconds([&] { m.one = set->device(0).create_metric_mirror(m.spec.spec); });
                std::printf("%s mirror on one GPU: load %.2f s, %.1f MB\n", m.label, t, double(m.one->bytes()) / 1e6);
                if (gpus > 1) {
                    std::vector<size_t> devices(gpus);
                    std::iota(devices.begin(), devices.end(), size_t(0));
                    t = seconds([&] { m.many = std::make_unique<PlacedMetricMirror>(*set, devices, m.spec.spec); });
                    std::printf("%s mirror over %zu GPUs (1-stage): load %.2f s, %.1f MB\n", m.label, gpus, t,
                                double(m.many->bytes()) / 1e6);
                }
            }
            std::printf("\n");
        }

        for (uint32_t r : {1u, 2u, 3u}) {
            const std::vector<uint32_t> radius{r};
            // Brute force: the baseline and the reference.
            MetricBatchResult bf;
            const double bf_s = seconds([&] { bf = range_search_batch(*brute, brute_q, radius, threads); });
            double hits = double(bf.hits.size()) / double(nb);
            rows.push_back({r, "brute force", "-", grouped(double(n)) + " (1.000)",
                            grouped(double(nb) / bf_s) + " (" + cpu_label + ")", "-", "-", "-", "-"});
            std::printf("r = %u: brute force %.2f s for %zu queries, %.2f answers per query\n", r, bf_s, nb, hits);
            std::fflush(stdout);
            for (Method& m : methods) {
                MetricBatchResult cpu;
                const double cpu_s = seconds([&] { cpu = range_search_batch(*m.index, cpu_q, radius, threads); });
                const double evals = mean_evaluations(cpu);
                const size_t vs_brute = count_differing(cpu, bf, std::min(nb, nc));
                std::printf("r = %u: %s engine %.2f s for %zu queries, %.0f evaluations per query; answers = brute "
                            "force on %zu queries: %s\n",
                            r, m.label, cpu_s, nc, evals, std::min(nb, nc),
                            vs_brute == 0 ? "yes" : (std::to_string(vs_brute) + " differ").c_str());
                std::fflush(stdout);
                Row row{r,
                        m.label,
                        fmt("%.2f", m.build_s) + " (" + grouped(double(m.build_evals)) + " evals)",
                        grouped(evals) + " (" + fmt("%.3f", evals / double(m.index->live())) + ")",
                        grouped(double(nc) / cpu_s) + " (" + cpu_label + ")",
                        "-",
                        "-",
                        "-",
                        "-"};
                if (m.one) {
                    MetricHits out;
                    m.one->range_batch(all_q, &r, 1, out);  // warm-up, and the answers compared
                    const size_t diff = count_differing(cpu, out, nc);
                    row.gpu_evals = mean_evaluations(out, m.index->live(), nc);
                    double best = 1e30;
                    for (int rep = 0; rep < 2; rep++) {
                        MetricHits o;
                        best = std::min(best, seconds([&] { m.one->range_batch(all_q, &r, 1, o); }));
                    }
                    const size_t ns = std::min(single, nq);
                    std::vector<double> lat;
                    for (size_t q = 0; q < ns; q++) {
                        MetricWords one_q;
                        one_q.n = 1;
                        one_q.code_points = queries.code_points();
                        one_q.offsets = queries.offsets() + q;
                        MetricHits o;
                        lat.push_back(seconds([&] { m.one->range_batch(one_q, &r, 1, o); }) * 1e3);
                    }
                    std::sort(lat.begin(), lat.end());
                    row.gpu_batch = grouped(double(nq) / best) + " (" + fmt("%.2f", best * 1e6 / double(nq)) + " µs/q)";
                    row.gpu_single = ns ? fmt("%.3f", lat[ns / 2]) + " (p99 " + fmt("%.3f", lat[(ns * 99) / 100]) + ")"
                                        : "-";
                    row.equal = equal_cell(diff, nc);
                    std::printf("r = %u: %s one GPU: batch of %zu %.3f s; single query p50 %.3f ms over %zu; "
                                "answers = engine: %s\n",
                                r, m.label, nq, best, ns ? lat[ns / 2] : 0.0, ns, row.equal.c_str());
                    std::fflush(stdout);
                }
                rows.push_back(row);
                if (m.many) {
                    MetricHits out;
                    m.many->range_batch(all_q, &r, 1, out);
                    const size_t diff = count_differing(cpu, out, nc);
                    double best = 1e30;
                    for (int rep = 0; rep < 2; rep++) {
                        MetricHits o;
                        best = std::min(best, seconds([&] { m.many->range_batch(all_q, &r, 1, o); }));
                    }
                    Row mr{r, std::string(m.label) + ", " + std::to_string(gpus) + " GPUs (1-stage)", "-", "-", "-",
                           mean_evaluations(out, m.index->live(), nc),
                           grouped(double(nq) / best) + " (" + fmt("%.2f", best * 1e6 / double(nq)) + " µs/q)", "-",
                           equal_cell(diff, nc)};
                    std::printf("r = %u: %s %zu GPUs: batch of %zu %.3f s; answers = engine: %s\n", r, m.label, gpus,
                                nq, best, mr.equal.c_str());
                    std::fflush(stdout);
                    rows.push_back(mr);
                }
            }
        }

        std::printf("\n## %s: %zu words, %zu queries (range search)\n\n", name.c_str(), n, nq);
        std::printf("CPU: the engine's range_search_batch over %d threads on the first %zu queries (brute force on the "
                    "first %zu); GPU: all %zu queries in one call through the device layer's metric mirror, and "
                    "single queries one call each (%zu queries; p50, p99 in brackets). Evaluations: distances "
                    "computed per query, over the queries the engine ran (the fraction of brute force's %zu); the GPU computes every centre or "
                    "pivot (the engine's List of Clusters stops at its stop cluster), and over several GPUs each "
                    "GPU its share of the centres or its objects with every pivot. equal: the GPU's answers (ids and "
                    "distances) against the CPU engine's on the queries both ran.\n\n",
                    threads, nc, nb, nq, std::min(single, nq), n);
        std::printf("| radius | method | build s | CPU evals/query (fraction of brute force) | CPU q/s (threads) | "
                    "GPU evals/query (fraction) | GPU batched q/s | GPU single-query p50 ms | equal |\n"
                    "|---|---|---|---|---|---|---|---|---|\n");
        for (const Row& r : rows)
            std::printf("| %u | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.radius, r.method.c_str(),
                        r.build.c_str(), r.evals.c_str(), r.cpu.c_str(), r.gpu_evals.c_str(), r.gpu_batch.c_str(),
                        r.gpu_single.c_str(), r.equal.c_str());
        bool all_equal = true;
        for (const Row& r : rows)
            all_equal = all_equal && (r.equal == "-" || r.equal.rfind("yes", 0) == 0);
        if (set)
            std::printf("\nanswers equal: %s\n", all_equal ? "yes" : "NO (see the equal column)");
        return all_equal ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "metric_bench: %s\n", e.what());
        return 2;
    }
}
