// Uniform random matrices for the k-selection benchmark, filled on the device.
// (Vector data sets come from tools/gen_synthetic, as files.)
#pragma once

#include <cstdint>

// n floats uniform in (0, 1), the same for the same seed.
void fill_uniform(float* x, int64_t n, uint64_t seed, void* stream);
