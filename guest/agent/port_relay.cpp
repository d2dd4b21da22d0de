#include "guest/agent/port_relay.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <string_view>
#include <thread>

#include "common/fd.hpp"
#include "guest/agent/byte_pump.hpp"
#include "guest/agent/relay_log.hpp"

namespace agentvm {

namespace {

using RelayClock = std::chrono::steady_clock;

RelayLog relay_log("ports");
std::atomic<size_t> relayed_connections{0};

// Errors a peer causes by going away, which are no news.
bool is_peer_gone(int err)
{
    return err == ECONNRESET || err == EPIPE || err == ENOTCONN || err == ECONNABORTED || err == ETIMEDOUT;
}

// "ERR <reason>\n", cut to max_port_answer_bytes, on a fresh socket whose send buffer is
// empty: MSG_DONTWAIT never holds the thread, and a peer that is gone costs nothing. Then the
// end of our side, and what the client sent beyond the request line and is already here is
// read and dropped: closing a socket with unread bytes resets the connection, which the
// client might see instead of the end after the line.
void refuse_relay_client(int socket, std::string_view reason)
{
    std::string line = "ERR ";
    line.append(reason.substr(0, max_port_answer_bytes - line.size() - 1));
    line += '\n';
    [[maybe_unused]] const ssize_t n = ::send(socket, line.data(), line.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    ::shutdown(socket, SHUT_WR);
    char dropped[4096];
    for (int i = 0; i < 16 && ::recv(socket, dropped, sizeof(dropped), MSG_DONTWAIT) > 0; ++i) {
    }
}

struct PortRequest {
    uint16_t port = 0;        // 0: refused, with `error`
    std::string error;
    std::string surplus;      // bytes that came after the line, to pass on
};

// "PORT <p>": p decimal, 1..65535, no sign, no leading zeros.
std::optional<uint16_t> parse_port_line(std::string_view line)
{
    constexpr std::string_view prefix = "PORT ";
    if (!line.starts_with(prefix))
        return std::nullopt;
    const std::string_view digits = line.substr(prefix.size());
    if (digits.empty() || digits.size() > 5 || digits[0] == '0')
        return std::nullopt;
    uint32_t port = 0;
    for (char c : digits) {
        if (c < '0' || c > '9')
            return std::nullopt;
        port = port * 10 + static_cast<uint32_t>(c - '0');
    }
    if (port > 65535)
        return std::nullopt;
    return static_cast<uint16_t>(port);
}

// Reads at most max_port_request_bytes, so what follows the line stays in the socket unless it
// came in the same read; that part is kept in `surplus`.
PortRequest read_port_request(int socket, RelayClock::time_point deadline)
{
    char bytes[max_port_request_bytes];
    size_t have = 0;
    PortRequest request;
    for (;;) {
        if (const void* newline = std::memchr(bytes, '\n', have)) {
            const std::string_view line(bytes, static_cast<size_t>(static_cast<const char*>(newline) - bytes));
            if (const std::optional<uint16_t> port = parse_port_line(line)) {
                request.port = *port;
                request.surplus.assign(bytes + line.size() + 1, have - line.size() - 1);
            } else if (line.starts_with("PORT ")) {
                request.error = "port must be 1-65535, no sign or leading 0";
            } else {
                request.error = "expected \"PORT <1-65535>\" and a newline";
            }
            return request;
        }
        if (have == sizeof(bytes)) {
            request.error = "no newline within " + std::to_string(max_port_request_bytes) + " bytes";
            return request;
        }
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - RelayClock::now());
        if (left.count() <= 0) {
            request.error = "no request line within " + std::to_string(port_request_timeout.count()) + " s";
            return request;
        }
        pollfd polled{socket, POLLIN, 0};
        if (::poll(&polled, 1, static_cast<int>(left.count())) <= 0)
            continue;  // the deadline, or EINTR: looked at above
        const ssize_t n = ::recv(socket, bytes + have, sizeof(bytes) - have, MSG_DONTWAIT);
        if (n > 0) {
            have += static_cast<size_t>(n);
        } else if (n == 0) {
            request.error = "the connection ended before a request line";
            return request;
        } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            request.error = std::string("reading the request line: ") + std::strerror(errno);
            return request;
        }
    }
}

// A TCP connection to the guest's loopback, or the errno that stopped it (ETIMEDOUT past the
// deadline).
struct LoopbackTry {
    Fd socket;
    int error = 0;
};

LoopbackTry connect_loopback(int family, uint16_t port, RelayClock::time_point deadline)
{
    LoopbackTry result;
    result.socket = Fd(::socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!result.socket) {
        result.error = errno;
        return result;
    }
    sockaddr_in v4{};
    v4.sin_family = AF_INET;
    v4.sin_port = htons(port);
    v4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sockaddr_in6 v6{};
    v6.sin6_family = AF_INET6;
    v6.sin6_port = htons(port);
    v6.sin6_addr = in6addr_loopback;
    const bool is_v4 = family == AF_INET;
    const auto* address = is_v4 ? reinterpret_cast<const sockaddr*>(&v4) : reinterpret_cast<const sockaddr*>(&v6);
    const socklen_t size = is_v4 ? sizeof(v4) : sizeof(v6);
    int err = 0;
    if (::connect(result.socket.get(), address, size) != 0) {
        err = errno;
        while (err == EINPROGRESS || err == EINTR) {
            const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - RelayClock::now());
            if (left.count() <= 0) {
                err = ETIMEDOUT;
                break;
            }
            pollfd polled{result.socket.get(), POLLOUT, 0};
            if (::poll(&polled, 1, static_cast<int>(left.count())) <= 0)
                continue;
            socklen_t err_size = sizeof(err);
            if (::getsockopt(result.socket.get(), SOL_SOCKET, SO_ERROR, &err, &err_size) != 0)
                err = errno;
            break;
        }
    }
    if (err != 0) {
        result.socket.reset();
        result.error = err;
        return result;
    }
    // The relay passes on whatever it reads at once; Nagle's wait on top would only delay
    // the small writes of an interactive protocol.
    const int one = 1;
    ::setsockopt(result.socket.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return result;
}

// 127.0.0.1 first, [::1] when that is refused: a server may listen on either, or on both.
LoopbackTry connect_guest_port(uint16_t port, std::string* why)
{
    const auto deadline = RelayClock::now() + port_connect_timeout;
    const std::string name = "guest port " + std::to_string(port);
    LoopbackTry v4 = connect_loopback(AF_INET, port, deadline);
    if (v4.socket)
        return v4;
    LoopbackTry tried = std::move(v4);
    if (tried.error == ECONNREFUSED) {
        LoopbackTry v6 = connect_loopback(AF_INET6, port, deadline);
        if (v6.socket)
            return v6;
        // A guest kernel without IPv6, or a loopback without ::1, has no server there either.
        if (v6.error != EAFNOSUPPORT && v6.error != EADDRNOTAVAIL && v6.error != ENETUNREACH)
            tried = std::move(v6);
    }
    if (tried.error == ECONNREFUSED)
        *why = "nothing listens on " + name + " (connection refused)";
    else if (tried.error == ETIMEDOUT)
        *why = name + " did not accept the connection within " + std::to_string(port_connect_timeout.count()) + " s";
    else
        *why = name + ": " + std::strerror(tried.error);
    return tried;
}

// Gives back the connection's place, however its thread ends.
struct RelaySlot {
    RelaySlot() = default;
    RelaySlot(const RelaySlot&) = delete;
    RelaySlot& operator=(const RelaySlot&) = delete;
    ~RelaySlot() { relayed_connections.fetch_sub(1); }
};

void relay_connection(int raw_socket, RelayClock::time_point accepted)
{
    const RelaySlot slot;
    try {
        const Fd client(raw_socket);
        const PortRequest request = read_port_request(client.get(), accepted + port_request_timeout);
        if (request.port == 0) {
            refuse_relay_client(client.get(), "bad request: " + request.error);
            return;
        }
        std::string why;
        const LoopbackTry server = connect_guest_port(request.port, &why);
        if (!server.socket) {
            refuse_relay_client(client.get(), why);
            return;
        }
        // "OK\n" goes first on the client's side, the bytes that came with the request line
        // first on the server's.
        const PumpEnd end = pump_bytes(client.get(), server.socket.get(), "OK\n", request.surplus);
        if (!end.clean && !is_peer_gone(end.error))
            relay_log.warn("guest port " + std::to_string(request.port) + ": " + end.call + ": "
                           + std::strerror(end.error));
    } catch (const std::exception& e) {
        // Out of memory for the buffers, most likely; only this connection pays.
        relay_log.warn(std::string("connection: ") + e.what());
    } catch (...) {
        relay_log.warn("connection: unknown exception");
    }
}

[[noreturn]] void accept_relay_connections(Fd listener)
{
    for (;;) {
        Fd socket(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
        if (!socket) {
            // Out of descriptors or memory, or a peer that left before we accepted: wait a
            // little and go on; the listener itself is fine.
            const int err = errno;
            if (err != EINTR && err != ECONNABORTED) {
                relay_log.warn(std::string("accept: ") + std::strerror(err));
                std::this_thread::sleep_for(std::chrono::milliseconds(10));
            }
            continue;
        }
        const auto accepted = RelayClock::now();
        if (relayed_connections.load() >= max_relayed_connections) {
            const std::string line = "too many connections (" + std::to_string(max_relayed_connections) + " at once)";
            refuse_relay_client(socket.get(), line);
            relay_log.warn(line);
            continue;
        }
        relayed_connections.fetch_add(1);
        try {
            std::thread(relay_connection, socket.get(), accepted).detach();
            socket.release();  // the thread's now
        } catch (const std::exception& e) {
            relayed_connections.fetch_sub(1);
            refuse_relay_client(socket.get(), "the agent cannot start a thread for this connection");
            relay_log.warn(std::string("thread: ") + e.what());
        }
    }
}

} // namespace

void start_port_relay(const ListenAddress& address, const std::string& spec)
{
    Fd listener;
    try {
        listener = listen_on(address);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "agentvm-agent: ports: %s; no inbound ports\n", e.what());
        return;
    }
    // listen_on's backlog suits the host's few tool-call connections; a burst of inbound ones
    // (a browser opening a page's worth at once) should wait for accept, not be refused.
    // Linux takes a second listen() as a new backlog.
    ::listen(listener.get(), 256);
    try {
        std::thread(accept_relay_connections, std::move(listener)).detach();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "agentvm-agent: ports: thread: %s; no inbound ports\n", e.what());
        return;
    }
    std::fprintf(stderr, "agentvm-agent: ports: listening on %s\n", spec.c_str());
}

} // namespace agentvm
