// Synthetic benchmark data generated on the device (deterministic, seeded).
#pragma once

#include <cstdint>

// n x d SIFT-like vectors around nc centres (centres: nc x d scratch, same
// centre_seed gives the same centres, so base and queries share clusters).
void synth_sift_like(float* x, int64_t n, int d, float* centres, int nc, uint64_t centre_seed,
                     uint64_t seed, void* stream);

// n floats uniform in (0, 1).
void synth_uniform(float* x, int64_t n, uint64_t seed, void* stream);
