// The GPU process's side of the channel (gpu_process_protocol.h): a loop
// that runs each request on the compute device and its mirror store. It is
// PostgreSQL-free and process-agnostic, so the unit tests run it on a thread.
#pragma once

#include <string>

#include "gpu_process/answer_dists.h"
#include "gpu_process/compute_device.h"
#include "gpu_process/device_set.h"
#include "gpu_process/gpu_process_protocol.h"

namespace gpuivfpq {
namespace gpuproc {

// Sends the first message (a Reply with seq 0): Ok with the device's
// capacity, kind and description, or the status and message of why there
// is no device (dev null).
void announce(int sock, const ComputeDevice* dev, Kind kind, Status status,
              const std::string& message);

// Ok, with the capacity of the set's smallest device and its description.
void announce(int sock, const DeviceSet& devices, Kind kind);

// Runs n queries (d floats each) on a mirror, k candidates each over nprobe
// lists, with per-query filter key ranges when key_lo is given (matched out):
// labels (n x k, -1 padded) and what exact holds (n x k): when the mirror
// keeps vectors, their exact distances in exact order (EXACT); for a mirror
// ranking by lower bounds, those bounds (LOWER); else nothing (NONE, the
// labels in ADC order). The Search request and the direct path's query
// server both run their searches here.
GpuIvfpqAnswerDists run_search(Mirror& mirror, const float* queries, uint64_t n, uint64_t d, uint64_t k,
                               uint64_t nprobe, const int64_t* key_lo, const int64_t* key_hi, int64_t* matched,
                               int64_t* labels, double* exact);

// Serves requests on sock until the peer closes it (returns 0), the channel
// fails (1) or no device is usable any more (kExitDeviceFailed, after the
// reply that says so). With several devices, searches run at once on a
// thread per device, answered in order. With queue_fd (not -1), the direct
// path's segment (query_queue.h): a thread of its own serves the searches
// queued there, taking turns on the devices with the requests of sock.
int serve(int sock, int exchange_fd, DeviceSet& devices, int queue_fd = -1);
// Over one device.
int serve(int sock, int exchange_fd, ComputeDevice& dev, int queue_fd = -1);

}  // namespace gpuproc
}  // namespace gpuivfpq
