// A minimal parallel-for for CPU-heavy engine work (builds).
#pragma once

#include <cstddef>
#include <functional>

namespace gpuivfpq {

// Runs body(begin, end) over [0, n) split into contiguous chunks on up to
// `threads` threads (the caller's thread takes one chunk). Worker threads are
// started with all signals blocked, so a host process's signal handlers
// (PostgreSQL's) only ever run on the caller's thread. The first exception
// thrown by any chunk is rethrown on the caller's thread after all join.
void parallel_for(size_t n, int threads, const std::function<void(size_t, size_t)>& body);

}  // namespace gpuivfpq
