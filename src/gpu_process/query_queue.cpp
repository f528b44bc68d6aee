// The direct path's segment: see query_queue.h.
#include "gpu_process/query_queue.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "gpu_process/reply_checks.h"

namespace gpuivfpq {
namespace queue {

namespace {

static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free,
              "the queue's atomics are shared between processes");
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "a state word is a futex word");

constexpr size_t kLine = 64;

size_t round_up(size_t n) { return (n + kLine - 1) / kLine * kLine; }
size_t states_offset() { return round_up(sizeof(Header)); }
size_t slots_offset(uint32_t nslots) { return states_offset() + round_up(sizeof(uint32_t) * nslots); }

// Shared (not process-private) futexes: the words live in a segment that
// several processes map.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int timeout_ms)
{
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
    (void)::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake(std::atomic<uint32_t>* word, int n)
{
    (void)::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, n, nullptr, nullptr, 0);
}

}  // namespace

uint64_t now_ns()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

size_t Queue::bytes_for(uint32_t nslots) { return slots_offset(nslots) + sizeof(Slot) * size_t(nslots); }

Queue Queue::create(void* base, size_t bytes, uint32_t nslots, uint64_t generation)
{
    Queue q;
    if (base == nullptr || bytes < bytes_for(nslots))
        return q;
    std::memset(base, 0, bytes_for(nslots));
    char* b = static_cast<char*>(base);
    q.h_ = new (b) Header();
    q.h_->nslots = nslots;
    q.h_->bytes = bytes;
    q.h_->generation = generation;
    q.nslots_ = nslots;
    q.bytes_ = bytes;
    q.generation_ = generation;
    q.state_ = reinterpret_cast<std::atomic<uint32_t>*>(b + states_offset());
    for (uint32_t i = 0; i < nslots; i++)
        new (&q.state_[i]) std::atomic<uint32_t>(Free);
    q.slots_ = reinterpret_cast<Slot*>(b + slots_offset(nslots));
    return q;
}

Queue Queue::attach(void* base, size_t bytes)
{
    Queue q;
    if (base == nullptr || bytes < sizeof(Header))
        return q;
    char* b = static_cast<char*>(base);
    Header* h = reinterpret_cast<Header*>(b);
    if (h->magic != kMagic || h->version != kVersion || h->nslots == 0 || h->nslots > (1u << 20) ||
        h->bytes != bytes || bytes < bytes_for(h->nslots))
        return q;
    q.h_ = h;
    q.nslots_ = h->nslots;
    q.bytes_ = bytes;
    q.generation_ = h->generation;
    q.state_ = reinterpret_cast<std::atomic<uint32_t>*>(b + states_offset());
    q.slots_ = reinterpret_cast<Slot*>(b + slots_offset(q.nslots_));
    return q;
}

void Queue::wake_server() const
{
    h_->submit_seq.fetch_add(1, std::memory_order_seq_cst);
    if (h_->gpu_waiting.load(std::memory_order_seq_cst) != 0)
        futex_wake(&h_->submit_seq, 1);
}

void Queue::submit(uint32_t i) const
{
    slots_[i].req.submitted_ns = now_ns();
    state_[i].store(Pending, std::memory_order_release);
    wake_server();
}

bool Queue::wait_done(uint32_t i, int timeout_ms) const
{
    uint32_t s = state_[i].load(std::memory_order_acquire);
    if (s == Done)
        return true;
    futex_wait(&state_[i], s, timeout_ms);
    return state_[i].load(std::memory_order_acquire) == Done;
}

bool Queue::abandon(uint32_t i) const
{
    for (;;) {
        uint32_t s = state_[i].load(std::memory_order_acquire);
        if (s == Done || s == Free || s == Abandoned)
            return s == Abandoned;
        // Not taken yet: the owner has it back at once. Taken: the GPU
        // process frees it when it completes (it writes the answer first).
        uint32_t to = s == Pending ? Free : Abandoned;
        if (state_[i].compare_exchange_weak(s, to, std::memory_order_acq_rel))
            return true;
    }
}

void Queue::release(uint32_t i) const
{
    uint32_t s = Done;
    (void)state_[i].compare_exchange_strong(s, Free, std::memory_order_acq_rel);
}

size_t Queue::take(std::vector<uint32_t>& out, size_t limit) const
{
    size_t taken = 0;
    for (uint32_t i = 0; i < nslots_ && taken < limit; i++) {
        uint32_t s = state_[i].load(std::memory_order_relaxed);
        if (s == Pending) {
            if (state_[i].compare_exchange_strong(s, Running, std::memory_order_acq_rel)) {
                out.push_back(i);
                taken++;
            }
        }
    }
    return taken;
}

void Queue::complete(uint32_t i) const
{
    uint32_t s = Running;
    if (state_[i].compare_exchange_strong(s, Done, std::memory_order_acq_rel)) {
        futex_wake(&state_[i], 1);
        return;
    }
    if (s == Abandoned)
        state_[i].store(Free, std::memory_order_release);
}

void Queue::wait_work(uint32_t seen, int timeout_ms) const
{
    // A count of sleepers, so that one waking does not hide the others.
    h_->gpu_waiting.fetch_add(1, std::memory_order_seq_cst);
    if (h_->submit_seq.load(std::memory_order_seq_cst) == seen)
        futex_wait(&h_->submit_seq, seen, timeout_ms);
    h_->gpu_waiting.fetch_sub(1, std::memory_order_seq_cst);
}

size_t Queue::fail_all(const char* message) const
{
    size_t answered = 0;
    // What the dead process may have left in the header: the identity a new
    // process and new backends check, its pid and sleepers, and the clocks
    // of the batches it was running (answered below), which would make the
    // next process look hung.
    h_->magic = kMagic;
    h_->version = kVersion;
    h_->nslots = nslots_;
    h_->bytes = bytes_;
    h_->generation = generation_;
    h_->gpu_pid.store(0, std::memory_order_relaxed);
    h_->gpu_waiting.store(0, std::memory_order_relaxed);
    for (int t = 0; t < kMaxServers; t++)
        h_->busy_since_ns[t].store(0, std::memory_order_release);
    for (uint32_t i = 0; i < nslots_; i++) {
        for (;;) {
            uint32_t s = state_[i].load(std::memory_order_acquire);
            if (s == Abandoned) {
                if (state_[i].compare_exchange_weak(s, Free, std::memory_order_acq_rel))
                    break;
                continue;
            }
            if (s != Pending && s != Running)
                break;
            // Written before the state says Done; an owner that abandons
            // meanwhile makes the exchange fail, and the loop frees it.
            SearchAnswer& a = slots_[i].ans;
            a = SearchAnswer();
            a.result = int32_t(Result::Gone);
            std::strncpy(a.error, message, sizeof(a.error) - 1);
            if (state_[i].compare_exchange_weak(s, Done, std::memory_order_acq_rel)) {
                futex_wake(&state_[i], 1);
                answered++;
                break;
            }
        }
    }
    return answered;
}

uint64_t Queue::stalled_since_ns() const
{
    uint64_t oldest = 0;
    for (int t = 0; t < kMaxServers; t++) {
        uint64_t b = h_->busy_since_ns[t].load(std::memory_order_acquire);
        if (b != 0 && (oldest == 0 || b < oldest))
            oldest = b;
    }
    for (uint32_t i = 0; i < nslots_; i++) {
        if (state_[i].load(std::memory_order_acquire) != Pending)
            continue;
        uint64_t t = slots_[i].req.submitted_ns;
        if (t != 0 && (oldest == 0 || t < oldest))
            oldest = t;
    }
    return oldest;
}

namespace {

// A known result and a terminated message.
bool result_sound(const SearchAnswer& ans)
{
    return ans.result >= 0 && ans.result < kResults && std::memchr(ans.error, 0, sizeof(ans.error)) != nullptr;
}

}  // namespace

bool answer_sound(const SearchRequest& req, const SearchAnswer& ans, const int64_t* labels, const double* dists,
                  int64_t* scratch, uint32_t nslots)
{
    if (!result_sound(ans))
        return false;
    if (ans.result != int32_t(Result::Ok))
        return true;
    if (ans.n > req.k || ans.exact > GPU_IVFPQ_DISTS_LOWER || ans.batch == 0 || ans.batch > nslots)
        return false;
    if (req.filtered == 0 && ans.matched != 0)
        return false;
    if (ans.matched < 0)
        return false;
    // The labels and the distances after them must fit the payload.
    if (sizeof(int64_t) * size_t(req.k) * (ans.exact ? 2 : 1) > kPayload)
        return false;
    if (labels == nullptr || scratch == nullptr || (ans.exact != 0 && dists == nullptr))
        return false;
    return replycheck::tid_rows_sound(labels, ans.n, scratch) &&
           (ans.exact == 0 || replycheck::ascending_sound(dists, ans.n));
}

bool metric_answer_sound(const SearchAnswer& ans, uint32_t nslots)
{
    if (!result_sound(ans))
        return false;
    if (ans.result != int32_t(Result::Ok))
        return true;
    if (ans.n != 0 || ans.exact != 0 || ans.matched != 0 || ans.batch == 0 || ans.batch > nslots)
        return false;
    return ans.needed == 0 || ans.needed > kPayload;
}

}  // namespace queue
}  // namespace gpuivfpq
