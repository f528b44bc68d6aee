// What the GPU service runs on: a compute device that holds index mirrors
// (inverted lists of PQ codes and labels next to the trained quantizers,
// and usually each entry's exact vector), searches them in batches, and
// trains and encodes for index builds.
//
// The CUDA device (cuda_device.cpp, built only when the extension is
// linked with the kernels) and a CPU emulation implement it. The emulation
// lets the service's request path, batching and mirror coherence be tested
// on machines without a GPU; it is never chosen unless a setting asks for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/distances.h"
#include "engine/ivfpq.h"
#include "engine/search_limits.h"
#include "gpu_process/metric_mirror.h"

namespace gpuivfpq {

// A trained model as the pages hold it (host pointers, borrowed).
struct MirrorSpec {
    size_t d = 0, lists = 0, m = 0;
    Metric metric = Metric::L2;
    const float* centroids = nullptr;  // lists x d
    const float* codebooks = nullptr;  // m x 256 x (d/m)
    // Entries carry their exact vectors (d floats each), so that a search
    // can return candidates re-ranked by exact distance (search_exact).
    bool vectors = false;
    // Entries carry a filter key (an int64, the index's filter column), so
    // that a search can skip entries outside a per-query key range.
    bool filter_keys = false;
    // RaBitQ codes (codes = rabitq; 0: PQ codes): bits per dimension. An
    // entry's code is then m = rabitq_row_bytes(d, bits) bytes (its bit
    // planes, then its RabitqFactors: the index pages' entry code),
    // codebooks is unused and rabitq_model points at the model blob
    // (rabitq_model_bytes(d, lists): the rotation, then P c; engine/rabitq.h).
    // Such a mirror keeps no vectors: search ranks by the lower bounds of
    // the codes' estimates (estimate - bound at kRabitqLowerEps0, the rank
    // keys of RabitqModel::scan_keys), returns them as the distances, and
    // the backends re-rank from the heap, fetching candidates in that order
    // until a lower bound passes the k-th exact distance.
    int rabitq_bits = 0;
    const void* rabitq_model = nullptr;
};

// A per-query range on the entries' filter keys (host pointers, nq each):
// query q considers only entries with lo[q] <= key <= hi[q]. Entries outside
// it are never candidates (as if absent from the lists). When matched is
// set, matched[q] receives how many entries of q's probed lists lie in its
// range (the scan estimates the filter's selectivity from it).
struct KeyRanges {
    const int64_t* lo = nullptr;
    const int64_t* hi = nullptr;
    int64_t* matched = nullptr;
};

// One index's inverted lists on the device.
class Mirror {
public:
    virtual ~Mirror() = default;
    // Appends n entries: list_ids[i], codes[i*m..], labels[i] and, exactly
    // when has_vectors(), vectors[i*d..] (else null), exactly when
    // has_keys(), keys[i] (else null). Throws Error(InvalidArgument) when
    // vectors or keys is given or missing against that.
    virtual void add(size_t n, const int32_t* list_ids, const uint8_t* codes,
                     const int64_t* labels, const float* vectors, const int64_t* keys) = 0;
    // Whether entries carry exact vectors (MirrorSpec::vectors).
    virtual bool has_vectors() const = 0;
    // Whether entries carry filter keys (MirrorSpec::filter_keys).
    virtual bool has_keys() const = 0;
    // Whether search's distances are lower bounds of the exact distances
    // (a mirror with RaBitQ codes), not distances of their own.
    virtual bool lower_bounds() const { return false; }
    // k best labels by ADC distance for nq queries through nprobe lists
    // (dist, labels: nq x k, padded with (+inf, -1)); with ranges (only on
    // a mirror with keys, else Error(InvalidArgument)), among the entries
    // within each query's key range. Throws Error(InvalidArgument) for k
    // outside 1..kMaxSelectK, or for nprobe (clamped to 1..lists) above
    // kMaxSelectK.
    virtual void search(const float* queries, size_t nq, size_t k, size_t nprobe, float* dist,
                        int64_t* labels, const KeyRanges* ranges) = 0;
    // The same k candidates, re-ranked: dist[i] is the exact distance of
    // labels[i] (gpuivfpq::exact_distance of the query and the stored
    // vector, as the SQL operators compute it), each row in exact_less
    // order, padded with (+inf, -1). Throws Error(Unsupported) without
    // vectors.
    virtual void search_exact(const float* queries, size_t nq, size_t k, size_t nprobe,
                              double* dist, int64_t* labels, const KeyRanges* ranges) = 0;
    // Exact k-NN over every stored vector (no list probing): dist[i] is the
    // exact distance (gpuivfpq::exact_distance, the mirror's metric) of
    // labels[i], each row in exact_less order, padded with (+inf, -1); the
    // device may preselect candidates in lower precision. Throws
    // Error(Unsupported) without vectors, Error(InvalidArgument) for k
    // outside 1..kMaxSelectK.
    virtual void brute_force(const float* queries, size_t nq, size_t k, double* dist, int64_t* labels) = 0;
    // Removes every entry whose label is in labels[0..n) (unknown labels
    // and duplicates allowed), in place; returns how many went.
    virtual size_t remove(size_t n, const int64_t* labels) = 0;
    virtual size_t entries() const = 0;
    virtual size_t bytes() const = 0;  // device memory held
};

class ComputeDevice {
public:
    virtual ~ComputeDevice() = default;
    virtual std::string description() const = 0;
    // Device memory available to mirrors and work space.
    virtual size_t memory_capacity() const = 0;
    // Device memory a mirror of n entries would take (an estimate, for the budget).
    virtual size_t mirror_bytes(const MirrorSpec& spec, size_t n) const = 0;
    // Throws Error(Unsupported) for m outside 1..kMaxGpuSubQuantizers.
    virtual std::unique_ptr<Mirror> create_mirror(const MirrorSpec& spec) = 0;
    // Trains the quantizers on n sample vectors (outputs as MirrorSpec holds them).
    virtual void train(const float* x, size_t n, size_t d, size_t lists, size_t m, Metric metric,
                       const IvfPqTrainParams& params, float* centroids, float* codebooks) = 0;
    // Exact k-NN of nq queries among n base vectors (host pointers), ranking
    // distances as metric_distance gives them, sorted, padded with (+inf, -1);
    // labels are base rows. Throws Error(InvalidArgument) for k outside
    // 1..kMaxSelectK.
    virtual void exact_knn(const float* queries, size_t nq, const float* base, size_t n, size_t d,
                           Metric metric, size_t k, float* dist, int64_t* labels) = 0;
    // Encodes n vectors with the model of spec: list_ids[i], codes[i*m..]
    // (for RaBitQ codes, spec.rabitq_bits, m is the row: the bit planes,
    // then the factors, RabitqModel::encode_rows's bytes).
    virtual void encode(const MirrorSpec& spec, const float* x, size_t n, int32_t* list_ids,
                        uint8_t* codes) = 0;
    // A metric index's mirror (metric_mirror.h) restored from its stored
    // state: Error(InvalidArgument) for a state that is no index,
    // Error(Unsupported) on a device that keeps none (the default).
    virtual std::unique_ptr<MetricMirror> create_metric_mirror(const MetricSpec& spec);
    // Page-locks host memory that stays mapped (the GPU process's exchange
    // with the service), so that copies between it and the device need no
    // staging; false where the device does not (the CPU emulation) or the
    // driver refuses. unpin_host undoes it before the memory is unmapped.
    virtual bool pin_host(void* /*p*/, size_t /*bytes*/) { return false; }
    virtual void unpin_host(void* /*p*/) {}
    // While a search call of the calling thread waits for its own device
    // work, it may let other threads queue theirs: it calls yield(arg)
    // before the wait and reclaim(arg) after (a DeviceSet::Lease that asks
    // for it sets this for its thread, which then lets go of the device for
    // good; null: none). Devices whose calls finish before they return
    // (the CPU emulation) ignore it.
    virtual void set_wait_handover(void (* /*yield*/)(void*), void (* /*reclaim*/)(void*), void* /*arg*/) {}
    // Whether the device still works after a failed call: false after a
    // sticky error (a CUDA context that every later call would fail on),
    // after which its process must exit and a new one open the device.
    virtual bool healthy() { return true; }
};

// Throws Error(InvalidArgument) unless spec's shape (rabitq_bits != 0) is
// one of RaBitQ codes a mirror can hold: bits in 1..8, 1 <= d <=
// kRabitqMaxDims, lists >= 1, m = rabitq_row_bytes(d, bits), no vectors
// (the pointers are the caller's to check). Every device's create_mirror,
// the service's client and the GPU process check it alike.
void require_rabitq_spec(const MirrorSpec& spec);

// The CPU emulation (single-threaded, the CPU engine's own ADC and k-selection).
std::unique_ptr<ComputeDevice> make_cpu_emulation_device();

}  // namespace gpuivfpq
