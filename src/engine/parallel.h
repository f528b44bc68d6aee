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

// Writes a zero byte at p and every 4 kB after it, up to p + bytes, on up to
// `threads` threads: a buffer just allocated, about to be filled, has the
// kernel clear its pages at first touch, which on one thread costs as much
// as filling it. The contents are undefined before and after, as those of
// any fresh allocation. Polls check_interrupt.
void prefault_pages(void* p, size_t bytes, int threads);

}  // namespace gpuivfpq
