// A channel to a GPU process's request loop run on a thread of the test
// (a socket pair and an exchange segment), shared by the unit tests of the
// GPU process and of the services it serves.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "gpu_process/compute_device.h"
#include "gpu_process/gpu_process_client.h"
#include "gpu_process/gpu_process_protocol.h"
#include "gpu_process/gpu_process_server.h"

namespace gpuivfpq {
namespace gpuproc {

// The GPU process's side of a channel, as a server thread sees it.
struct ServerEnd {
    int sock = -1, exchange = -1;
    // The client sees the channel close, as when the process dies.
    void close_sock()
    {
        ::close(sock);
        sock = -1;
    }
};

// A socket pair and an exchange segment, with a server on a thread holding
// one end. Declare the client after the Channel: it must be destroyed (and
// close its socket, which ends serve()) before the thread is joined.
class Channel {
public:
    using Server = std::function<int(ServerEnd&)>;

    explicit Channel(Server server)
    {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
            throw std::runtime_error(std::string("socketpair: ") + std::strerror(errno));
        client_sock_ = sv[0];
        end_.sock = sv[1];
        end_.exchange = memfd_create("gpu_ivfpq test exchange", MFD_CLOEXEC);
        if (end_.exchange < 0)
            throw std::runtime_error(std::string("memfd_create: ") + std::strerror(errno));
        thread_ = std::thread([this, server] { server_rc_ = server(end_); });
    }

    ~Channel()
    {
        if (client_sock_ >= 0)
            ::close(client_sock_);  // a raw client: this ends serve()
        join();
        if (end_.sock >= 0)
            ::close(end_.sock);
        ::close(end_.exchange);
    }

    // The client closes its socket and exchange descriptor when destroyed,
    // so it gets descriptors of its own, never the server's.
    std::unique_ptr<GpuProcess> connect(GpuProcess::StopCheck stop = nullptr)
    {
        int sock = client_sock_;
        client_sock_ = -1;
        int xfd = fcntl(end_.exchange, F_DUPFD_CLOEXEC, 0);
        return std::make_unique<GpuProcess>(sock, xfd, stop);
    }

    // The client's socket, for tests that speak the wire format themselves.
    int raw_sock() const { return client_sock_; }
    int exchange_fd() const { return end_.exchange; }

    uint64_t exchange_size() const
    {
        struct stat st;
        if (fstat(end_.exchange, &st) != 0)
            return 0;
        return uint64_t(st.st_size);
    }

    // What the server returned (serve()'s exit code); joins first.
    int server_rc()
    {
        join();
        return server_rc_;
    }

    void join()
    {
        if (thread_.joinable())
            thread_.join();
    }

private:
    ServerEnd end_;
    int client_sock_ = -1;
    std::thread thread_;
    std::atomic<int> server_rc_{-1};
};

// What gpu_process_main.cpp runs for --emulate, minus the process.
inline int emulated_server(ServerEnd& end)
{
    auto dev = make_cpu_emulation_device();
    announce(end.sock, dev.get(), Kind::Emulated, Status::Ok, dev->description());
    return serve(end.sock, end.exchange, *dev);
}

}  // namespace gpuproc
}  // namespace gpuivfpq
