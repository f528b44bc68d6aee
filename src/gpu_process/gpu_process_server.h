// The GPU process's side of the channel (gpu_process_protocol.h): a loop
// that runs each request on the compute device and its mirror store. It is
// PostgreSQL-free and process-agnostic, so the unit tests run it on a thread.
#pragma once

#include <string>

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

// Serves requests on sock until the peer closes it (returns 0), the channel
// fails (1) or no device is usable any more (kExitDeviceFailed, after the
// reply that says so). With several devices, searches run at once on a
// thread per device, answered in order.
int serve(int sock, int exchange_fd, DeviceSet& devices);
// Over one device.
int serve(int sock, int exchange_fd, ComputeDevice& dev);

}  // namespace gpuproc
}  // namespace gpuivfpq
