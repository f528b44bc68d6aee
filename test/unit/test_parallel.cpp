// parallel_for: exact coverage, inline execution, blocked signals, exceptions.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "engine/parallel.h"
#include "test_util.h"

using namespace gpuivfpq;

TEST(Parallel, CoversRangeExactlyOnce)
{
    for (size_t n : {0, 1, 2, 3, 7, 100, 1001}) {
        for (int threads : {-1, 0, 1, 2, 3, 8, 64}) {
            SCOPED_TRACE(testing::Message() << "n=" << n << " threads=" << threads);
            std::vector<std::atomic<int>> hits(n);
            std::atomic<int> calls{0};
            parallel_for(n, threads, [&](size_t b, size_t e) {
                ASSERT_LT(b, e);
                ASSERT_LE(e, n);
                calls++;
                for (size_t i = b; i < e; i++)
                    hits[i]++;
            });
            for (size_t i = 0; i < n; i++)
                ASSERT_EQ(hits[i].load(), 1) << "i=" << i;
            EXPECT_LE(calls.load(), std::max(threads, 1));
        }
    }
}

TEST(Parallel, SingleThreadRunsInline)
{
    const auto me = std::this_thread::get_id();
    int calls = 0;
    parallel_for(10, 1, [&](size_t b, size_t e) {
        EXPECT_EQ(std::this_thread::get_id(), me);
        EXPECT_EQ(b, 0u);
        EXPECT_EQ(e, 10u);
        calls++;
    });
    EXPECT_EQ(calls, 1);
}

TEST(Parallel, WorkersHaveSignalsBlockedAndCallerMaskIsRestored)
{
    sigset_t before;
    ASSERT_EQ(pthread_sigmask(SIG_SETMASK, nullptr, &before), 0);
    ASSERT_FALSE(sigismember(&before, SIGINT));
    const auto me = std::this_thread::get_id();
    std::atomic<int> workers{0}, blocked{0}, caller_blocked{0};
    parallel_for(4, 4, [&](size_t, size_t) {
        sigset_t cur;
        pthread_sigmask(SIG_SETMASK, nullptr, &cur);
        const bool all = sigismember(&cur, SIGINT) && sigismember(&cur, SIGTERM) &&
                         sigismember(&cur, SIGUSR1) && sigismember(&cur, SIGQUIT);
        if (std::this_thread::get_id() == me) {
            caller_blocked += sigismember(&cur, SIGINT);
        } else {
            workers++;
            blocked += all;
        }
    });
    EXPECT_EQ(workers.load(), 3);
    EXPECT_EQ(blocked.load(), 3);
    EXPECT_EQ(caller_blocked.load(), 0);  // caller's chunk runs with its own mask
    sigset_t after;
    ASSERT_EQ(pthread_sigmask(SIG_SETMASK, nullptr, &after), 0);
    EXPECT_FALSE(sigismember(&after, SIGINT));
}

TEST(Parallel, PropagatesExceptionsAfterAllChunksFinish)
{
    for (int thrower : {0, 1, 3}) {
        SCOPED_TRACE(testing::Message() << "throwing chunk=" << thrower);
        std::atomic<int> finished{0};
        bool caught = false;
        try {
            parallel_for(4, 4, [&](size_t b, size_t) {
                if (int(b) == thrower)
                    throw std::runtime_error("chunk failed");
                std::this_thread::sleep_for(std::chrono::milliseconds(20));
                finished++;
            });
        } catch (const std::runtime_error& e) {
            caught = std::string(e.what()) == "chunk failed";
        }
        EXPECT_TRUE(caught);
        EXPECT_EQ(finished.load(), 3);  // the others ran to completion (joined)
    }
}

TEST(Parallel, PropagatesEngineErrorKind)
{
    try {
        parallel_for(2, 2, [](size_t b, size_t) {
            if (b == 1)
                throw Error(ErrorKind::Unsupported, "nope");
        });
        FAIL() << "no exception";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
    }
}

// prefault_pages writes a zero at the start of every 4 kB page of the range
// and nothing else, on any thread count, and an empty range is a no-op.
TEST(Parallel, PrefaultTouchesEveryPageOnly)
{
    constexpr size_t kPage = 4096;
    for (int threads : {1, 3, 8}) {
        // 20 MiB and a ragged tail: more than one 8 MiB chunk.
        const size_t bytes = (size_t(20) << 20) + 1234;
        std::vector<unsigned char> buf(bytes, 0xAB);
        prefault_pages(buf.data(), bytes, threads);
        size_t zeros = 0, others = 0;
        for (size_t i = 0; i < bytes; i++) {
            if (i % kPage == 0)
                zeros += buf[i] == 0;
            else
                others += buf[i] == 0xAB;
        }
        EXPECT_EQ(zeros, (bytes + kPage - 1) / kPage) << threads;
        EXPECT_EQ(others, bytes - (bytes + kPage - 1) / kPage) << threads;
    }
    prefault_pages(nullptr, 0, 4);
    unsigned char one = 7;
    prefault_pages(&one, 0, 4);
    EXPECT_EQ(one, 7);
}
