// The GPU process's side of the direct path (query_queue.h): a thread that
// takes the searches backends queue, holds each until the mirrors include
// the change-log position it carries, batches the ready ones per index,
// probe count and k, searches, and answers each in its slot.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "gpu_process/device_set.h"
#include "gpu_process/mirror_store.h"
#include "gpu_process/query_queue.h"

namespace gpuivfpq {
namespace gpuproc {

class QueryServer {
public:
    // device_mutex: held around every use of store and the devices (the
    // request loop takes it too). on_device_failed: called (on this thread)
    // when no device works any more; it does not return.
    QueryServer(queue::Queue q, MirrorStore& store, DeviceSet& devices, std::mutex& device_mutex,
                void (*on_device_failed)());
    ~QueryServer();
    QueryServer(const QueryServer&) = delete;
    QueryServer& operator=(const QueryServer&) = delete;

    // One pass: takes what is queued and serves what is ready; false when
    // nothing was ready (the loop then sleeps until woken). Public for tests.
    bool serve_once();

private:
    struct Held {
        uint32_t slot;
        uint64_t taken_ns;
    };
    void loop();
    void serve_batch(std::vector<Held>& ready);
    void answer(uint32_t slot, queue::Result result, const char* error);

    queue::Queue q_;
    MirrorStore& store_;
    DeviceSet& devices_;
    std::mutex& device_mutex_;
    void (*on_device_failed_)();
    std::vector<Held> held_;  // taken, waiting for the change log
    std::vector<uint32_t> taken_;
    // First NotFound of a key: that requester loads it; the others get
    // Loading until the claim is this old.
    std::map<MirrorKey, std::chrono::steady_clock::time_point> claims_;
    std::atomic<bool> stop_{false};
    std::thread thread_;
};

}  // namespace gpuproc
}  // namespace gpuivfpq
