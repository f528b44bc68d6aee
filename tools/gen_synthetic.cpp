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
// depend on --threads.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "common.h"

using namespace tools;

namespace {

const char* kUsage = R"USAGE(usage: gen_synthetic [options]

Writes synthetic SIFT-like vectors, deterministically from --seed.

  --what base|queries   which set to write (default base)
  --format copy|fvecs   copy: PostgreSQL binary COPY rows (id bigint, embedding real[]),
                        for COPY t FROM STDIN WITH (FORMAT binary);
                        fvecs: int32 d + d float32 per vector (little endian)
                        (default copy)
  --out FILE            output file (default - = stdout)
  --rows N              base vectors (default 1000000)
  --queries Q           query vectors (default 10000)
  --dim D               dimension (default 128)
  --seed S              seed (default 42)
  --id-start I          first id of the COPY rows (default 1; ids are consecutive)
  --clusters K          gaussian clusters (default 2000)
  --latent L            dimension of the center subspace (default 24)
  --rank R              rank of each cluster's anisotropic shape (default 12)
  --overlap X           within-cluster spread relative to the center spread
                        (default 3.0: an IVF of 1000 lists over 1M rows needs
                        ~32 probes for recall@10 0.95; 2.0: ~12; 1.2: ~2)
  --threads T           generator threads (default 2; output is the same for any T)
  --help

Load example:
  gen_synthetic --rows 1000000 | psql -c "COPY items (id, embedding) FROM STDIN WITH (FORMAT binary)"
  gen_synthetic --what queries --queries 1000 --format fvecs --out queries.fvecs
)USAGE";

struct Model {
    size_t d, k, r;
    std::vector<float> centers;  // k x d
    std::vector<float> bases;    // k x d x r, pre-scaled by the spectrum
    std::vector<float> iso;      // k: isotropic noise sigma
    std::vector<double> cdf;     // k: cumulative cluster weights
};

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

}  // namespace

int main(int argc, char** argv)
{
    Args args(argc, argv, {"help"});
    if (args.has("help")) {
        std::fputs(kUsage, stdout);
        return 0;
    }
    args.check({"what", "format", "out", "rows", "queries", "dim", "seed", "id-start",
                "clusters", "latent", "rank", "overlap", "threads"});

    const std::string what = args.str("what", "base");
    const std::string format = args.str("format", "copy");
    if (what != "base" && what != "queries")
        die("--what must be base or queries");
    if (format != "copy" && format != "fvecs")
        die("--format must be copy or fvecs");
    const long long rows = args.num("rows", 1000000);
    const long long queries = args.num("queries", 10000);
    const long long dim = args.num("dim", 128);
    const uint64_t seed = static_cast<uint64_t>(args.num("seed", 42));
    const long long id_start = args.num("id-start", 1);
    const long long clusters = args.num("clusters", 2000);
    const long long latent = args.num("latent", 24);
    const long long rank = args.num("rank", 12);
    const double overlap = args.real("overlap", 3.0);
    const long long threads = args.num("threads", 2);
    if (rows < 0 || queries < 0 || dim < 1 || clusters < 1 || latent < 1 || rank < 1 ||
        threads < 1 || overlap <= 0)
        die("invalid sizes (rows, queries >= 0; dim, clusters, latent, rank, threads >= 1; overlap > 0)");

    Model model = build_model(seed, static_cast<size_t>(dim), static_cast<size_t>(clusters),
                              static_cast<size_t>(latent), static_cast<size_t>(rank), overlap);

    const size_t d = static_cast<size_t>(dim);
    const size_t total = static_cast<size_t>(what == "base" ? rows : queries);
    const uint64_t stream = what == "base" ? 1 : 2;
    const size_t chunk_rows = 1024;
    const size_t nchunks = (total + chunk_rows - 1) / chunk_rows;
    const size_t nthreads = static_cast<size_t>(threads);

    Output out(args.str("out", "-"));
    if (format == "copy") {
        std::string h = CopyEncoder::header();
        out.write(h.data(), h.size());
    }
    const std::vector<Col> cols{Col::Int8, Col::Float4Array};
    const size_t row_bytes = CopyEncoder::row_bytes(cols, d);

    // Waves of nthreads chunks: generated and encoded in parallel, written in order.
    std::vector<std::vector<float>> vec_buf(nthreads, std::vector<float>(chunk_rows * d));
    std::vector<std::vector<char>> enc_buf(nthreads);
    for (size_t wave = 0; wave < nchunks; wave += nthreads) {
        size_t in_wave = std::min(nthreads, nchunks - wave);
        auto work = [&](size_t t) {
            size_t chunk = wave + t;
            size_t first = chunk * chunk_rows;
            size_t n = std::min(chunk_rows, total - first);
            generate(model, seed, stream, chunk, n, vec_buf[t].data());
            if (format == "copy") {
                enc_buf[t].resize(n * row_bytes);
                char* p = enc_buf[t].data();
                for (size_t i = 0; i < n; i++) {
                    put16(p, 2);
                    CopyEncoder::put_int8(p, id_start + static_cast<long long>(first + i));
                    CopyEncoder::put_float_array(p, &vec_buf[t][i * d], d);
                }
            } else {
                enc_buf[t].resize(n * (4 + d * 4));
                char* p = enc_buf[t].data();
                int32_t dd = static_cast<int32_t>(d);
                for (size_t i = 0; i < n; i++) {
                    std::memcpy(p, &dd, 4);
                    std::memcpy(p + 4, &vec_buf[t][i * d], d * 4);
                    p += 4 + d * 4;
                }
            }
        };
        std::vector<std::thread> pool;
        for (size_t t = 1; t < in_wave; t++)
            pool.emplace_back(work, t);
        work(0);
        for (auto& th : pool)
            th.join();
        for (size_t t = 0; t < in_wave; t++)
            out.write(enc_buf[t].data(), enc_buf[t].size());
    }
    if (format == "copy") {
        std::string tr = CopyEncoder::trailer();
        out.write(tr.data(), tr.size());
    }
    out.close();
    return 0;
}
