// The request loop of the GPU process: maps the exchange segment at the
// size each request states, checks every region against it and against
// the sizes the request's arguments imply, and answers every request with
// a status (device errors never end the loop, except an unusable device).
#include "service/device/gpu_process_server.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <new>
#include <vector>

#include "engine/error.h"

namespace gpuivfpq {
namespace gpuproc {
namespace {

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

MirrorSpec spec_of(const Request& q, const Exchange& x)
{
    MirrorSpec s;
    s.d = q.d;
    s.lists = q.lists;
    s.m = q.m;
    s.metric = static_cast<Metric>(q.metric);
    s.centroids = x.at<float>(q.region[0], mul(q.d, q.lists));
    s.codebooks = x.at<float>(q.region[1], mul(kPqCentroids, q.d));
    s.vectors = q.vectors != 0;
    s.filter_keys = q.keys != 0;
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

// Runs one request; throws Error for device errors.
void handle(const Request& q, Reply& rep, ComputeDevice& dev, MirrorStore& store, const Exchange& x)
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
    case Op::Load: {
        MirrorSpec s = spec_of(q, x);
        store.load(q.key, s, q.n, x.at<int32_t>(q.region[2], q.n), x.at<uint8_t>(q.region[3], mul(q.n, q.m)),
                   x.at<int64_t>(q.region[4], q.n), s.vectors ? x.at<float>(q.region[5], mul(q.n, q.d)) : nullptr,
                   s.filter_keys ? x.at<int64_t>(q.region[6], q.n) : nullptr);
        return;
    }
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
        return;
    }
    case Op::Search: {
        Mirror* mirror = find_mirror(q, store, true, rep);
        if (mirror == nullptr)
            return;
        const float* queries = x.at<float>(q.region[0], mul(q.n, q.d));
        int64_t* labels = x.at<int64_t>(q.region[1], mul(q.n, q.k));
        const int64_t* key_lo = q.keys != 0 ? x.at<int64_t>(q.region[3], q.n) : nullptr;
        const int64_t* key_hi = q.keys != 0 ? x.at<int64_t>(q.region[4], q.n) : nullptr;
        int64_t* matched = q.keys != 0 ? x.at<int64_t>(q.region[5], q.n) : nullptr;
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
        if (q.brute != 0) {
            // Brute force needs the vectors; a mirror without them says so
            // (value[0] 0). One call for all queries: the device gathers the
            // stored vectors once and tiles the queries itself.
            if (mirror->has_vectors()) {
                double* exact = x.at<double>(q.region[2], mul(q.n, q.k));
                mirror->brute_force(queries, q.n, q.k, exact, labels);
                rep.value[0] = 1;
            }
        } else if (mirror->has_vectors()) {
            double* exact = x.at<double>(q.region[2], mul(q.n, q.k));
            for (uint64_t i = 0; i < q.n; i += tile) {
                uint64_t nq = std::min(tile, q.n - i);
                KeyRanges r;
                mirror->search_exact(queries + i * q.d, nq, q.k, q.nprobe, exact + i * q.k, labels + i * q.k,
                                     ranges_at(i, r));
            }
            rep.value[0] = 1;
        } else {
            std::vector<float> dist(mul(std::min(tile, q.n), q.k));
            for (uint64_t i = 0; i < q.n; i += tile) {
                uint64_t nq = std::min(tile, q.n - i);
                KeyRanges r;
                mirror->search(queries + i * q.d, nq, q.k, q.nprobe, dist.data(), labels + i * q.k,
                               ranges_at(i, r));
            }
        }
        store.count_queries(q.key, q.n);
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
        dev.train(x.at<float>(q.region[0], mul(q.n, q.d)), q.n, q.d, q.lists, q.m, static_cast<Metric>(q.metric),
                  params, x.at<float>(q.region[1], mul(q.d, q.lists)),
                  x.at<float>(q.region[2], mul(kPqCentroids, q.d)));
        return;
    }
    case Op::Encode: {
        MirrorSpec s = spec_of(q, x);
        dev.encode(s, x.at<float>(q.region[2], mul(q.n, q.d)), q.n, x.at<int32_t>(q.region[3], q.n),
                   x.at<uint8_t>(q.region[4], mul(q.n, q.m)));
        return;
    }
    case Op::Exact:
        dev.exact_knn(x.at<float>(q.region[0], mul(q.nq, q.d)), q.nq, x.at<float>(q.region[1], mul(q.n, q.d)),
                      q.n, q.d, static_cast<Metric>(q.metric), q.k, x.at<float>(q.region[2], mul(q.nq, q.k)),
                      x.at<int64_t>(q.region[3], mul(q.nq, q.k)));
        return;
    }
    throw Error(ErrorKind::InvalidArgument, "GPU process: unknown request");
}

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

int serve(int sock, int exchange_fd, ComputeDevice& dev)
{
    MirrorStore store(dev);
    Exchange exchange(exchange_fd, dev);

    for (;;) {
        Request q;
        // MSG_TRUNC: the length of the message, even if longer than a Request.
        ssize_t r = ::recv(sock, &q, sizeof(q), MSG_TRUNC);
        if (r == 0)
            return 0;  // the service closed the channel
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return 1;
        }
        Reply rep;
        rep.seq = q.seq;
        if (r != (ssize_t)sizeof(q) || q.magic != kMagic) {
            rep.status = Status::Internal;
            set_message(rep, "GPU process: a malformed request");
        } else {
            auto start = std::chrono::steady_clock::now();
            try {
                exchange.map(q.exchange_bytes);
                handle(q, rep, dev, store, exchange);
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
            // An internal failure may have left the device unusable (a sticky CUDA error).
            if (rep.status == Status::Internal && !dev.healthy())
                rep.status = Status::DeviceFailed;
        }
        if (!send_reply(sock, rep))
            return 1;
        if (rep.status == Status::DeviceFailed)
            return kExitDeviceFailed;
    }
}

}  // namespace gpuproc
}  // namespace gpuivfpq
