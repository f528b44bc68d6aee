// The host's interrupt poll (interrupt.h): one per process.
#include "interrupt.h"

namespace gpuivfpq {

namespace detail {

std::atomic<InterruptPoll> g_interrupt_poll{nullptr};

void throw_interrupted() { throw Interrupted(); }

}  // namespace detail

InterruptPoll set_interrupt_poll(InterruptPoll poll)
{
    return detail::g_interrupt_poll.exchange(poll);
}

}  // namespace gpuivfpq
