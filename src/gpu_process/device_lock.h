// The GPU process's lock between searches and the changes of its mirror
// store: searches (the direct path's serving threads, the pool's batch
// searches) hold it shared and run at once on different devices; the
// request loop (loads, appends, removals, drops) holds it exclusive.
// Writers come first: once one waits, new searches wait behind it, so that
// a change-log append, which the searches queued after it wait for, is
// never starved by a stream of overlapping searches (glibc's rwlock would
// let readers in for as long as any holds it).
#pragma once

#include <condition_variable>
#include <mutex>

namespace gpuivfpq {
namespace gpuproc {

class DeviceLock {
public:
    void lock()
    {
        std::unique_lock<std::mutex> g(m_);
        writers_waiting_++;
        cv_.wait(g, [&] { return !writer_ && readers_ == 0; });
        writers_waiting_--;
        writer_ = true;
    }
    void unlock()
    {
        {
            std::lock_guard<std::mutex> g(m_);
            writer_ = false;
        }
        cv_.notify_all();
    }
    void lock_shared()
    {
        std::unique_lock<std::mutex> g(m_);
        cv_.wait(g, [&] { return !writer_ && writers_waiting_ == 0; });
        readers_++;
    }
    void unlock_shared()
    {
        bool last;
        {
            std::lock_guard<std::mutex> g(m_);
            last = --readers_ == 0;
        }
        if (last)
            cv_.notify_all();
    }

    // Writers waiting now (for tests).
    int writers_waiting()
    {
        std::lock_guard<std::mutex> g(m_);
        return writers_waiting_;
    }

private:
    std::mutex m_;
    std::condition_variable cv_;
    int readers_ = 0, writers_waiting_ = 0;
    bool writer_ = false;
};

}  // namespace gpuproc
}  // namespace gpuivfpq
