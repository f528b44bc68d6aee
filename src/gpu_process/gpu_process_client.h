// The service's side of the channel to the GPU process: starts the
// process, calls it, and notices its death. Every call either returns the
// device's answer, throws the device's Error (the process lives on), or
// finds the process gone: then alive() turns false, cause() says why, and
// the call throws Error(Internal). A reply is checked against what was
// asked before anything of it is passed on (reply_checks.h): one whose
// counts, offsets or ids do not fit the request, or whose status is no
// status, is a failure of the process, which is killed as a process that
// stopped answering is. PostgreSQL-free: the service passes a
// stop check, called while a call waits, that abandons the wait (and the
// process) when the service must stop.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/error.h"
#include "gpu_process/answer_dists.h"
#include "gpu_process/gpu_process_protocol.h"

namespace gpuivfpq {
namespace gpuproc {

struct StoreStatus {
    std::vector<MirrorInfo> mirrors;
    size_t bytes = 0, budget = 0, evictions = 0;
};

// Why a start failed: no device at all (do not retry) or a failure (retry later).
class StartError : public Error {
public:
    StartError(bool no_device, const std::string& msg)
        : Error(ErrorKind::Internal, msg), no_device_(no_device)
    {
    }
    bool no_device() const { return no_device_; }

private:
    bool no_device_;
};

class GpuProcess {
public:
    using StopCheck = bool (*)();
    // Whether a label (not -1) a search answers can be one of a mirror's:
    // the service's labels are heap TIDs (replycheck::tid_label).
    using LabelCheck = bool (*)(int64_t);

    // Starts program (argv[0] shown as title) with --emulate or --cuda and
    // the extra arguments (the devices to open), and waits for its
    // announcement. Throws StartError.
    // queue_fd (not -1): the direct path's segment, which the process finds
    // on queue::kQueueFd.
    static std::unique_ptr<GpuProcess> start(const std::string& program, const std::string& title,
                                             bool emulate, StopCheck stop, double start_timeout_s,
                                             const std::vector<std::string>& extra = {}, int queue_fd = -1);
    // Over an existing channel whose server runs elsewhere (a thread in the
    // unit tests): no process to reap or kill. Reads the announcement.
    GpuProcess(int sock, int exchange_fd, StopCheck stop);
    ~GpuProcess();  // closes the channel, then kills and reaps the process
    GpuProcess(const GpuProcess&) = delete;
    GpuProcess& operator=(const GpuProcess&) = delete;

    bool alive() const { return alive_; }
    const std::string& cause() const { return cause_; }
    pid_t pid() const { return pid_; }
    const std::string& description() const { return description_; }
    size_t capacity() const { return capacity_; }
    Kind kind() const { return kind_; }
    // How long the process worked on the last answered call (the rest of
    // the call's time is the channel and the copies).
    uint64_t last_busy_ns() const { return last_busy_ns_; }
    // A call that has not been answered after this long kills the process
    // (0: never); bulk calls (load, train, encode, exact) get bulk_factor
    // times as long, since they move whole indexes.
    void set_timeout(double seconds, double bulk_factor = 1)
    {
        timeout_s_ = seconds;
        bulk_factor_ = bulk_factor;
    }
    // Without blocking: has the process died while idle? (Reaps it.)
    bool check_exit();
    // Kills and reaps a process that stopped answering (what: how it
    // failed, the start of cause()); afterwards alive() is false.
    void kill_hung(const std::string& what);
    // Search answers whose labels fail check are malformed (null: any
    // label from 0 on passes).
    void set_label_check(LabelCheck check) { label_check_ = check; }

    void set_budget(size_t bytes);
    void enforce_budget();
    StoreStatus status();
    // Each device the process serves, and the memory mirrors hold there.
    std::vector<DeviceInfo> devices();
    // vectors: n x spec.d floats when spec.vectors, keys: n filter keys
    // when spec.filter_keys (else unused). placement: replicas or shards
    // over the process's devices (MirrorStore::load).
    void load(const MirrorKey& key, const MirrorSpec& spec, size_t n, const int32_t* list_ids,
              const uint8_t* codes, const int64_t* labels, const float* vectors, const int64_t* keys,
              Placement placement = Placement::Auto, bool hidden = false);
    // A mirror loaded hidden becomes searchable on the direct path; false
    // when the process holds no mirror of key.
    bool reveal(const MirrorKey& key);
    // false when the process holds no mirror of key. vectors (n x d floats)
    // or null; a mirror without vectors ignores them. keys (n) or null; a
    // mirror without filter keys ignores them, one with them requires them.
    bool add(const MirrorKey& key, size_t m, size_t n, const int32_t* list_ids, const uint8_t* codes,
             const int64_t* labels, const float* vectors, size_t d, const int64_t* keys);
    // false when the process holds no mirror of key. *dists: what exact (nq
    // x k) holds: EXACT when the mirror re-ranked (exact distances, each row
    // in exact order), LOWER the lower bounds the rows are ranked by (RaBitQ
    // codes), NONE when labels are in ADC order and exact is untouched.
    // key_lo / key_hi (nq each, or both null): each query's range of filter
    // keys (a mirror without filter keys refuses them: InvalidArgument);
    // matched (nq, or null) receives how many entries of each query's
    // probed lists lie in its range.
    // brute: exact k-NN over every stored vector instead (nprobe unused);
    // *dists NONE when the mirror keeps no vectors (nothing written).
    bool search(const MirrorKey& key, size_t d, const float* queries, size_t nq, size_t k,
                size_t nprobe, const int64_t* key_lo, const int64_t* key_hi, int64_t* matched,
                int64_t* labels, double* exact, GpuIvfpqAnswerDists* dists, bool brute = false);
    // The same search in two steps, so that the service can collect and
    // answer other requests while the process works: send_search queues it
    // and returns at once; receive_search waits for its answer and copies it
    // out (the arguments and result as search's). Searches are answered in
    // the order sent; at most kMaxSearchesInFlight are in flight, each in
    // its own part of the exchange, and no other call may be made while one
    // is. send_search returns false, sending nothing, when this one would
    // not fit beside those in flight (no part free, or too large for one):
    // receive the oldest first.
    static constexpr int kMaxSearchesInFlight = 4;
    struct SearchCall {
        Request q;
        bool open = false;
        int part = 0;        // the exchange part it was written to
        bool spill = false;  // larger than a part: it took the whole exchange
    };
    bool send_search(SearchCall& c, const MirrorKey& key, size_t d, const float* queries, size_t nq,
                     size_t k, size_t nprobe, const int64_t* key_lo, const int64_t* key_hi,
                     bool brute = false);
    bool receive_search(SearchCall& c, int64_t* matched, int64_t* labels, double* exact,
                        GpuIvfpqAnswerDists* dists);
    int searches_in_flight() const { return inflight_; }
    // false when the process holds no mirror of key; *removed: entries that went.
    bool remove(const MirrorKey& key, size_t n, const int64_t* labels, size_t* removed = nullptr);
    size_t drop_index(uint32_t db, uint32_t index);
    void drop_all();
    // A gpu_metric index's mirror (key with its change count) from its
    // state (spec.ids must be null: the whole index); returns its live
    // objects. Replaces any other version of the index.
    size_t metric_load(const MirrorKey& key, const MetricSpec& spec);
    // Range search (k 0: radii holds nradii radii, 1 for all) or k-NN of
    // queries on the metric mirror of key, into out (per query sorted by
    // (distance, id)); false when the process holds no such mirror. A range
    // answer larger than the room guessed (at least room_hint hits, the
    // room its asker has) is asked for again with room for it (the search
    // runs twice). *live: the mirror's live objects. Timed as a bulk call:
    // long words make long searches.
    bool metric_search(const MirrorKey& key, const MetricWords& queries, size_t k, const uint32_t* radii,
                       size_t nradii, MetricHits& out, size_t* live = nullptr, size_t room_hint = 0);
    void train(const float* x, size_t n, size_t d, size_t lists, size_t m, Metric metric,
               const IvfPqTrainParams& params, float* centroids, float* codebooks);
    // ComputeDevice::encode in the GPU process (RaBitQ codes: the lists
    // only, codes untouched and may be null).
    void encode(const MirrorSpec& spec, const float* x, size_t n, int32_t* list_ids, uint8_t* codes);
    void exact_knn(const float* queries, size_t nq, const float* base, size_t n, size_t d,
                   Metric metric, size_t k, float* dist, int64_t* labels);

private:
    GpuProcess(int sock, int exchange_fd, pid_t pid, StopCheck stop);
    struct Layout;
    void read_announcement(double timeout_s);
    bool wait_reply(Reply& rep, uint64_t seq, double timeout_s);
    Reply call(Request& q, bool bulk = false);
    void send(Request& q);
    Reply receive(const Request& q, bool bulk);
    char* exchange(const Layout& layout);
    [[noreturn]] void lost(const std::string& what, bool kill_it);
    // A reply that is no answer to its request (why, or null: returns).
    void check_reply(const char* why);
    std::string reap(bool kill_it);

    int sock_ = -1, exchange_fd_ = -1;
    pid_t pid_ = 0;
    StopCheck stop_ = nullptr;
    bool alive_ = true;
    std::string cause_;
    std::string description_;
    size_t capacity_ = 0;
    Kind kind_ = Kind::Emulated;
    double timeout_s_ = 0, bulk_factor_ = 1;
    uint64_t seq_ = 0;
    int inflight_ = 0;             // searches sent and not yet received
    bool part_busy_[kMaxSearchesInFlight] = {};  // exchange parts holding a search in flight
    uint64_t last_busy_ns_ = 0;
    char* base_ = nullptr;
    uint64_t size_ = 0;
    LabelCheck label_check_ = nullptr;
    // Each gpu_metric index's mirror loaded (by db and index: a load
    // replaces the index's other versions) and its objects, which bound the
    // object ids and live counts of its answers. A version absent here was
    // never loaded, so the process cannot answer for it.
    std::map<std::pair<uint32_t, uint32_t>, std::pair<MirrorKey, uint64_t>> metric_objects_;
};

}  // namespace gpuproc
}  // namespace gpuivfpq
