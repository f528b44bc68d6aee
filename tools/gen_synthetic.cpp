// gen_synthetic: deterministic SIFT-like synthetic vectors for benchmarks.
//
// The data is a mixture of gaussian clusters built so that an IVF index needs
// tens of probes for high recall:
//   * cluster centers lie near a low-dimensional (latent) subspace, grouped
//     into super-clusters, so many centers are close to each other;
//   * each cluster has its own low-rank anisotropic shape (a random basis with
//     a decaying spectrum) plus isotropic noise, and its own scale;
//   * cluster sizes are uneven (log-normal weights);
//   * the within-cluster spread is comparable to the distance between
//     neighbouring centers, so clusters overlap.
// Everything is derived from --seed: the model from stream 0, the base rows
// from stream 1 and the queries from stream 2 (queries are fresh draws from
// the same distribution, never copies of base rows). The output does not
// depend on --threads. Every benchmark (bench/cpu, bench/gpu, gpu/bench)
// reads its synthetic data from here, so their figures are comparable.
#include <algorithm>
#include <cmath>
#include <exception>
#include <thread>

#include "common.h"
#include "copy_sink.h"

using namespace tools;

namespace {

const char* kUsage = R"USAGE(usage: gen_synthetic [options]

Writes synthetic SIFT-like vectors, deterministically from --seed, into a
table (--table) or a file.

  --what base|queries   which set (default base)
  --table T             load into table T's columns (id, embedding) in one
                        transaction (COPY through libpqxx)
  --conninfo STR        libpq connection string for --table (default: the PGHOST,
                        PGPORT, PGUSER, PGDATABASE ... environment)
  --format copy|fvecs   without --table: COPY text rows (id, embedding), for
                        COPY t (id, embedding) FROM STDIN; or fvecs: int32 d + d
                        float32 per vector, little endian (default copy)
  --out FILE            without --table: output file (default - = stdout)
  --rows N              base vectors (default 1000000)
  --queries Q           query vectors (default 10000)
  --dim D               dimension (default 128)
  --seed S              seed (default 42)
  --id-start I          id of the first row (default 1; ids are consecutive)
  --clusters K          gaussian clusters (default 2000)
  --latent L            dimension of the center subspace (default 24)
  --rank R              rank of each cluster's anisotropic shape (default 12)
  --overlap X           within-cluster spread relative to the center spread
                        (default 3.0: an IVF of 1000 lists over 1M rows needs
                        ~32 probes for recall@10 0.95; 2.0: ~12; 1.2: ~2)
  --threads T           generator threads (default 2; output is the same for any T)
  --part P/K            COPY rows only: every K-th chunk of 1024 rows from chunk P
                        (0 <= P < K), so that K loaders run side by side and
                        together load the very rows of one run
  --help

Examples:
  gen_synthetic --rows 1000000 --table items
  gen_synthetic --rows 1000000 | psql -c "COPY items (id, embedding) FROM STDIN"
  gen_synthetic --what queries --queries 1000 --format fvecs --out queries.fvecs
)USAGE";

// One step of splitmix64: spreads a seed over the generator state.
uint64_t splitmix64(uint64_t& x)
{
    uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

// xoshiro256** seeded from (seed, stream, substream) via splitmix64: each
// (stream, substream) pair is an independent, reproducible sequence.
class Rng {
public:
    Rng(uint64_t seed, uint64_t stream = 0, uint64_t sub = 0)
    {
        uint64_t x = seed ^ (stream * 0xd1b54a32d192ed03ULL) ^ (sub * 0x8cb92ba72f3d8dd7ULL);
        for (int i = 0; i < 4; i++)
            s_[i] = splitmix64(x);
    }
    uint64_t next()
    {
        uint64_t r = rotl(s_[1] * 5, 7) * 9;
        uint64_t t = s_[1] << 17;
        s_[2] ^= s_[0];
        s_[3] ^= s_[1];
        s_[1] ^= s_[2];
        s_[0] ^= s_[3];
        s_[2] ^= t;
        s_[3] = rotl(s_[3], 45);
        return r;
    }
    // Uniform in [0, 1).
    double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
    // Standard normal (Box-Muller, both values used).
    double normal()
    {
        if (have_spare_) {
            have_spare_ = false;
            return spare_;
        }
        double u1 = uniform(), u2 = uniform();
        if (u1 < 1e-300)
            u1 = 1e-300;
        double r = std::sqrt(-2.0 * std::log(u1));
        spare_ = r * std::sin(2.0 * M_PI * u2);
        have_spare_ = true;
        return r * std::cos(2.0 * M_PI * u2);
    }
    // Fills n standard normals as floats (faster path).
    void normals(float* out, size_t n)
    {
        size_t i = 0;
        if (have_spare_ && n > 0) {
            out[i++] = static_cast<float>(spare_);
            have_spare_ = false;
        }
        for (; i + 1 < n; i += 2) {
            float u1 = static_cast<float>((next() >> 40) + 1) * 0x1.0p-24f;  // (0, 1]
            float u2 = static_cast<float>(next() >> 40) * 0x1.0p-24f;
            float r = std::sqrt(-2.0f * std::log(u1));
            float a = 6.2831853f * u2;
            out[i] = r * std::cos(a);
            out[i + 1] = r * std::sin(a);
        }
        if (i < n)
            out[i] = static_cast<float>(normal());
    }

private:
    static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
    uint64_t s_[4];
    bool have_spare_ = false;
    double spare_ = 0.0;
};

// The mixture: cluster centers, shapes, noise levels and weights.
struct Model {
    size_t d, k, r;
    std::vector<float> centers;  // k x d
    std::vector<float> bases;    // k x d x r, pre-scaled by the spectrum
    std::vector<float> iso;      // k: isotropic noise sigma
    std::vector<double> cdf;     // k: cumulative cluster weights
};

// Draws the mixture from stream 0 of the seed.
Model build_model(uint64_t seed, size_t d, size_t k, size_t latent, size_t rank, double overlap)
{
    Model m;
    m.d = d;
    m.k = k;
    m.r = rank;
    Rng rng(seed, 0, 0);

    // Projection of the latent space, and a positive offset (SIFT-like values).
    std::vector<float> proj(d * latent);
    for (auto& v : proj)
        v = static_cast<float>(rng.normal() / std::sqrt(static_cast<double>(latent)));
    std::vector<float> offset(d);
    for (auto& v : offset)
        v = static_cast<float>(40.0 + 10.0 * rng.uniform());

    // Center scale: each center coordinate has a standard deviation of about
    // center_sd; points spread about overlap * center_sd per coordinate.
    const double center_sd = 20.0;
    size_t groups = std::max<size_t>(1, k / 16);
    std::vector<double> group_z(groups * latent);
    for (auto& v : group_z)
        v = rng.normal();
    m.centers.resize(k * d);
    std::vector<double> z(latent);
    for (size_t c = 0; c < k; c++) {
        size_t g = static_cast<size_t>(rng.uniform() * static_cast<double>(groups));
        for (size_t l = 0; l < latent; l++)
            z[l] = (group_z[g * latent + l] + 0.7 * rng.normal()) / std::sqrt(1.49);
        for (size_t j = 0; j < d; j++) {
            double s = 0;
            for (size_t l = 0; l < latent; l++)
                s += proj[j * latent + l] * z[l];
            // a little full-dimensional jitter so centers are not exactly in the subspace
            s += 0.15 * rng.normal();
            m.centers[c * d + j] = static_cast<float>(offset[j] + center_sd * s);
        }
    }

    // Per-cluster shape: random d x r basis, spectrum decaying as (i+1)^-0.6,
    // scaled so the per-coordinate variance of the low-rank part is about
    // (0.8 * sigma)^2 and of the isotropic part (0.45 * sigma)^2, where sigma
    // is the cluster's own scale (log-normal around overlap * center_sd).
    m.bases.resize(k * d * rank);
    m.iso.resize(k);
    std::vector<double> spec(rank);
    double spec_sum = 0;
    for (size_t i = 0; i < rank; i++) {
        spec[i] = std::pow(static_cast<double>(i + 1), -0.6);
        spec_sum += spec[i] * spec[i];
    }
    for (size_t c = 0; c < k; c++) {
        double sigma = overlap * center_sd * std::exp(0.25 * rng.normal());
        double low = 0.8 * sigma / std::sqrt(spec_sum);
        float* b = &m.bases[c * d * rank];
        for (size_t j = 0; j < d; j++)
            for (size_t i = 0; i < rank; i++)
                b[j * rank + i] = static_cast<float>(rng.normal() * spec[i] * low);
        m.iso[c] = static_cast<float>(0.45 * sigma);
    }

    // Uneven cluster sizes.
    m.cdf.resize(k);
    double acc = 0;
    for (size_t c = 0; c < k; c++) {
        acc += std::exp(0.7 * rng.normal());
        m.cdf[c] = acc;
    }
    for (auto& v : m.cdf)
        v /= acc;
    return m;
}

// Generates rows [first, first + n) of a stream into out (n x d).
void generate(const Model& m, uint64_t seed, uint64_t stream, uint64_t chunk, size_t n,
              float* out)
{
    Rng rng(seed, stream, chunk + 1);
    const size_t d = m.d, r = m.r;
    std::vector<float> u(r), eps(d);
    for (size_t i = 0; i < n; i++) {
        double x = rng.uniform();
        size_t c = static_cast<size_t>(std::lower_bound(m.cdf.begin(), m.cdf.end(), x) -
                                       m.cdf.begin());
        if (c >= m.k)
            c = m.k - 1;
        rng.normals(u.data(), r);
        rng.normals(eps.data(), d);
        const float* center = &m.centers[c * d];
        const float* b = &m.bases[c * d * r];
        const float iso = m.iso[c];
        float* o = out + i * d;
        for (size_t j = 0; j < d; j++) {
            float s = center[j] + iso * eps[j];
            const float* bj = b + j * r;
            for (size_t t = 0; t < r; t++)
                s += bj[t] * u[t];
            o[j] = s;
        }
    }
}

// The command line, checked.
struct Options {
    std::string what = "base", format = "copy", out = "-", table, conninfo;
    long long rows = 1000000, queries = 10000, dim = 128, id_start = 1;
    long long clusters = 2000, latent = 24, rank = 12, threads = 2;
    long long part = 0, parts = 1;
    uint64_t seed = 42;
    double overlap = 3.0;
};

// Parses and checks the options (getopt_long); dies with a message on a bad one.
Options parse_options(int argc, char** argv)
{
    enum { kWhat = 256, kTable, kConninfo, kFormat, kOut, kRows, kQueries, kDim, kSeed,
           kIdStart, kClusters, kLatent, kRank, kOverlap, kThreads, kPart, kHelp };
    static const option longopts[] = {
        {"what", required_argument, nullptr, kWhat},
        {"table", required_argument, nullptr, kTable},
        {"conninfo", required_argument, nullptr, kConninfo},
        {"format", required_argument, nullptr, kFormat},
        {"out", required_argument, nullptr, kOut},
        {"rows", required_argument, nullptr, kRows},
        {"queries", required_argument, nullptr, kQueries},
        {"dim", required_argument, nullptr, kDim},
        {"seed", required_argument, nullptr, kSeed},
        {"id-start", required_argument, nullptr, kIdStart},
        {"clusters", required_argument, nullptr, kClusters},
        {"latent", required_argument, nullptr, kLatent},
        {"rank", required_argument, nullptr, kRank},
        {"overlap", required_argument, nullptr, kOverlap},
        {"threads", required_argument, nullptr, kThreads},
        {"part", required_argument, nullptr, kPart},
        {"help", no_argument, nullptr, kHelp},
        {nullptr, 0, nullptr, 0}};
    Options o;
    bool have_out = false;
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, nullptr)) != -1) {
        switch (c) {
        case kWhat: o.what = optarg; break;
        case kTable: o.table = optarg; break;
        case kConninfo: o.conninfo = optarg; break;
        case kFormat: o.format = optarg; break;
        case kOut: o.out = optarg; have_out = true; break;
        case kRows: o.rows = opt_int("rows"); break;
        case kQueries: o.queries = opt_int("queries"); break;
        case kDim: o.dim = opt_int("dim"); break;
        case kSeed: o.seed = static_cast<uint64_t>(opt_int("seed")); break;
        case kIdStart: o.id_start = opt_int("id-start"); break;
        case kClusters: o.clusters = opt_int("clusters"); break;
        case kLatent: o.latent = opt_int("latent"); break;
        case kRank: o.rank = opt_int("rank"); break;
        case kOverlap: o.overlap = opt_real("overlap"); break;
        case kThreads: o.threads = opt_int("threads"); break;
        case kPart:
            if (std::sscanf(optarg, "%lld/%lld", &o.part, &o.parts) != 2 || o.parts < 1 || o.part < 0 ||
                o.part >= o.parts)
                die("--part takes P/K with 0 <= P < K");
            break;
        case kHelp: std::fputs(kUsage, stdout); std::exit(0);
        default: die("see --help");  // getopt_long has named the bad option
        }
    }
    if (optind < argc)
        die(std::string("unexpected argument '") + argv[optind] + "' (see --help)");
    if (o.what != "base" && o.what != "queries")
        die("--what must be base or queries");
    if (o.format != "copy" && o.format != "fvecs")
        die("--format must be copy or fvecs");
    if (!o.table.empty() && (have_out || o.format != "copy"))
        die("--table loads the rows itself: no --out or --format with it");
    if (o.parts > 1 && o.format != "copy")
        die("--part writes COPY rows only");
    if (o.rows < 0 || o.queries < 0 || o.dim < 1 || o.clusters < 1 || o.latent < 1 || o.rank < 1 ||
        o.threads < 1 || !(o.overlap > 0))
        die("invalid sizes (rows, queries >= 0; dim, clusters, latent, rank, threads >= 1; overlap > 0)");
    return o;
}

// Generates the chosen set and sends it to the table or the file.
void run(const Options& o)
{
    const Model model = build_model(o.seed, size_t(o.dim), size_t(o.clusters), size_t(o.latent),
                                    size_t(o.rank), o.overlap);
    const size_t d = size_t(o.dim);
    const size_t total = size_t(o.what == "base" ? o.rows : o.queries);
    const uint64_t stream = o.what == "base" ? 1 : 2;
    const size_t chunk_rows = 1024;  // a chunk is one RNG substream: fixed, for determinism
    const size_t nchunks = (total + chunk_rows - 1) / chunk_rows;
    const size_t nthreads = size_t(o.threads);
    const bool fvecs = o.format == "fvecs";

    std::unique_ptr<Output> fvecs_out;
    std::unique_ptr<CopySink> sink;
    if (fvecs)
        fvecs_out = std::make_unique<Output>(o.out);
    else if (!o.table.empty())
        sink = CopySink::table(o.conninfo, o.table, {"id", "embedding"});
    else
        sink = CopySink::file(o.out);

    // Waves of nthreads chunks, generated (and turned into array text) in
    // parallel, written in order.
    std::vector<std::vector<float>> vec_buf(nthreads, std::vector<float>(chunk_rows * d));
    std::vector<std::vector<std::string>> text_buf(nthreads, std::vector<std::string>(chunk_rows));
    // This part's chunks (all of them unless --part).
    std::vector<size_t> mine;
    for (size_t c = size_t(o.part); c < nchunks; c += size_t(o.parts))
        mine.push_back(c);
    for (size_t wave = 0; wave < mine.size(); wave += nthreads) {
        const size_t in_wave = std::min(nthreads, mine.size() - wave);
        auto work = [&](size_t t) {
            const size_t chunk = mine[wave + t];
            const size_t n = std::min(chunk_rows, total - chunk * chunk_rows);
            generate(model, o.seed, stream, chunk, n, vec_buf[t].data());
            if (!fvecs)
                for (size_t i = 0; i < n; i++) {
                    text_buf[t][i].clear();
                    append_array_text(text_buf[t][i], &vec_buf[t][i * d], d);
                }
        };
        std::vector<std::thread> pool;
        for (size_t t = 1; t < in_wave; t++)
            pool.emplace_back(work, t);
        work(0);
        for (auto& th : pool)
            th.join();
        for (size_t t = 0; t < in_wave; t++) {
            const size_t first = mine[wave + t] * chunk_rows;
            const size_t n = std::min(chunk_rows, total - first);
            for (size_t i = 0; i < n; i++) {
                if (fvecs)
                    write_fvecs_row(*fvecs_out, &vec_buf[t][i * d], d);
                else
                    sink->row(o.id_start + static_cast<long long>(first + i), text_buf[t][i]);
            }
        }
    }
    if (fvecs)
        fvecs_out->close();
    else
        sink->finish();
}

}  // namespace

int main(int argc, char** argv)
{
    const Options o = parse_options(argc, argv);
    try {
        run(o);
    } catch (const std::exception& e) {
        die(e.what());
    }
    return 0;
}
