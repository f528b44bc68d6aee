// The wire format between the GPU service (a PostgreSQL background worker)
// and the GPU process it starts: the process that owns the compute device,
// so that a fault in CUDA code or the driver kills only that process, never
// a process attached to PostgreSQL's shared memory.
//
// Two channels, nothing else shared: a SOCK_SEQPACKET socket pair carries
// one fixed-size Request and one Reply per call, and an exchange segment (a
// memfd both map) carries the arrays a call names in its regions. The
// service owns the exchange and grows or shrinks it; a request states its
// current size, and the process remaps before it reads.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/error.h"
#include "engine/rabitq.h"
#include "gpu_process/mirror_store.h"

namespace gpuivfpq {
namespace gpuproc {

constexpr uint32_t kMagic = 0x47495650;  // "GIVP"
// Raised with every change of Request or Reply. The program is installed
// apart from the extension's library: after an upgrade, a server still
// running the old library may start the new program (or the reverse).
constexpr uint64_t kVersion = 14;  // 14: Encode replies carry RaBitQ rows
constexpr int kRegions = 8;
constexpr size_t kAlign = 64;
constexpr size_t kMaxStatusMirrors = 1024;  // mirrors a Status reply lists (GPU_IVFPQ_STATUS_MIRRORS)
constexpr size_t kMaxDevices = 16;        // devices one process serves (a Devices reply lists)
// File descriptors the process finds its channels on (set up at spawn).
constexpr int kSocketFd = 3;
constexpr int kExchangeFd = 4;
// Exit codes with a meaning for the supervisor.
constexpr int kExitNoDevice = 2;      // no usable device: do not restart
constexpr int kExitDeviceFailed = 3;  // the device is unusable now (a sticky CUDA error)

// The process first announces itself: a Reply with seq 0, value[2] kVersion
// and value[3] sizeof(Request) (the service refuses another build), then Ok
// with value[0] the memory capacity (of its smallest device), value[1] the
// Kind and the description as message, or the status and message of why it
// has no device (then it exits).
//
// Replies come in the order of the requests. A process with several devices
// runs searches at once (each on a device of its own) and answers them in
// order; any other request waits for the searches before it.
enum class Op : uint32_t {
    SetBudget = 1,  // budget
    EnforceBudget,  //
    Status,         // r0 out: MirrorInfo[kMaxStatusMirrors]; value: count, bytes, budget, evictions
    Load,           // key, d, lists, m, metric, rabitq_bits, n, vectors, keys, placement, hidden; r0 centroids,
                    // r1 codebooks (RaBitQ codes: the model blob, model_bytes),
                    // r2 list ids, r3 codes, r4 labels, r5 vectors (n x d floats, when vectors),
                    // r6 filter keys (n int64, when keys)
    Add,            // key, m, n, vectors (then d), keys; r2 list ids, r3 codes, r4 labels,
                    // r5 vectors, r6 filter keys -> NotFound without the mirror
    Search,         // key, d, n queries, k, nprobe, keys; r0 queries, r1 labels out, r2 exact
                    // distances out (doubles), with keys r3 / r4 each query's lowest / highest
                    // filter key (int64) and r5 out how many entries of its probed lists lie
                    // in its range (int64) -> value[0] what r2 holds (GpuIvfpqAnswerDists): 1
                    // when re-ranked (the mirror keeps vectors: exact distances, rows in exact
                    // order), 2 the lower bounds the rows are ranked by (RaBitQ codes), 0 for
                    // ADC order (r2 unused); NotFound without the mirror. With brute: exact k-NN over every
                    // stored vector (value[0] 1), or value[0] 0 and nothing written when the
                    // mirror keeps no vectors
    Remove,         // key, n; r4 labels -> value[0] entries removed; NotFound without the mirror
    DropIndex,      // key.db, key.index -> value[0] mirrors dropped
    DropAll,        //
    Train,          // d, lists, m, metric, n, the IvfPqTrainParams; r0 rows, r1 centroids out, r2 codebooks out
    Encode,         // d, lists, m, metric, n; r0 centroids, r1 codebooks, r2 rows, r3 list ids out, r4 codes out
    Exact,          // d, metric, nq, n, k; r0 queries, r1 base, r2 dist out, r3 labels out
    Devices,        // r0 out: DeviceInfo[kMaxDevices]; value: count
    Reveal,         // key: a mirror loaded hidden becomes searchable on the direct path -> NotFound without it
    // gpu_metric indexes (MetricMirror). A mirror's key carries the index's
    // change count: any insert or VACUUM makes a new version, loaded anew
    // (the service keeps no change log for them, so there is no add or remove).
    MetricLoad,     // key, method, n, clusters (LC clusters or SSS pivots), bucket, alpha, max_distance,
                    // cps; r0 code points (cps uint32), r1 offsets (n + 1 uint64), r2 labels (n int64),
                    // r3 removed flags (n bytes), r4 LC centres then radii (2 x clusters uint32) or SSS
                    // pivot ids (clusters uint32), r5 LC each object's cluster (n uint32) or SSS table
                    // (n x clusters bytes) -> value[0] live objects
    MetricSearch,   // key, nq, k (0: range), nradii (range: 1 or nq), cps, n (room for hits); r0 query
                    // code points, r1 offsets (nq + 1), r2 radii (nradii uint32); out r3 hit offsets
                    // (nq + 1 uint64), r4 object ids (n uint32), r5 distances (n uint32), r6 labels
                    // (n int64), r7 each query's distance evaluations (nq uint64) -> value[0] hits, value[1] 1 when they exceed n (nothing written: ask
                    // again with room for value[0]), value[2] live objects; NotFound without the mirror
};

enum class Kind : uint64_t { Gpu = 1, Emulated = 2 };

enum class Status : int32_t {
    Ok = 0,
    NotFound,         // no mirror of that key
    InvalidArgument,  // ErrorKind::InvalidArgument
    OutOfMemory,
    Unsupported,
    Internal,
    DeviceFailed,  // the device is unusable; the process exits after this reply
};

struct Region {
    uint64_t offset = 0, bytes = 0;
};

struct Request {
    uint32_t magic = kMagic;
    Op op{};  // 0: no operation (rejected)
    uint64_t seq = 0;
    uint64_t exchange_bytes = 0;  // the exchange's size now
    MirrorKey key;
    uint64_t d = 0, lists = 0, m = 0, metric = 0, n = 0, nq = 0, k = 0, nprobe = 0;
    uint64_t iterations = 0, seed = 0, max_points_per_centroid = 0, pq_max_training = 0, threads = 0;
    uint64_t budget = 0;
    uint64_t vectors = 0;  // Load: keep exact vectors; Add: region 5 holds them
    uint64_t keys = 0;     // Load: keep filter keys; Add: region 6 holds them; Search: ranges
    uint64_t brute = 0;    // Search: exact k-NN over every stored vector (no probing)
    uint64_t placement = 0;  // Load: a Placement (replicas or shards over the process's devices)
    uint64_t hidden = 0;     // Load: not searched on the direct path until Reveal
    uint64_t rabitq_bits = 0;  // Load, Encode: RaBitQ codes of these bits per dimension (0: PQ codes)
    // MetricLoad / MetricSearch
    uint64_t method = 0;        // a MetricMethod
    uint64_t clusters = 0;      // LC clusters or SSS pivots
    uint64_t bucket = 0;        // LC bucket size
    uint64_t max_distance = 0;  // SSS M
    uint64_t nradii = 0;        // range search: radii given (1: one for all)
    uint64_t cps = 0;           // code points in region 0
    double alpha = 0;           // SSS alpha
    Region region[kRegions];
};

struct Reply {
    uint64_t seq = 0;
    Status status = Status::Ok;
    uint64_t value[4] = {0, 0, 0, 0};
    uint64_t busy_ns = 0;  // how long the process worked on the request
    char message[256] = {0};
};

// An engine error's kind as a status, and back: device errors cross the
// channel with their kind, so the service still tells bad input, out of
// memory and unsupported models apart.
inline Status status_of(ErrorKind kind)
{
    switch (kind) {
    case ErrorKind::InvalidArgument:
        return Status::InvalidArgument;
    case ErrorKind::OutOfMemory:
        return Status::OutOfMemory;
    case ErrorKind::Unsupported:
        return Status::Unsupported;
    case ErrorKind::Internal:
        break;
    }
    return Status::Internal;
}
inline ErrorKind kind_of(Status s)
{
    switch (s) {
    case Status::InvalidArgument:
        return ErrorKind::InvalidArgument;
    case Status::OutOfMemory:
        return ErrorKind::OutOfMemory;
    case Status::Unsupported:
        return ErrorKind::Unsupported;
    default:
        return ErrorKind::Internal;
    }
}

// Bytes of the arrays of a Load/Encode model (centroids, codebooks; with
// RaBitQ codes the model blob of engine/rabitq.h in place of the codebooks).
inline uint64_t centroid_bytes(uint64_t d, uint64_t lists) { return d * lists * sizeof(float); }
inline uint64_t codebook_bytes(uint64_t d) { return kPqCentroids * d * sizeof(float); }
inline uint64_t model_bytes(uint64_t d, uint64_t lists, uint64_t rabitq_bits)
{
    return rabitq_bits != 0 ? rabitq_model_bytes(d, lists) : codebook_bytes(d);
}

}  // namespace gpuproc
}  // namespace gpuivfpq
