// gpu_ivfpq_gpu_process: the program the GPU service starts to own the
// compute device. It shares nothing with PostgreSQL but the channel it
// finds on fds 3 and 4 (gpu_process_protocol.h), so a fault in CUDA code or
// the driver (a signal, a sticky error, an abort) ends this process only:
// the service answers from the CPU engine meanwhile and starts another.
//
//   gpu_ivfpq_gpu_process --cuda [--devices 0,1,...] | --emulate [--emulated-devices N]
//                         [--parent PID]
//
// --cuda opens every CUDA device it sees (CUDA_VISIBLE_DEVICES narrows what
// it sees), or those --devices names; devices that fail to open are left
// out, logged on stderr, as long as one opens.
#include <dirent.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <vector>

#include "gpu_process/compute_device.h"
#include "gpu_process/gpu_process_server.h"
#include "gpu_process/query_queue.h"
#ifdef GPU_IVFPQ_WITH_CUDA
#include "gpu_process/cuda_device.h"
#endif

using namespace gpuivfpq;
using namespace gpuivfpq::gpuproc;

namespace {

// Closes every descriptor but the channel and the direct path's segment:
// the service's files, sockets and pipes are none of this process's business.
void close_inherited_fds()
{
    std::vector<int> fds;
    if (DIR* dir = opendir("/proc/self/fd")) {
        while (struct dirent* e = readdir(dir)) {
            int fd = std::atoi(e->d_name);
            if (e->d_name[0] != '.' && fd > kExchangeFd && fd != queue::kQueueFd && fd != dirfd(dir))
                fds.push_back(fd);
        }
        closedir(dir);
    }
    for (int fd : fds)
        close(fd);
}

// "0,2,3" -> {0, 2, 3}; false on anything else.
bool parse_list(const char* s, std::vector<int>& out)
{
    const char* p = s;
    while (*p != '\0') {
        char* end = nullptr;
        long v = std::strtol(p, &end, 10);
        if (end == p || v < 0 || v > 1023)
            return false;
        out.push_back((int)v);
        p = end;
        if (*p == ',')
            p++;
        else if (*p != '\0')
            return false;
    }
    return !out.empty();
}

}  // namespace

int main(int argc, char** argv)
{
    bool emulate = false, cuda = false;
    long parent = 0, emulated = 1;
    std::vector<int> wanted;
    for (int i = 1; i < argc; i++) {
        if (std::strcmp(argv[i], "--emulate") == 0)
            emulate = true;
        else if (std::strcmp(argv[i], "--cuda") == 0)
            cuda = true;
        else if (std::strcmp(argv[i], "--parent") == 0 && i + 1 < argc)
            parent = std::atol(argv[++i]);
        else if (std::strcmp(argv[i], "--devices") == 0 && i + 1 < argc && parse_list(argv[i + 1], wanted))
            i++;
        else if (std::strcmp(argv[i], "--emulated-devices") == 0 && i + 1 < argc) {
            emulated = std::atol(argv[++i]);
            if (emulated < 1 || emulated > (long)kMaxDevices) {
                std::fprintf(stderr, "%s: --emulated-devices takes 1 to %zu\n", argv[0], kMaxDevices);
                return 64;
            }
        } else {
            std::fprintf(stderr, "usage: %s --cuda [--devices LIST]|--emulate [--emulated-devices N] [--parent PID]\n",
                         argv[0]);
            return 64;
        }
    }
    if (emulate == cuda) {
        std::fprintf(stderr, "%s: exactly one of --cuda and --emulate\n", argv[0]);
        return 64;
    }
    // Ends with the service, however the service ends.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (parent != 0 && getppid() != (pid_t)parent)
        return 1;
    signal(SIGPIPE, SIG_IGN);
    close_inherited_fds();

    std::vector<std::unique_ptr<ComputeDevice>> devs;
    std::vector<uint32_t> ordinals;
    Kind kind = emulate ? Kind::Emulated : Kind::Gpu;
    std::string failures;
    [[maybe_unused]] bool open_failed = false;  // a visible device failed to open (else: none visible)
    if (emulate) {
        // N emulated devices, numbered 0..N-1; --devices picks among them as among GPUs.
        if (wanted.empty())
            for (long i = 0; i < emulated; i++)
                wanted.push_back((int)i);
        for (int i : wanted) {
            if (i >= emulated || devs.size() >= kMaxDevices) {
                failures += "device " + std::to_string(i) + ": not visible; ";
                continue;
            }
            devs.push_back(make_cpu_emulation_device());
            ordinals.push_back((uint32_t)i);
        }
        if (devs.empty()) {
            announce(kSocketFd, nullptr, kind, Status::Unsupported,
                     "none (no listed device is visible: " + failures + ")");
            return kExitNoDevice;
        }
    } else {
#ifdef GPU_IVFPQ_WITH_CUDA
        int count = cuda_device_count();
        if (count == 0) {
            announce(kSocketFd, nullptr, kind, Status::Unsupported, "none (no CUDA device found)");
            return kExitNoDevice;
        }
        if (wanted.empty())
            for (int i = 0; i < count; i++)
                wanted.push_back(i);
        for (int i : wanted) {
            if (i >= count || devs.size() >= kMaxDevices) {
                failures += "device " + std::to_string(i) + ": not visible; ";
                continue;
            }
            try {
                // Diagnostics: GPU_IVFPQ_HOST_WAIT (auto, spin, yield, block) in
                // the server's environment sets how the serving threads wait for
                // the device (the CUDA runtime's choice otherwise).
                if (const char* w = std::getenv("GPU_IVFPQ_HOST_WAIT"))
                    if (!cuda_set_host_wait(i, w))
                        std::fprintf(stderr, "gpu_ivfpq_gpu_process: GPU_IVFPQ_HOST_WAIT \"%s\" ignored\n", w);
                devs.push_back(make_cuda_device(i, 0));
                ordinals.push_back((uint32_t)i);
            } catch (const std::exception& e) {
                failures += "device " + std::to_string(i) + ": " + e.what() + "; ";
                open_failed = true;
            }
        }
        if (devs.empty() && !open_failed) {
            announce(kSocketFd, nullptr, kind, Status::Unsupported,
                     "none (no listed CUDA device is visible: " + failures + ")");
            return kExitNoDevice;
        }
#else
        announce(kSocketFd, nullptr, kind, Status::Unsupported, "none (extension built without CUDA)");
        return kExitNoDevice;
#endif
    }
    if (devs.empty()) {
        announce(kSocketFd, nullptr, kind, Status::Internal, "the devices failed to open: " + failures);
        return 1;
    }
    if (!failures.empty())
        std::fprintf(stderr, "gpu_ivfpq_gpu_process: left out: %s\n", failures.c_str());
    std::unique_ptr<DeviceSet> set;
    try {
        set = std::make_unique<DeviceSet>(std::move(devs), ordinals);
    } catch (const std::exception& e) {
        announce(kSocketFd, nullptr, kind, Status::Internal, std::string("the devices failed to open: ") + e.what());
        return 1;
    }
    announce(kSocketFd, *set, kind);
    // The direct path's segment, when the service passed one.
    struct stat st;
    int queue_fd = fstat(queue::kQueueFd, &st) == 0 ? queue::kQueueFd : -1;
    return serve(kSocketFd, kExchangeFd, *set, queue_fd);
}
