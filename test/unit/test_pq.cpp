// Product quantizer: encode/decode, error vs m, distance tables and adc_scan.
#include <cstring>
#include <cmath>
#include <limits>

#include "engine/pq.h"
#include "engine/search_limits.h"
#include "test_util.h"

using namespace gpuivfpq;
using testutil::test_seed;

namespace {

// Mean squared reconstruction error of pq on x.
double pq_mse(const ProductQuantizer& pq, const std::vector<float>& x, size_t n)
{
    const size_t d = pq.d();
    std::vector<uint8_t> codes(n * pq.m());
    std::vector<float> rec(n * d);
    pq.encode(x.data(), n, codes.data());
    pq.decode(codes.data(), n, rec.data());
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += testutil::l2_ref(x.data() + i * d, rec.data() + i * d, d);
    return s / double(n);
}

}  // namespace

TEST(PQ, RejectsBadShapes)
{
    EXPECT_THROW(ProductQuantizer(10, 3), Error);
    EXPECT_THROW(ProductQuantizer(10, 0), Error);
    EXPECT_THROW(ProductQuantizer(0, 1), Error);
    try {
        ProductQuantizer(10, 4);
        FAIL();
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
        EXPECT_NE(std::string(e.what()).find("multiple"), std::string::npos) << e.what();
    }
    ProductQuantizer ok(12, 4);
    EXPECT_EQ(ok.dsub(), 3u);
    EXPECT_EQ(ok.codebooks().size(), 4u * 256u * 3u);
}

TEST(PQ, ErrorDecreasesWithM)
{
    const uint64_t seed = test_seed(501);
    const size_t n = 3000, d = 32;
    const auto x = testutil::gaussian_vectors(n, d, seed);
    double prev = 1e30;
    for (size_t m : {1, 2, 4, 8, 16}) {
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " n=" << n << " d=" << d
                                        << " m=" << m);
        ProductQuantizer pq(d, m);
        KMeansParams p;
        p.seed = seed;
        p.threads = 2;
        pq.train(x.data(), n, p);
        const double mse = pq_mse(pq, x, n);
        std::printf("PQ d=%zu m=%zu: mse %.4f (data variance %zu)\n", d, m, mse, d);
        EXPECT_LT(mse, 0.9 * prev);
        prev = mse;
    }
}

TEST(PQ, CodebookEntriesRoundTripExactly)
{
    const uint64_t seed = test_seed(502);
    for (size_t m : {1, 3, 8}) {
        const size_t d = 24;
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " d=" << d << " m=" << m);
        ProductQuantizer pq(d, m);
        const auto train = testutil::gaussian_vectors(2000, d, seed + m);
        KMeansParams p;
        p.seed = seed;
        p.iterations = 4;
        pq.train(train.data(), 2000, p);
        // Vectors made of random codewords: encoding must find codewords at
        // distance 0, so decode(encode(v)) == v bit for bit.
        std::mt19937_64 gen(seed);
        const size_t n = 300;
        std::vector<uint8_t> chosen(n * m);
        for (auto& c : chosen)
            c = uint8_t(gen() & 255);
        std::vector<float> v(n * d), back(n * d);
        pq.decode(chosen.data(), n, v.data());
        std::vector<uint8_t> codes(n * m);
        pq.encode(v.data(), n, codes.data(), 2);
        pq.decode(codes.data(), n, back.data());
        EXPECT_EQ(v, back);
    }
}

TEST(PQ, SetCodebooksRoundTrip)
{
    const uint64_t seed = test_seed(503);
    SCOPED_TRACE(testing::Message() << "seed=" << seed);
    ProductQuantizer a(16, 4), b(16, 4);
    const auto cb = testutil::uniform_vectors(4 * 256, 4, seed);
    a.set_codebooks(cb.data());
    EXPECT_EQ(a.codebooks(), cb);
    b.set_codebooks(a.codebooks().data());
    const auto x = testutil::uniform_vectors(100, 16, seed + 1);
    std::vector<uint8_t> ca(100 * 4), cbytes(100 * 4);
    a.encode(x.data(), 100, ca.data());
    b.encode(x.data(), 100, cbytes.data());
    EXPECT_EQ(ca, cbytes);
}

// encode keeps what it derives from the codebooks (the small-dimension
// kernel's transposed codebooks, or the codewords' norms) between calls:
// after new codebooks, or a training, it must encode with those, one row at
// a time as an insert does, or a batch.
TEST(PQ, EncodeFollowsNewCodebooks)
{
    const uint64_t seed = test_seed(507);
    for (size_t dsub : {size_t(4), size_t(24)}) {  // the small-dimension kernel, then GEMM
        const size_t m = 3, d = m * dsub, n = 50;
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " dsub=" << dsub);
        const auto x = testutil::uniform_vectors(n, d, seed + 1);
        const auto cb1 = testutil::uniform_vectors(m * 256, dsub, seed + 2);
        const auto cb2 = testutil::uniform_vectors(m * 256, dsub, seed + 3);
        auto codes_of = [&](const ProductQuantizer& pq, size_t rows_a_call) {
            std::vector<uint8_t> c(n * m);
            for (size_t i = 0; i < n; i += rows_a_call)
                pq.encode(x.data() + i * d, std::min(rows_a_call, n - i), c.data() + i * m);
            return c;
        };
        ProductQuantizer fresh(d, m), reused(d, m);
        fresh.set_codebooks(cb2.data());
        reused.set_codebooks(cb1.data());
        const auto with_cb1 = codes_of(reused, 1);
        reused.set_codebooks(cb2.data());
        EXPECT_NE(with_cb1, codes_of(reused, 1));
        EXPECT_EQ(codes_of(reused, 1), codes_of(fresh, n));
        EXPECT_EQ(codes_of(reused, n), codes_of(fresh, 1));
        // A copy keeps encoding with its own codebooks after the original changes.
        ProductQuantizer copy = reused;
        reused.set_codebooks(cb1.data());
        EXPECT_EQ(codes_of(copy, 1), codes_of(fresh, 1));
        EXPECT_EQ(codes_of(reused, 1), with_cb1);
        // Trained codebooks: the same codes as a quantizer given them.
        KMeansParams params;
        params.iterations = 3;
        params.seed = seed;
        const auto train = testutil::uniform_vectors(600, d, seed + 4);
        reused.train(train.data(), 600, params);
        ProductQuantizer given(d, m);
        given.set_codebooks(reused.codebooks().data());
        EXPECT_EQ(codes_of(reused, 1), codes_of(given, n));
    }
}

TEST(PQ, EncodeIsNearestCodewordAndPortablePathAgrees)
{
    const uint64_t seed = test_seed(504);
    const size_t d = 20, m = 4, dsub = 5, n = 700;
    SCOPED_TRACE(testing::Message() << "seed=" << seed << " d=" << d << " m=" << m);
    ProductQuantizer pq(d, m);
    const auto cb = testutil::uniform_vectors(m * 256, dsub, seed);
    pq.set_codebooks(cb.data());
    const auto x = testutil::uniform_vectors(n, d, seed + 1);
    std::vector<uint8_t> codes(n * m), codes2(n * m);
    pq.encode(x.data(), n, codes.data());
    {
        testutil::ScopedPortableGemm portable;
        pq.encode(x.data(), n, codes2.data());
    }
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < m; j++) {
            const float* xs = x.data() + i * d + j * dsub;
            double best = 1e30;
            for (size_t c = 0; c < 256; c++)
                best = std::min(best, testutil::l2_ref(xs, cb.data() + (j * 256 + c) * dsub, dsub));
            for (const auto* cs : {&codes, &codes2}) {
                const double got =
                    testutil::l2_ref(xs, cb.data() + (j * 256 + (*cs)[i * m + j]) * dsub, dsub);
                ASSERT_NEAR(got, best, 1e-5) << "i=" << i << " j=" << j;
            }
        }
    }
}

TEST(PQ, TablesMatchFloat64)
{
    const uint64_t seed = test_seed(505);
    for (size_t dsub : {1, 2, 3, 4, 5, 8, 16, 32}) {
        const size_t m = 3, d = m * dsub;
        SCOPED_TRACE(testing::Message() << "seed=" << seed << " m=" << m << " dsub=" << dsub);
        ProductQuantizer pq(d, m);
        const auto cb = testutil::gaussian_vectors(m * 256, dsub, seed + dsub);
        pq.set_codebooks(cb.data());
        const auto q = testutil::gaussian_vectors(1, d, seed + 100 + dsub);
        std::vector<float> l2(m * 256), ip(m * 256);
        pq.l2_table(q.data(), l2.data());
        pq.ip_table(q.data(), ip.data());
        for (size_t j = 0; j < m; j++)
            for (size_t c = 0; c < 256; c++) {
                const float* w = cb.data() + (j * 256 + c) * dsub;
                const double rl2 = testutil::l2_ref(q.data() + j * dsub, w, dsub);
                const double rip = testutil::ip_ref(q.data() + j * dsub, w, dsub);
                ASSERT_NEAR(l2[j * 256 + c], rl2, 1e-5 * (rl2 + 1)) << "j=" << j << " c=" << c;
                ASSERT_NEAR(ip[j * 256 + c], rip, 1e-5 * (std::fabs(rip) + 1))
                    << "j=" << j << " c=" << c;
            }
    }
}

TEST(PQ, AdcScanMatchesDecodedDistanceWithStrides)
{
    const uint64_t seed = test_seed(506);
    std::mt19937_64 gen(seed);
    for (size_t m : {1, 3, 4, 8, 12, 16, 24, 32, 64, 96}) {
        for (size_t extra : {0, 1, 5}) {
            const size_t dsub = 2, d = m * dsub, n = 257, stride = m + extra;
            SCOPED_TRACE(testing::Message() << "seed=" << seed << " m=" << m
                                            << " stride=" << stride << " n=" << n);
            ProductQuantizer pq(d, m);
            const auto cb = testutil::gaussian_vectors(m * 256, dsub, seed + m);
            pq.set_codebooks(cb.data());
            // Codes interleaved with junk bytes that must be ignored.
            std::vector<uint8_t> buf(n * stride);
            for (auto& b : buf)
                b = uint8_t(gen() & 255);
            const auto q = testutil::gaussian_vectors(1, d, seed + 7 * m);
            std::vector<float> table(m * 256), out(n), rec(d);
            pq.l2_table(q.data(), table.data());
            const float base = 0.75f;
            adc_scan(buf.data(), n, stride, table.data(), m, base, out.data());
            for (size_t i = 0; i < n; i++) {
                pq.decode(buf.data() + i * stride, 1, rec.data());
                const double ref = base + testutil::l2_ref(q.data(), rec.data(), d);
                ASSERT_NEAR(out[i], ref, 1e-5 * ref) << "i=" << i;
                ASSERT_NEAR(out[i], base + adc_lookup(buf.data() + i * stride, table.data(), m),
                            1e-5 * ref);
            }
        }
    }
}

// Codes scanned side by side give each code the bits it gets alone (the
// order of its sums does not depend on its neighbours or on n).
TEST(PQ, AdcScanSameBitsWhateverTheBatch)
{
    std::mt19937_64 gen(11);
    for (size_t m : {4, 8, 16, 32, 64, 12, 24, 96}) {
        for (size_t stride : {m, m + 3, size_t(560)}) {
            const size_t n = 23;
            std::vector<uint8_t> buf(n * stride);
            for (auto& b : buf)
                b = uint8_t(gen() & 255);
            std::vector<float> table(m * 256);
            std::normal_distribution<float> g(0.0f, 3.0f);
            for (auto& t : table)
                t = g(gen);
            for (size_t count = 1; count <= n; count++) {
                std::vector<float> out(count);
                adc_scan(buf.data(), count, stride, table.data(), m, 0.3f, out.data());
                for (size_t i = 0; i < count; i++) {
                    float one = 0.0f;
                    adc_scan(buf.data() + i * stride, 1, stride, table.data(), m, 0.3f, &one);
                    ASSERT_EQ(std::memcmp(&one, &out[i], sizeof(float)), 0)
                        << "m=" << m << " stride=" << stride << " count=" << count << " i=" << i;
                }
            }
        }
    }
}

TEST(PQ, AdcScanRejectsShortStride)
{
    const uint8_t codes[8] = {};
    const std::vector<float> table(8 * 256, 0.0f);
    float out[2];
    EXPECT_THROW(adc_scan(codes, 2, 4, table.data(), 8, 0.0f, out), Error);
    EXPECT_THROW(adc_scan(codes, 2, 4, table.data(), 0, 0.0f, out), Error);
}

// A sum past the float range (+inf, or NaN from inf - inf) comes out as the
// overflow mark, so that the entry still competes after every finite
// distance (and never reads as +inf padding); -inf (an inner product past
// the range: the nearest there is) stays.
TEST(PQ, AdcScanMarksOverflow)
{
    const float big = std::numeric_limits<float>::max();
    for (size_t m : {2, 4}) {  // the generic loop and a fixed-m kernel
        SCOPED_TRACE(testing::Message() << "m=" << m);
        std::vector<float> table(m * kPqCentroids, 1.0f);
        table[0] = big;                      // code 0 of every sub-quantizer: big
        table[1] = -std::numeric_limits<float>::infinity();
        for (size_t j = 1; j < m; j++) {
            table[j * kPqCentroids] = big;
            table[j * kPqCentroids + 1] = std::numeric_limits<float>::infinity();
        }
        // Codes: all 0 (overflows to +inf), all 1 (-inf + inf: NaN), all 2 (finite).
        std::vector<uint8_t> codes(3 * m);
        for (size_t j = 0; j < m; j++) {
            codes[j] = 0;
            codes[m + j] = 1;
            codes[2 * m + j] = 2;
        }
        std::vector<float> out(3);
        adc_scan(codes.data(), 3, m, table.data(), m, 0.5f, out.data());
        EXPECT_EQ(out[0], kOverflowDistance);
        EXPECT_EQ(out[1], kOverflowDistance);
        EXPECT_EQ(out[2], 0.5f + float(m));
        // -inf alone stays -inf.
        std::vector<float> neg(m * kPqCentroids, 0.0f);
        neg[0] = -std::numeric_limits<float>::infinity();
        std::vector<uint8_t> zero(m, 0);
        float one = 0;
        adc_scan(zero.data(), 1, m, neg.data(), m, 0.0f, &one);
        EXPECT_EQ(one, -std::numeric_limits<float>::infinity());
    }
    EXPECT_EQ(rank_distance(std::nanf("")), kOverflowDistance);
    EXPECT_EQ(rank_distance(std::numeric_limits<float>::infinity()), kOverflowDistance);
    EXPECT_EQ(rank_distance(3.0f), 3.0f);
}
