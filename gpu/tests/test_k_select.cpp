// WarpSelect / BlockSelect against a sort: many k and n, ties, both directions.
#include <algorithm>
#include <limits>
#include <set>

#include "gpu_ivfpq/k_select.h"
#include "gpu_test_util.h"

using namespace gputest;
using gpuivfpq::gpu::k_select;
using gpuivfpq::gpu::SelectAlgo;

namespace {

// Checks one k_select run against std::sort: the values must be exactly the
// k best (selection does no arithmetic), each index must point at its value,
// indices distinct, padding (+-inf, -1) past n.
void check_select(const std::vector<float>& in, size_t rows, size_t n, size_t ld, size_t k,
                  bool largest, SelectAlgo algo, const std::string& what)
{
    SCOPED_TRACE(what);
    DeviceBuffer din = to_device(in);
    DeviceBuffer dd(ctx(), rows * k * sizeof(float)), di(ctx(), rows * k * sizeof(int32_t));
    k_select(ctx(), din.as<float>(), rows, n, ld, k, largest, dd.as<float>(), di.as<int32_t>(), algo);
    auto gd = to_host<float>(dd, rows * k);
    auto gi = to_host<int32_t>(di, rows * k);
    const float pad = largest ? -std::numeric_limits<float>::infinity()
                              : std::numeric_limits<float>::infinity();
    int bad = 0;
    for (size_t r = 0; r < rows && bad < 5; ++r) {
        std::vector<float> ref(in.begin() + r * ld, in.begin() + r * ld + n);
        if (largest)
            std::sort(ref.begin(), ref.end(), std::greater<float>());
        else
            std::sort(ref.begin(), ref.end());
        // The radix selection takes equal values in column order.
        std::vector<int32_t> cols(n);
        for (size_t c = 0; c < n; ++c)
            cols[c] = int32_t(c);
        if (algo == SelectAlgo::Radix)
            std::stable_sort(cols.begin(), cols.end(),
                             [&](int32_t a, int32_t b) {
                                 return largest ? in[r * ld + a] > in[r * ld + b] : in[r * ld + a] < in[r * ld + b];
                             });
        std::set<int32_t> seen;
        for (size_t j = 0; j < k; ++j) {
            const float g = gd[r * k + j];
            const int32_t i = gi[r * k + j];
            if (j < n && ref[j] != pad) {  // the padding value is no candidate
                if (g != ref[j] || i < 0 || size_t(i) >= n || in[r * ld + i] != g || !seen.insert(i).second ||
                    (algo == SelectAlgo::Radix && i != cols[j])) {
                    ADD_FAILURE() << "row " << r << " rank " << j << ": got (" << g << ", " << i
                                  << ") want value " << ref[j];
                    ++bad;
                    break;
                }
            } else if (g != pad || i != -1) {
                ADD_FAILURE() << "row " << r << " rank " << j << ": padding expected, got (" << g
                              << ", " << i << ")";
                ++bad;
                break;
            }
        }
    }
}

}  // namespace

TEST(KSelect, MatchesSortManyKAndN)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s0 = seed(101);
    const size_t ks[] = {1, 32, 100, 1024, 2048};
    const size_t ns[] = {1, 33, 1000, 2048, 5000, 40000};
    uint64_t s = s0;
    for (size_t k : ks)
        for (size_t n : ns)
            for (SelectAlgo algo : {SelectAlgo::Warp, SelectAlgo::Block, SelectAlgo::Radix})
                for (bool largest : {false, true}) {
                    if (algo == SelectAlgo::Radix && k > 256)
                        continue;
                    const size_t rows = 3 + (s % 5);
                    auto in = uniform(rows * n, ++s);
                    check_select(in, rows, n, n, k, largest, algo,
                                 shape("k_select", {{"k", double(k)}, {"n", double(n)}, {"rows", double(rows)},
                                                    {"algo", double(int(algo))},
                                                    {"largest", largest ? 1.0 : 0.0}},
                                       s));
                }
}

TEST(KSelect, TiesAndStride)
{
    GPU_REQUIRE_DEVICE();
    uint64_t s = seed(202);
    for (size_t k : {1, 32, 100, 1024, 2048}) {
        const size_t rows = 6, n = 9000, ld = n + 7;  // unaligned stride: scalar path
        std::mt19937_64 g(++s);
        std::vector<float> in(rows * ld, 123.0f);
        for (size_t i = 0; i < in.size(); ++i)
            in[i] = float(g() % 10);  // heavy ties
        for (SelectAlgo algo : {SelectAlgo::Warp, SelectAlgo::Block, SelectAlgo::Radix})
            if (algo != SelectAlgo::Radix || k <= 256)
                check_select(in, rows, n, ld, k, false, algo,
                             shape("ties", {{"k", double(k)}, {"n", double(n)}, {"ld", double(ld)}}, s));
    }
}

// The radix selection past one tile of shared memory: long rows (several
// tiles a chunk, a running bar), many chunks (a merge of several tiles),
// and rows mostly +inf, which is no candidate.
TEST(KSelect, RadixLongRowsAndPadding)
{
    GPU_REQUIRE_DEVICE();
    uint64_t s = seed(505);
    for (size_t n : {size_t(4095), size_t(4097), size_t(20000), size_t(300000)})
        for (size_t k : {size_t(1), size_t(100), size_t(256)}) {
            const size_t rows = 3;
            auto in = uniform(rows * n, ++s, -3.0f, 3.0f);
            // Row 1: mostly +inf (fewer candidates than k in some chunks).
            for (size_t i = 0; i < n; ++i)
                if (i % 97 != 0)
                    in[n + i] = std::numeric_limits<float>::infinity();
            // Row 2: descending, the worst order for a running bar.
            for (size_t i = 0; i < n; ++i)
                in[2 * n + i] = float(n - i) * 0.5f;
            check_select(in, rows, n, n, k, false, SelectAlgo::Radix,
                         shape("radix", {{"k", double(k)}, {"n", double(n)}}, s));
        }
}

TEST(KSelect, ManyRowsWarpPerRow)
{
    GPU_REQUIRE_DEVICE();
    const uint64_t s = seed(303);
    const size_t rows = 3000, n = 3000;
    auto in = uniform(rows * n, s, 0.0f, 1000.0f);
    for (size_t k : {10, 100})
        check_select(in, rows, n, n, k, false, SelectAlgo::Auto,
                     shape("many rows", {{"k", double(k)}, {"rows", double(rows)}}, s));
}

TEST(KSelect, RandomShapes)
{
    GPU_REQUIRE_DEVICE();
    uint64_t s = seed(404);
    std::mt19937_64 g(s);
    for (int trial = 0; trial < 12; ++trial) {
        const size_t k = 1 + g() % 2048;
        const size_t n = 1 + g() % 20000;
        const size_t rows = 1 + g() % 9;
        auto in = uniform(rows * n, s + trial, -5.0f, 5.0f);
        check_select(in, rows, n, n, k, trial % 2 == 1, trial % 3 == 0 ? SelectAlgo::Block : SelectAlgo::Auto,
                     shape("random", {{"k", double(k)}, {"n", double(n)}, {"rows", double(rows)}}, s + trial));
    }
}
