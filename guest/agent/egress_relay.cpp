#include "guest/agent/egress_relay.hpp"

#include <arpa/inet.h>
#include <linux/vm_sockets.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <thread>

#include "common/fd.hpp"
#include "guest/agent/byte_pump.hpp"
#include "guest/agent/relay_log.hpp"

namespace agentvm {

namespace {

RelayLog egress_log("egress");
std::atomic<size_t> egress_connections{0};

// A connection to the host's end, or an invalid Fd (errno set).
Fd connect_host(const ListenAddress& host)
{
    if (host.kind == ListenAddress::Kind::vsock) {
        Fd socket(::socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0));
        if (!socket)
            return socket;
        sockaddr_vm address{};
        address.svm_family = AF_VSOCK;
        address.svm_cid = VMADDR_CID_HOST;
        address.svm_port = host.port;
        if (::connect(socket.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0)
            return Fd();
        return socket;
    }
    Fd socket(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!socket)
        return socket;
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, host.path.c_str(), sizeof(address.sun_path) - 1);
    if (::connect(socket.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0)
        return Fd();
    return socket;
}

// The answer goes out on a fresh socket (MSG_DONTWAIT never holds the thread), then the end of
// our side; what the tool sent is read and dropped for a moment, since closing a socket with
// unread bytes resets the connection, which the tool might see instead of the answer.
void answer_and_close(int socket, const std::string& answer)
{
    [[maybe_unused]] const ssize_t n = ::send(socket, answer.data(), answer.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    ::shutdown(socket, SHUT_WR);
    const timeval patience{1, 0};
    ::setsockopt(socket, SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof(patience));
    char dropped[4096];
    for (int i = 0; i < 64 && ::recv(socket, dropped, sizeof(dropped), 0) > 0; ++i) {
    }
}

struct EgressSlot {
    EgressSlot() = default;
    EgressSlot(const EgressSlot&) = delete;
    EgressSlot& operator=(const EgressSlot&) = delete;
    ~EgressSlot() { egress_connections.fetch_sub(1); }
};

void relay_egress(int raw_socket, const ListenAddress& host)
{
    const EgressSlot slot;
    try {
        const Fd tool(raw_socket);
        // The relay passes on whatever it reads at once; Nagle's wait for the tool's ACK on
        // top would hold a tunnel's small answers back by the delayed-ACK time (40 ms).
        const int one = 1;
        ::setsockopt(tool.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        const Fd upstream = connect_host(host);
        if (!upstream) {
            // ECONNRESET or ECONNREFUSED: the host has no proxy for this sandbox.
            answer_and_close(tool.get(), egress_off_answer());
            return;
        }
        const PumpEnd end = pump_bytes(tool.get(), upstream.get(), "", "");
        if (!end.clean && end.error != ECONNRESET && end.error != EPIPE && end.error != ENOTCONN)
            egress_log.warn(std::string(end.call) + ": " + std::strerror(end.error));
    } catch (const std::exception& e) {
        egress_log.warn(std::string("connection: ") + e.what());
    } catch (...) {
        egress_log.warn("connection: unknown exception");
    }
}

[[noreturn]] void accept_egress(Fd listener, ListenAddress host)
{
    for (;;) {
        Fd socket(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
        if (!socket) {
            const int err = errno;
            if (err != EINTR && err != ECONNABORTED) {
                egress_log.warn(std::string("accept: ") + std::strerror(err));
                std::this_thread::sleep_for(std::chrono::milliseconds(10));
            }
            continue;
        }
        if (egress_connections.load() >= max_egress_connections) {
            egress_log.warn("too many connections out at once (" + std::to_string(max_egress_connections) + ")");
            ::close(socket.release());  // the tool sees a reset; its retry may find room
            continue;
        }
        egress_connections.fetch_add(1);
        try {
            std::thread(relay_egress, socket.get(), host).detach();
            socket.release();  // the thread's now
        } catch (const std::exception& e) {
            egress_connections.fetch_sub(1);
            egress_log.warn(std::string("thread: ") + e.what());
        }
    }
}

} // namespace

std::string egress_off_answer()
{
    const std::string body = "agentvm egress: this sandbox has no egress policy, so it may not connect out\n";
    return "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: " + std::to_string(body.size())
         + "\r\nConnection: close\r\n\r\n" + body;
}

void start_egress_relay(uint16_t port, const ListenAddress& host, const std::string& host_spec)
{
    Fd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    const int one = 1;
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (!listener || ::setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0
        || ::bind(listener.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0
        || ::listen(listener.get(), 256) != 0) {
        std::fprintf(stderr, "agentvm-agent: egress: listening on 127.0.0.1:%u: %s; no egress\n", port,
                     std::strerror(errno));
        return;
    }
    try {
        std::thread(accept_egress, std::move(listener), host).detach();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "agentvm-agent: egress: thread: %s; no egress\n", e.what());
        return;
    }
    std::fprintf(stderr, "agentvm-agent: egress: 127.0.0.1:%u to the host's %s\n", port, host_spec.c_str());
}

} // namespace agentvm
