// Starting, calling and supervising the GPU process (see the header).
#include "gpu_process/gpu_process_client.h"
#include "gpu_process/query_queue.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <thread>

#include "engine/error.h"
#include "gpu_process/reply_checks.h"

extern char** environ;

namespace gpuivfpq {
namespace gpuproc {
namespace {

// The exchange keeps at least this much mapped, and gives back memory
// above it at the next call that needs less.
constexpr uint64_t kExchangeKeep = 64ull << 20;
constexpr uint64_t kExchangeStep = 1ull << 20;

uint64_t round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

std::string describe_exit(int status)
{
    if (WIFEXITED(status)) {
        switch (WEXITSTATUS(status)) {
        case kExitNoDevice:
            return "exited: no usable device";
        case kExitDeviceFailed:
            return "exited: its device failed";
        default:
            return "exited with code " + std::to_string(WEXITSTATUS(status));
        }
    }
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        const char* name = strsignal(sig);
        return "was killed by signal " + std::to_string(sig) + " (" + (name ? name : "?") + ")";
    }
    return "ended (status " + std::to_string(status) + ")";
}

// A reply's message, bounded even if the reply was not terminated.
std::string message_of(const Reply& rep) { return std::string(rep.message, strnlen(rep.message, sizeof(rep.message))); }

// Throws the device's error a reply carries (Ok and NotFound pass).
void raise_for(const Reply& rep)
{
    if (rep.status != Status::Ok && rep.status != Status::NotFound)
        throw Error(kind_of(rep.status), message_of(rep));
}

// The readers of the replies that carry more than a status: each copies
// the answer out of the exchange (the process cannot change it after the
// check), checks every count, offset and id in it against the request, and
// returns why the reply is malformed, or null when it is an answer.

uint64_t saturating_mul(uint64_t a, uint64_t b)
{
    return a != 0 && b > std::numeric_limits<uint64_t>::max() / a ? std::numeric_limits<uint64_t>::max() : a * b;
}

// A byte of a struct copied from the exchange, read as a byte (a bool
// member holding another value than 0 or 1 must not be read as a bool).
uint8_t byte_at(const void* p)
{
    uint8_t b;
    std::memcpy(&b, p, 1);
    return b;
}

// Status: value[0] mirrors listed in region 0.
const char* read_status(const Reply& rep, const char* region, StoreStatus& out)
{
    if (rep.value[0] > kMaxStatusMirrors)
        return "a Status reply lists more mirrors than the room given";
    out.mirrors.resize(rep.value[0]);
    std::memcpy(static_cast<void*>(out.mirrors.data()), region, out.mirrors.size() * sizeof(MirrorInfo));
    for (const MirrorInfo& m : out.mirrors)
        if (byte_at(&m.vectors) > 1 || byte_at(&m.filter_keys) > 1 ||
            m.placement > static_cast<uint32_t>(Placement::Shard) ||
            m.kind > static_cast<uint32_t>(MirrorKind::Metric))
            return "a Status reply lists a mirror with an unknown flag, placement or kind";
    out.bytes = rep.value[1];
    out.budget = rep.value[2];
    out.evictions = rep.value[3];
    return nullptr;
}

// Devices: value[0] devices (at least the one it announced) listed in region 0.
const char* read_devices(const Reply& rep, const char* region, std::vector<DeviceInfo>& out)
{
    if (rep.value[0] < 1 || rep.value[0] > kMaxDevices)
        return "a Devices reply lists no device, or more than the room given";
    out.resize(rep.value[0]);
    std::memcpy(static_cast<void*>(out.data()), region, out.size() * sizeof(DeviceInfo));
    for (const DeviceInfo& d : out)
        if (d.alive > 1 || std::memchr(d.description, '\0', sizeof(d.description)) == nullptr)
            return "a Devices reply lists a device with an unknown state or an unterminated description";
    return nullptr;
}

// Search (q, answered Ok and searched): nq x k labels, each -1 or a label
// check passes, and nq counts of matched entries (with key ranges), none
// negative; copied to labels, matched (or null) and exact (when the reply
// has distances).
const char* read_search(const Request& q, const Reply& rep, const char* x, GpuProcess::LabelCheck check,
                        int64_t* labels, int64_t* matched, double* exact)
{
    if (rep.value[0] > GPU_IVFPQ_DISTS_LOWER)
        return "a Search reply says its distances are of an unknown kind";
    const size_t n = q.region[1].bytes / sizeof(int64_t);
    std::memcpy(labels, x + q.region[1].offset, q.region[1].bytes);
    if (q.keys && matched != nullptr)
        std::memcpy(matched, x + q.region[5].offset, q.region[5].bytes);
    if (rep.value[0] != 0)
        std::memcpy(exact, x + q.region[2].offset, q.region[2].bytes);
    for (size_t i = 0; i < n; i++)
        if (labels[i] < -1 || (labels[i] >= 0 && check != nullptr && !check(labels[i])))
            return "a Search reply answers a label that is no mirror's";
    if (q.keys && matched != nullptr &&
        !replycheck::all_within<int64_t>(matched, q.n, 0, std::numeric_limits<int64_t>::max()))
        return "a Search reply counts a negative number of matched entries";
    return nullptr;
}

// MetricSearch (q, answered Ok) on a mirror of objects objects: value[0]
// hits, value[1] 1 when they exceed the room q.n (then out is null: nothing
// is read), value[2] live objects; else the hits, copied to out: offsets
// from 0 to value[0], each query's hits at most the live objects (k-NN: and
// k), every object id below objects. (A k-NN answer always fits: its room
// is k a query.)
const char* read_metric_hits(const Request& q, const Reply& rep, const char* x, uint64_t objects, MetricHits* out)
{
    const uint64_t total = rep.value[0], live = rep.value[2];
    const uint64_t per_query = q.k > 0 ? std::min<uint64_t>(q.k, live) : live;
    if (rep.value[1] > 1)
        return "a MetricSearch reply's flag of too little room is neither 0 nor 1";
    if (live > objects)
        return "a MetricSearch reply counts more live objects than the mirror holds";
    // Bounded so that the room asked for next cannot overflow the exchange's layout.
    if (total > saturating_mul(q.nq, per_query) || total > std::numeric_limits<uint64_t>::max() / 64)
        return "a MetricSearch reply counts more hits than its queries can have";
    if (rep.value[1] != 0)
        return total > q.n ? nullptr : "a MetricSearch reply asks for room it was given";
    if (total > q.n)
        return "a MetricSearch reply counts more hits than the room given";
    const uint64_t* offsets = reinterpret_cast<const uint64_t*>(x + q.region[3].offset);
    const uint32_t* ids = reinterpret_cast<const uint32_t*>(x + q.region[4].offset);
    const uint32_t* dists = reinterpret_cast<const uint32_t*>(x + q.region[5].offset);
    const int64_t* labels = reinterpret_cast<const int64_t*>(x + q.region[6].offset);
    const uint64_t* evaluations = reinterpret_cast<const uint64_t*>(x + q.region[7].offset);
    out->offsets.assign(offsets, offsets + q.nq + 1);
    out->ids.assign(ids, ids + total);
    out->distances.assign(dists, dists + total);
    out->labels.assign(labels, labels + total);
    out->evaluations.assign(evaluations, evaluations + q.nq);
    if (!replycheck::hit_offsets_sound(out->offsets.data(), q.nq, total) || out->offsets[q.nq] != total)
        return "a MetricSearch reply's hit offsets are not its hits";
    for (uint64_t i = 0; i < q.nq; i++)
        if (out->offsets[i + 1] - out->offsets[i] > per_query)
            return "a MetricSearch reply answers a query with more hits than it can have";
    if (!replycheck::ids_below(out->ids.data(), total, 1, objects))
        return "a MetricSearch reply answers an object id past the mirror's objects";
    return nullptr;
}

// A descriptor above the ones the process expects, close-on-exec.
int lift(int fd)
{
    int high = fcntl(fd, F_DUPFD_CLOEXEC, 10);
    int saved = errno;
    close(fd);
    errno = saved;
    return high;
}

}  // namespace

struct GpuProcess::Layout {
    uint64_t total = 0;
    Region take(uint64_t bytes)
    {
        Region r;
        r.offset = total;
        r.bytes = bytes;
        total += round_up(bytes, kAlign);
        return r;
    }
};

namespace {

// The model part of a Load or Encode request: its shape, and regions 0 and
// 1 (centroids, then codebooks or RaBitQ codes' model blob) taken from
// layout first.
template <typename Layout>
void describe_model(Request& q, Layout& l, const MirrorSpec& spec)
{
    q.d = spec.d;
    q.lists = spec.lists;
    q.m = spec.m;
    q.metric = static_cast<uint64_t>(spec.metric);
    q.rabitq_bits = static_cast<uint64_t>(spec.rabitq_bits);
    q.region[0] = l.take(centroid_bytes(spec.d, spec.lists));
    q.region[1] = l.take(model_bytes(spec.d, spec.lists, q.rabitq_bits));
}

// Copies the model into the exchange at the regions describe_model took.
void copy_model(char* x, const Request& q, const MirrorSpec& spec)
{
    std::memcpy(x + q.region[0].offset, spec.centroids, q.region[0].bytes);
    std::memcpy(x + q.region[1].offset, spec.rabitq_bits != 0 ? spec.rabitq_model : spec.codebooks,
                q.region[1].bytes);
}

}  // namespace

GpuProcess::GpuProcess(int sock, int exchange_fd, pid_t pid, StopCheck stop)
    : sock_(sock), exchange_fd_(exchange_fd), pid_(pid), stop_(stop)
{
}

GpuProcess::GpuProcess(int sock, int exchange_fd, StopCheck stop) : GpuProcess(sock, exchange_fd, 0, stop)
{
    read_announcement(30);
}

std::unique_ptr<GpuProcess> GpuProcess::start(const std::string& program, const std::string& title,
                                              bool emulate, StopCheck stop, double start_timeout_s,
                                              const std::vector<std::string>& extra, int queue_fd)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        throw StartError(false, std::string("socketpair: ") + std::strerror(errno));
    int mine = lift(sv[0]), theirs = lift(sv[1]);
    int mfd = memfd_create("gpu_ivfpq exchange", MFD_CLOEXEC);
    if (mfd >= 0)
        mfd = lift(mfd);
    if (mine < 0 || theirs < 0 || mfd < 0) {
        std::string err = std::strerror(errno);
        for (int fd : {mine, theirs, mfd})
            if (fd >= 0)
                close(fd);
        throw StartError(false, "cannot create the GPU process's channel: " + err);
    }

    // The process gets the channel on fds 3 and 4, default signal handling,
    // no blocked signals, and a session of its own: the postmaster signals
    // its children's process groups (a reload's SIGHUP would kill it).
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    sigdelset(&all, SIGKILL);
    sigdelset(&all, SIGSTOP);
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, theirs, kSocketFd);
    posix_spawn_file_actions_adddup2(&fa, mfd, kExchangeFd);
    if (queue_fd >= 0)
        posix_spawn_file_actions_adddup2(&fa, queue_fd, queue::kQueueFd);
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSID);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &all);
    std::string parent = std::to_string(getpid());
    std::vector<const char*> argv = {title.c_str(), emulate ? "--emulate" : "--cuda", "--parent", parent.c_str()};
    for (const std::string& a : extra)
        argv.push_back(a.c_str());
    argv.push_back(nullptr);
    pid_t pid = 0;
    int rc = posix_spawn(&pid, program.c_str(), &fa, &attr, const_cast<char* const*>(argv.data()), environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    close(theirs);
    if (rc != 0) {
        close(mine);
        close(mfd);
        // A missing program is an installation without the GPU process: no device.
        throw StartError(rc == ENOENT, "cannot start the GPU process " + program + ": " + std::strerror(rc));
    }
    std::unique_ptr<GpuProcess> p(new GpuProcess(mine, mfd, pid, stop));
    p->read_announcement(start_timeout_s);
    return p;
}

GpuProcess::~GpuProcess()
{
    if (sock_ >= 0)
        close(sock_);  // the process sees the channel close and exits
    if (pid_ > 0)
        (void)reap(false);
    if (base_ != nullptr)
        munmap(base_, size_);
    if (exchange_fd_ >= 0)
        close(exchange_fd_);
}

void GpuProcess::read_announcement(double timeout_s)
{
    Reply rep;
    try {
        (void)wait_reply(rep, 0, timeout_s);
    } catch (const Error& e) {
        throw StartError(false, e.what());
    }
    if (rep.value[2] != kVersion || rep.value[3] != sizeof(Request)) {
        alive_ = false;
        std::string why = "gpu_ivfpq_gpu_process is from another build than the loaded extension (protocol " +
                          std::to_string(rep.value[2]) + ", expected " + std::to_string(kVersion) +
                          "): restart the server after installing";
        cause_ = why + (pid_ > 0 ? " (the process " + reap(true) + ")" : "");
        throw StartError(true, why);
    }
    if (rep.status != Status::Ok) {
        alive_ = false;
        std::string why = message_of(rep);
        cause_ = why + (pid_ > 0 ? " (the process " + reap(false) + ")" : "");
        throw StartError(rep.status == Status::Unsupported, why);
    }
    if (rep.value[1] != static_cast<uint64_t>(Kind::Gpu) && rep.value[1] != static_cast<uint64_t>(Kind::Emulated)) {
        alive_ = false;
        std::string why = "the GPU process sent a malformed announcement: an unknown device kind";
        cause_ = why + (pid_ > 0 ? " (the process " + reap(true) + ")" : "");
        throw StartError(false, why);
    }
    capacity_ = rep.value[0];
    kind_ = static_cast<Kind>(rep.value[1]);
    description_ = message_of(rep);
}

std::string GpuProcess::reap(bool kill_it)
{
    if (pid_ <= 0)
        return "closed its channel";
    if (kill_it)
        (void)::kill(pid_, SIGKILL);
    // Give it a moment to exit on its own (it reports, then exits).
    for (int i = 0; i < 500; i++) {
        int st = 0;
        pid_t r = waitpid(pid_, &st, WNOHANG);
        if (r > 0 || (r < 0 && errno == ECHILD)) {
            pid_ = 0;
            return r > 0 ? describe_exit(st) : "ended";
        }
        if (i == 200 && !kill_it) {
            (void)::kill(pid_, SIGKILL);
            kill_it = true;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    pid_ = 0;  // unkillable (stuck in the driver): forget it
    return "did not exit after SIGKILL";
}

[[noreturn]] void GpuProcess::lost(const std::string& what, bool kill_it)
{
    alive_ = false;
    bool had_process = pid_ > 0;
    std::string how = reap(kill_it);
    if (what.empty())
        cause_ = how;
    else if (kill_it)
        cause_ = what + (had_process ? " and was killed" : "");
    else
        cause_ = what + " (" + how + ")";
    throw Error(ErrorKind::Internal, "the GPU process " + cause_);
}

void GpuProcess::check_reply(const char* why)
{
    if (why != nullptr)
        lost(std::string("sent a malformed reply (") + why + ")", true);
}

void GpuProcess::kill_hung(const std::string& what)
{
    if (!alive_)
        return;
    alive_ = false;
    bool had_process = pid_ > 0;
    (void)reap(true);
    cause_ = what + (had_process ? " and was killed" : "");
}

bool GpuProcess::check_exit()
{
    if (!alive_)
        return true;
    if (pid_ <= 0)
        return false;
    int st = 0;
    pid_t r = waitpid(pid_, &st, WNOHANG);
    if (r == 0)
        return false;
    alive_ = false;
    pid_ = 0;
    cause_ = r > 0 ? describe_exit(st) : "ended";
    return true;
}

bool GpuProcess::wait_reply(Reply& rep, uint64_t seq, double timeout_s)
{
    auto start = std::chrono::steady_clock::now();
    for (;;) {
        struct pollfd p = {sock_, POLLIN, 0};
        int r = ::poll(&p, 1, 100);
        if (r < 0 && errno != EINTR)
            lost("channel failed: " + std::string(std::strerror(errno)), true);
        if (r > 0) {
            // MSG_TRUNC: the message's own length, so that an oversized one is caught.
            ssize_t n = ::recv(sock_, &rep, sizeof(rep), MSG_TRUNC);
            if (n < 0 && errno == EINTR)
                continue;
            if (n == 0 || (n < 0 && errno == ECONNRESET))
                lost("", false);  // it died: its exit status is the cause
            if (n < 0)
                lost("channel failed: " + std::string(std::strerror(errno)), true);
            if (n != (ssize_t)sizeof(rep) || rep.seq != seq)
                lost("sent a malformed reply", true);
            return true;
        }
        if (stop_ != nullptr && stop_())
            lost("was stopped with the service", true);
        double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (timeout_s > 0 && waited > timeout_s) {
            char secs[32];
            std::snprintf(secs, sizeof(secs), "%g", timeout_s);
            lost(std::string("did not answer within ") + secs + " s", true);
        }
    }
}

void GpuProcess::send(Request& q)
{
    if (!alive_)
        throw Error(ErrorKind::Internal, "the GPU process " + cause_);
    q.seq = ++seq_;
    q.exchange_bytes = size_;
    ssize_t w;
    do
        w = ::send(sock_, &q, sizeof(q), MSG_NOSIGNAL);
    while (w < 0 && errno == EINTR);
    if (w != (ssize_t)sizeof(q))
        lost("", false);
}

Reply GpuProcess::receive(const Request& q, bool bulk)
{
    Reply rep;
    (void)wait_reply(rep, q.seq, bulk ? timeout_s_ * bulk_factor_ : timeout_s_);
    last_busy_ns_ = rep.busy_ns;
    if (static_cast<uint32_t>(rep.status) > static_cast<uint32_t>(Status::DeviceFailed))
        check_reply("an unknown status");
    if (rep.status == Status::DeviceFailed)
        lost("reported that its device failed: " + message_of(rep), false);
    return rep;
}

Reply GpuProcess::call(Request& q, bool bulk)
{
    // A reply to a search in flight would come first: the caller receives it.
    if (inflight_ > 0)
        throw Error(ErrorKind::Internal, "GPU process: a call while a search is in flight");
    send(q);
    return receive(q, bulk);
}

char* GpuProcess::exchange(const Layout& layout)
{
    // Resizing or writing it would pull the memory from under a search the
    // process may be reading.
    if (inflight_ > 0)
        throw Error(ErrorKind::Internal, "GPU process: a call while a search is in flight");
    // A dead process: fail before sizing and filling the exchange for nothing.
    if (!alive_)
        throw Error(ErrorKind::Internal, "the GPU process " + cause_);
    uint64_t want = round_up(std::max<uint64_t>(layout.total, 1), kExchangeStep);
    // Grow to fit; give back what a large call took once calls are small again.
    if (want > size_ || (size_ > kExchangeKeep && want < size_)) {
        uint64_t target = want > size_ ? want : std::max(want, kExchangeKeep);
        if (ftruncate(exchange_fd_, (off_t)target) != 0)
            throw Error(ErrorKind::OutOfMemory, std::string("cannot size the GPU exchange: ") + std::strerror(errno));
        // Reserve the pages now: short of memory, a clean error here rather
        // than the out-of-memory killer choosing this process at the copy.
        if (target > size_) {
            int rc = posix_fallocate(exchange_fd_, (off_t)size_, (off_t)(target - size_));
            if (rc != 0) {
                if (ftruncate(exchange_fd_, (off_t)size_) != 0) {
                    // Still larger than mapped: harmless, the next growth resizes it.
                }
                throw Error(ErrorKind::OutOfMemory,
                            std::string("cannot reserve the GPU exchange: ") + std::strerror(rc));
            }
        }
        if (base_ != nullptr)
            munmap(base_, size_);
        base_ = nullptr;
        size_ = 0;
        void* p = mmap(nullptr, target, PROT_READ | PROT_WRITE, MAP_SHARED, exchange_fd_, 0);
        if (p == MAP_FAILED)
            throw Error(ErrorKind::OutOfMemory, std::string("cannot map the GPU exchange: ") + std::strerror(errno));
        base_ = static_cast<char*>(p);
        size_ = target;
    }
    return base_;
}

void GpuProcess::set_budget(size_t bytes)
{
    Request q;
    q.op = Op::SetBudget;
    q.budget = bytes;
    raise_for(call(q));
}

void GpuProcess::enforce_budget()
{
    Request q;
    q.op = Op::EnforceBudget;
    raise_for(call(q));
}

StoreStatus GpuProcess::status()
{
    Request q;
    Layout l;
    q.op = Op::Status;
    q.region[0] = l.take(kMaxStatusMirrors * sizeof(MirrorInfo));
    char* x = exchange(l);
    Reply rep = call(q);
    raise_for(rep);
    StoreStatus s;
    check_reply(read_status(rep, x + q.region[0].offset, s));
    return s;
}

std::vector<DeviceInfo> GpuProcess::devices()
{
    Request q;
    Layout l;
    q.op = Op::Devices;
    q.region[0] = l.take(kMaxDevices * sizeof(DeviceInfo));
    char* x = exchange(l);
    Reply rep = call(q);
    raise_for(rep);
    std::vector<DeviceInfo> devs;
    check_reply(read_devices(rep, x + q.region[0].offset, devs));
    return devs;
}

void GpuProcess::load(const MirrorKey& key, const MirrorSpec& spec, size_t n, const int32_t* list_ids,
                      const uint8_t* codes, const int64_t* labels, const float* vectors,
                      const int64_t* keys, Placement placement, bool hidden)
{
    if ((spec.vectors && vectors == nullptr) || (spec.filter_keys && keys == nullptr))
        throw Error(ErrorKind::InvalidArgument, "GPU process load: the spec's vectors or filter keys are missing");
    if (spec.rabitq_bits != 0)
        require_rabitq_spec(spec);
    Request q;
    Layout l;
    q.op = Op::Load;
    q.key = key;
    q.n = n;
    q.placement = static_cast<uint64_t>(placement);
    q.hidden = hidden ? 1 : 0;
    q.vectors = spec.vectors ? 1 : 0;
    q.keys = spec.filter_keys ? 1 : 0;
    describe_model(q, l, spec);
    q.region[2] = l.take(n * sizeof(int32_t));
    q.region[3] = l.take(n * spec.m);
    q.region[4] = l.take(n * sizeof(int64_t));
    if (spec.vectors)
        q.region[5] = l.take(n * spec.d * sizeof(float));
    if (spec.filter_keys)
        q.region[6] = l.take(n * sizeof(int64_t));
    char* x = exchange(l);
    copy_model(x, q, spec);
    std::memcpy(x + q.region[2].offset, list_ids, q.region[2].bytes);
    std::memcpy(x + q.region[3].offset, codes, q.region[3].bytes);
    std::memcpy(x + q.region[4].offset, labels, q.region[4].bytes);
    if (spec.vectors)
        std::memcpy(x + q.region[5].offset, vectors, q.region[5].bytes);
    if (spec.filter_keys)
        std::memcpy(x + q.region[6].offset, keys, q.region[6].bytes);
    raise_for(call(q, true));
}

bool GpuProcess::add(const MirrorKey& key, size_t m, size_t n, const int32_t* list_ids, const uint8_t* codes,
                     const int64_t* labels, const float* vectors, size_t d, const int64_t* keys)
{
    Request q;
    Layout l;
    q.op = Op::Add;
    q.key = key;
    q.m = m;
    q.n = n;
    q.vectors = vectors != nullptr ? 1 : 0;
    q.d = vectors != nullptr ? d : 0;
    q.keys = keys != nullptr ? 1 : 0;
    q.region[2] = l.take(n * sizeof(int32_t));
    q.region[3] = l.take(n * m);
    q.region[4] = l.take(n * sizeof(int64_t));
    if (vectors != nullptr)
        q.region[5] = l.take(n * d * sizeof(float));
    if (keys != nullptr)
        q.region[6] = l.take(n * sizeof(int64_t));
    char* x = exchange(l);
    std::memcpy(x + q.region[2].offset, list_ids, q.region[2].bytes);
    std::memcpy(x + q.region[3].offset, codes, q.region[3].bytes);
    std::memcpy(x + q.region[4].offset, labels, q.region[4].bytes);
    if (vectors != nullptr)
        std::memcpy(x + q.region[5].offset, vectors, q.region[5].bytes);
    if (keys != nullptr)
        std::memcpy(x + q.region[6].offset, keys, q.region[6].bytes);
    Reply rep = call(q);
    raise_for(rep);
    return rep.status == Status::Ok;
}

bool GpuProcess::search(const MirrorKey& key, size_t d, const float* queries, size_t nq, size_t k,
                        size_t nprobe, const int64_t* key_lo, const int64_t* key_hi, int64_t* matched,
                        int64_t* labels, double* exact, GpuIvfpqAnswerDists* dists, bool brute)
{
    if (inflight_ > 0)
        throw Error(ErrorKind::Internal, "GPU process: a call while a search is in flight");
    SearchCall c;
    (void)send_search(c, key, d, queries, nq, k, nprobe, key_lo, key_hi, brute);  // fits: nothing in flight
    return receive_search(c, matched, labels, exact, dists);
}

bool GpuProcess::send_search(SearchCall& c, const MirrorKey& key, size_t d, const float* queries, size_t nq,
                             size_t k, size_t nprobe, const int64_t* key_lo, const int64_t* key_hi, bool brute)
{
    if (inflight_ >= kMaxSearchesInFlight || (c.open && inflight_ > 0))
        throw Error(ErrorKind::Internal, "GPU process: more searches in flight than the exchange has parts");
    c.open = false;  // left open by a caller that gave its searches up (nothing is in flight)
    Request& q = c.q;
    q = Request();
    Layout l;
    q.op = Op::Search;
    q.key = key;
    q.d = d;
    q.n = nq;
    q.k = k;
    q.nprobe = nprobe;
    q.brute = brute ? 1 : 0;
    q.region[0] = l.take(nq * d * sizeof(float));
    q.region[1] = l.take(nq * k * sizeof(int64_t));
    q.region[2] = l.take(nq * k * sizeof(double));
    if ((key_lo == nullptr) != (key_hi == nullptr))
        throw Error(ErrorKind::InvalidArgument, "GPU process search: a key range needs both bounds");
    q.keys = key_lo != nullptr ? 1 : 0;
    if (q.keys) {
        q.region[3] = l.take(nq * sizeof(int64_t));
        q.region[4] = l.take(nq * sizeof(int64_t));
        q.region[5] = l.take(nq * sizeof(int64_t));
    }
    // Parts, so that more searches can be written while the process reads
    // the first (and, with several GPUs, runs them at once). The exchange
    // is sized (grown, or given back as for any call) only with nothing in
    // flight, since the process maps it at the size each request states:
    // room for a part per search in flight up to the size the exchange
    // keeps anyway, beyond it room for this one alone (it spills over all).
    const uint64_t parts = kMaxSearchesInFlight;
    int part = 0;
    if (inflight_ == 0) {
        const uint64_t one = round_up(l.total, kExchangeStep);
        Layout want;
        want.total = parts * one <= kExchangeKeep ? parts * one : one;
        (void)exchange(want);
        c.spill = l.total > size_ / parts;
    } else {
        while (part < int(parts) && part_busy_[part])
            part++;
        if (part == int(parts) || l.total > size_ / parts)
            return false;
        c.spill = false;
    }
    // size_ is a multiple of kExchangeStep: each part starts aligned.
    const uint64_t base = static_cast<uint64_t>(part) * (size_ / parts);
    for (Region& r : q.region)
        if (r.bytes != 0)
            r.offset += base;
    char* x = base_;
    std::memcpy(x + q.region[0].offset, queries, q.region[0].bytes);
    if (q.keys) {
        std::memcpy(x + q.region[3].offset, key_lo, q.region[3].bytes);
        std::memcpy(x + q.region[4].offset, key_hi, q.region[4].bytes);
    }
    send(q);
    c.open = true;
    c.part = part;
    for (uint64_t p = 0; p < parts; p++)
        if (int(p) == part || c.spill)
            part_busy_[p] = true;
    inflight_++;
    return true;
}

bool GpuProcess::receive_search(SearchCall& c, int64_t* matched, int64_t* labels, double* exact,
                                GpuIvfpqAnswerDists* dists)
{
    if (!c.open)
        throw Error(ErrorKind::Internal, "GPU process: receiving a search that was not sent");
    c.open = false;
    inflight_--;
    for (int p = 0; p < kMaxSearchesInFlight; p++)
        if (p == c.part || c.spill)
            part_busy_[p] = false;
    if (!alive_)
        throw Error(ErrorKind::Internal, "the GPU process " + cause_);
    const Request& q = c.q;
    Reply rep = receive(q, false);
    raise_for(rep);
    if (rep.status != Status::Ok)
        return false;
    if (q.brute && rep.value[0] == 0) {
        *dists = GPU_IVFPQ_DISTS_NONE;
        return true;  // the mirror keeps no vectors: nothing was searched
    }
    check_reply(read_search(q, rep, base_, label_check_, labels, matched, exact));
    *dists = GpuIvfpqAnswerDists(rep.value[0]);
    return true;
}

bool GpuProcess::remove(const MirrorKey& key, size_t n, const int64_t* labels, size_t* removed)
{
    Request q;
    Layout l;
    q.op = Op::Remove;
    q.key = key;
    q.n = n;
    q.region[4] = l.take(n * sizeof(int64_t));
    char* x = exchange(l);
    std::memcpy(x + q.region[4].offset, labels, q.region[4].bytes);
    Reply rep = call(q);
    raise_for(rep);
    if (rep.status == Status::Ok && rep.value[0] > n)
        check_reply("a Remove reply counts more entries removed than labels given");
    if (removed != nullptr)
        *removed = rep.status == Status::Ok ? rep.value[0] : 0;
    return rep.status == Status::Ok;
}

bool GpuProcess::reveal(const MirrorKey& key)
{
    Request q;
    q.op = Op::Reveal;
    q.key = key;
    Reply rep = call(q);
    if (rep.status == Status::NotFound)
        return false;
    raise_for(rep);
    return true;
}

size_t GpuProcess::drop_index(uint32_t db, uint32_t index)
{
    Request q;
    q.op = Op::DropIndex;
    q.key.db = db;
    q.key.index = index;
    Reply rep = call(q);
    raise_for(rep);
    metric_objects_.erase({db, index});
    return rep.value[0];
}

void GpuProcess::drop_all()
{
    Request q;
    q.op = Op::DropAll;
    raise_for(call(q));
    metric_objects_.clear();
}

size_t GpuProcess::metric_load(const MirrorKey& key, const MetricSpec& spec)
{
    const size_t n = spec.words.n;
    const bool lc = spec.method == MetricMethod::ListOfClusters;
    const size_t structure = lc ? spec.clusters : spec.pivots;
    // An index with no objects (an empty table, only NULL words) has empty arrays.
    if (spec.ids != nullptr || spec.words.offsets == nullptr || (n > 0 && spec.labels == nullptr) ||
        (lc && ((n > 0 && spec.cluster_of == nullptr) ||
                (structure > 0 && (spec.centres == nullptr || spec.radii == nullptr)))) ||
        (!lc && ((structure > 0 && spec.pivot_ids == nullptr) || (n > 0 && structure > 0 && spec.table == nullptr))))
        throw Error(ErrorKind::InvalidArgument, "GPU process metric load: the index state is incomplete");
    const uint64_t cps = spec.words.offsets[n];
    Request q;
    Layout l;
    q.op = Op::MetricLoad;
    q.key = key;
    q.method = static_cast<uint64_t>(spec.method);
    q.n = n;
    q.cps = cps;
    q.clusters = structure;
    q.bucket = spec.bucket;
    q.alpha = spec.alpha;
    q.max_distance = spec.max_distance;
    q.region[0] = l.take(cps * sizeof(uint32_t));
    q.region[1] = l.take((n + 1) * sizeof(uint64_t));
    q.region[2] = l.take(n * sizeof(int64_t));
    q.region[3] = l.take(n);
    q.region[4] = l.take((lc ? 2 : 1) * structure * sizeof(uint32_t));
    q.region[5] = l.take(lc ? n * sizeof(uint32_t) : n * structure);
    char* x = exchange(l);
    // Empty regions may come with null sources (memcpy wants valid pointers even for 0 bytes).
    auto put = [x](size_t offset, const void* from, size_t bytes) {
        if (bytes > 0)
            std::memcpy(x + offset, from, bytes);
    };
    put(q.region[0].offset, spec.words.code_points, q.region[0].bytes);
    put(q.region[1].offset, spec.words.offsets, q.region[1].bytes);
    put(q.region[2].offset, spec.labels, q.region[2].bytes);
    if (spec.removed != nullptr)
        put(q.region[3].offset, spec.removed, n);
    else
        std::memset(x + q.region[3].offset, 0, n);
    if (lc) {
        put(q.region[4].offset, spec.centres, structure * sizeof(uint32_t));
        put(q.region[4].offset + structure * sizeof(uint32_t), spec.radii, structure * sizeof(uint32_t));
        put(q.region[5].offset, spec.cluster_of, q.region[5].bytes);
    } else {
        put(q.region[4].offset, spec.pivot_ids, q.region[4].bytes);
        put(q.region[5].offset, spec.table, q.region[5].bytes);
    }
    Reply rep = call(q, true);
    raise_for(rep);
    if (rep.value[0] > n)
        check_reply("a MetricLoad reply counts more live objects than were loaded");
    // Loaded, it replaced the index's other versions (a failed load may
    // leave them: kept here too).
    metric_objects_[{key.db, key.index}] = {key, n};
    return rep.value[0];
}

bool GpuProcess::metric_search(const MirrorKey& key, const MetricWords& queries, size_t k, const uint32_t* radii,
                               size_t nradii, MetricHits& out, size_t* live, size_t room_hint)
{
    const size_t nq = queries.n;
    const uint64_t cps = nq > 0 ? queries.offsets[nq] : 0;
    // Room for k hits a query (k-NN: always enough), a range search's guess
    // otherwise: the asker's room, up to 4M hits (64 MB of exchange).
    uint64_t room = k > 0 ? uint64_t(nq) * k
                          : std::max<uint64_t>({uint64_t(nq) * 64, 4096, std::min<uint64_t>(room_hint, 1u << 22)});
    for (int attempt = 0; attempt < 2; attempt++) {
        Request q;
        Layout l;
        q.op = Op::MetricSearch;
        q.key = key;
        q.nq = nq;
        q.k = k;
        q.nradii = k > 0 ? 0 : nradii;
        q.cps = cps;
        q.n = room;
        q.region[0] = l.take(cps * sizeof(uint32_t));
        q.region[1] = l.take((nq + 1) * sizeof(uint64_t));
        q.region[2] = l.take(q.nradii * sizeof(uint32_t));
        q.region[3] = l.take((nq + 1) * sizeof(uint64_t));
        q.region[4] = l.take(room * sizeof(uint32_t));
        q.region[5] = l.take(room * sizeof(uint32_t));
        q.region[6] = l.take(room * sizeof(int64_t));
        q.region[7] = l.take(nq * sizeof(uint64_t));
        char* x = exchange(l);
        if (cps > 0)
            std::memcpy(x + q.region[0].offset, queries.code_points, q.region[0].bytes);
        if (nq > 0)
            std::memcpy(x + q.region[1].offset, queries.offsets, q.region[1].bytes);
        else
            std::memset(x + q.region[1].offset, 0, sizeof(uint64_t));
        if (q.nradii > 0)
            std::memcpy(x + q.region[2].offset, radii, q.region[2].bytes);
        Reply rep = call(q, true);
        raise_for(rep);
        if (rep.status == Status::NotFound)
            return false;
        auto loaded = metric_objects_.find({key.db, key.index});
        if (loaded == metric_objects_.end() || !(loaded->second.first == key))
            check_reply("a MetricSearch reply answers for a mirror it was never given");
        if (rep.value[1] != 0) {
            check_reply(read_metric_hits(q, rep, x, loaded->second.second, nullptr));
            room = rep.value[0];  // the mirror cannot change between the two calls
            continue;
        }
        check_reply(read_metric_hits(q, rep, x, loaded->second.second, &out));
        if (live != nullptr)
            *live = rep.value[2];
        return true;
    }
    check_reply("a MetricSearch reply asks for more room than it asked for before");
    return false;  // not reached
}

void GpuProcess::train(const float* x_in, size_t n, size_t d, size_t lists, size_t m, Metric metric,
                       const IvfPqTrainParams& params, float* centroids, float* codebooks)
{
    Request q;
    Layout l;
    q.op = Op::Train;
    q.d = d;
    q.lists = lists;
    q.m = m;
    q.metric = static_cast<uint64_t>(metric);
    q.n = n;
    q.iterations = params.iterations;
    q.seed = params.seed;
    q.max_points_per_centroid = params.max_points_per_centroid;
    q.pq_max_training = params.pq_max_training;
    q.threads = params.threads;
    q.region[0] = l.take(n * d * sizeof(float));
    q.region[1] = l.take(centroid_bytes(d, lists));
    q.region[2] = l.take(codebook_bytes(d));
    char* x = exchange(l);
    std::memcpy(x + q.region[0].offset, x_in, q.region[0].bytes);
    raise_for(call(q, true));
    std::memcpy(centroids, x + q.region[1].offset, q.region[1].bytes);
    std::memcpy(codebooks, x + q.region[2].offset, q.region[2].bytes);
}

void GpuProcess::encode(const MirrorSpec& spec, const float* rows, size_t n, int32_t* list_ids, uint8_t* codes)
{
    Request q;
    Layout l;
    q.op = Op::Encode;
    q.n = n;
    describe_model(q, l, spec);
    q.region[2] = l.take(n * spec.d * sizeof(float));
    q.region[3] = l.take(n * sizeof(int32_t));
    q.region[4] = l.take(n * spec.m);  // RaBitQ codes: the rows
    char* x = exchange(l);
    copy_model(x, q, spec);
    std::memcpy(x + q.region[2].offset, rows, q.region[2].bytes);
    raise_for(call(q, true));
    std::memcpy(list_ids, x + q.region[3].offset, q.region[3].bytes);
    std::memcpy(codes, x + q.region[4].offset, q.region[4].bytes);
    if (!replycheck::all_within<int32_t>(list_ids, n, 0, static_cast<int32_t>(spec.lists)))
        check_reply("an Encode reply assigns a row to a list the model does not have");
    if (spec.rabitq_bits != 0 &&
        (spec.m != rabitq_row_bytes(spec.d, spec.rabitq_bits) ||
         !replycheck::rabitq_rows_sound(codes, n, spec.d, spec.rabitq_bits, spec.metric == Metric::InnerProduct)))
        check_reply("an Encode reply holds RaBitQ rows that no encoding writes");
}

void GpuProcess::exact_knn(const float* queries, size_t nq, const float* base, size_t n, size_t d,
                           Metric metric, size_t k, float* dist, int64_t* labels)
{
    Request q;
    Layout l;
    q.op = Op::Exact;
    q.d = d;
    q.metric = static_cast<uint64_t>(metric);
    q.nq = nq;
    q.n = n;
    q.k = k;
    q.region[0] = l.take(nq * d * sizeof(float));
    q.region[1] = l.take(n * d * sizeof(float));
    q.region[2] = l.take(nq * k * sizeof(float));
    q.region[3] = l.take(nq * k * sizeof(int64_t));
    char* x = exchange(l);
    std::memcpy(x + q.region[0].offset, queries, q.region[0].bytes);
    std::memcpy(x + q.region[1].offset, base, q.region[1].bytes);
    raise_for(call(q, true));
    std::memcpy(dist, x + q.region[2].offset, q.region[2].bytes);
    std::memcpy(labels, x + q.region[3].offset, q.region[3].bytes);
    if (!replycheck::all_within<int64_t>(labels, nq * k, -1, static_cast<int64_t>(n)))
        check_reply("an Exact reply answers a row that is not among the rows given");
}

}  // namespace gpuproc
}  // namespace gpuivfpq
