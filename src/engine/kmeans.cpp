// Lloyd k-means with GEMM assignment, seeded subsampling and empty-cluster splitting.
#include "kmeans.h"
#include "interrupt.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "distances.h"
#include "error.h"
#include "internal.h"
#include "parallel.h"
#include "sampling.h"
#include "search_limits.h"

namespace gpuivfpq {

namespace detail {

size_t exact_nearest(const float* x, const float* centroids, size_t k, size_t d)
{
    size_t best = 0;
    double bv = 0.0;
    for (size_t j = 0; j < k; j++) {
        const float* c = centroids + j * d;
        double s = 0.0;
        for (size_t t = 0; t < d; t++) {
            const double diff = double(x[t]) - double(c[t]);
            s += diff * diff;
        }
        if (j == 0 || s < bv) {
            bv = s;
            best = j;
        }
    }
    return best;
}

size_t nearest_or_exact(const float* x, const float* centroids, size_t k, size_t d, size_t chosen,
                        float value)
{
    double nx = 0.0;
    for (size_t t = 0; t < d; t++)
        nx += double(x[t]) * double(x[t]);
    if (nx <= kMaxRankedNormSqr && std::isfinite(value))
        return chosen;
    return exact_nearest(x, centroids, k, d);
}

}  // namespace detail

void assign_nearest(const float* x, size_t n, const float* centroids, size_t k, size_t d,
                     int32_t* assign, float* dist, int threads, const float* centroid_norms)
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
                check_interrupt();
                const size_t r0 = t * kRows, nr = std::min(kRows, n - r0);
                detail::nearest_small(x + r0 * d, nr, d, cb, assign + r0);
                for (size_t i = r0; i < r0 + nr; i++) {
                    const size_t j = size_t(assign[i]);
                    assign[i] = int32_t(detail::nearest_or_exact(
                        x + i * d, centroids, k, d, j,
                        cb.norms[j] - 2.0f * inner_product(x + i * d, centroids + j * d, d)));
                }
                fill_dist(r0, nr);
            }
        });
        return;
    }

    std::vector<float> own;
    if (!centroid_norms) {
        own.resize(k);
        for (size_t j = 0; j < k; j++)
            own[j] = norm_sqr(centroids + j * d, d);
    }
    const float* cnorm = centroid_norms ? centroid_norms : own.data();

    // Tiles of rows x centroid-block keep each thread's block at <= 4 MiB;
    // tiling depends only on (n, k), never on the thread count.
    const size_t cb = std::min<size_t>(k, 4096);
    const size_t rows = std::clamp<size_t>((size_t(1) << 20) / cb, 64, 1024);
    const size_t ntiles = (n + rows - 1) / rows;

    parallel_for(ntiles, threads, [&](size_t t0, size_t t1) {
        std::vector<float> block(std::min(rows, n) * cb), best(std::min(rows, n));
        for (size_t t = t0; t < t1; t++) {
            check_interrupt();
            const size_t r0 = t * rows, nr = std::min(rows, n - r0);
            const float* xt = x + r0 * d;
            for (size_t c0 = 0; c0 < k; c0 += cb) {
                const size_t nc = std::min(cb, k - c0);
                detail::gemm_nt(nr, nc, d, xt, d, centroids + c0 * d, d, block.data(), nc);
                for (size_t i = 0; i < nr; i++) {
                    const float* row = block.data() + i * nc;
                    const size_t j = detail::argmin_l2(row, cnorm + c0, nc);
                    const float v = cnorm[c0 + j] - 2.0f * row[j];
                    if (c0 == 0 || v < best[i]) {
                        best[i] = v;
                        assign[r0 + i] = int32_t(c0 + j);
                    }
                }
            }
            for (size_t i = 0; i < nr; i++)
                assign[r0 + i] = int32_t(detail::nearest_or_exact(xt + i * d, centroids, k, d,
                                                                  size_t(assign[r0 + i]), best[i]));
            fill_dist(r0, nr);
        }
    });
}

namespace {

// Re-seeds each empty cluster by splitting the currently largest one into two
// slightly perturbed copies (largest by count, first on ties); counts are
// halved so successive empties split different clusters.
void split_empty_clusters(float* centroids, std::vector<size_t>& counts, size_t d, float scale,
                          Rng& rng)
{
    const size_t k = counts.size();
    for (size_t c = 0; c < k; c++) {
        if (counts[c] != 0)
            continue;
        const size_t big = size_t(std::max_element(counts.begin(), counts.end()) - counts.begin());
        split_centroid(centroids + big * d, centroids + c * d, d, scale, rng);
        counts[c] = counts[big] / 2;
        counts[big] -= counts[c];
    }
}

// Point-centroid distance evaluations (points x centroids) up to which
// k-means++ seeding is used: it is sequential, so keep it to ~tens of ms.
constexpr double kPlusPlusBudget = double(1 << 22);

// seeding_distance of each of the n rows of x to c, four rows at a time
// (four independent fma chains; each row's chain is seeding_distance's).
GPU_IVFPQ_HOT
void seeding_distances(const float* x, size_t n, size_t d, const float* c, float* out)
{
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float* p0 = x + i * d;
        const float* p1 = p0 + d;
        const float* p2 = p1 + d;
        const float* p3 = p2 + d;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        for (size_t t = 0; t < d; t++) {
            const float d0 = p0[t] - c[t], d1 = p1[t] - c[t], d2 = p2[t] - c[t], d3 = p3[t] - c[t];
            s0 = std::fma(d0, d0, s0);
            s1 = std::fma(d1, d1, s1);
            s2 = std::fma(d2, d2, s2);
            s3 = std::fma(d3, d3, s3);
        }
        out[i] = s0;
        out[i + 1] = s1;
        out[i + 2] = s2;
        out[i + 3] = s3;
    }
    for (; i < n; i++)
        out[i] = seeding_distance(x + i * d, c, d);
}

}  // namespace

GPU_IVFPQ_HOT
float seeding_distance(const float* a, const float* b, size_t d)
{
    float s = 0.0f;
    for (size_t t = 0; t < d; t++) {
        const float df = a[t] - b[t];
        s = std::fma(df, df, s);
    }
    return s;
}

std::vector<size_t> kmeans_subsample(size_t n, size_t k, size_t max_points_per_centroid, Rng& rng)
{
    require(k >= 1, "k-means: k must be at least 1");
    require(max_points_per_centroid >= 1, "k-means: max_points_per_centroid must be >= 1");
    // Beyond ~max_points_per_centroid per centroid more points cost time
    // without improving the centroids much.
    const size_t cap = max_points_per_centroid > SIZE_MAX / k ? n : k * max_points_per_centroid;
    if (n <= cap)
        return {};
    return sample_indices(n, cap, rng);
}

std::vector<size_t> kmeans_initial_rows(size_t ns, size_t k, Rng& rng, const SeedingUpdate& update)
{
    require(ns >= 1 && k >= 1, "k-means: need at least one point and one centroid");
    std::vector<size_t> rows;
    rows.reserve(k);
    if (ns <= k) {
        // Too few points to cluster: the points themselves, then seeded repeats.
        for (size_t c = 0; c < ns; c++)
            rows.push_back(c);
        for (size_t c = ns; c < k; c++)
            rows.push_back(rng.below(ns));
        return rows;
    }
    if (double(ns) * double(k) > kPlusPlusBudget)
        return sample_indices(ns, k, rng);  // k distinct random points

    // k-means++ (it avoids the bad local minima of random seeding): each next
    // centroid is a point drawn with probability proportional to its squared
    // distance to the nearest centroid so far.
    std::vector<float> mind(ns);
    size_t pick = rng.below(ns);
    for (size_t c = 0; c < k; c++) {
        rows.push_back(pick);
        if (c + 1 == k)
            break;
        update(pick, c == 0, mind.data());
        double total = 0.0;
        size_t overflowed = 0;
        for (size_t i = 0; i < ns; i++) {
            total += double(mind[i]);
            overflowed += !(mind[i] <= std::numeric_limits<float>::max());
        }
        if (overflowed > 0) {
            // Squared distances past the float range (values near it): those
            // points outweigh every other, and the draw is uniform among them.
            size_t r = rng.below(overflowed);
            for (size_t i = 0; i < ns; i++)
                if (!(mind[i] <= std::numeric_limits<float>::max()) && r-- == 0) {
                    pick = i;
                    break;
                }
            continue;
        }
        if (!(total > 0.0)) {
            pick = rng.below(ns);  // every point already covered: any one will do
            continue;
        }
        const double target = double(rng.unit()) * total;
        double acc = 0.0;
        pick = ns - 1;
        for (size_t i = 0; i < ns; i++) {
            acc += double(mind[i]);
            if (acc > target && mind[i] > 0.0f) {
                pick = i;
                break;
            }
        }
    }
    return rows;
}

void split_centroid(float* big, float* empty, size_t d, float scale, Rng& rng)
{
    constexpr float kEps = 1.0f / 1024.0f;
    for (size_t t = 0; t < d; t++) {
        const float delta = kEps * (std::fabs(big[t]) + scale);
        const float sgn = (rng.next() & 1) ? 1.0f : -1.0f;
        empty[t] = big[t] + sgn * delta;
        big[t] = big[t] - sgn * delta;
    }
    clamp_to_finite(big, d);
    clamp_to_finite(empty, d);
}

void clamp_to_finite(float* x, size_t n)
{
    const float top = std::numeric_limits<float>::max();
    for (size_t i = 0; i < n; i++)
        if (!std::isfinite(x[i]))
            x[i] = std::isnan(x[i]) ? 0.0f : std::copysign(top, x[i]);
}

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

    Rng rng(params.seed);
    const float* data = x;
    size_t ns = n;
    std::vector<float> sample;
    const std::vector<size_t> sub = kmeans_subsample(n, k, params.max_points_per_centroid, rng);
    if (!sub.empty()) {
        ns = sub.size();
        sample.resize(detail::checked_mul(ns, d, "k-means sample"));
        for (size_t i = 0; i < ns; i++)
            std::memcpy(sample.data() + i * d, x + sub[i] * d, d * sizeof(float));
        data = sample.data();
    }

    std::vector<float> dist;
    const std::vector<size_t> init =
        kmeans_initial_rows(ns, k, rng, [&](size_t row, bool first, float* mind) {
            dist.resize(ns);
            seeding_distances(data, ns, d, data + row * d, dist.data());
            for (size_t i = 0; i < ns; i++)
                mind[i] = first ? dist[i] : std::min(mind[i], dist[i]);
        });
    for (size_t c = 0; c < k; c++)
        std::memcpy(centroids + c * d, data + init[c] * d, d * sizeof(float));
    if (ns <= k)
        return;  // every point is a centroid already

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
        check_interrupt();
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
