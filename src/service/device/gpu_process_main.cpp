// gpu_ivfpq_gpu_process: the program the GPU service starts to own the
// compute device. It shares nothing with PostgreSQL but the channel it
// finds on fds 3 and 4 (gpu_process_protocol.h), so a fault in CUDA code or
// the driver (a signal, a sticky error, an abort) ends this process only:
// the service answers from the CPU engine meanwhile and starts another.
//
//   gpu_ivfpq_gpu_process --cuda|--emulate [--parent PID]
#include <dirent.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <vector>

#include "service/device/compute_device.h"
#include "service/device/gpu_process_server.h"
#ifdef GPU_IVFPQ_WITH_CUDA
#include "service/device/cuda_device.h"
#endif

using namespace gpuivfpq;
using namespace gpuivfpq::gpuproc;

namespace {

// Closes every descriptor but the channel: the service's files, sockets
// and pipes are none of this process's business.
void close_inherited_fds()
{
    std::vector<int> fds;
    if (DIR* dir = opendir("/proc/self/fd")) {
        while (struct dirent* e = readdir(dir)) {
            int fd = std::atoi(e->d_name);
            if (e->d_name[0] != '.' && fd > kExchangeFd && fd != dirfd(dir))
                fds.push_back(fd);
        }
        closedir(dir);
    }
    for (int fd : fds)
        close(fd);
}

}  // namespace

int main(int argc, char** argv)
{
    bool emulate = false, cuda = false;
    long parent = 0;
    for (int i = 1; i < argc; i++) {
        if (std::strcmp(argv[i], "--emulate") == 0)
            emulate = true;
        else if (std::strcmp(argv[i], "--cuda") == 0)
            cuda = true;
        else if (std::strcmp(argv[i], "--parent") == 0 && i + 1 < argc)
            parent = std::atol(argv[++i]);
        else {
            std::fprintf(stderr, "usage: %s --cuda|--emulate [--parent PID]\n", argv[0]);
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

    std::unique_ptr<ComputeDevice> dev;
    Kind kind = emulate ? Kind::Emulated : Kind::Gpu;
    try {
        if (emulate)
            dev = make_cpu_emulation_device();
        else {
#ifdef GPU_IVFPQ_WITH_CUDA
            if (cuda_device_count() == 0) {
                announce(kSocketFd, nullptr, kind, Status::Unsupported, "none (no CUDA device found)");
                return kExitNoDevice;
            }
            dev = make_cuda_device(0, 0);
#else
            announce(kSocketFd, nullptr, kind, Status::Unsupported, "none (extension built without CUDA)");
            return kExitNoDevice;
#endif
        }
    } catch (const std::exception& e) {
        announce(kSocketFd, nullptr, kind, Status::Internal, std::string("the device failed to open: ") + e.what());
        return 1;
    }
    announce(kSocketFd, dev.get(), kind, Status::Ok, dev->description());
    return serve(kSocketFd, kExchangeFd, *dev);
}
