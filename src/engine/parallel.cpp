// parallel_for on plain std::threads whose signals stay blocked, so a host
// process's signal handlers (PostgreSQL's) only run on the calling thread.
#include "parallel.h"

#include "internal.h"
#include "interrupt.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace gpuivfpq {

namespace detail {

namespace {
thread_local bool t_in_parallel = false;
}  // namespace

bool in_parallel_region()
{
    return t_in_parallel;
}

}  // namespace detail

namespace {

// Blocks every signal on the current thread for its lifetime, restoring the
// previous mask after: threads created meanwhile inherit the full block.
class SignalBlock {
public:
    SignalBlock()
    {
        sigset_t all;
        sigfillset(&all);
        ok_ = pthread_sigmask(SIG_SETMASK, &all, &saved_) == 0;
    }
    ~SignalBlock()
    {
        if (ok_)
            pthread_sigmask(SIG_SETMASK, &saved_, nullptr);
    }
    SignalBlock(const SignalBlock&) = delete;
    SignalBlock& operator=(const SignalBlock&) = delete;

private:
    sigset_t saved_;
    bool ok_;
};

}  // namespace

void parallel_for(size_t n, int threads, const std::function<void(size_t, size_t)>& body)
{
    if (n == 0)
        return;
    const size_t nt = std::min(n, size_t(std::max(threads, 1)));
    if (nt == 1) {
        body(0, n);
        return;
    }

    std::mutex mu;
    std::exception_ptr first;
    // Runs one chunk, keeping the first exception (in time) for the caller.
    auto run_chunk = [&](size_t c) {
        const size_t begin = n * c / nt, end = n * (c + 1) / nt;
        // Marks the chunk as concurrent (the caller's too), so GEMMs inside
        // use the thread-safe portable kernel rather than serial OpenBLAS.
        const bool saved = detail::t_in_parallel;
        detail::t_in_parallel = true;
        try {
            if (begin < end)
                body(begin, end);
        } catch (...) {
            std::lock_guard<std::mutex> lock(mu);
            if (!first)
                first = std::current_exception();
        }
        detail::t_in_parallel = saved;
    };

    std::vector<std::thread> workers;
    workers.reserve(nt - 1);
    size_t started = 0;
    {
        SignalBlock block;
        try {
            for (size_t c = 1; c < nt; c++) {
                workers.emplace_back(run_chunk, c);
                started = c;
            }
        } catch (...) {
            // Could not start a thread (resource limits): the caller's thread
            // runs the chunks left over below instead of failing the build.
        }
    }
    run_chunk(0);
    for (size_t c = started + 1; c < nt; c++)
        run_chunk(c);
    for (auto& w : workers)
        w.join();
    if (first)
        std::rethrow_exception(first);
}

void prefault_pages(void* p, size_t bytes, int threads)
{
    constexpr size_t kPage = 4096, kChunk = size_t(8) << 20;
    if (p == nullptr || bytes == 0)
        return;
    char* c = static_cast<char*>(p);
    const size_t chunks = (bytes + kChunk - 1) / kChunk;
    parallel_for(chunks, threads, [&](size_t c0, size_t c1) {
        for (size_t k = c0; k < c1; k++) {
            check_interrupt();
            const size_t end = std::min(bytes, (k + 1) * kChunk);
            for (size_t o = k * kChunk; o < end; o += kPage)
                c[o] = 0;
        }
    });
}

}  // namespace gpuivfpq
