// The request loop of the GPU process: maps the exchange segment at the
// size each request states, checks every region against it and against
// the sizes the request's arguments imply, and answers every request with
// a status (device errors never end the loop, except an unusable device).
#include "gpu_process/gpu_process_server.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <new>
#include <thread>
#include <vector>

#include "engine/error.h"
#include "gpu_process/query_server.h"

namespace gpuivfpq {
namespace gpuproc {
namespace {

// Encode batches of at least this many rows are split over the devices.
constexpr uint64_t kSplitRows = 8192;

bool send_reply(int sock, const Reply& rep)
{
    ssize_t w;
    do
        w = ::send(sock, &rep, sizeof(rep), MSG_NOSIGNAL);
    while (w < 0 && errno == EINTR);
    return w == (ssize_t)sizeof(rep);
}

void set_message(Reply& rep, const char* msg)
{
    std::snprintf(rep.message, sizeof(rep.message), "%s", msg);
}

uint64_t mul(uint64_t a, uint64_t b)
{
    if (a != 0 && b > UINT64_MAX / a)
        throw Error(ErrorKind::InvalidArgument, "GPU process: a request's array size overflows");
    return a * b;
}

// The service's exchange segment, mapped at the size the last request stated,
// and page-locked where the device can (queries, vectors and answers then
// go between it and the device by DMA, without a staging copy each).
class Exchange {
public:
    Exchange(int fd, ComputeDevice& dev) : fd_(fd), dev_(dev) {}
    ~Exchange() { unmap(); }

    void map(uint64_t bytes)
    {
        if (bytes == size_)
            return;
        unmap();
        if (bytes == 0)
            return;
        struct stat st;
        if (fstat(fd_, &st) != 0 || (uint64_t)st.st_size < bytes)
            throw Error(ErrorKind::Internal, "GPU process: the exchange segment is smaller than stated");
        void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
        if (p == MAP_FAILED)
            throw Error(ErrorKind::OutOfMemory, std::string("GPU process: cannot map the exchange segment: ") +
                                                    std::strerror(errno));
        base_ = static_cast<char*>(p);
        size_ = bytes;
        pinned_ = dev_.pin_host(base_, size_);
    }

    // The region as count elements of T, after checking it lies inside.
    uint64_t size() const { return size_; }

    template <typename T>
    T* at(const Region& r, uint64_t count) const
    {
        uint64_t need = mul(count, sizeof(T));
        if (r.bytes < need || r.offset > size_ || r.bytes > size_ - r.offset || r.offset % alignof(T) != 0)
            throw Error(ErrorKind::InvalidArgument, "GPU process: a request's region lies outside the exchange");
        return reinterpret_cast<T*>(base_ + r.offset);
    }

private:
    void unmap()
    {
        if (pinned_)
            dev_.unpin_host(base_);
        pinned_ = false;
        if (base_ != nullptr)
            munmap(base_, size_);
        base_ = nullptr;
        size_ = 0;
    }
    int fd_;
    ComputeDevice& dev_;
    char* base_ = nullptr;
    uint64_t size_ = 0;
    bool pinned_ = false;
};

// The model a Load or Encode request carries; RaBitQ codes' shape checked
// (require_rabitq_spec) before their model blob is read.
MirrorSpec spec_of(const Request& q, const Exchange& x)
{
    MirrorSpec s;
    s.d = q.d;
    s.lists = q.lists;
    s.m = q.m;
    s.metric = static_cast<Metric>(q.metric);
    s.vectors = q.vectors != 0;
    s.filter_keys = q.keys != 0;
    if (q.rabitq_bits > uint64_t(kRabitqMaxBits))
        throw Error(ErrorKind::InvalidArgument,
                    "GPU process: " + std::to_string(q.rabitq_bits) + " bits per dimension of RaBitQ codes");
    s.rabitq_bits = static_cast<int>(q.rabitq_bits);
    if (s.rabitq_bits != 0)
        require_rabitq_spec(s);
    // The centroids' region bounds lists * d first: the model's size below cannot overflow.
    s.centroids = x.at<float>(q.region[0], mul(q.d, q.lists));
    if (s.rabitq_bits != 0)
        s.rabitq_model = x.at<uint8_t>(q.region[1], model_bytes(q.d, q.lists, q.rabitq_bits));
    else
        s.codebooks = x.at<float>(q.region[1], mul(kPqCentroids, q.d));
    return s;
}

// The mirror of a request's key, or null (NotFound); throws when the
// request's dimension or code size is not the mirror's, which would make the
// mirror read past the request's arrays.
Mirror* find_mirror(const Request& q, MirrorStore& store, bool check_d, Reply& rep)
{
    Mirror* mirror = store.find(q.key);
    size_t d = 0, m = 0;
    if (mirror == nullptr || !store.shape(q.key, &d, &m)) {
        rep.status = Status::NotFound;
        return nullptr;
    }
    if (check_d ? q.d != d : q.m != m)
        throw Error(ErrorKind::InvalidArgument,
                    std::string("GPU process: the request's ") + (check_d ? "dimension " : "code size ") +
                        std::to_string(check_d ? q.d : q.m) + " is not the mirror's " +
                        std::to_string(check_d ? d : m));
    return mirror;
}

// The work of a Search request, checked and bound to its mirror and
// regions (on the serving thread: the store is not shared), to run on any
// thread: it writes only its own regions and rep.value[0]. Empty when the
// process holds no whole mirror of the key (rep says NotFound).
std::function<void()> prepare_search(const Request& q, Reply& rep, MirrorStore& store, const Exchange& x)
{
    Mirror* mirror = find_mirror(q, store, true, rep);
    if (mirror == nullptr)
        return {};
    const float* queries = x.at<float>(q.region[0], mul(q.n, q.d));
    int64_t* labels = x.at<int64_t>(q.region[1], mul(q.n, q.k));
    const int64_t* key_lo = q.keys != 0 ? x.at<int64_t>(q.region[3], q.n) : nullptr;
    const int64_t* key_hi = q.keys != 0 ? x.at<int64_t>(q.region[4], q.n) : nullptr;
    int64_t* matched = q.keys != 0 ? x.at<int64_t>(q.region[5], q.n) : nullptr;
    double* exact = (q.brute != 0 || mirror->has_vectors() || mirror->lower_bounds())
                        ? x.at<double>(q.region[2], mul(q.n, q.k))
                        : nullptr;
    store.count_queries(q.key, q.n);
    uint64_t n = q.n, d = q.d, k = q.k, nprobe = q.nprobe;
    bool brute = q.brute != 0;
    return [=, &rep]() {
        if (brute) {
            // Brute force needs the vectors; a mirror without them says so
            // (value[0] 0). One call for all queries: the device gathers the
            // stored vectors once and tiles the queries itself.
            if (mirror->has_vectors()) {
                mirror->brute_force(queries, n, k, exact, labels);
                rep.value[0] = 1;
            }
        } else {
            rep.value[0] = run_search(*mirror, queries, n, d, k, nprobe, key_lo, key_hi, matched, labels, exact);
        }
    };
}

}  // namespace

GpuIvfpqAnswerDists run_search(Mirror& mirror, const float* queries, uint64_t n, uint64_t d, uint64_t k,
                               uint64_t nprobe, const int64_t* key_lo, const int64_t* key_hi, int64_t* matched,
                               int64_t* labels, double* exact)
{
    // Tiles keep the device's scratch space bounded for batch searches.
    const uint64_t tile = 4096;
    auto ranges_at = [&](uint64_t i, KeyRanges& r) -> const KeyRanges* {
        if (key_lo == nullptr)
            return nullptr;
        r.lo = key_lo + i;
        r.hi = key_hi + i;
        r.matched = matched + i;
        return &r;
    };
    if (mirror.has_vectors()) {
        // One call: the placed mirror splits the batch over its replicas
        // (or shards) and runs each share in tiles of bounded scratch.
        KeyRanges r;
        mirror.search_exact(queries, n, k, nprobe, exact, labels, ranges_at(0, r));
        return GPU_IVFPQ_DISTS_EXACT;
    }
    const bool lower = mirror.lower_bounds();
    std::vector<float> dist(mul(std::min(tile, n), k));
    for (uint64_t i = 0; i < n; i += tile) {
        uint64_t nq = std::min(tile, n - i);
        KeyRanges r;
        mirror.search(queries + i * d, nq, k, nprobe, dist.data(), labels + i * k, ranges_at(i, r));
        if (lower)
            for (uint64_t j = 0; j < nq * k; j++)
                exact[i * k + j] = double(dist[j]);
    }
    return lower ? GPU_IVFPQ_DISTS_LOWER : GPU_IVFPQ_DISTS_NONE;
}

namespace {

// Words of a request: n of them, offsets (n + 1) nondecreasing from 0 and
// within the cps code points of the code points region.
MetricWords words_of(const Exchange& x, const Region& cps_region, const Region& offsets_region, uint64_t n,
                     uint64_t cps)
{
    MetricWords w;
    w.n = n;
    w.code_points = x.at<uint32_t>(cps_region, cps);
    w.offsets = x.at<uint64_t>(offsets_region, n + 1);
    if (w.offsets[0] != 0 || w.offsets[n] > cps)
        throw Error(ErrorKind::InvalidArgument, "GPU process: a request's word offsets lie outside its code points");
    for (uint64_t i = 0; i < n; i++)
        if (w.offsets[i + 1] < w.offsets[i])
            throw Error(ErrorKind::InvalidArgument, "GPU process: a request's word offsets decrease");
    return w;
}

// A MetricLoad's index state, over the exchange's regions (checked).
MetricSpec metric_spec_of(const Request& q, const Exchange& x)
{
    MetricSpec s;
    if (q.method != static_cast<uint64_t>(MetricMethod::ListOfClusters) &&
        q.method != static_cast<uint64_t>(MetricMethod::SparseSpatialSelection))
        throw Error(ErrorKind::InvalidArgument, "GPU process: unknown metric index method");
    s.method = static_cast<MetricMethod>(q.method);
    s.words = words_of(x, q.region[0], q.region[1], q.n, q.cps);
    s.labels = x.at<int64_t>(q.region[2], q.n);
    s.removed = x.at<uint8_t>(q.region[3], q.n);
    if (s.method == MetricMethod::ListOfClusters) {
        s.bucket = q.bucket;
        s.clusters = q.clusters;
        const uint32_t* cr = x.at<uint32_t>(q.region[4], mul(2, q.clusters));
        s.centres = cr;
        s.radii = cr + q.clusters;
        s.cluster_of = x.at<uint32_t>(q.region[5], q.n);
    } else {
        s.alpha = q.alpha;
        s.max_distance = static_cast<uint32_t>(q.max_distance);
        s.pivots = q.clusters;
        s.pivot_ids = x.at<uint32_t>(q.region[4], q.clusters);
        s.table = x.at<uint8_t>(q.region[5], mul(q.n, q.clusters));
    }
    return s;
}

// A MetricSearch: range (k 0) or k-NN of the request's queries on the
// mirror of its key, the hits written when they fit the room it gave.
void metric_search(const Request& q, Reply& rep, MirrorStore& store, const Exchange& x)
{
    PlacedMetricMirror* mirror = store.find_metric(q.key);
    if (mirror == nullptr) {
        rep.status = Status::NotFound;
        return;
    }
    MetricWords queries = words_of(x, q.region[0], q.region[1], q.nq, q.cps);
    MetricHits hits;
    if (q.k == 0)
        mirror->range_batch(queries, x.at<uint32_t>(q.region[2], q.nradii), q.nradii, hits);
    else
        mirror->knn_batch(queries, q.k, hits);
    store.count_queries(q.key, q.nq);
    const uint64_t total = hits.ids.size();
    rep.value[0] = total;
    rep.value[2] = mirror->entries();
    if (total > q.n) {
        rep.value[1] = 1;
        return;
    }
    std::copy(hits.offsets.begin(), hits.offsets.end(), x.at<uint64_t>(q.region[3], q.nq + 1));
    std::copy(hits.ids.begin(), hits.ids.end(), x.at<uint32_t>(q.region[4], total));
    std::copy(hits.distances.begin(), hits.distances.end(), x.at<uint32_t>(q.region[5], total));
    std::copy(hits.labels.begin(), hits.labels.end(), x.at<int64_t>(q.region[6], total));
    uint64_t* evaluations = x.at<uint64_t>(q.region[7], q.nq);
    for (uint64_t i = 0; i < q.nq; i++)
        evaluations[i] = i < hits.evaluations.size() ? hits.evaluations[i] : 0;
}

// Splits [0, n) into one contiguous share per working device when n is at
// least `least` and there are several, and runs fn(device, first, count)
// on each at once; else on the least busy device alone.
void on_devices(DeviceSet& devices, uint64_t n, uint64_t least,
                const std::function<void(ComputeDevice&, uint64_t, uint64_t)>& fn)
{
    std::vector<size_t> alive = devices.alive_devices();
    if (alive.empty())
        throw Error(ErrorKind::Internal, "GPU process: no working device is left");
    size_t parts = n >= least ? alive.size() : 1;
    if (parts == 1)
        alive = {devices.least_busy(alive)};
    DeviceSet::in_parallel(parts, [&](size_t j) {
        uint64_t first = n * j / parts, last = n * (j + 1) / parts;
        DeviceSet::Lease lease(devices, alive[j]);
        try {
            if (last > first || parts == 1)
                fn(lease.device(), first, last - first);
        } catch (const Error& e) {
            if (e.kind() == ErrorKind::Internal)
                (void)devices.check_health(alive[j]);
            throw;
        }
    });
}

// Runs one request other than a search run by a pool thread; throws Error
// for device errors.
void handle(const Request& q, Reply& rep, DeviceSet& devices, MirrorStore& store, const Exchange& x)
{
    switch (q.op) {
    case Op::SetBudget:
        store.set_budget(q.budget);
        return;
    case Op::EnforceBudget:
        store.enforce_budget();
        return;
    case Op::Status: {
        std::vector<MirrorInfo> list = store.list();
        size_t n = std::min(list.size(), kMaxStatusMirrors);
        MirrorInfo* out = x.at<MirrorInfo>(q.region[0], n);
        std::copy(list.begin(), list.begin() + n, out);
        rep.value[0] = n;
        rep.value[1] = store.bytes();
        rep.value[2] = store.budget();
        rep.value[3] = store.evictions();
        return;
    }
    case Op::Devices: {
        std::vector<DeviceInfo> list = store.device_info();
        size_t n = std::min(list.size(), kMaxDevices);
        DeviceInfo* out = x.at<DeviceInfo>(q.region[0], n);
        std::copy(list.begin(), list.begin() + n, out);
        rep.value[0] = n;
        return;
    }
    case Op::Load: {
        MirrorSpec s = spec_of(q, x);
        if (q.placement > static_cast<uint64_t>(Placement::Shard))
            throw Error(ErrorKind::InvalidArgument, "GPU process: unknown placement");
        store.load(q.key, s, q.n, x.at<int32_t>(q.region[2], q.n), x.at<uint8_t>(q.region[3], mul(q.n, q.m)),
                   x.at<int64_t>(q.region[4], q.n), s.vectors ? x.at<float>(q.region[5], mul(q.n, q.d)) : nullptr,
                   s.filter_keys ? x.at<int64_t>(q.region[6], q.n) : nullptr, static_cast<Placement>(q.placement),
                   q.hidden != 0);
        return;
    }
    case Op::Reveal:
        if (store.find(q.key) == nullptr) {
            rep.status = Status::NotFound;
            return;
        }
        store.reveal(q.key);
        return;
    case Op::Add: {
        Mirror* mirror = find_mirror(q, store, false, rep);
        if (mirror == nullptr)
            return;
        size_t d = 0, m = 0;
        (void)store.shape(q.key, &d, &m);
        if (q.vectors != 0 && q.d != d)
            throw Error(ErrorKind::InvalidArgument, "GPU process: the request's vectors have dimension " +
                                                        std::to_string(q.d) + ", the mirror " + std::to_string(d));
        // A mirror made without vectors (they did not fit its budget) ignores them.
        const float* vectors = q.vectors != 0 && mirror->has_vectors() ? x.at<float>(q.region[5], mul(q.n, d))
                                                                       : nullptr;
        // Likewise filter keys for a mirror without them (the log carries one per entry).
        const int64_t* keys = q.keys != 0 && mirror->has_keys() ? x.at<int64_t>(q.region[6], q.n) : nullptr;
        mirror->add(q.n, x.at<int32_t>(q.region[2], q.n), x.at<uint8_t>(q.region[3], mul(q.n, q.m)),
                    x.at<int64_t>(q.region[4], q.n), vectors, keys);
        // Inserts grow mirrors: the budget holds for them as for loads (the
        // least recently used mirror goes, as on a reload of the setting).
        store.enforce_budget();
        return;
    }
    case Op::Search: {
        std::function<void()> work = prepare_search(q, rep, store, x);
        if (work)
            work();
        return;
    }
    case Op::Remove: {
        Mirror* mirror = store.find(q.key);
        if (mirror == nullptr) {
            rep.status = Status::NotFound;
            return;
        }
        rep.value[0] = mirror->remove(q.n, x.at<int64_t>(q.region[4], q.n));
        return;
    }
    case Op::MetricLoad:
        rep.value[0] = store.load_metric(q.key, metric_spec_of(q, x))->entries();
        return;
    case Op::MetricSearch:
        metric_search(q, rep, store, x);
        return;
    case Op::DropIndex:
        rep.value[0] = store.drop_index(q.key.db, q.key.index);
        return;
    case Op::DropAll:
        store.drop_all();
        return;
    case Op::Train: {
        IvfPqTrainParams params;
        params.iterations = (int)q.iterations;
        params.seed = q.seed;
        params.max_points_per_centroid = q.max_points_per_centroid;
        params.pq_max_training = q.pq_max_training;
        params.threads = (int)q.threads;
        const float* rows = x.at<float>(q.region[0], mul(q.n, q.d));
        float* centroids = x.at<float>(q.region[1], mul(q.d, q.lists));
        float* codebooks = x.at<float>(q.region[2], mul(kPqCentroids, q.d));
        // One device trains (k-means on a sample is not worth splitting).
        on_devices(devices, 1, 2, [&](ComputeDevice& dev, uint64_t, uint64_t) {
            dev.train(rows, q.n, q.d, q.lists, q.m, static_cast<Metric>(q.metric), params, centroids, codebooks);
        });
        return;
    }
    case Op::Encode: {
        MirrorSpec s = spec_of(q, x);
        const float* rows = x.at<float>(q.region[2], mul(q.n, q.d));
        int32_t* lists = x.at<int32_t>(q.region[3], q.n);
        const uint64_t code_bytes = q.m;  // RaBitQ codes: the rows (spec_of checked m)
        uint8_t* codes = x.at<uint8_t>(q.region[4], mul(q.n, code_bytes));
        // A build's batches of rows are split over the devices.
        on_devices(devices, q.n, kSplitRows, [&](ComputeDevice& dev, uint64_t first, uint64_t count) {
            dev.encode(s, rows + first * q.d, count, lists + first, codes + first * code_bytes);
        });
        return;
    }
    case Op::Exact: {
        const float* queries = x.at<float>(q.region[0], mul(q.nq, q.d));
        const float* base = x.at<float>(q.region[1], mul(q.n, q.d));
        float* dist = x.at<float>(q.region[2], mul(q.nq, q.k));
        int64_t* labels = x.at<int64_t>(q.region[3], mul(q.nq, q.k));
        // Each device takes a share of the queries against the whole base.
        on_devices(devices, q.nq, PlacedMirror::kSplitQueries,
                   [&](ComputeDevice& dev, uint64_t first, uint64_t count) {
                       dev.exact_knn(queries + first * q.d, count, base, q.n, q.d, static_cast<Metric>(q.metric),
                                     q.k, dist + first * q.k, labels + first * q.k);
                   });
        return;
    }
    }
    throw Error(ErrorKind::InvalidArgument, "GPU process: unknown request");
}

// Runs fn as one request's work: errors become the reply's status and
// message (device errors never end the loop), the time it took busy_ns.
void run_request(Reply& rep, const std::function<void()>& fn)
{
    auto start = std::chrono::steady_clock::now();
    try {
        fn();
    } catch (const Error& e) {
        rep.status = status_of(e.kind());
        set_message(rep, e.what());
    } catch (const std::bad_alloc&) {
        rep.status = Status::OutOfMemory;
        set_message(rep, "GPU process: out of host memory");
    } catch (const std::exception& e) {
        rep.status = Status::Internal;
        set_message(rep, e.what());
    } catch (...) {
        rep.status = Status::Internal;
        set_message(rep, "GPU process: an unknown exception");
    }
    rep.busy_ns = (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now() - start)
                      .count();
}

// A request answered in order: at once, or by a pool thread (a search of a
// process with several devices).
struct Job {
    Request q;
    Reply rep;
    std::function<void()> work;
    std::atomic<bool> done{false};
};

// Threads that run searches, one per device: the searches of several
// batches run at once, each on the device its mirror chooses. A finished
// job is signalled on an eventfd the serving loop polls.
class SearchPool {
public:
    explicit SearchPool(size_t threads)
    {
        efd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (efd_ < 0)
            throw Error(ErrorKind::Internal, std::string("GPU process: eventfd: ") + std::strerror(errno));
        // The pool's threads take no signals: the process's handlers run on the serving thread.
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &old);
        for (size_t i = 0; i < threads; i++)
            threads_.emplace_back([this] { loop(); });
        pthread_sigmask(SIG_SETMASK, &old, nullptr);
    }
    ~SearchPool()
    {
        {
            std::lock_guard<std::mutex> g(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        for (auto& t : threads_)
            t.join();
        close(efd_);
    }
    int fd() const { return efd_; }
    void submit(std::shared_ptr<Job> job)
    {
        {
            std::lock_guard<std::mutex> g(mu_);
            queue_.push_back(std::move(job));
        }
        cv_.notify_one();
    }
    void clear_signal()
    {
        uint64_t v;
        while (read(efd_, &v, sizeof(v)) > 0) {
        }
    }

private:
    void loop()
    {
        for (;;) {
            std::shared_ptr<Job> job;
            {
                std::unique_lock<std::mutex> g(mu_);
                cv_.wait(g, [this] { return stop_ || !queue_.empty(); });
                if (queue_.empty())
                    return;
                job = std::move(queue_.front());
                queue_.pop_front();
            }
            run_request(job->rep, job->work);
            job->done.store(true, std::memory_order_release);
            uint64_t one = 1;
            (void)!write(efd_, &one, sizeof(one));
        }
    }
    int efd_ = -1;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::shared_ptr<Job>> queue_;
    std::vector<std::thread> threads_;
    bool stop_ = false;
};

}  // namespace

void announce(int sock, const ComputeDevice* dev, Kind kind, Status status, const std::string& message)
{
    Reply rep;
    rep.seq = 0;  // the announcement, the answer to no request
    rep.status = status;
    rep.value[2] = kVersion;
    rep.value[3] = sizeof(Request);
    if (dev != nullptr) {
        rep.value[0] = dev->memory_capacity();
        rep.value[1] = static_cast<uint64_t>(kind);
    }
    set_message(rep, message.c_str());
    (void)send_reply(sock, rep);
}

void announce(int sock, const DeviceSet& devices, Kind kind)
{
    Reply rep;
    rep.seq = 0;
    rep.status = Status::Ok;
    rep.value[0] = devices.capacity();
    rep.value[1] = static_cast<uint64_t>(kind);
    rep.value[2] = kVersion;
    rep.value[3] = sizeof(Request);
    set_message(rep, devices.description().c_str());
    (void)send_reply(sock, rep);
}

int serve(int sock, int exchange_fd, ComputeDevice& dev, int queue_fd)
{
    DeviceSet one(dev);
    return serve(sock, exchange_fd, one, queue_fd);
}

namespace {

// The direct path's segment, mapped for the life of the process.
class QueueMapping {
public:
    explicit QueueMapping(int fd)
    {
        struct stat st;
        if (fd < 0 || fstat(fd, &st) != 0 || st.st_size <= 0)
            return;
        void* p = mmap(nullptr, size_t(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED)
            return;
        base_ = p;
        bytes_ = size_t(st.st_size);
        queue_ = queue::Queue::attach(base_, bytes_);
    }
    ~QueueMapping()
    {
        if (base_ != nullptr)
            munmap(base_, bytes_);
    }
    const queue::Queue& queue() const { return queue_; }

private:
    void* base_ = nullptr;
    size_t bytes_ = 0;
    queue::Queue queue_;
};

[[noreturn]] void device_failed_exit()
{
    // No device works any more: the service restarts the process and
    // answers the searches it leaves (the queue's Gone).
    _exit(kExitDeviceFailed);
}

}  // namespace

int serve(int sock, int exchange_fd, DeviceSet& devices, int queue_fd)
{
    MirrorStore store(devices);
    Exchange exchange(exchange_fd, devices.device(0));
    // Searches (the pool's and the direct path's) hold it shared, so that
    // they run at once on different devices (each device takes one call at
    // a time: DeviceSet::Lease); the request loop, which changes the store,
    // holds it exclusive.
    DeviceLock device_lock;
    QueueMapping queue_mapping(queue_fd);
    std::unique_ptr<QueryServer> queries;
    if (queue_mapping.queue().ok())
        queries = std::make_unique<QueryServer>(queue_mapping.queue(), store, devices, device_lock,
                                                device_failed_exit, queue::kMaxServers);
    // One device: every request in turn, on this thread. Several: searches
    // on the pool, answered in order (pool declared last: it ends first).
    std::unique_ptr<SearchPool> pool;
    if (devices.size() > 1)
        pool = std::make_unique<SearchPool>(devices.size());
    std::deque<std::shared_ptr<Job>> fifo;

    // Sends the finished replies at the head; with wait, all of them.
    // Returns an exit code when the loop must end, else -1.
    auto flush = [&](bool wait) -> int {
        while (!fifo.empty()) {
            Job& job = *fifo.front();
            if (!job.done.load(std::memory_order_acquire)) {
                if (!wait)
                    return -1;
                struct pollfd p = {pool->fd(), POLLIN, 0};
                (void)::poll(&p, 1, 100);
                pool->clear_signal();
                continue;
            }
            // An internal failure may have left the devices unusable (a sticky CUDA error).
            if (job.rep.status == Status::Internal && devices.alive_devices().empty())
                job.rep.status = Status::DeviceFailed;
            if (!send_reply(sock, job.rep))
                return 1;
            if (job.rep.status == Status::DeviceFailed)
                return kExitDeviceFailed;
            fifo.pop_front();
        }
        return -1;
    };

    for (;;) {
        int code = flush(false);
        if (code >= 0)
            return code;
        if (pool) {
            struct pollfd p[2] = {{sock, POLLIN, 0}, {pool->fd(), POLLIN, 0}};
            int r = ::poll(p, 2, -1);
            if (r < 0 && errno != EINTR)
                return 1;
            if (r <= 0)
                continue;
            if (p[1].revents != 0)
                pool->clear_signal();
            if (p[0].revents == 0)
                continue;
        }
        auto job = std::make_shared<Job>();
        Request& q = job->q;
        // MSG_TRUNC: the length of the message, even if longer than a Request.
        ssize_t r = ::recv(sock, &q, sizeof(q), MSG_TRUNC);
        if (r == 0)
            return 0;  // the service closed the channel
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return 1;
        }
        Reply& rep = job->rep;
        rep.seq = q.seq;
        fifo.push_back(job);
        if (r != (ssize_t)sizeof(q) || q.magic != kMagic) {
            rep.status = Status::Internal;
            set_message(rep, "GPU process: a malformed request");
            job->done = true;
            continue;
        }
        if (pool && q.op == Op::Search && q.exchange_bytes == exchange.size()) {
            // Checked and bound here, run on the pool.
            run_request(rep, [&] {
                std::unique_lock<DeviceLock> lock(device_lock);
                job->work = prepare_search(q, rep, store, exchange);
            });
            if (job->work) {
                job->work = [work = std::move(job->work), &device_lock] {
                    std::shared_lock<DeviceLock> lock(device_lock);
                    work();
                };
                pool->submit(job);
                continue;
            }
            job->done = true;
            continue;
        }
        // Any other request: the searches before it first (it may change
        // the mirrors or the exchange they use).
        fifo.pop_back();
        if ((code = flush(true)) >= 0)
            return code;
        fifo.push_back(job);
        // Under the device lock, exclusively: appends on a serving thread
        // between its batches (run_between_batches), the rest here.
        std::function<void()> work = [&] {
            store.drop_failed();
            run_request(rep, [&] {
                exchange.map(q.exchange_bytes);
                handle(q, rep, devices, store, exchange);
            });
            if (rep.status == Status::Internal)
                for (size_t i : devices.alive_devices())
                    (void)devices.check_health(i);
            // A dropped mirror's load claim goes with it (a load under way is lost).
            if (queries && (q.op == Op::DropIndex || q.op == Op::DropAll))
                queries->release_claims(q.key.db, q.op == Op::DropAll ? 0 : q.key.index);
        };
        if (!(queries && q.op == Op::Add && queries->run_between_batches(work))) {
            std::unique_lock<DeviceLock> lock(device_lock);
            work();
        }
        job->done = true;
    }
}

}  // namespace gpuproc
}  // namespace gpuivfpq
