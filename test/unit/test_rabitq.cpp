// Extended RaBitQ codes: rotation, grid search, layout, determinism,
// estimator accuracy and bound coverage, IVF recall, and edge cases.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>

#include "engine/interrupt.h"
#include "engine/kmeans.h"
#include "engine/rabitq.h"
#include "engine/rabitq_row.h"
#include "engine/sampling.h"
#include "engine/search_limits.h"
#include "engine/topk.h"
#include "test_util.h"

using namespace gpuivfpq;
using testutil::test_seed;

namespace {

// FNV-1a over the bytes of n floats: a fingerprint of a rotation.
uint64_t fingerprint(const float* x, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    const auto* b = reinterpret_cast<const uint8_t*>(x);
    for (size_t i = 0; i < n * sizeof(float); i++)
        h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

// An encoded IVF index: model, list of each row, codes, factors, and the
// lists as search() takes them.
struct Encoded {
    RabitqModel model;
    std::vector<int32_t> list_ids;
    std::vector<uint8_t> codes;
    std::vector<RabitqFactors> factors;
    // Per list: labels, codes and factors gathered contiguously.
    std::vector<std::vector<int64_t>> labels;
    std::vector<std::vector<uint8_t>> list_codes;
    std::vector<std::vector<RabitqFactors>> list_factors;
    std::vector<RabitqList> lists;
};

// Trains `lists` k-means centroids on x (normalised for Cosine), encodes
// every row with `bits` bits and gathers the lists.
Encoded encode_ivf(const std::vector<float>& x, size_t n, size_t d, size_t lists, int bits,
                   Metric metric, uint64_t seed, int threads = 2)
{
    Encoded e{RabitqModel(d, lists, bits, metric, RabitqRotation::generate(d, seed, threads))};
    std::vector<float> train(x.begin(), x.begin() + n * d);
    if (metric == Metric::Cosine)
        normalize_rows(train.data(), n, d);
    std::vector<float> cent(lists * d);
    KMeansParams kp;
    kp.seed = seed;
    kp.threads = threads;
    kmeans_train(train.data(), n, d, lists, kp, cent.data());
    e.model.set_centroids(cent.data());
    e.list_ids.resize(n);
    e.model.assign(x.data(), n, e.list_ids.data(), threads);
    const size_t cb = e.model.code_bytes();
    e.codes.resize(n * cb);
    e.factors.resize(n);
    e.model.encode(x.data(), n, e.list_ids.data(), e.codes.data(), e.factors.data(), threads);
    e.labels.resize(lists);
    e.list_codes.resize(lists);
    e.list_factors.resize(lists);
    for (size_t i = 0; i < n; i++) {
        const size_t l = size_t(e.list_ids[i]);
        e.labels[l].push_back(int64_t(i));
        e.list_codes[l].insert(e.list_codes[l].end(), e.codes.begin() + i * cb,
                               e.codes.begin() + (i + 1) * cb);
        e.list_factors[l].push_back(e.factors[i]);
    }
    for (size_t l = 0; l < lists; l++)
        e.lists.push_back({e.labels[l].data(), e.list_codes[l].data(), e.list_factors[l].data(),
                           e.labels[l].size()});
    return e;
}

// Estimates of every (query, row) pair against the rows' own lists.
struct PairStats {
    // Mean |est - true| / scale: scale = true for L2 and Cosine, ||q|| ||o||
    // for InnerProduct (whose distances cross 0).
    double mean_rel_err = 0;
    double mean_bias = 0;      // mean (est - true) / mean true
    double coverage_19 = 0;    // share with |est - true| <= bound at eps0 = 1.9
    double coverage_30 = 0;    // the same at eps0 = 3
    double lower_19 = 0;       // share with est - bound <= true at eps0 = 1.9 (what pruning uses)
    size_t pairs = 0;
};

PairStats pair_stats(const Encoded& e, const std::vector<float>& base, size_t n,
                     const std::vector<float>& queries, size_t nq)
{
    const RabitqModel& m = e.model;
    const size_t d = m.d(), cb = m.code_bytes();
    PairStats s;
    double sum_err = 0, sum_true = 0, sum_signed = 0;
    size_t in19 = 0, in30 = 0, low19 = 0;
    RabitqQuery query;
    std::vector<RabitqListQuery> lqs(m.lists());
    for (size_t qi = 0; qi < nq; qi++) {
        const float* q = queries.data() + qi * d;
        m.prepare_query(q, query);
        for (size_t l = 0; l < m.lists(); l++)
            m.prepare_list(query, int32_t(l), lqs[l]);
        for (size_t i = 0; i < n; i++) {
            const RabitqListQuery& lq = lqs[size_t(e.list_ids[i])];
            const double truth = testutil::metric_ref(m.metric(), q, base.data() + i * d, d);
            const RabitqEstimate a = m.estimate(lq, e.codes.data() + i * cb, e.factors[i], 1.9f);
            const RabitqEstimate b = m.estimate(lq, e.codes.data() + i * cb, e.factors[i], 3.0f);
            const double err = double(a.estimate) - truth;
            const float* o = base.data() + i * d;
            const double scale =
                m.metric() == Metric::InnerProduct
                    ? std::sqrt(testutil::ip_ref(q, q, d) * testutil::ip_ref(o, o, d))
                    : std::fabs(truth);
            sum_err += std::fabs(err) / std::max(scale, 1e-12);
            sum_signed += err;
            sum_true += std::fabs(truth);
            // A relative slack of 1e-5 for the float rounding of the estimate itself.
            const double slack = 1e-5 * (std::fabs(truth) + 1.0);
            in19 += std::fabs(err) <= a.bound + slack;
            in30 += std::fabs(err) <= b.bound + slack;
            low19 += err <= a.bound + slack;
            s.pairs++;
        }
    }
    s.mean_rel_err = sum_err / double(s.pairs);
    s.mean_bias = sum_signed / sum_true;
    s.coverage_19 = double(in19) / double(s.pairs);
    s.coverage_30 = double(in30) / double(s.pairs);
    s.lower_19 = double(low19) / double(s.pairs);
    return s;
}

// recall@k of got (nq x k labels, -1 padded) against the exact k nearest.
double recall_at_k(const std::vector<int64_t>& truth, const std::vector<int64_t>& got, size_t nq,
                   size_t k)
{
    size_t hits = 0;
    for (size_t qi = 0; qi < nq; qi++) {
        const std::set<int64_t> t(truth.begin() + qi * k, truth.begin() + (qi + 1) * k);
        for (size_t r = 0; r < k; r++)
            hits += t.count(got[qi * k + r]);
    }
    return double(hits) / double(nq * k);
}

// The best cosine of the sweep, found the slow way: every step of every
// coordinate sorted by scale, and every state after a step evaluated (the
// engine stops its sweep early and merges levels with a heap).
double full_sweep_cos(const std::vector<double>& o, int bits)
{
    const size_t d = o.size();
    const unsigned half = 1u << (bits - 1);
    std::vector<std::pair<double, size_t>> steps;
    double ip = 0, nsq = 0.25 * double(d);
    for (size_t i = 0; i < d; i++) {
        ip += 0.5 * std::fabs(o[i]);
        if (o[i] != 0)
            for (unsigned j = 1; j < half; j++)
                steps.push_back({double(j) / std::fabs(o[i]), i});
    }
    std::sort(steps.begin(), steps.end());
    std::vector<unsigned> k(d, 0);
    double best = ip / std::sqrt(nsq);
    for (const auto& st : steps) {
        const unsigned kk = ++k[st.second];
        ip += std::fabs(o[st.second]);
        nsq += 2.0 * kk;
        best = std::max(best, ip / std::sqrt(nsq));
    }
    return best;
}

// The sweep of rabitq_best_grid_point as its header defines it, step by
// step and without shortcuts: every step sorted by (t, level, rank), the
// running sums in that order, the best by the sweep's comparison. Writes x;
// returns <y, u> and ||y||^2 of the best point.
RabitqGridPoint reference_sweep(const std::vector<double>& o, int bits, std::vector<uint8_t>& x)
{
    const size_t d = o.size();
    const unsigned half = 1u << (bits - 1);
    std::vector<double> u(d);
    double ip = 0.0;
    for (size_t i = 0; i < d; i++) {
        u[i] = std::fabs(o[i]);
        ip += 0.5 * u[i];
    }
    double nsq = 0.25 * double(d);
    std::vector<size_t> rank;  // coordinates with u > 0 by decreasing u, ties by index
    for (size_t i = 0; i < d; i++)
        if (u[i] > 0.0)
            rank.push_back(i);
    std::stable_sort(rank.begin(), rank.end(), [&](size_t a, size_t b) { return u[a] > u[b]; });
    struct Step {
        double t;
        unsigned level;
        size_t rank;
    };
    std::vector<Step> steps;
    for (size_t r = 0; r < rank.size(); r++) {
        const double w = 1.0 / u[rank[r]];
        for (unsigned j = 1; j < half; j++)
            steps.push_back({double(j) * w, j, r});
    }
    std::sort(steps.begin(), steps.end(), [](const Step& a, const Step& b) {
        return a.t < b.t ||
               (a.t == b.t && (a.level < b.level || (a.level == b.level && a.rank < b.rank)));
    });
    double best_ip = ip, best_nsq = nsq;
    size_t best_steps = 0;
    for (size_t s = 0; s < steps.size(); s++) {
        ip += u[rank[steps[s].rank]];
        nsq += 2.0 * double(steps[s].level);
        if (ip * ip * best_nsq > best_ip * best_ip * nsq) {
            best_ip = ip;
            best_nsq = nsq;
            best_steps = s + 1;
        }
    }
    std::vector<unsigned> k(d, 0);
    for (size_t s = 0; s < best_steps; s++)
        k[rank[steps[s].rank]]++;
    x.resize(d);
    for (size_t i = 0; i < d; i++)
        x[i] = uint8_t(o[i] >= 0.0 ? half + k[i] : half - 1 - k[i]);
    return {best_ip, best_nsq};
}

}  // namespace

// ---------------------------------------------------------------- rotation

TEST(Rabitq, RotationIsOrthogonal)
{
    const uint64_t seed = test_seed(901);
    for (size_t d : {1, 2, 3, 7, 33, 64, 100, 128, 385}) {
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " d=" << d);
        const RabitqRotation rot = RabitqRotation::generate(d, seed, 2);
        const std::vector<float>& p = rot.matrix();
        ASSERT_EQ(p.size(), d * d);
        double worst = 0, largest = 0;
        for (size_t i = 0; i < d; i++)
            for (size_t j = i; j < d; j++) {
                double s = 0;  // column i . column j
                for (size_t t = 0; t < d; t++)
                    s += double(p[t * d + i]) * double(p[t * d + j]);
                worst = std::max(worst, std::fabs(s - (i == j ? 1.0 : 0.0)));
            }
        for (float v : p)
            largest = std::max(largest, double(std::fabs(v)));
        EXPECT_LT(worst, 1e-5);
        // Haar: entries spread (about sqrt(4 ln d / d) at most), not a permutation.
        if (d >= 64)
            EXPECT_LT(largest, 0.6) << "largest entry " << largest;
    }
}

// The largest dimension: every column unit length, sampled pairs orthogonal
// (all pairs would take d^3).
TEST(Rabitq, RotationAtLargestDimension)
{
    const uint64_t seed = test_seed(914);
    const size_t d = kRabitqMaxDims;
    SCOPED_TRACE(testing::Message() << "seed=" << seed << " d=" << d);
    const RabitqRotation rot = RabitqRotation::generate(d, seed, 2);
    const std::vector<float>& p = rot.matrix();
    auto column_dot = [&](size_t i, size_t j) {
        double s = 0;
        for (size_t t = 0; t < d; t++)
            s += double(p[t * d + i]) * double(p[t * d + j]);
        return s;
    };
    double worst = 0;
    for (size_t i = 0; i < d; i++)
        worst = std::max(worst, std::fabs(column_dot(i, i) - 1.0));
    std::mt19937_64 gen(seed);
    for (int r = 0; r < 2000; r++) {
        const size_t i = gen() % d, j = gen() % d;
        if (i != j)
            worst = std::max(worst, std::fabs(column_dot(i, j)));
    }
    EXPECT_LT(worst, 1e-5);
}

TEST(Rabitq, RotationIsDeterministic)
{
    const uint64_t seed = test_seed(902);
    SCOPED_TRACE(testing::Message() << "seed=" << seed);
    for (size_t d : {5, 100}) {
        const auto a = RabitqRotation::generate(d, seed, 1);
        const auto b = RabitqRotation::generate(d, seed, 3);
        const auto c = RabitqRotation::generate(d, seed + 1, 1);
        EXPECT_EQ(a.matrix(), b.matrix()) << "d=" << d;
        EXPECT_NE(a.matrix(), c.matrix()) << "d=" << d;
        const auto loaded = RabitqRotation::from_matrix(d, a.matrix().data());
        EXPECT_EQ(loaded.matrix(), a.matrix());
    }
    // The same floats on every machine and compiler: pinned fingerprints
    // (IEEE double +, -, *, /, sqrt only, no FMA contraction, no libm).
    const auto g = RabitqRotation::generate(24, 12345, 1);
    const auto h = RabitqRotation::generate(300, 7, 2);
    std::printf("rotation fingerprints: d=24 seed=12345 %016llx, d=300 seed=7 %016llx\n",
                (unsigned long long)fingerprint(g.matrix().data(), 24 * 24),
                (unsigned long long)fingerprint(h.matrix().data(), 300 * 300));
    EXPECT_EQ(fingerprint(g.matrix().data(), 24 * 24), 0x3296e42bcbfa8c68ULL);
    EXPECT_EQ(fingerprint(h.matrix().data(), 300 * 300), 0x5f9d65eb288d42b0ULL);
}

TEST(Rabitq, RotationApplyPreservesNorms)
{
    const uint64_t seed = test_seed(903);
    const size_t d = 77;
    SCOPED_TRACE(testing::Message() << "seed=" << seed << " d=" << d);
    const auto rot = RabitqRotation::generate(d, seed);
    const auto x = testutil::gaussian_vectors(20, d, seed);
    std::vector<float> y(d);
    for (size_t i = 0; i < 20; i++) {
        const float* xi = x.data() + i * d;
        rot.apply(xi, y.data());
        EXPECT_NEAR(testutil::ip_ref(y.data(), y.data(), d), testutil::ip_ref(xi, xi, d),
                    1e-5 * testutil::ip_ref(xi, xi, d));
        for (size_t r = 0; r < d; r += 13)
            EXPECT_NEAR(y[r], testutil::ip_ref(rot.matrix().data() + r * d, xi, d), 1e-5);
    }
    std::vector<float> bad(d * d, 0.0f);
    bad[3] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_THROW(RabitqRotation::from_matrix(d, bad.data()), Error);
    EXPECT_THROW(RabitqRotation::generate(0, seed), Error);
    EXPECT_THROW(RabitqRotation::generate(kRabitqMaxDims + 1, seed), Error);
}

// ---------------------------------------------------------------- codes

TEST(Rabitq, PackRoundTripAndLayout)
{
    const uint64_t seed = test_seed(904);
    std::mt19937_64 gen(seed);
    for (int bits = 1; bits <= kRabitqMaxBits; bits++)
        for (size_t d : {1, 5, 31, 32, 33, 100, 128}) {
            SCOPED_TRACE(testing::Message() << "seed=" << seed << " bits=" << bits << " d=" << d);
            std::vector<uint8_t> x(d), back(d);
            for (auto& v : x)
                v = uint8_t(gen() & ((1u << bits) - 1));
            std::vector<uint8_t> code(rabitq_code_bytes(d, bits), 0xAB);
            ASSERT_EQ(code.size(), size_t(bits) * ((d + 31) / 32) * 4);
            rabitq_pack(x.data(), d, bits, code.data());
            rabitq_unpack(code.data(), d, bits, back.data());
            EXPECT_EQ(x, back);
            // Plane p holds bit bits-1-p of x_i at bit i%32 of little-endian word i/32.
            const size_t words = rabitq_plane_words(d);
            for (int p = 0; p < bits; p++)
                for (size_t i = 0; i < words * 32; i++) {
                    uint32_t w;
                    std::memcpy(&w, code.data() + (size_t(p) * words + i / 32) * 4, 4);
                    const unsigned bit = (w >> (i % 32)) & 1u;
                    const unsigned want = i < d ? (x[i] >> (bits - 1 - p)) & 1u : 0u;
                    ASSERT_EQ(bit, want) << "plane " << p << " dim " << i;
                }
        }
}

TEST(Rabitq, BytesPerRow)
{
    // The layout's budget: <= 130 bytes per row at d = 128, 7 bits.
    EXPECT_EQ(rabitq_row_bytes(128, 7), 124u);
    std::printf("bytes per row (code + 12 bytes of factors):\n");
    for (size_t d : {128, 768}) {
        std::printf("  d=%zu:", d);
        for (int b = 1; b <= 8; b++)
            std::printf(" B=%d %zu", b, rabitq_row_bytes(d, b));
        std::printf("\n");
    }
    EXPECT_EQ(rabitq_row_bytes(768, 1), 108u);
    EXPECT_EQ(rabitq_row_bytes(100, 3), 3u * 16u + 12u);
}

// The sweep finds the grid point of best cosine: exhaustively checked at
// small d, and no single-coordinate step improves it at d = 128.
TEST(Rabitq, GridPointIsBestCosine)
{
    const uint64_t seed = test_seed(905);
    std::mt19937_64 gen(seed);
    std::normal_distribution<double> g(0.0, 1.0);
    for (int bits = 1; bits <= 4; bits++)
        for (size_t d : {1, 2, 3, 4}) {
            const size_t levels = size_t(1) << bits;
            size_t total = 1;
            for (size_t t = 0; t < d; t++)
                total *= levels;
            for (int rep = 0; rep < 20; rep++) {
                SCOPED_TRACE(testing::Message() << "seed=" << seed << " bits=" << bits
                                                << " d=" << d << " rep=" << rep);
                std::vector<double> o(d);
                double nrm = 0;
                for (auto& v : o) {
                    v = g(gen);
                    nrm += v * v;
                }
                for (auto& v : o)
                    v /= std::sqrt(nrm);
                std::vector<uint8_t> x(d);
                const RabitqGridPoint gp = rabitq_best_grid_point(o.data(), d, bits, x.data());
                const double got = gp.ip / std::sqrt(gp.norm_sqr);
                // gp matches x.
                double ip = 0, nsq = 0;
                for (size_t t = 0; t < d; t++) {
                    const double y = double(x[t]) - (double(levels) - 1) / 2;
                    ip += y * o[t];
                    nsq += y * y;
                }
                EXPECT_NEAR(ip, gp.ip, 1e-9);
                EXPECT_NEAR(nsq, gp.norm_sqr, 1e-9);
                double best = -2;
                for (size_t code = 0; code < total; code++) {
                    double a = 0, b = 0;
                    size_t c = code;
                    for (size_t t = 0; t < d; t++, c /= levels) {
                        const double y = double(c % levels) - (double(levels) - 1) / 2;
                        a += y * o[t];
                        b += y * y;
                    }
                    best = std::max(best, a / std::sqrt(b));
                }
                EXPECT_NEAR(got, best, 1e-12);
            }
        }
    // Wide codes (the engine's sweep stops early there) against the full sweep,
    // on Gaussian, heavy-tailed and sparse directions.
    for (int bits : {5, 6, 7, 8})
        for (size_t d : {16, 128, 300})
            for (int kind = 0; kind < 3; kind++) {
                SCOPED_TRACE(testing::Message() << "seed=" << seed << " bits=" << bits
                                                << " d=" << d << " kind=" << kind);
                std::vector<double> o(d);
                double nrm = 0;
                for (size_t t = 0; t < d; t++) {
                    double v = g(gen);
                    if (kind == 1)
                        v = v * v * v;  // heavy tails
                    if (kind == 2 && t % 3 != 0)
                        v = 0;  // sparse
                    o[t] = v;
                    nrm += v * v;
                }
                for (auto& v : o)
                    v /= std::sqrt(nrm);
                std::vector<uint8_t> x(d);
                const RabitqGridPoint gp = rabitq_best_grid_point(o.data(), d, bits, x.data());
                EXPECT_NEAR(gp.ip / std::sqrt(gp.norm_sqr), full_sweep_cos(o, bits), 1e-12);
            }
    for (int bits : {2, 4, 7, 8}) {
        const size_t d = 128;
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " bits=" << bits << " d=" << d);
        std::vector<double> o(d);
        double nrm = 0;
        for (auto& v : o) {
            v = g(gen);
            nrm += v * v;
        }
        for (auto& v : o)
            v /= std::sqrt(nrm);
        std::vector<uint8_t> x(d);
        const RabitqGridPoint gp = rabitq_best_grid_point(o.data(), d, bits, x.data());
        const double c0 = gp.ip / std::sqrt(gp.norm_sqr);
        const double half = ((1 << bits) - 1) / 2.0;
        for (size_t t = 0; t < d; t++)
            for (int step : {-1, 1}) {
                const int nx = int(x[t]) + step;
                if (nx < 0 || nx >= (1 << bits))
                    continue;
                const double y0 = x[t] - half, y1 = nx - half;
                const double ip = gp.ip + (y1 - y0) * o[t];
                const double nsq = gp.norm_sqr + y1 * y1 - y0 * y0;
                ASSERT_LE(ip / std::sqrt(nsq), c0 + 1e-12) << "t=" << t << " step=" << step;
            }
        std::printf("grid point cosine d=%zu bits=%d: %.6f\n", d, bits, c0);
    }
}

// The engine's grid search (binned sums, early stop) returns the full
// sweep's point and its rounded sums bit for bit, on directions that probe
// its special cases: ties in u and in t, u that are short binary fractions
// (rounding ties), zeros, heavy tails, a dominant coordinate, and vectors
// just off unit length.
TEST(Rabitq, GridPointIsTheSweepBitForBit)
{
    const uint64_t seed = test_seed(915);
    std::mt19937_64 gen(seed);
    std::normal_distribution<double> g(0.0, 1.0);
    const size_t dims[] = {1, 2, 3, 5, 8, 16, 31, 64, 100, 128, 200, 300, 768};
    size_t mismatches = 0, mismatches_levels = 0, cases = 0;
    for (int rep = 0; rep < 3000; rep++) {
        const size_t d = dims[gen() % 13];
        const int bits = 1 + int(gen() % 8);
        const int kind = int(gen() % 8);
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " rep=" << rep << " d=" << d
                                        << " bits=" << bits << " kind=" << kind);
        std::vector<double> o(d);
        double nrm = 0;
        for (size_t t = 0; t < d; t++) {
            double v = g(gen);
            if (kind == 1)
                v = v * v * v;  // heavy tails
            if (kind == 2 && gen() % 3 != 0)
                v = 0;  // sparse
            if (kind == 3)
                v = double(1 + gen() % 4) * (gen() % 2 ? 1.0 : -1.0);  // ties
            if (kind == 4)
                v = std::ldexp(double(int64_t(gen() % 64) - 32), -5);  // short fractions
            if (kind == 5 && t == 0)
                v = 50.0;  // one dominant coordinate
            o[t] = v;
            nrm += v * v;
        }
        if (nrm > 0)
            for (auto& v : o)
                v /= std::sqrt(nrm) * (kind == 6 ? 1.0000001 : 1.0);
        std::vector<uint8_t> want, got(d);
        const RabitqGridPoint a = reference_sweep(o, bits, want);
        const RabitqGridPoint b = rabitq_best_grid_point(o.data(), d, bits, got.data());
        const bool same = want == got && std::memcmp(&a.ip, &b.ip, sizeof a.ip) == 0 &&
                          std::memcmp(&a.norm_sqr, &b.norm_sqr, sizeof a.norm_sqr) == 0;
        EXPECT_TRUE(same) << "ip " << a.ip << " vs " << b.ip << ", nsq " << a.norm_sqr << " vs "
                          << b.norm_sqr;
        mismatches += !same;
        // The GPU build encoder's form (a heap of levels, rabitq_row.h).
        std::vector<double> us(d);
        std::vector<uint16_t> coord(d);
        std::vector<uint8_t> by_levels(d);
        const RabitqGridPoint c = gpuivfpq::rabitq_grid_point_sweep(o.data(), d, bits, us.data(), coord.data(),
                                                                    by_levels.data());
        const bool same_levels = want == by_levels && std::memcmp(&a.ip, &c.ip, sizeof a.ip) == 0 &&
                                 std::memcmp(&a.norm_sqr, &c.norm_sqr, sizeof a.norm_sqr) == 0;
        EXPECT_TRUE(same_levels) << "heap of levels: ip " << a.ip << " vs " << c.ip << ", nsq " << a.norm_sqr
                                 << " vs " << c.norm_sqr;
        mismatches_levels += !same_levels;
        cases++;
    }
    std::printf("grid search vs the full sweep: %zu of %zu differ (heap of levels: %zu)\n", mismatches, cases,
                mismatches_levels);
}

TEST(Rabitq, CodesIdenticalAcrossThreadCounts)
{
    const uint64_t seed = test_seed(906);
    const size_t n = 1500, d = 100, lists = 6;
    for (Metric metric : {Metric::L2, Metric::InnerProduct, Metric::Cosine}) {
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " n=" << n << " d=" << d
                                        << " metric=" << testutil::metric_name(metric));
        const auto x = testutil::clustered_vectors(n, d, 10, 2.0f, seed);
        const Encoded ref = encode_ivf(x, n, d, lists, 5, metric, seed, 1);
        for (int threads : {1, 2, 3, 8}) {
            std::vector<uint8_t> codes(ref.codes.size());
            std::vector<RabitqFactors> f(n);
            ref.model.encode(x.data(), n, ref.list_ids.data(), codes.data(), f.data(), threads);
            EXPECT_EQ(codes, ref.codes) << "threads=" << threads;
            EXPECT_EQ(std::memcmp(f.data(), ref.factors.data(), n * sizeof(RabitqFactors)), 0)
                << "threads=" << threads;
        }
    }
}

namespace {

// Rows from the engine's Rng (not std:: distributions, which differ between
// standard libraries): each value a sum of four uniforms, about N(0, 1/3).
std::vector<float> pinned_rows(size_t n, size_t d, uint64_t seed)
{
    Rng rng(seed);
    std::vector<float> v(n * d);
    for (float& x : v)
        x = (rng.unit() + rng.unit()) + (rng.unit() + rng.unit()) - 2.0f;
    return v;
}

// FNV-1a over bytes, continuing from h.
uint64_t fnv_bytes(uint64_t h, const void* p, size_t n)
{
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

}  // namespace

// The codes and factors are pinned: hashes of the output of the first
// implementation (a heap-merged sweep, one row at a time), so that a faster
// encoder must give the same bytes. Fixed seeds (not test_seed), list ids
// given (no k-means or BLAS), L2 and InnerProduct (their arithmetic is
// IEEE double in a fixed order: the same bytes on every x86-64).
TEST(Rabitq, CodesArePinned)
{
    struct Case {
        size_t d;
        int bits;
        Metric metric;
        uint64_t hash;
    };
    const Case cases[] = {
        {128, 1, Metric::L2, 0x34c39dcb6f2f34b9ULL},
        {128, 2, Metric::L2, 0x3af97dbd68594bc7ULL},
        {128, 3, Metric::L2, 0xfe947378fa442004ULL},
        {128, 4, Metric::L2, 0x49e73a6ffee4b8d8ULL},
        {128, 5, Metric::L2, 0x478843a8eeb9cbbaULL},
        {128, 6, Metric::L2, 0x3ed8e9003369e927ULL},
        {128, 7, Metric::L2, 0xaff7cdda8cd9e697ULL},
        {128, 8, Metric::L2, 0xfa16fecc8ae32eaaULL},
        {128, 4, Metric::InnerProduct, 0x2750f9059b0b89f1ULL},
        {100, 7, Metric::L2, 0xbec91819ab817177ULL},
        {768, 1, Metric::L2, 0xb26b7f890bc6c127ULL},
        {768, 4, Metric::L2, 0xb0a6f8937065a8d9ULL},
        {768, 7, Metric::L2, 0x9df2f5e14670a231ULL},
    };
    const size_t n = 1000, lists = 4;
    for (const Case& c : cases) {
        SCOPED_TRACE(testing::Message() << "d=" << c.d << " bits=" << c.bits
                                        << " metric=" << testutil::metric_name(c.metric));
        RabitqModel m(c.d, lists, c.bits, c.metric, RabitqRotation::generate(c.d, 4242, 2));
        const auto cent = pinned_rows(lists, c.d, 17);
        m.set_centroids(cent.data());
        const auto x = pinned_rows(n, c.d, 1000 + c.d);
        std::vector<int32_t> ids(n);
        for (size_t i = 0; i < n; i++)
            ids[i] = int32_t(i % lists);
        std::vector<uint8_t> codes(n * m.code_bytes());
        std::vector<RabitqFactors> f(n);
        m.encode(x.data(), n, ids.data(), codes.data(), f.data(), 2);
        uint64_t h = fnv_bytes(1469598103934665603ULL, codes.data(), codes.size());
        h = fnv_bytes(h, f.data(), n * sizeof(RabitqFactors));
        std::printf("pinned codes d=%zu bits=%d %s: 0x%016llxULL\n", c.d, c.bits,
                    testutil::metric_name(c.metric), (unsigned long long)h);
        EXPECT_EQ(h, c.hash);
    }

    // The grid search alone on directions with ties (equal |o_i|, and steps
    // of different levels at the same scale), zeros and heavy tails.
    Rng rng(77);
    uint64_t h = 1469598103934665603ULL;
    for (int bits = 1; bits <= kRabitqMaxBits; bits++)
        for (size_t d : {1, 2, 5, 64, 128, 300})
            for (int kind = 0; kind < 4; kind++) {
                std::vector<double> o(d);
                double nrm = 0;
                for (size_t t = 0; t < d; t++) {
                    double v = double(rng.unit()) * 2.0 - 1.0;
                    if (kind == 1)  // few distinct magnitudes: 1, 2, 3, 4 (ties)
                        v = double(1 + rng.below(4)) * (rng.below(2) ? 1.0 : -1.0);
                    if (kind == 2 && rng.below(3) != 0)  // sparse
                        v = 0.0;
                    if (kind == 3)  // heavy tails
                        v = v * v * v * v * v;
                    o[t] = v;
                    nrm += v * v;
                }
                if (nrm > 0)
                    for (auto& v : o)
                        v /= std::sqrt(nrm);
                std::vector<uint8_t> xs(d);
                const RabitqGridPoint gp = rabitq_best_grid_point(o.data(), d, bits, xs.data());
                h = fnv_bytes(h, xs.data(), d);
                h = fnv_bytes(h, &gp.ip, sizeof gp.ip);
                h = fnv_bytes(h, &gp.norm_sqr, sizeof gp.norm_sqr);
            }
    std::printf("pinned grid points: 0x%016llxULL\n", (unsigned long long)h);
    EXPECT_EQ(h, 0xdaafb49e5d9ac61cULL);
}

// ---------------------------------------------------------------- estimator

// Mean relative error of the L2 estimate falls as bits grow; the bound
// holds for the share of pairs its Gaussian scale predicts.
TEST(Rabitq, EstimatorAccuracyAndBound)
{
    const uint64_t seed = test_seed(907);
    struct Case {
        size_t d, n, nq;
        bool clustered;
    };
    for (const Case& c : {Case{128, 2000, 40, false}, Case{128, 2000, 40, true},
                          Case{768, 600, 12, false}, Case{768, 600, 12, true}}) {
        const size_t lists = c.clustered ? 8 : 1;
        const auto all = c.clustered
                             ? testutil::clustered_vectors(c.n + c.nq, c.d, 20, 2.0f, seed)
                             : testutil::gaussian_vectors(c.n + c.nq, c.d, seed);
        const std::vector<float> base(all.begin(), all.begin() + c.n * c.d);
        const std::vector<float> queries(all.begin() + c.n * c.d, all.end());
        double prev = 1e30;
        for (int bits : {1, 4, 7}) {
            SCOPED_TRACE(testing::Message() << "seed=" << seed << " d=" << c.d << " n=" << c.n
                                            << " nq=" << c.nq << " clustered=" << c.clustered
                                            << " bits=" << bits);
            const Encoded e = encode_ivf(base, c.n, c.d, lists, bits, Metric::L2, seed);
            const PairStats s = pair_stats(e, base, c.n, queries, c.nq);
            std::printf("L2 d=%zu %s B=%d: mean rel err %.5f, bias %+.5f, bound holds "
                        "%.4f (eps0 1.9; lower bound alone %.4f) %.4f (eps0 3.0), %zu pairs\n",
                        c.d, c.clustered ? "clustered" : "gaussian ", bits, s.mean_rel_err,
                        s.mean_bias, s.coverage_19, s.lower_19, s.coverage_30, s.pairs);
            EXPECT_LT(s.mean_rel_err, 0.5 * prev);
            prev = s.mean_rel_err;
            // Unbiased: the mean signed error is small against the distances.
            EXPECT_LT(std::fabs(s.mean_bias), 0.01);
            // eps0 = 1.9 scales: a Gaussian error stays inside for 94.3% of
            // pairs, more as query and row residuals correlate.
            EXPECT_GE(s.coverage_19, 0.93);
            EXPECT_GE(s.lower_19, 0.96);
            EXPECT_GE(s.coverage_30, 0.99);
        }
    }
}

TEST(Rabitq, InnerProductAndCosineEstimates)
{
    const uint64_t seed = test_seed(908);
    const size_t n = 1500, nq = 20, d = 96;
    for (Metric metric : {Metric::InnerProduct, Metric::Cosine}) {
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " n=" << n << " d=" << d
                                        << " metric=" << testutil::metric_name(metric));
        const auto all = testutil::clustered_vectors(n + nq, d, 10, 2.0f, seed);
        const std::vector<float> base(all.begin(), all.begin() + n * d);
        const std::vector<float> queries(all.begin() + n * d, all.end());
        const Encoded e = encode_ivf(base, n, d, 8, 6, metric, seed);
        const PairStats s = pair_stats(e, base, n, queries, nq);
        std::printf("%s d=%zu B=6: mean rel err %.5f, bound holds %.4f (eps0 1.9) %.4f (3.0)\n",
                    testutil::metric_name(metric), d, s.mean_rel_err, s.coverage_19,
                    s.coverage_30);
        EXPECT_GE(s.coverage_19, 0.93);
        EXPECT_GE(s.coverage_30, 0.99);
        EXPECT_LT(std::fabs(s.mean_bias), 0.01);
        // Search agrees with the estimates' order: the first hit's estimate
        // is the smallest of the probed lists.
        const auto top = e.model.search(e.lists.data(), queries.data(), 8, 5);
        ASSERT_EQ(top.size(), 5u);
        for (size_t r = 1; r < top.size(); r++)
            EXPECT_LE(top[r - 1].dist, top[r].dist);
    }
}

// ---------------------------------------------------------------- recall

// IVF (k-means lists) + RaBitQ, ranked by the estimates alone, against exact
// search; and the candidates a bound-based re-rank would fetch.
TEST(Rabitq, IvfRecall)
{
    const uint64_t seed = test_seed(909);
    const size_t n = 20000, nq = 200, d = 128, lists = 64, nprobe = 48, k = 10;
    const auto all = testutil::clustered_vectors(n + nq, d, 100, 1.0f, seed);
    const std::vector<float> base(all.begin(), all.begin() + n * d);
    const std::vector<float> queries(all.begin() + n * d, all.end());
    std::vector<float> td(nq * k);
    std::vector<int64_t> truth(nq * k);
    brute_force_knn(queries.data(), nq, base.data(), n, d, Metric::L2, k, td.data(), truth.data());
    double recall7 = 0;
    for (int bits : {1, 4, 7}) {
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " n=" << n << " d=" << d
                                        << " lists=" << lists << " nprobe=" << nprobe
                                        << " bits=" << bits);
        const Encoded e = encode_ivf(base, n, d, lists, bits, Metric::L2, seed);
        std::vector<int64_t> got(nq * k, -1);
        size_t cand_total = 0, cand_hits = 0;
        for (size_t qi = 0; qi < nq; qi++) {
            const float* q = queries.data() + qi * d;
            const auto res = e.model.search(e.lists.data(), q, nprobe, k);
            for (size_t r = 0; r < res.size(); r++)
                got[qi * k + r] = res[r].label;
            const auto cands = e.model.search_candidates(e.lists.data(), q, nprobe, k);
            cand_total += cands.size();
            std::set<int64_t> cs;
            for (const auto& c : cands) {
                cs.insert(c.label);
                EXPECT_LE(c.lower, c.estimate);
                EXPECT_GE(c.upper, c.estimate);
            }
            for (size_t r = 0; r < k; r++)
                cand_hits += cs.count(truth[qi * k + r]);
        }
        const double recall = recall_at_k(truth, got, nq, k);
        const double cand_recall = double(cand_hits) / double(nq * k);
        std::printf("IVF-RaBitQ L2 n=%zu d=%zu lists=%zu nprobe=%zu B=%d (%zu B/row): "
                    "recall@10 %.4f by estimate; eps0 1.9 candidates: %.1f per query, "
                    "holding %.4f of the true top-10\n",
                    n, d, lists, nprobe, bits, rabitq_row_bytes(d, bits), recall,
                    double(cand_total) / double(nq), cand_recall);
        if (bits == 7) {
            recall7 = recall;
            EXPECT_GE(recall, 0.95);
            EXPECT_GE(cand_recall, 0.99);
        }
        if (bits == 4) {
            EXPECT_GE(recall, 0.6);
            EXPECT_GE(cand_recall, 0.98);
        }
    }
    EXPECT_GT(recall7, 0.0);
}

// ---------------------------------------------------------------- edge cases

TEST(Rabitq, ZeroResidualIsExact)
{
    const uint64_t seed = test_seed(910);
    const size_t d = 40, lists = 3;
    SCOPED_TRACE(testing::Message() << "seed=" << seed << " d=" << d);
    for (Metric metric : {Metric::L2, Metric::InnerProduct}) {
        RabitqModel m(d, lists, 4, metric, RabitqRotation::generate(d, seed));
        const auto cent = testutil::gaussian_vectors(lists, d, seed);
        m.set_centroids(cent.data());
        // Rows equal to their centroid.
        std::vector<int32_t> ids = {0, 1, 2};
        std::vector<uint8_t> codes(3 * m.code_bytes());
        std::vector<RabitqFactors> f(3);
        m.encode(cent.data(), 3, ids.data(), codes.data(), f.data());
        const auto q = testutil::gaussian_vectors(1, d, seed + 1);
        RabitqQuery query;
        m.prepare_query(q.data(), query);
        RabitqListQuery lq;
        for (int32_t l = 0; l < 3; l++) {
            EXPECT_EQ(f[l].add, 0.0f);
            EXPECT_EQ(f[l].rescale, 0.0f);
            EXPECT_EQ(f[l].error, 0.0f);
            m.prepare_list(query, l, lq);
            const RabitqEstimate est = m.estimate(lq, codes.data() + l * m.code_bytes(), f[l]);
            const double truth = testutil::metric_ref(metric, q.data(), cent.data() + l * d, d);
            EXPECT_NEAR(est.estimate, truth, 1e-5 * (std::fabs(truth) + 1));
            EXPECT_EQ(est.bound, 0.0f);
        }
    }
}

TEST(Rabitq, OneDimensionIsExact)
{
    const uint64_t seed = test_seed(911);
    SCOPED_TRACE(testing::Message() << "seed=" << seed);
    const size_t n = 200;
    const auto x = testutil::uniform_vectors(n, 1, seed, -5.0f, 5.0f);
    for (int bits : {1, 3, 8}) {
        const Encoded e = encode_ivf(x, n, 1, 4, bits, Metric::L2, seed);
        EXPECT_EQ(e.model.code_bytes(), size_t(bits) * 4);
        const float q = 0.37f;
        const auto res = e.model.search(e.lists.data(), &q, 4, 3);
        std::vector<double> exact;
        for (size_t i = 0; i < n; i++)
            exact.push_back((double(x[i]) - q) * (double(x[i]) - q));
        std::sort(exact.begin(), exact.end());
        ASSERT_EQ(res.size(), 3u);
        for (size_t r = 0; r < 3; r++)
            EXPECT_NEAR(res[r].dist, exact[r], 1e-5) << "bits=" << bits << " r=" << r;
        for (const auto& f : e.factors)
            EXPECT_EQ(f.error, 0.0f);
    }
}

TEST(Rabitq, OddDimensions)
{
    const uint64_t seed = test_seed(912);
    for (size_t d : {2, 13, 63, 65, 100, 200}) {
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " d=" << d);
        const size_t n = 400, nq = 10;
        const auto all = testutil::gaussian_vectors(n + nq, d, seed + d);
        const std::vector<float> base(all.begin(), all.begin() + n * d);
        const std::vector<float> queries(all.begin() + n * d, all.end());
        const Encoded e = encode_ivf(base, n, d, 4, 6, Metric::L2, seed);
        const PairStats s = pair_stats(e, base, n, queries, nq);
        EXPECT_LT(s.mean_rel_err, 0.02) << s.mean_rel_err;
        EXPECT_GE(s.coverage_30, 0.98);
    }
}

TEST(Rabitq, ExtremeMagnitudes)
{
    const uint64_t seed = test_seed(913);
    const size_t n = 300, d = 48;
    for (float scale : {1e-30f, 1e-15f, 1e15f, 1e18f, 1e30f, 3e38f}) {
        for (Metric metric : {Metric::L2, Metric::InnerProduct, Metric::Cosine}) {
            SCOPED_TRACE(testing::Message() << "seed=" << seed << " scale=" << scale
                                            << " metric=" << testutil::metric_name(metric));
            auto x = testutil::uniform_vectors(n + 1, d, seed);
            for (auto& v : x)
                v *= scale;
            const Encoded e = encode_ivf(x, n, d, 4, 5, metric, seed);
            for (const auto& f : e.factors) {
                ASSERT_FALSE(std::isnan(f.add));
                ASSERT_FALSE(std::isnan(f.rescale));
                ASSERT_FALSE(std::isnan(f.error));
            }
            const float* q = x.data() + n * d;
            RabitqQuery query;
            e.model.prepare_query(q, query);
            RabitqListQuery lq;
            double worst = 0;
            for (int32_t l = 0; l < 4; l++) {
                const auto& L = e.lists[size_t(l)];
                e.model.prepare_list(query, l, lq);
                std::vector<float> est(L.n), bnd(L.n);
                e.model.scan(lq, L.codes, e.model.code_bytes(), L.factors, L.n, 1.9f, est.data(),
                             bnd.data());
                for (size_t i = 0; i < L.n; i++) {
                    ASSERT_FALSE(std::isnan(est[i]));
                    ASSERT_FALSE(std::isnan(bnd[i]));
                    ASSERT_GE(bnd[i], 0.0f);
                    const float* o = x.data() + size_t(L.labels[i]) * d;
                    const double truth = testutil::metric_ref(metric, q, o, d);
                    // Errors against the size of the distances: ||q||^2 +
                    // ||o||^2, and 1 for Cosine (unit vectors).
                    const double size = metric == Metric::Cosine
                                            ? 1.0
                                            : testutil::ip_ref(q, q, d) + testutil::ip_ref(o, o, d);
                    if (std::isfinite(truth) && std::fabs(truth) < 1e37)
                        worst = std::max(worst, std::fabs(est[i] - truth) / size);
                }
            }
            const auto res = e.model.search(e.lists.data(), q, 4, 5);
            EXPECT_EQ(res.size(), 5u);
            for (const auto& r : res)
                EXPECT_FALSE(std::isnan(r.dist));
            // Where the distances are within float range (and not denormal),
            // the estimates are as good as at scale 1.
            if (scale >= 1e-15f && scale <= 1e15f)
                EXPECT_LT(worst, 0.05) << "worst relative error " << worst;
        }
    }
}

// scan (which sums four codes at a time) gives every row estimate()'s bits,
// for any count of rows, with codes packed or further apart (index pages).
TEST(Rabitq, ScanIsEstimateBitForBit)
{
    const uint64_t seed = test_seed(4417);
    const size_t n = 203, d = 100;
    for (int bits : {1, 4, 7}) {
        for (Metric metric : {Metric::L2, Metric::InnerProduct, Metric::Cosine}) {
            SCOPED_TRACE(testing::Message() << "seed=" << seed << " bits=" << bits
                                            << " metric=" << testutil::metric_name(metric));
            auto x = testutil::uniform_vectors(n + 1, d, seed);
            const Encoded e = encode_ivf(x, n, d, 3, bits, metric, seed);
            const size_t cb = e.model.code_bytes(), stride = cb + 19;
            RabitqQuery query;
            e.model.prepare_query(x.data() + n * d, query);
            RabitqListQuery lq;
            for (int32_t l = 0; l < 3; l++) {
                const auto& L = e.lists[size_t(l)];
                e.model.prepare_list(query, l, lq);
                std::vector<uint8_t> spread(std::max<size_t>(L.n, 1) * stride, 0xA5);
                for (size_t i = 0; i < L.n; i++)
                    std::memcpy(spread.data() + i * stride, L.codes + i * cb, cb);
                for (size_t count : {L.n, L.n > 0 ? L.n - 1 : 0, std::min<size_t>(L.n, 3)}) {
                    std::vector<float> est(count + 1), bnd(count + 1), est2(count + 1);
                    e.model.scan(lq, L.codes, cb, L.factors, count, 1.9f, est.data(), bnd.data());
                    e.model.scan(lq, spread.data(), stride, L.factors, count, 1.9f, est2.data(),
                                 nullptr);
                    for (size_t i = 0; i < count; i++) {
                        const RabitqEstimate one = e.model.estimate(lq, L.codes + i * cb, L.factors[i]);
                        ASSERT_EQ(std::memcmp(&est[i], &one.estimate, sizeof(float)), 0) << "row " << i;
                        ASSERT_EQ(std::memcmp(&bnd[i], &one.bound, sizeof(float)), 0) << "row " << i;
                        ASSERT_EQ(std::memcmp(&est2[i], &one.estimate, sizeof(float)), 0) << "row " << i;
                    }
                }
            }
        }
    }
}

// P c per list: the same bits for any thread count; a model loaded with them
// (as an index loads its pages) prepares the same tables; q' = P q - P c is
// P (q - c) up to rounding.
TEST(Rabitq, RotatedCentroids)
{
    const uint64_t seed = test_seed(5150);
    const size_t d = 70, lists = 37;
    const auto rot = RabitqRotation::generate(d, seed);
    auto c = testutil::uniform_vectors(lists + 1, d, seed);
    RabitqModel a(d, lists, 4, Metric::L2, rot), b(d, lists, 4, Metric::L2, rot),
        l(d, lists, 4, Metric::L2, rot);
    a.set_centroids(c.data(), 1);
    b.set_centroids(c.data(), 3);
    ASSERT_EQ(std::memcmp(a.rotated_centroids().data(), b.rotated_centroids().data(),
                          lists * d * sizeof(double)),
              0);
    l.set_centroids(c.data(), a.rotated_centroids().data());
    RabitqQuery qa, ql;
    a.prepare_query(c.data() + lists * d, qa);
    l.prepare_query(c.data() + lists * d, ql);
    for (int32_t li : {0, 17, 36}) {
        RabitqListQuery la, ll;
        a.prepare_list(qa, li, la);
        l.prepare_list(ql, li, ll);
        ASSERT_EQ(la.lut, ll.lut);
        // Against the rotation of q - c itself.
        std::vector<double> qc(d), want(d);
        for (size_t k = 0; k < d; k++)
            qc[k] = double(qa.q[k]) - double(c[size_t(li) * d + k]);
        rot.apply(qc.data(), want.data());
        for (size_t k = 0; k < d; k++)
            EXPECT_NEAR(qa.rotated[k] - a.rotated_centroids()[size_t(li) * d + k], want[k], 1e-12);
    }
    std::vector<double> bad(a.rotated_centroids());
    bad[5] = std::numeric_limits<double>::quiet_NaN();
    EXPECT_THROW(l.set_centroids(c.data(), bad.data()), Error);
}

TEST(Rabitq, RejectsBadArguments)
{
    const auto rot = RabitqRotation::generate(8, 1);
    EXPECT_THROW(RabitqModel(8, 2, 0, Metric::L2, rot), Error);
    EXPECT_THROW(RabitqModel(8, 2, 9, Metric::L2, rot), Error);
    EXPECT_THROW(RabitqModel(9, 2, 4, Metric::L2, rot), Error);
    EXPECT_THROW(RabitqModel(8, 0, 4, Metric::L2, rot), Error);
    RabitqModel m(8, 2, 4, Metric::L2, rot);
    const std::vector<float> x(8, 1.0f);
    const int32_t bad = 2;
    std::vector<uint8_t> code(m.code_bytes());
    RabitqFactors f;
    EXPECT_THROW(m.encode(x.data(), 1, &bad, code.data(), &f), Error);
    RabitqQuery q;
    m.prepare_query(x.data(), q);
    RabitqListQuery lq;
    EXPECT_THROW(m.prepare_list(q, -1, lq), Error);
    EXPECT_THROW(m.search(nullptr, x.data(), 1, 1), Error);
    std::vector<RabitqList> lists(2);
    EXPECT_THROW(m.search(lists.data(), x.data(), 0, 1), Error);
    EXPECT_THROW(m.search(lists.data(), x.data(), 1, 0), Error);
    EXPECT_TRUE(m.search(lists.data(), x.data(), 5, 3).empty());  // empty lists
}

TEST(Rabitq, EncodeAndRotationStopOnInterrupt)
{
    const InterruptPoll previous = set_interrupt_poll([] { return true; });
    EXPECT_THROW(RabitqRotation::generate(64, 1, 2), Interrupted);
    set_interrupt_poll(previous);
    RabitqModel m(16, 1, 3, Metric::L2, RabitqRotation::generate(16, 1));
    const auto x = testutil::gaussian_vectors(100, 16, 5);
    std::vector<int32_t> ids(100, 0);
    std::vector<uint8_t> codes(100 * m.code_bytes());
    std::vector<RabitqFactors> f(100);
    set_interrupt_poll([] { return true; });
    EXPECT_THROW(m.encode(x.data(), 100, ids.data(), codes.data(), f.data(), 2), Interrupted);
    set_interrupt_poll(previous);
}
