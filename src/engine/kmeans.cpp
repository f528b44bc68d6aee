// Lloyd k-means with GEMM assignment, seeded subsampling and empty-cluster splitting.
#include "kmeans.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "distances.h"
#include "error.h"
#include "internal.h"
#include "parallel.h"

namespace gpuivfpq {

void assign_nearest(const float* x, size_t n, const float* centroids, size_t k, size_t d,
                     int32_t* assign, float* dist, int threads)
{
    require(k >= 1, "assign_nearest: need at least one centroid");
    require(d >= 1, "assign_nearest: dimension must be at least 1");
    require(k <= size_t(INT32_MAX), "assign_nearest: too many centroids");
    if (n == 0)
        return;
    require(x && centroids && assign, "assign_nearest: null pointer");

    // Exact distance to the winner: the GEMM form loses precision by
    // cancellation when the point is close to its centroid.
    auto fill_dist = [&](size_t r0, size_t nr) {
        if (dist)
            for (size_t i = r0; i < r0 + nr; i++)
                dist[i] = l2_sqr(x + i * d, centroids + size_t(assign[i]) * d, d);
    };

    if (d <= detail::kSmallDimMax) {
        // Tiny d (PQ sub-vectors): the fused kernel beats GEMM + argmin.
        const detail::SmallCodebook cb = detail::make_small_codebook(centroids, k, d);
        constexpr size_t kRows = 4096;
        parallel_for((n + kRows - 1) / kRows, threads, [&](size_t t0, size_t t1) {
            for (size_t t = t0; t < t1; t++) {
                const size_t r0 = t * kRows, nr = std::min(kRows, n - r0);
                detail::nearest_small(x + r0 * d, nr, d, cb, assign + r0);
                fill_dist(r0, nr);
            }
        });
        return;
    }

    std::vector<float> cnorm(k);
    for (size_t j = 0; j < k; j++)
        cnorm[j] = norm_sqr(centroids + j * d, d);

    // Tiles of rows x centroid-block keep each thread's block at <= 4 MiB;
    // tiling depends only on (n, k), never on the thread count.
    const size_t cb = std::min<size_t>(k, 4096);
    const size_t rows = std::clamp<size_t>((size_t(1) << 20) / cb, 64, 1024);
    const size_t ntiles = (n + rows - 1) / rows;

    parallel_for(ntiles, threads, [&](size_t t0, size_t t1) {
        std::vector<float> block(rows * cb), best(rows);
        for (size_t t = t0; t < t1; t++) {
            const size_t r0 = t * rows, nr = std::min(rows, n - r0);
            const float* xt = x + r0 * d;
            for (size_t c0 = 0; c0 < k; c0 += cb) {
                const size_t nc = std::min(cb, k - c0);
                detail::gemm_nt(nr, nc, d, xt, d, centroids + c0 * d, d, block.data(), nc);
                for (size_t i = 0; i < nr; i++) {
                    const float* row = block.data() + i * nc;
                    const size_t j = detail::argmin_l2(row, cnorm.data() + c0, nc);
                    const float v = cnorm[c0 + j] - 2.0f * row[j];
                    if (c0 == 0 || v < best[i]) {
                        best[i] = v;
                        assign[r0 + i] = int32_t(c0 + j);
                    }
                }
            }
            fill_dist(r0, nr);
        }
    });
}

namespace {

// Re-seeds each empty cluster by splitting the currently largest one into two
// slightly perturbed copies (largest by count, first on ties); counts are
// halved so successive empties split different clusters.
void split_empty_clusters(float* centroids, std::vector<size_t>& counts, size_t d, float scale,
                          detail::Rng& rng)
{
    const size_t k = counts.size();
    constexpr float kEps = 1.0f / 1024.0f;
    for (size_t c = 0; c < k; c++) {
        if (counts[c] != 0)
            continue;
        const size_t big = size_t(std::max_element(counts.begin(), counts.end()) - counts.begin());
        float* src = centroids + big * d;
        float* dst = centroids + c * d;
        // Additive, sign-randomised perturbation: also separates zero coordinates.
        for (size_t t = 0; t < d; t++) {
            const float delta = kEps * (std::fabs(src[t]) + scale);
            const float sgn = (rng.next() & 1) ? 1.0f : -1.0f;
            dst[t] = src[t] + sgn * delta;
            src[t] = src[t] - sgn * delta;
        }
        counts[c] = counts[big] / 2;
        counts[big] -= counts[c];
    }
}

// Point-centroid distance evaluations (points x centroids) up to which
// k-means++ seeding is used: it is sequential, so keep it to ~tens of ms.
constexpr double kPlusPlusBudget = double(1 << 22);

// k-means++ seeding: each next centroid is a point drawn with probability
// proportional to its squared distance to the nearest centroid so far.
void init_plus_plus(const float* x, size_t n, size_t d, size_t k, detail::Rng& rng,
                    float* centroids)
{
    std::vector<double> mind(n);
    size_t pick = rng.below(n);
    for (size_t c = 0; c < k; c++) {
        std::memcpy(centroids + c * d, x + pick * d, d * sizeof(float));
        const float* cc = centroids + c * d;
        double total = 0.0;
        for (size_t i = 0; i < n; i++) {
            const double v = l2_sqr(x + i * d, cc, d);
            mind[i] = c == 0 ? v : std::min(mind[i], v);
            total += mind[i];
        }
        if (c + 1 == k)
            break;
        if (!(total > 0.0)) {
            pick = rng.below(n);  // every point already covered: any one will do
            continue;
        }
        double target = double(rng.unit()) * total, acc = 0.0;
        pick = n - 1;
        for (size_t i = 0; i < n; i++) {
            acc += mind[i];
            if (acc > target && mind[i] > 0.0) {
                pick = i;
                break;
            }
        }
    }
}

}  // namespace

void kmeans_train(const float* x, size_t n, size_t d, size_t k, const KMeansParams& params,
                  float* centroids)
{
    require(n >= 1, "k-means: need at least one training point");
    require(k >= 1, "k-means: k must be at least 1");
    require(d >= 1, "k-means: dimension must be at least 1");
    require(params.iterations >= 0, "k-means: iterations must not be negative");
    require(params.max_points_per_centroid >= 1, "k-means: max_points_per_centroid must be >= 1");
    require(x && centroids, "k-means: null pointer");
    require(k <= size_t(INT32_MAX), "k-means: k too large");
    detail::checked_mul(k, d, "k-means centroids");

    detail::Rng rng(params.seed);
    if (n <= k) {
        // Too few points to cluster: the points themselves, then seeded repeats.
        std::memcpy(centroids, x, n * d * sizeof(float));
        for (size_t c = n; c < k; c++)
            std::memcpy(centroids + c * d, x + rng.below(n) * d, d * sizeof(float));
        return;
    }

    // Seeded subsample: beyond ~max_points_per_centroid per centroid more
    // points cost time without improving the centroids much.
    const size_t cap = params.max_points_per_centroid > SIZE_MAX / k
                           ? n
                           : k * params.max_points_per_centroid;
    const float* data = x;
    size_t ns = n;
    std::vector<float> sample;
    if (n > cap) {
        const std::vector<size_t> idx = detail::sample_indices(n, cap, rng);
        sample.resize(detail::checked_mul(cap, d, "k-means sample"));
        for (size_t i = 0; i < cap; i++)
            std::memcpy(sample.data() + i * d, x + idx[i] * d, d * sizeof(float));
        data = sample.data();
        ns = cap;
    }

    // Init: k-means++ where its k passes over the data are cheap (it avoids the
    // bad local minima of random seeding), k distinct random points otherwise.
    if (double(ns) * double(k) <= kPlusPlusBudget) {
        init_plus_plus(data, ns, d, k, rng, centroids);
    } else {
        const std::vector<size_t> idx = detail::sample_indices(ns, k, rng);
        for (size_t c = 0; c < k; c++)
            std::memcpy(centroids + c * d, data + idx[c] * d, d * sizeof(float));
    }

    // Data scale for perturbing split clusters (RMS coordinate).
    double sq = 0.0;
    for (size_t i = 0; i < ns * d; i++)
        sq += double(data[i]) * data[i];
    const float scale = float(std::sqrt(sq / double(ns * d)));

    std::vector<int32_t> assign(ns, -1), prev(ns, -1);
    std::vector<double> sums(k * d);
    std::vector<size_t> counts(k);
    bool perturbed = true;
    for (int it = 0; it < params.iterations; it++) {
        assign_nearest(data, ns, centroids, k, d, assign.data(), nullptr, params.threads);
        // Same assignment as last round and no split since: converged.
        if (!perturbed && assign == prev)
            break;
        std::fill(sums.begin(), sums.end(), 0.0);
        std::fill(counts.begin(), counts.end(), 0);
        for (size_t i = 0; i < ns; i++) {
            const size_t c = size_t(assign[i]);
            counts[c]++;
            double* s = sums.data() + c * d;
            const float* p = data + i * d;
            for (size_t t = 0; t < d; t++)
                s[t] += p[t];
        }
        perturbed = false;
        for (size_t c = 0; c < k; c++) {
            if (counts[c] == 0) {
                perturbed = true;
                continue;
            }
            const double inv = 1.0 / double(counts[c]);
            for (size_t t = 0; t < d; t++)
                centroids[c * d + t] = float(sums[c * d + t] * inv);
        }
        if (perturbed)
            split_empty_clusters(centroids, counts, d, scale, rng);
        prev.swap(assign);
    }
}

}  // namespace gpuivfpq
