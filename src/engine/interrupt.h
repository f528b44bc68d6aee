// Stopping long engine work from outside. A host that can cancel work (a
// PostgreSQL backend: statement_timeout, pg_cancel_backend, a shutdown)
// installs a poll; the engine's long loops (builds, searches, the distance
// loops of inserts) call check_interrupt() on whatever thread runs them,
// which throws Interrupted once the poll says to stop. Every thread of a
// parallel step polls, so the step ends within a few distances and its
// caller rethrows. Without a poll (unit tests, tools, the GPU process)
// nothing is ever interrupted.
#pragma once

#include <atomic>
#include <cstddef>
#include <stdexcept>

namespace gpuivfpq {

// Whether the host wants the engine's work to stop now. Called from any
// thread, often: it must only read flags (no allocation, no locks, no call
// back into the host) and be cheap when nothing is pending.
using InterruptPoll = bool (*)();

// Installs poll for the whole process (nullptr: none) and returns the
// previous one.
InterruptPoll set_interrupt_poll(InterruptPoll poll);

// Thrown by check_interrupt. Not an Error: nothing is wrong with the input
// or the device, the host asked to stop; it acts on its own request once the
// engine's frames are gone (the backend raises its cancel or shutdown).
class Interrupted : public std::runtime_error {
public:
    Interrupted() : std::runtime_error("interrupted by a request of the host (a cancel or a shutdown)") {}
};

// Loops poll every kInterruptStride steps of one distance each (or of a
// cheaper filter): a poll per step would cost more than a short word's
// distance, and this many distances take well under a millisecond for
// words of ordinary length (a few milliseconds at kMaxWordCodePoints).
constexpr size_t kInterruptStride = 32;

namespace detail {
extern std::atomic<InterruptPoll> g_interrupt_poll;
[[noreturn]] void throw_interrupted();
}  // namespace detail

// Throws Interrupted when the installed poll says to stop.
inline void check_interrupt()
{
    const InterruptPoll poll = detail::g_interrupt_poll.load(std::memory_order_relaxed);
    if (poll != nullptr && poll())
        detail::throw_interrupted();
}

// check_interrupt() on every kInterruptStride-th step i of a loop.
inline void check_interrupt_every(size_t i)
{
    if (i % kInterruptStride == 0)
        check_interrupt();
}

}  // namespace gpuivfpq
