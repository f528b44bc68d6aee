// The direct path: the segment where backends and the GPU process meet.
//
// A backend writes its search, in this format, into its own slot and sleeps
// on the slot's state word (a futex); the GPU process takes pending slots,
// batches them per index, searches, writes each answer into its slot and
// wakes its owner. No other process touches a search on its way. The
// service creates the segment (a POSIX shared memory object of its own,
// never PostgreSQL's main shared memory, which the GPU process must not
// map), hands it to each GPU process it starts, publishes the change-log
// position the mirrors include, and answers the searches of a GPU process
// that died.
//
// Two kinds of search share the slots: a scan round of a gpu_ivfpq index
// (Kind::Knn) and a batch of gpu_metric queries (Kind::Metric), small
// enough that the queries and the answer's room fit the payload (larger
// ones go through the service in a DSM segment).
//
// Layout: Header, then one state word per slot (the futex words, packed so
// that a scan for pending work reads a few cache lines), then the slots.
// Everything a reader takes from the segment is checked before use: the
// backends trust no answer (answer_sound), the GPU process no request.
//
// PostgreSQL-free: the backends (src/service/query_client.cpp), the GPU
// process (query_server.cpp), the service and the unit tests use it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpu_process/answer_dists.h"
#include "gpu_process/metric_request.h"
#include "gpu_process/mirror_store.h"

namespace gpuivfpq {
namespace queue {

constexpr uint32_t kMagic = 0x47495151;  // "GIQQ"
// Raised with every change of the layout below (the GPU process program is
// installed apart from the library that creates the segment).
constexpr uint32_t kVersion = 4;
constexpr size_t kPayload = 32 * 1024;  // a query in; labels and distances out
constexpr int kHistBuckets = 8;         // batch sizes 1, 2-3, 4-7, ..., 128+
constexpr int kQueueFd = 5;             // where the GPU process finds the segment
constexpr int kMaxServers = 8;          // threads of the GPU process that serve the queue
// The settings' ceilings (those of gpu_ivfpq.batch_size, batch_wait and
// gpu_poll): the GPU process clamps what it reads from the header to them.
constexpr uint32_t kMaxBatchSize = 4096;
constexpr uint32_t kMaxWaitUs = 100000;

// A slot's state. Transitions: the owner Free -> Pending (filled); the GPU
// process Pending -> Running -> Done; the owner Done -> Free. An owner that
// stops waiting (a cancel) takes a Pending slot back (Free) and marks a
// Running one Abandoned, which only the GPU process that holds it (or, after
// its death, the service) turns back into Free: it may still write there.
enum SlotState : uint32_t { Free = 0, Pending = 1, Running = 2, Done = 3, Abandoned = 4 };

enum class Result : int32_t {
    Ok = 0,
    NotLoaded,  // no mirror: this requester should load it
    Loading,    // another requester is loading it: use the CPU meanwhile
    NoMemory,   // the device ran out of memory
    Error,      // the search failed: error says why
    Gone,       // the GPU process died before answering
};
constexpr int32_t kResults = 6;

enum class Kind : uint32_t {
    Knn = 0,     // a gpu_ivfpq scan round: the query (d floats) in the payload
    Metric = 1,  // gpu_metric queries in the payload, laid out as metric_request.h says
};

struct SearchRequest {
    uint32_t kind = 0;  // a Kind
    // Knn: the query's dimension, k candidates, nprobe lists. Metric: k
    // nearest (0: a range search), d and nprobe 0.
    uint32_t d = 0, k = 0, nprobe = 0;
    uint32_t filtered = 0;  // rank only entries whose filter key lies in [key_lo, key_hi]
    MirrorKey key;  // Metric: with the index's change count
    int64_t key_lo = 0, key_hi = 0;
    uint64_t log_pos = 0;       // the change-log position the search must see
    uint64_t submitted_ns = 0;  // CLOCK_MONOTONIC, when it became Pending
    uint32_t owner_pid = 0;
    // Metric: nq queries of ncps code points in all, nradii radii.
    uint32_t nq = 0, nradii = 0;
    uint64_t ncps = 0;
};

struct SearchAnswer {
    int32_t result = 0;  // a Result
    uint32_t n = 0;      // labels in the payload (<= k)
    uint32_t exact = 0;  // what follows the k labels (GpuIvfpqAnswerDists): 1 exact distances, 2 lower bounds
    uint32_t batch = 0;  // searches in the batch that served it
    int64_t matched = 0; // filtered: entries of its probed lists within its range
    uint64_t taken_ns = 0, done_ns = 0;
    // Metric: the hits did not fit the payload: the bytes a request needs
    // for them (the backend asks the service, with a segment that large);
    // the mirror's live objects, the distances the search computed.
    uint64_t needed = 0, live = 0, evaluations = 0;
    char error[256] = {0};
};

// The payload. Knn: the query (d floats) in; out k labels (int64, -1 padded)
// and, when exact is not 0, their k distances (double: exact, or lower
// bounds). Metric: the request
// and its answer as metric_request.h lays them out in kPayload bytes.
struct alignas(64) Slot {
    SearchRequest req;
    SearchAnswer ans;
    // Raised by the owner when it gives up a mirror load it was told to do
    // (NotLoaded): a cancel while it read the index. The GPU process then
    // lets the next search claim the load at once (QueryServer).
    std::atomic<uint32_t> loads_given_up;
    alignas(64) char payload[kPayload];
};

// Counters the GPU process adds to (the status view reads them).
struct Stats {
    std::atomic<uint64_t> batches{0}, queries{0};
    std::atomic<uint64_t> hist[kHistBuckets];
    std::atomic<uint64_t> wait_ns{0};       // submitted -> taken, summed over searches
    std::atomic<uint64_t> catchup_ns{0};    // of which held for the change log
    std::atomic<uint64_t> catchup_searches{0};
    std::atomic<uint64_t> gpu_ns{0};        // the batches' device work
    std::atomic<uint64_t> deliver_ns{0};    // writing answers and waking their owners, per batch
    std::atomic<uint64_t> not_found{0};     // searches of an index with no mirror
    std::atomic<uint64_t> failed{0};        // searches answered with an error
};

struct alignas(64) Header {
    uint32_t magic = kMagic, version = kVersion;
    uint32_t nslots = 0;
    uint32_t reserved = 0;
    uint64_t bytes = 0;       // of the whole segment
    uint64_t generation = 0;  // the service's, so that backends see a new segment
    alignas(64) std::atomic<uint32_t> submit_seq{0};  // futex the GPU process waits on
    std::atomic<uint32_t> gpu_waiting{0};             // the GPU process sleeps: wake it
    alignas(64) std::atomic<uint64_t> applied{0};     // change-log position the mirrors include
    std::atomic<uint32_t> batch_size{256};            // settings, written by the service
    std::atomic<uint32_t> batch_wait_us{0};
    std::atomic<uint32_t> poll_us{0};                 // the GPU process polls this long before it sleeps
    std::atomic<uint32_t> servers{0};                 // batches in flight at once (0: the process decides)
    std::atomic<uint32_t> gpu_pid{0};                 // the process serving the queue, 0: none
    // Per serving thread: since when its batch runs (0: none).
    alignas(64) std::atomic<uint64_t> busy_since_ns[kMaxServers];
    alignas(64) Stats stats;
};

// A view of a mapped segment.
class Queue {
public:
    Queue() = default;
    // Bytes of a segment of nslots slots.
    static size_t bytes_for(uint32_t nslots);
    // Lays a segment out in base (bytes_for(nslots) bytes, zeroed or not).
    static Queue create(void* base, size_t bytes, uint32_t nslots, uint64_t generation);
    // A view of a segment someone else created, or an empty view (ok() false)
    // when it is not one of this version or its sizes disagree with bytes.
    static Queue attach(void* base, size_t bytes);

    bool ok() const { return h_ != nullptr; }
    Header& header() const { return *h_; }
    // The slots as the segment was created or attached with: never read
    // from the header again (another process can write there).
    uint32_t slots() const { return nslots_; }
    Slot& slot(uint32_t i) const { return slots_[i]; }
    std::atomic<uint32_t>& state(uint32_t i) const { return state_[i]; }

    // ---- a backend, on its own slot ----
    // The filled slot becomes Pending; the GPU process is woken if it sleeps.
    void submit(uint32_t i) const;
    // Waits up to timeout_ms for Done; true when it is.
    bool wait_done(uint32_t i, int timeout_ms) const;
    // Gives up a request: false when it was already Done (then release it).
    bool abandon(uint32_t i) const;
    // Done -> Free.
    void release(uint32_t i) const;
    // The load this slot was told to do is given up (no system call, no
    // allocation: safe in an error path).
    void give_up_load(uint32_t i) const { slots_[i].loads_given_up.fetch_add(1, std::memory_order_release); }
    uint32_t loads_given_up(uint32_t i) const { return slots_[i].loads_given_up.load(std::memory_order_acquire); }

    // ---- the GPU process ----
    // Marks up to limit Pending slots Running and appends them to out.
    // Returns how many it took.
    size_t take(std::vector<uint32_t>& out, size_t limit) const;
    // The answer is written: Running -> Done and its owner woken, or, when
    // the owner gave up meanwhile, Free.
    void complete(uint32_t i) const;
    // Sleeps until a submission after seen (submit_seq) or timeout_ms.
    void wait_work(uint32_t seen, int timeout_ms) const;
    // Wakes the GPU process (a submission, or the change log advanced).
    void wake_server() const;

    // ---- the service ----
    // After the GPU process died: every taken or pending search answered
    // Gone with message, abandoned ones freed, and the header's identity
    // (magic, version, sizes, generation) and the process's words (its pid,
    // sleepers, batch clocks) as a new process expects them, whatever the
    // dead one wrote there. The settings are the caller's to write again.
    // Returns how many searches it answered.
    size_t fail_all(const char* message) const;
    // Since when the GPU process owes progress (0: it owes none): the
    // oldest submission it has not taken, or the batch it runs. Searches it
    // holds for the change log do not count (the service owes those).
    uint64_t stalled_since_ns() const;

private:
    Header* h_ = nullptr;
    std::atomic<uint32_t>* state_ = nullptr;
    Slot* slots_ = nullptr;
    uint32_t nslots_ = 0;
    uint64_t bytes_ = 0, generation_ = 0;
};

// CLOCK_MONOTONIC in nanoseconds: comparable across the processes of a host.
uint64_t now_ns();

// Whether an answer read from the segment (copied out first) can be used
// for the request it answers: a known result, at most k labels, each of the
// n a TID label and no two the same, the distances (exact or lower bounds)
// after them ascending, NaN only last, a known kind of distances, a batch of
// at most nslots, a terminated message. labels and dists: the n labels and
// their distances (dists only when ans.exact says there are some); scratch:
// room for n labels.
bool answer_sound(const SearchRequest& req, const SearchAnswer& ans, const int64_t* labels, const double* dists,
                  int64_t* scratch, uint32_t nslots);

// The same for a Metric answer, before its hits are read: a known result, a
// terminated message, no Knn fields, a batch of at most nslots searches,
// and a needed size only beyond the payload (the hit offsets and ids are
// checked by replycheck's routines when read).
bool metric_answer_sound(const SearchAnswer& ans, uint32_t nslots);

}  // namespace queue
}  // namespace gpuivfpq
