// The GPU process's side of the direct path (query_queue.h): threads that
// take the searches backends queue, hold each until the mirrors include the
// change-log position it carries, batch the ready ones per index, probe
// count and k, search, and answer each in its slot. gpu_metric searches
// are batched per mirror (index and change count) and kind (range, or k-NN
// with one k): their queries concatenated into one call, the hits split
// back so that each gets the answer it would have got alone. Several threads keep
// several batches in flight: on several GPUs each runs on the least busy
// replica, and on one GPU one thread gathers and delivers while another's
// batch runs on the device.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>

#include "gpu_process/device_lock.h"
#include <thread>
#include <vector>

#include "gpu_process/device_set.h"
#include "gpu_process/mirror_store.h"
#include "gpu_process/query_queue.h"

namespace gpuivfpq {
namespace gpuproc {

// When serving threads take their searches so that their batches queue
// on the devices one behind the other (QueryServer::kPipelineLeadNs): each
// thread's batch in flight has an expected end, from a moving average of
// the time a batch keeps a device, counted from when the device could
// start it (its own start, or the end of the batch queued before it).
// With `devices` devices, a device is free once fewer than that many of
// the other batches are expected to run past a moment: the devices-th
// latest expected end. Thread-safe; times in ns of one clock.
class BatchPacer {
public:
    BatchPacer(uint64_t lead_ns, uint64_t max_wait_ns) : lead_(lead_ns), max_wait_(max_wait_ns) {}
    // How much longer thread t should wait at now before taking searches
    // (0: take them now): until a device is free within the lead, and
    // never more than max_wait.
    uint64_t wait_ns(int t, uint64_t now, size_t devices = 1) const;
    // Thread t's batch goes to a device at now: queued behind the batch
    // that frees one first when every device is taken.
    void begins(int t, uint64_t now, size_t devices = 1);
    // It came back: started (was handed to the device) at start, ended at
    // end; start 0 (a call that failed): no time is learnt from it.
    void ends(int t, uint64_t start, uint64_t end, size_t devices = 1);
    uint64_t batch_ns() const { return batch_ns_.load(std::memory_order_relaxed); }
    uint64_t expected_end(int t) const { return end_[t].load(std::memory_order_acquire); }

private:
    // The devices-th latest expected end of the other threads' batches
    // (0: fewer are in flight).
    uint64_t device_free(int t, size_t devices) const;
    const uint64_t lead_, max_wait_;
    std::atomic<uint64_t> end_[queue::kMaxServers] = {};
    std::atomic<uint64_t> last_end_{0};
    std::atomic<uint64_t> batch_ns_{0};
};

class QueryServer {
public:
    // device_lock: searches hold it shared, the request loop (which loads,
    // appends and removes) exclusive. on_device_failed: called (on a
    // serving thread) when no device works any more; it does not return.
    // threads: serving threads to start (0: none, for tests that drive
    // serve_once); the header's servers setting says how many of them work.
    QueryServer(queue::Queue q, MirrorStore& store, DeviceSet& devices, DeviceLock& device_lock,
                void (*on_device_failed)(), int threads);
    ~QueryServer();
    QueryServer(const QueryServer&) = delete;
    QueryServer& operator=(const QueryServer&) = delete;

    // How many threads serve when the setting says 0: one per GPU (a
    // delivery thread writes the answers, so a GPU's thread goes from one
    // batch to the next; one batch per GPU keeps batches large, and large
    // batches cost the GPU less per search).
    static int default_servers(size_t devices) { return int(std::max<size_t>(1, devices)); }

    // Several serving threads keep batches in flight one behind the other:
    // a thread whose device work is queued lets go of the device while it
    // waits (DeviceSet::Lease), and the next thread takes its searches only
    // when the batches in flight are this close to their expected end, so
    // that its batch is queued on the device just before the GPU would go
    // idle, and holds what arrived meanwhile rather than splitting the
    // queue at once into small batches (whose fixed cost per launch would
    // cost more than the idle gap saves). GPU_IVFPQ_PIPELINE_LEAD_US in
    // the server's environment overrides it (diagnostics).
    static constexpr uint64_t kPipelineLeadNs = 30000;
    // The longest a thread waits so (an estimate gone wrong costs no more).
    static constexpr uint64_t kPipelineMaxWaitNs = 2000000;

    // Delivery threads, and the fewest answers worth a share of their own.
    // Waking a backend costs a futex wake-up (3-5 us on a 16-core host), so
    // a batch of 20 delivered by one thread keeps its last owner waiting
    // ~80 us; yet four threads sharing a batch served fewer searches at 64
    // clients than one (they contend: 4.6-5.5 us a wake-up; an H200 host,
    // bench/gpu/direct_path.sh DELIVERY_AB=1), and no thread at all fewer
    // still (the serving thread then wakes every owner before the next
    // batch). A group of at most kDeliveryShare answers is delivered by
    // the serving thread itself (no hand-over).
    static constexpr int kDeliverers = 1;
    static constexpr size_t kDeliveryShare = 4;

    // Shortens the load claims of index (db, index), or of every index with
    // index 0, to retry_after_drop from now: its mirror was dropped (an
    // invalidation, or a load the service discarded because the pages
    // changed under it), so a load under way is lost and a search claims
    // the load again soon, rather than every search using the CPU for the
    // whole claim; not at once, so that a long VACUUM, which discards every
    // load beside it, does not have the index read again and again.
    void release_claims(uint32_t db, uint32_t index);
    // For tests: how soon a dropped mirror's load may be claimed again.
    void set_retry_after_drop(std::chrono::milliseconds d) { retry_after_drop_ = d; }

    // One pass of serving thread t: takes what is queued and serves what is
    // ready; false when nothing was ready (the thread then sleeps until
    // woken). Public for tests.
    bool serve_once(int t);

    // Runs fn on a serving thread between two of its batches, holding the
    // device lock exclusively, and returns once it ran: true. false when no
    // serving thread runs (tests that drive serve_once): the caller runs it
    // itself. The change log's appends come this way: the thread that
    // would start the next batch runs the append at once, where the request
    // loop taking the lock waited for the running batch and then for its own
    // wake-up, the GPU idle meanwhile (~86 us an append on a loaded 16-core
    // host). What fn throws is rethrown here.
    bool run_between_batches(const std::function<void()>& fn);

private:
    struct Held {
        uint32_t slot;
        uint64_t taken_ns;
    };
    // A search being served, with a copy of its request: the owner may
    // abandon it meanwhile, and the segment is no place to read twice.
    struct Item {
        uint32_t slot;
        queue::SearchRequest req;
    };
    void loop(int t);
    // Before thread t takes searches: waits while another thread's batch
    // is in flight and more than the lead from its expected end.
    void pace(int t);
    void serve_batch(int t, std::vector<Held>& ready);
    void serve_metric(int t, const Item* items, size_t n, uint64_t start);
    // The device for a batch of serving thread t: behind a request that
    // holds it (a mirror load, which the service times by its own, longer
    // limit) the batch is not stalled, so its clock stops while it waits
    // (its owners' own deadline still holds).
    std::shared_lock<DeviceLock> device_for_batch(int t);
    // A group that failed: each answered result; an error looks at the
    // devices' health (none left working: on_device_failed).
    void fail_group(const Item* items, size_t n, queue::Result result, const std::string& error);
    void answer(uint32_t slot, queue::Result result, const char* error);
    // A searched group's answers, for the delivery thread.
    struct Answers {
        std::vector<uint32_t> slots;
        std::vector<uint8_t> filtered;  // per search: its own key range
        std::vector<int64_t> labels, matched;
        std::vector<double> exact;
        size_t k = 0;
        GpuIvfpqAnswerDists dists = GPU_IVFPQ_DISTS_NONE;
        uint64_t start = 0;
    };
    // Answers [begin, end) of a group: a delivery thread's share.
    struct Delivery {
        std::shared_ptr<const Answers> a;
        size_t begin = 0, end = 0;
    };
    void deliver(const Answers& a, size_t begin, size_t end);
    // Written and woken by the delivery threads, in shares, while the
    // serving thread goes on to the next batch.
    void hand_over(Answers&& a);
    void deliver_loop();
    // A search of key found no mirror: NotLoaded for the first asker of a
    // batch (slot: it claims the load) unless a live claim stands, else
    // Loading. A claim lapses after kLoadClaim, or at once when its slot
    // gave the load up (Queue::give_up_load).
    queue::Result claim_or_wait(const MirrorKey& key, bool first, uint32_t slot);
    // A group with no mirror of key: each answered, the first of them whose
    // owner still waits told to load it (NotLoaded) unless another search's
    // claim holds, the others told to use the CPU (Loading). An owner that
    // gave up would never load, and its claim would keep every search of
    // the index on the CPU until it lapsed.
    void answer_not_loaded(const MirrorKey& key, const Item* items, size_t n);

    queue::Queue q_;
    MirrorStore& store_;
    DeviceSet& devices_;
    DeviceLock& device_lock_;
    void (*on_device_failed_)();
    // The store is not shared: lookups by the serving threads take turns.
    std::mutex store_mutex_;
    std::vector<Held> held_[queue::kMaxServers];  // per thread: taken, waiting for the change log
    // First NotFound of a key: that requester loads it; the others get
    // Loading until the claim is this old.
    std::mutex claims_mutex_;
    struct Claim {
        std::chrono::steady_clock::time_point at;
        uint32_t slot;
        uint32_t given_up;  // the slot's loads_given_up when it claimed
    };
    std::map<MirrorKey, Claim> claims_;
    std::chrono::milliseconds retry_after_drop_{std::chrono::seconds(5)};
    std::atomic<bool> stop_{false};
    // run_between_batches' jobs, oldest first; done under jobs_mutex_.
    struct Job {
        const std::function<void()>* fn;
        bool done = false;
        std::exception_ptr error;  // what fn threw, rethrown to the caller
    };
    std::mutex jobs_mutex_;
    std::condition_variable jobs_cv_;
    std::deque<Job*> jobs_;
    std::atomic<int> jobs_queued_{0};
    void run_jobs();
    std::vector<std::thread> threads_;
    BatchPacer pacer_{kPipelineLeadNs, kPipelineMaxWaitNs};
    // Tests only (GPU_IVFPQ_TEST_GARBAGE_ANSWERS in the environment): every
    // answer is overwritten with one of several malformed ones, so that
    // the tests see backends refuse what a misbehaving process writes.
    bool garbage_ = false;
    std::mutex deliver_mutex_;
    std::condition_variable deliver_cv_;
    std::deque<Delivery> to_deliver_;
    std::vector<std::thread> deliverers_;
    std::atomic<uint32_t> garbage_count_{0};
    void scramble(queue::Slot& slot, uint32_t k);
    void scramble_metric(queue::Slot& slot);
};

}  // namespace gpuproc
}  // namespace gpuivfpq
