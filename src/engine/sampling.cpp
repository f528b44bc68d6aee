// Seeded, platform-independent randomness for subsampling and k-means seeding.
#include "sampling.h"

#include <algorithm>
#include <numeric>
#include <unordered_set>

#include "error.h"

namespace gpuivfpq {

uint64_t Rng::next()
{
    // splitmix64: tiny state, good enough mixing for sampling indices.
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

size_t Rng::below(size_t n)
{
    // Multiply-shift maps 64 random bits onto [0, n) without a division.
    __extension__ typedef unsigned __int128 u128;  // GCC/Clang, 64-bit targets
    return size_t((static_cast<u128>(next()) * n) >> 64);
}

float Rng::unit()
{
    return float(next() >> 40) * (1.0f / 16777216.0f);
}

std::vector<size_t> sample_indices(size_t n, size_t k, Rng& rng)
{
    require(k <= n, "sample_indices: cannot draw more indices than exist");
    std::vector<size_t> out;
    if (k == n) {
        out.resize(n);
        std::iota(out.begin(), out.end(), size_t(0));
        return out;
    }
    out.reserve(k);
    if (k > n / 4) {
        // Dense draw: a partial Fisher-Yates shuffle of all indices.
        std::vector<size_t> all(n);
        std::iota(all.begin(), all.end(), size_t(0));
        for (size_t i = 0; i < k; i++)
            std::swap(all[i], all[i + rng.below(n - i)]);
        out.assign(all.begin(), all.begin() + k);
    } else {
        // Sparse draw: Floyd's algorithm needs O(k) memory; the set's content
        // (not its iteration order) is all that is used, so it is deterministic.
        std::unordered_set<size_t> chosen;
        chosen.reserve(k * 2);
        for (size_t j = n - k; j < n; j++) {
            const size_t t = rng.below(j + 1);
            const size_t pick = chosen.count(t) ? j : t;
            chosen.insert(pick);
            out.push_back(pick);
        }
    }
    // Ascending order keeps the gathers that follow cache-friendly.
    std::sort(out.begin(), out.end());
    return out;
}

}  // namespace gpuivfpq
