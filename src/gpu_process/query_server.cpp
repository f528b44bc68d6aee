// The direct path's server in the GPU process: see query_server.h.
#include "gpu_process/query_server.h"

#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <tuple>

#include "engine/error.h"
#include "engine/search_limits.h"
#include "gpu_process/gpu_process_server.h"

namespace gpuivfpq {
namespace gpuproc {

namespace {

// A search that found no mirror claims its load for this long: the others
// use the CPU meanwhile, then one of them claims it again (the loader may
// have failed).
constexpr auto kLoadClaim = std::chrono::seconds(60);

// Why a request read from the segment cannot be served, or null. payload:
// the slot's (a Metric request's offsets are read from it).
const char* request_invalid(const queue::SearchRequest& r, const char* payload)
{
    if (r.kind == uint32_t(queue::Kind::Metric)) {
        MetricSearchLayout l;
        if (r.nq == 0 || r.ncps > queue::kPayload ||
            !metric_request_sound(r.nq, int64_t(r.ncps), r.nradii, r.k, payload, queue::kPayload, &l))
            return "GPU process: a malformed queued gpu_metric search";
        // k hits a query could never come back in a slot (backends ask the service for larger ones).
        if (uint64_t(r.nq) * r.k * 2 * sizeof(uint32_t) > queue::kPayload)
            return "GPU process: a queued gpu_metric search asks for more neighbours than a slot holds";
        return nullptr;
    }
    if (r.kind != uint32_t(queue::Kind::Knn))
        return "GPU process: a queued search of an unknown kind";
    if (r.d == 0 || size_t(r.d) * sizeof(float) > queue::kPayload)
        return "GPU process: a queued search has a dimension outside the payload";
    if (r.k == 0 || r.k > kMaxSelectK || 2 * sizeof(int64_t) * size_t(r.k) > queue::kPayload)
        return "GPU process: a queued search asks for too many candidates";
    if (r.nprobe == 0 || r.nprobe > kMaxSelectK)
        return "GPU process: a queued search probes too many lists";
    if (r.filtered > 1 || (r.filtered != 0 && r.key_lo > r.key_hi))
        return "GPU process: a queued search has a malformed key range";
    return nullptr;
}

// Runs fn (a group's search); an exception becomes the group's result
// (NoMemory or Error) and its message.
template <class Fn>
void guarded(Fn&& fn, queue::Result& result, std::string& error)
{
    try {
        fn();
    } catch (const Error& ex) {
        result = ex.kind() == ErrorKind::OutOfMemory ? queue::Result::NoMemory : queue::Result::Error;
        error = ex.what();
    } catch (const std::bad_alloc&) {
        result = queue::Result::NoMemory;
        error = "GPU process: out of host memory";
    } catch (const std::exception& ex) {
        result = queue::Result::Error;
        error = ex.what();
    }
}

uint64_t pipeline_lead_ns()
{
    const char* v = std::getenv("GPU_IVFPQ_PIPELINE_LEAD_US");
    return v ? uint64_t(std::clamp(std::atoi(v), 0, 1000)) * 1000 : QueryServer::kPipelineLeadNs;
}

int bucket_of(size_t n)
{
    int b = 0;
    while (b < queue::kHistBuckets - 1 && (size_t(1) << (b + 1)) <= n)
        b++;
    return b;
}

}  // namespace

QueryServer::QueryServer(queue::Queue q, MirrorStore& store, DeviceSet& devices, DeviceLock& device_lock,
                         void (*on_device_failed)(), int threads)
    : q_(q), store_(store), devices_(devices), device_lock_(device_lock), on_device_failed_(on_device_failed),
      pacer_(pipeline_lead_ns(), kPipelineMaxWaitNs)
{
    garbage_ = std::getenv("GPU_IVFPQ_TEST_GARBAGE_ANSWERS") != nullptr;

    threads = std::min(threads, queue::kMaxServers);
    if (threads <= 0)
        return;  // driven by serve_once (tests)
    // The threads take no signals: the process's handlers run on the request loop's thread.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    for (int t = 0; t < threads; t++)
        threads_.emplace_back([this, t] { loop(t); });
    int deliverers = kDeliverers;
    // Diagnostics: GPU_IVFPQ_DELIVERY_THREADS (0-16) in the server's
    // environment overrides the count; 0 delivers on the serving threads.
    if (const char* v = std::getenv("GPU_IVFPQ_DELIVERY_THREADS"))
        deliverers = std::min(16, std::max(0, std::atoi(v)));
    for (int t = 0; t < deliverers; t++)
        deliverers_.emplace_back([this] { deliver_loop(); });
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    q_.header().gpu_pid.store(uint32_t(getpid()), std::memory_order_release);
}

QueryServer::~QueryServer()
{
    stop_.store(true);
    for (size_t i = 0; i < threads_.size(); i++)
        q_.wake_server();
    for (auto& t : threads_) {
        q_.wake_server();
        t.join();
    }
    {
        std::lock_guard<std::mutex> g(deliver_mutex_);
        deliver_cv_.notify_all();
    }
    for (auto& t : deliverers_)
        t.join();
}

void QueryServer::deliver_loop()
{
    for (;;) {
        Delivery d;
        bool more = false;
        {
            std::unique_lock<std::mutex> g(deliver_mutex_);
            deliver_cv_.wait(g, [&] { return stop_.load() || !to_deliver_.empty(); });
            if (to_deliver_.empty())
                return;
            d = std::move(to_deliver_.front());
            to_deliver_.pop_front();
            more = !to_deliver_.empty();
        }
        // The serving thread woke one delivery thread: each wakes the next
        // while shares are left, so that the wake-ups cost the serving
        // thread (the GPU's feeder) one call per batch, not one per share.
        if (more)
            deliver_cv_.notify_one();
        deliver(*d.a, d.begin, d.end);
    }
}

void QueryServer::hand_over(Answers&& a)
{
    const size_t nq = a.slots.size();
    if (deliverers_.empty() || nq <= kDeliveryShare) {
        deliver(a, 0, nq);  // a hand-over would cost more than the wake-ups
        return;
    }
    const size_t shares = std::min<size_t>(deliverers_.size(), (nq + kDeliveryShare - 1) / kDeliveryShare);
    auto shared = std::make_shared<const Answers>(std::move(a));
    {
        std::lock_guard<std::mutex> g(deliver_mutex_);
        for (size_t s = 0; s < shares; s++)
            to_deliver_.push_back({shared, nq * s / shares, nq * (s + 1) / shares});
    }
    deliver_cv_.notify_one();  // the others follow from the delivery threads (deliver_loop)
}

void QueryServer::deliver(const Answers& r, size_t from, size_t to)
{
    uint64_t begin = queue::now_ns();
    size_t nq = r.slots.size(), k = r.k;
    for (size_t i = from; i < to; i++) {
        uint32_t s = r.slots[i];
        queue::Slot& slot = q_.slot(s);
        queue::SearchAnswer& a = slot.ans;
        a = queue::SearchAnswer();
        uint32_t n = 0;
        while (n < k && r.labels[i * k + n] >= 0)
            n++;
        std::memcpy(slot.payload, &r.labels[i * k], k * sizeof(int64_t));
        if (r.dists != GPU_IVFPQ_DISTS_NONE)
            std::memcpy(slot.payload + k * sizeof(int64_t), &r.exact[i * k], k * sizeof(double));
        a.result = int32_t(queue::Result::Ok);
        a.n = n;
        a.exact = uint32_t(r.dists);
        a.batch = uint32_t(nq);
        a.matched = r.filtered[i] ? r.matched[i] : 0;
        a.taken_ns = r.start;
        a.done_ns = queue::now_ns();
        if (garbage_)
            scramble(slot, uint32_t(k));
        q_.complete(s);
    }
    q_.header().stats.deliver_ns.fetch_add(queue::now_ns() - begin, std::memory_order_relaxed);
}

namespace {

inline void cpu_relax()
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}

}  // namespace

bool QueryServer::run_between_batches(const std::function<void()>& fn)
{
    if (threads_.empty())
        return false;
    Job job{&fn};
    {
        std::lock_guard<std::mutex> g(jobs_mutex_);
        jobs_.push_back(&job);
        jobs_queued_.fetch_add(1, std::memory_order_release);
    }
    q_.wake_server();  // a sleeping serving thread looks at the jobs
    std::unique_lock<std::mutex> g(jobs_mutex_);
    jobs_cv_.wait(g, [&] { return job.done; });
    if (job.error)
        std::rethrow_exception(job.error);
    return true;
}

void QueryServer::run_jobs()
{
    std::unique_lock<std::mutex> g(jobs_mutex_);
    while (!jobs_.empty()) {
        Job* job = jobs_.front();
        jobs_.pop_front();
        jobs_queued_.fetch_sub(1, std::memory_order_relaxed);
        g.unlock();
        try {
            std::unique_lock<DeviceLock> lock(device_lock_);
            (*job->fn)();
        } catch (...) {
            job->error = std::current_exception();
        }
        g.lock();
        job->done = true;
        jobs_cv_.notify_all();
    }
}

uint64_t BatchPacer::device_free(int t, size_t devices) const
{
    uint64_t ends[queue::kMaxServers];
    size_t n = 0;
    for (int u = 0; u < queue::kMaxServers; u++)
        if (u != t) {
            const uint64_t e = end_[u].load(std::memory_order_acquire);
            if (e != 0)
                ends[n++] = e;
        }
    devices = std::max<size_t>(devices, 1);
    if (n < devices)
        return 0;
    std::nth_element(ends, ends + (devices - 1), ends + n, std::greater<uint64_t>());
    return ends[devices - 1];
}

uint64_t BatchPacer::wait_ns(int t, uint64_t now, size_t devices) const
{
    const uint64_t end = device_free(t, devices);
    if (end == 0 || now + lead_ >= end)
        return 0;
    return std::min(end - lead_ - now, max_wait_);
}

void BatchPacer::begins(int t, uint64_t now, size_t devices)
{
    end_[t].store(std::max(now, device_free(t, devices)) + batch_ns(), std::memory_order_release);
}

void BatchPacer::ends(int t, uint64_t start, uint64_t end, size_t devices)
{
    end_[t].store(0, std::memory_order_release);
    if (start == 0 || end <= start)
        return;
    uint64_t before = last_end_.load(std::memory_order_acquire);
    const uint64_t prev = before;
    while (before < end && !last_end_.compare_exchange_weak(before, end, std::memory_order_acq_rel))
        ;
    // On one device a batch queued behind another starts when that one
    // ends; on several, the last end may be another device's, and the
    // call's own time is taken (a batch queued behind another there
    // counts its wait too).
    const uint64_t from = devices <= 1 ? std::max(start, std::min(prev, end)) : start;
    const uint64_t took = end - from;
    const uint64_t avg = batch_ns_.load(std::memory_order_relaxed);
    batch_ns_.store(avg == 0 ? took : (avg * 7 + took) / 8, std::memory_order_relaxed);
}

void QueryServer::pace(int t)
{
    const size_t devices = devices_.alive_count();
    const uint64_t until = queue::now_ns() + kPipelineMaxWaitNs;
    while (!stop_.load(std::memory_order_relaxed)) {
        const uint64_t now = queue::now_ns();
        const uint64_t left = now >= until ? 0 : std::min(pacer_.wait_ns(t, now, devices), until - now);
        if (left == 0)
            return;
        // Sleep most of the way (the thread's timer slack is 1 us: loop),
        // then spin; a batch that ends early clears its expected end.
        if (left > 20000)
            std::this_thread::sleep_for(std::chrono::nanoseconds(std::min<uint64_t>(left - 15000, 50000)));
        else
            cpu_relax();
    }
}

void QueryServer::loop(int t)
{
#ifdef PR_SET_TIMERSLACK
    // pace() sleeps for tens of microseconds; the default slack is 50.
    (void)prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
#endif
    uint64_t last_work = 0;
    while (!stop_.load(std::memory_order_relaxed)) {
        // seen first: a job queued after this check bumps submit_seq past
        // it (run_between_batches wakes the servers), so wait_work below
        // returns at once instead of sleeping on an unchanged word.
        uint32_t seen = q_.header().submit_seq.load(std::memory_order_acquire);
        if (jobs_queued_.load(std::memory_order_acquire) > 0)
            run_jobs();
        uint32_t servers = q_.header().servers.load(std::memory_order_relaxed);
        if (servers == 0)
            servers = uint32_t(default_servers(devices_.size()));
        if (uint32_t(t) >= servers && held_[t].empty()) {
            // Not wanted now: look at the setting again later (not on the
            // futex, whose wake-ups belong to the working threads).
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            continue;
        }
        if (serve_once(t)) {
            last_work = queue::now_ns();
            continue;
        }
        // gpu_ivfpq.gpu_poll: for a while after a batch, poll for the
        // next search instead of sleeping: a backend that finds no sleeper
        // makes no wake-up call, and the search is taken at once.
        const uint64_t poll_ns =
            uint64_t(std::min(q_.header().poll_us.load(std::memory_order_relaxed), queue::kMaxWaitUs)) * 1000;
        if (poll_ns > 0 && held_[t].empty() && queue::now_ns() - last_work < poll_ns) {
            while (!stop_.load(std::memory_order_relaxed) &&
                   q_.header().submit_seq.load(std::memory_order_acquire) == seen &&
                   queue::now_ns() - last_work < poll_ns)
                cpu_relax();
            if (q_.header().submit_seq.load(std::memory_order_acquire) != seen)
                continue;
        }
        // Searches held for the change log are woken by the service's
        // advance; the timeout is a backstop.
        q_.wait_work(seen, held_[t].empty() ? 100 : 2);
    }
}

queue::Result QueryServer::claim_or_wait(const MirrorKey& key, bool first, uint32_t slot)
{
    std::lock_guard<std::mutex> g(claims_mutex_);
    auto now = std::chrono::steady_clock::now();
    auto claim = claims_.find(key);
    if (claim != claims_.end() && now - claim->second.at < kLoadClaim &&
        q_.loads_given_up(claim->second.slot) == claim->second.given_up)
        return queue::Result::Loading;
    if (!first)
        return queue::Result::Loading;
    claims_[key] = Claim{now, slot, q_.loads_given_up(slot)};
    return queue::Result::NotLoaded;
}

void QueryServer::answer_not_loaded(const MirrorKey& key, const Item* items, size_t n)
{
    bool asked = false;
    for (size_t j = 0; j < n; j++) {
        const bool first =
            !asked && q_.state(items[j].slot).load(std::memory_order_acquire) != queue::Abandoned;
        asked |= first;
        answer(items[j].slot, claim_or_wait(key, first, items[j].slot), nullptr);
    }
}

void QueryServer::release_claims(uint32_t db, uint32_t index)
{
    std::lock_guard<std::mutex> g(claims_mutex_);
    // A claim made at `at` lapses at at + kLoadClaim: moved so that it lapses by now + retry_after_drop_.
    const auto lapse_by = std::chrono::steady_clock::now() + retry_after_drop_ - kLoadClaim;
    for (auto& c : claims_)
        if ((index == 0 || (c.first.db == db && c.first.index == index)) && c.second.at > lapse_by)
            c.second.at = lapse_by;
}

void QueryServer::answer(uint32_t slot, queue::Result result, const char* error)
{
    queue::SearchAnswer& a = q_.slot(slot).ans;
    a = queue::SearchAnswer();
    a.result = int32_t(result);
    if (error != nullptr)
        std::strncpy(a.error, error, sizeof(a.error) - 1);
    a.done_ns = queue::now_ns();
    q_.complete(slot);
}

void QueryServer::scramble(queue::Slot& slot, uint32_t k)
{
    queue::SearchAnswer& a = slot.ans;
    int64_t* labels = reinterpret_cast<int64_t*>(slot.payload);
    switch (garbage_count_.fetch_add(1) % 5) {
    case 0:
        a.result = 77;  // no result
        break;
    case 1:
        a.n = k + 1000;  // more labels than asked for (past the payload's share)
        break;
    case 2:
        labels[0] = int64_t(12345) << 16;  // offset 0: no heap TID
        a.n = std::max<uint32_t>(a.n, 1);
        break;
    case 3:
        a.exact = 9;
        a.batch = 0;
        break;
    default:
        std::memset(a.error, 'x', sizeof(a.error));  // no terminator
        a.result = int32_t(queue::Result::Error);
        break;
    }
}

void QueryServer::fail_group(const Item* items, size_t n, queue::Result result, const std::string& error)
{
    queue::Stats& st = q_.header().stats;
    for (size_t i = 0; i < n; i++)
        answer(items[i].slot, result, error.c_str());
    if (result == queue::Result::Loading)
        st.not_found.fetch_add(n, std::memory_order_relaxed);
    else
        st.failed.fetch_add(n, std::memory_order_relaxed);
    if (result == queue::Result::Error) {
        std::shared_lock<DeviceLock> lock(device_lock_);
        for (size_t dev : devices_.alive_devices()) {
            // The check waits on the device's stream: not while another
            // thread uses it (a graph capture there would fail it).
            DeviceSet::Lease lease(devices_, dev);
            (void)devices_.check_health(dev);
        }
        if (devices_.alive_devices().empty() && on_device_failed_ != nullptr)
            on_device_failed_();
    }
}

std::shared_lock<DeviceLock> QueryServer::device_for_batch(int t)
{
    q_.header().busy_since_ns[t].store(0, std::memory_order_release);
    std::shared_lock<DeviceLock> lock(device_lock_);
    q_.header().busy_since_ns[t].store(queue::now_ns(), std::memory_order_release);
    return lock;
}

void QueryServer::serve_metric(int t, const Item* items, size_t n, uint64_t start)
{
    queue::Stats& st = q_.header().stats;
    const queue::SearchRequest& r0 = items[0].req;
    const bool knn = r0.k > 0;
    // The group's queries concatenated (a range search's radius one a query).
    std::vector<uint32_t> cps;
    std::vector<uint64_t> offsets(1, 0);
    std::vector<uint32_t> radii;
    std::vector<size_t> first(n);
    MetricHits hits;
    size_t live = 0;
    bool found = false;
    queue::Result result = queue::Result::Ok;
    std::string error;
    uint64_t device_start = 0, device_end = 0;
    guarded([&] {
        for (size_t j = 0; j < n; j++) {
            const queue::SearchRequest& r = items[j].req;
            const char* base = q_.slot(items[j].slot).payload;
            const MetricSearchLayout l = metric_search_layout(r.nq, r.ncps, r.nradii);
            // Read once: the checked offsets are the copy's.
            std::vector<uint64_t> off(r.nq + 1);
            std::memcpy(off.data(), base + l.offsets, sizeof(uint64_t) * off.size());
            for (uint32_t q = 0; q < r.nq; q++)
                if (off[q + 1] < off[q] || off[q + 1] > r.ncps || off[0] != 0)
                    throw Error(ErrorKind::InvalidArgument, "GPU process: a queued gpu_metric search changed");
            const uint64_t at = cps.size();
            const uint32_t* cp = reinterpret_cast<const uint32_t*>(base + l.cps);
            const uint32_t* rad = reinterpret_cast<const uint32_t*>(base + l.radii);
            first[j] = offsets.size() - 1;
            cps.insert(cps.end(), cp, cp + off[r.nq]);
            for (uint32_t q = 0; q < r.nq; q++) {
                offsets.push_back(at + off[q + 1]);
                if (!knn)
                    radii.push_back(r.nradii == 1 ? rad[0] : rad[q]);
            }
        }
        MetricWords words;
        words.n = offsets.size() - 1;
        words.code_points = cps.data();
        words.offsets = offsets.data();
        std::shared_lock<DeviceLock> lock = device_for_batch(t);
        PlacedMetricMirror* mirror = nullptr;
        {
            std::lock_guard<std::mutex> g(store_mutex_);
            mirror = store_.find_metric(r0.key);
            if (mirror != nullptr)
                store_.count_queries(r0.key, words.n);
        }
        if (mirror != nullptr) {
            found = true;
            device_start = queue::now_ns();
            if (knn)
                mirror->knn_batch(words, r0.k, hits);
            else
                mirror->range_batch(words, radii.data(), radii.size(), hits);
            device_end = queue::now_ns();
            live = mirror->entries();
        }
    }, result, error);
    if (result != queue::Result::Ok) {
        fail_group(items, n, result, error);
        return;
    }
    if (!found) {
        answer_not_loaded(r0.key, items, n);
        st.not_found.fetch_add(n, std::memory_order_relaxed);
        return;
    }
    {
        std::lock_guard<std::mutex> cg(claims_mutex_);
        claims_.erase(r0.key);
    }
    const size_t nwords = offsets.size() - 1;
    for (size_t j = 0; j < n; j++) {
        const queue::SearchRequest& r = items[j].req;
        queue::Slot& slot = q_.slot(items[j].slot);
        queue::SearchAnswer& a = slot.ans;
        const MetricSearchLayout l = metric_search_layout(r.nq, r.ncps, r.nradii);
        a = queue::SearchAnswer();
        a.result = int32_t(queue::Result::Ok);
        a.batch = uint32_t(n);
        a.live = live;
        a.taken_ns = start;
        const uint64_t need = write_metric_answer(hits.offsets.data(), hits.ids.data(), hits.distances.data(),
                                                  hits.evaluations.data(), hits.evaluations.size(), first[j],
                                                  r.nq, slot.payload, queue::kPayload, l, &a.evaluations);
        if (need > queue::kPayload)
            a.needed = need;
        a.done_ns = queue::now_ns();
        if (garbage_)
            scramble_metric(slot);
        q_.complete(items[j].slot);
    }
    st.batches.fetch_add(1, std::memory_order_relaxed);
    st.queries.fetch_add(nwords, std::memory_order_relaxed);
    st.hist[bucket_of(nwords)].fetch_add(1, std::memory_order_relaxed);
    st.gpu_ns.fetch_add(device_end - device_start, std::memory_order_relaxed);
}

void QueryServer::scramble_metric(queue::Slot& slot)
{
    queue::SearchAnswer& a = slot.ans;
    const queue::SearchRequest& r = slot.req;
    const MetricSearchLayout l = metric_search_layout(r.nq, r.ncps, r.nradii);
    switch (garbage_count_.fetch_add(1) % 5) {
    case 0:
        a.result = 77;  // no result
        break;
    case 1:
        a.needed = 1;  // "larger than the payload", yet smaller
        break;
    case 2:
        // Hits past the room the payload leaves.
        a.needed = 0;
        reinterpret_cast<uint64_t*>(slot.payload + l.hit_offsets)[r.nq] = uint64_t(1) << 40;
        break;
    case 3:
        // An object id no index has.
        a.needed = 0;
        reinterpret_cast<uint64_t*>(slot.payload + l.hit_offsets)[r.nq] = 1;
        for (uint32_t q = 1; q < r.nq; q++)
            reinterpret_cast<uint64_t*>(slot.payload + l.hit_offsets)[q] = 0;
        reinterpret_cast<uint32_t*>(slot.payload + l.hits)[0] = 0xFFFFFFF0u;
        break;
    default:
        std::memset(a.error, 'x', sizeof(a.error));  // no terminator
        a.result = int32_t(queue::Result::Error);
        break;
    }
}

bool QueryServer::serve_once(int t)
{
    std::vector<Held>& held = held_[t];
    std::vector<uint32_t> taken;
    queue::Header& h = q_.header();
    size_t limit = std::clamp<uint32_t>(h.batch_size.load(std::memory_order_relaxed), 1,
                                        std::min(queue::kMaxBatchSize, q_.slots()));
    pace(t);
    uint64_t now = queue::now_ns();
    if (held.size() < limit)
        q_.take(taken, limit - held.size());
    for (uint32_t i : taken)
        held.push_back({i, now});
    if (held.empty())
        return false;
    uint32_t wait_us = std::min(h.batch_wait_us.load(std::memory_order_relaxed), queue::kMaxWaitUs);
    if (wait_us > 0 && held.size() < limit && !taken.empty()) {
        // gpu_ivfpq.batch_wait: a moment for more searches to join.
        std::this_thread::sleep_for(std::chrono::microseconds(wait_us));
        taken.clear();
        q_.take(taken, limit - held.size());
        now = queue::now_ns();
        for (uint32_t i : taken)
            held.push_back({i, now});
    }

    // Ready: the mirrors include the change-log position the search must see.
    uint64_t applied = h.applied.load(std::memory_order_acquire);
    std::vector<Held> ready;
    size_t kept = 0;
    for (Held& x : held) {
        if (q_.slot(x.slot).req.log_pos <= applied)
            ready.push_back(x);
        else
            held[kept++] = x;
    }
    held.resize(kept);
    if (ready.empty())
        return false;
    serve_batch(t, ready);
    return true;
}

void QueryServer::serve_batch(int t, std::vector<Held>& ready)
{
    queue::Stats& st = q_.header().stats;
    uint64_t start = queue::now_ns();
    q_.header().busy_since_ns[t].store(start, std::memory_order_release);

    std::vector<Item> items;
    items.reserve(ready.size());
    for (const Held& x : ready) {
        const queue::SearchRequest& r = q_.slot(x.slot).req;
        uint64_t submitted = r.submitted_ns;
        if (submitted != 0 && submitted <= start) {
            st.wait_ns.fetch_add(start - submitted, std::memory_order_relaxed);
            if (start - x.taken_ns > 1000 && x.taken_ns < start) {
                st.catchup_ns.fetch_add(start - x.taken_ns, std::memory_order_relaxed);
                st.catchup_searches.fetch_add(1, std::memory_order_relaxed);
            }
        }
        items.push_back({x.slot, r});
        if (const char* why = request_invalid(items.back().req, q_.slot(x.slot).payload)) {
            answer(x.slot, queue::Result::Error, why);
            st.failed.fetch_add(1, std::memory_order_relaxed);
            items.pop_back();
        }
    }
    // Groups: one kind, mirror, probe count and k each (stable: oldest first).
    std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
        return std::tie(a.req.kind, a.req.key, a.req.nprobe, a.req.k, a.req.d) <
               std::tie(b.req.kind, b.req.key, b.req.nprobe, b.req.k, b.req.d);
    });
    // gpu_metric searches (sorted last) after the scan rounds, which are quick.
    size_t metric_from = items.size();
    while (metric_from > 0 && items[metric_from - 1].req.kind == uint32_t(queue::Kind::Metric))
        metric_from--;
    std::vector<Item> metric(items.begin() + metric_from, items.end());
    items.resize(metric_from);
    std::vector<float> queries;
    std::vector<int64_t> labels, key_lo, key_hi, matched;
    std::vector<double> exact;
    for (size_t g = 0; g < items.size();) {
        size_t e = g + 1;
        while (e < items.size() && items[e].req.key == items[g].req.key &&
               items[e].req.nprobe == items[g].req.nprobe && items[e].req.k == items[g].req.k &&
               items[e].req.d == items[g].req.d)
            e++;
        const queue::SearchRequest& r0 = items[g].req;
        size_t nq = e - g, d = r0.d, k = r0.k;
        bool filtered = false;
        for (size_t i = g; i < e; i++)
            filtered |= items[i].req.filtered != 0;

        queue::Result result = queue::Result::Ok;
        std::string error;
        bool found = false;
        GpuIvfpqAnswerDists dists = GPU_IVFPQ_DISTS_NONE;
        uint64_t device_start = 0, device_end = 0;
        guarded([&] {
            queries.resize(nq * d);
            for (size_t i = 0; i < nq; i++)
                std::memcpy(&queries[i * d], q_.slot(items[g + i].slot).payload, d * sizeof(float));
            labels.assign(nq * k, -1);
            exact.assign(nq * k, 0.0);
            if (filtered) {
                // Queries without a filter take every key (NULLs too).
                key_lo.resize(nq);
                key_hi.resize(nq);
                matched.assign(nq, 0);
                for (size_t i = 0; i < nq; i++) {
                    const queue::SearchRequest& r = items[g + i].req;
                    key_lo[i] = r.filtered ? r.key_lo : INT64_MIN;
                    key_hi[i] = r.filtered ? r.key_hi : INT64_MAX;
                }
            }
            std::shared_lock<DeviceLock> lock = device_for_batch(t);
            Mirror* mirror = nullptr;
            size_t md = 0, mm = 0;
            {
                std::lock_guard<std::mutex> g(store_mutex_);
                mirror = store_.find(r0.key);
                // Loaded, not yet caught up with the changes logged meanwhile.
                if (mirror != nullptr && !store_.servable(r0.key)) {
                    mirror = nullptr;
                    result = queue::Result::Loading;
                }
                if (mirror != nullptr && store_.shape(r0.key, &md, &mm) && md == d)
                    store_.count_queries(r0.key, nq);
            }
            if (mirror != nullptr && md == d) {
                found = true;
                struct InFlight {
                    BatchPacer& p;
                    int t;
                    uint64_t& start;
                    uint64_t& end;
                    size_t devices;
                    ~InFlight() { p.ends(t, start, end, devices); }
                } in_flight{pacer_, t, device_start, device_end, devices_.alive_count()};
                pacer_.begins(t, queue::now_ns(), in_flight.devices);
                device_start = queue::now_ns();
                dists = run_search(*mirror, queries.data(), nq, d, k, r0.nprobe,
                                      filtered ? key_lo.data() : nullptr, filtered ? key_hi.data() : nullptr,
                                      filtered ? matched.data() : nullptr, labels.data(), exact.data());
                device_end = queue::now_ns();
            } else if (mirror != nullptr) {
                result = queue::Result::Error;
                error = "GPU process: a queued search's dimension is not its mirror's";
            }
        }, result, error);

        if (result != queue::Result::Ok) {
            fail_group(&items[g], nq, result, error);
        } else if (!found) {
            answer_not_loaded(r0.key, &items[g], nq);
            st.not_found.fetch_add(nq, std::memory_order_relaxed);
        } else {
            {
                std::lock_guard<std::mutex> cg(claims_mutex_);
                claims_.erase(r0.key);
            }
            Answers out;
            out.slots.reserve(nq);
            out.filtered.reserve(nq);
            for (size_t i = g; i < e; i++) {
                out.slots.push_back(items[i].slot);
                out.filtered.push_back(filtered && items[i].req.filtered ? 1 : 0);
            }
            out.labels.swap(labels);
            out.exact.swap(exact);
            if (filtered)
                out.matched.swap(matched);
            out.k = k;
            out.dists = dists;
            out.start = start;
            st.batches.fetch_add(1, std::memory_order_relaxed);
            st.queries.fetch_add(nq, std::memory_order_relaxed);
            st.hist[bucket_of(nq)].fetch_add(1, std::memory_order_relaxed);
            st.gpu_ns.fetch_add(device_end - device_start, std::memory_order_relaxed);
            hand_over(std::move(out));
        }
        g = e;
    }
    for (size_t g = 0; g < metric.size();) {
        size_t e = g + 1;
        while (e < metric.size() && metric[e].req.key == metric[g].req.key && metric[e].req.k == metric[g].req.k)
            e++;
        serve_metric(t, &metric[g], e - g, start);
        g = e;
    }
    q_.header().busy_since_ns[t].store(0, std::memory_order_release);
}

}  // namespace gpuproc
}  // namespace gpuivfpq
