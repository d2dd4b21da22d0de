#include "service/ports/guest_port_dialer.hpp"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace agentvm {

namespace {

// The longest line either end of the handshake sends: "OK 4294967295\n" from the VMM, and
// the relay's "ERR <reason>\n", which it keeps short. More without a newline is not ours.
constexpr size_t max_handshake_line = 512;

} // namespace

std::shared_ptr<GuestPortDialer> GuestPortDialer::dial(EventLoop& loop, SocketPoller& poller,
                                                       const std::string& vsock_path, uint16_t port,
                                                       Handlers handlers)
{
    std::shared_ptr<GuestPortDialer> dialer(new GuestPortDialer(loop, poller, port, std::move(handlers)));
    dialer->start(vsock_path);
    return dialer;
}

GuestPortDialer::GuestPortDialer(EventLoop& loop, SocketPoller& poller, uint16_t port, Handlers handlers)
    : poller_(poller), port_(port), handlers_(std::move(handlers)), timer_(loop, [this] { on_timer(); })
{
}

void GuestPortDialer::on_timer()
{
    if (unreachable_)
        return fail(fmt::format("guest port {}: the sandbox's VM takes no connections (its vsock socket: {})", port_,
                                *unreachable_),
                    false);
    fail(fmt::format("guest port {}: no answer within {} s", port_, guest_port_handshake_timeout.count()), false);
}

void GuestPortDialer::fail_soon(std::string why)
{
    // Never inside dial(): its caller is not ready for an answer yet.
    unreachable_ = std::move(why);
    timer_.arm(std::chrono::nanoseconds(1));
}

GuestPortDialer::~GuestPortDialer()
{
    if (socket_)
        poller_.remove(socket_.get());
}

void GuestPortDialer::start(const std::string& vsock_path)
{
    timer_.arm(guest_port_handshake_timeout);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    if (vsock_path.empty() || vsock_path.size() >= sizeof address.sun_path)
        return fail_soon("none");
    std::memcpy(address.sun_path, vsock_path.data(), vsock_path.size());
    socket_ = Fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!socket_ || ::connect(socket_.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
        // A Unix socket connects at once or not at all: EAGAIN is a full backlog.
        const int err = errno;
        socket_.reset();
        return fail_soon(std::strerror(err));
    }
    auto self = weak_from_this();
    poller_.add(socket_.get(), [self](uint32_t) {
        if (auto dialer = self.lock())
            dialer->on_ready();
    });
    if (!send_line(fmt::format("CONNECT {}\n", guest_ports_vsock_port)))
        fail_soon("sending CONNECT failed");
}

bool GuestPortDialer::send_line(const std::string& line)
{
    // The socket is fresh (or its only bytes were read): a line this short fits its buffer.
    const ssize_t sent = ::send(socket_.get(), line.data(), line.size(), MSG_NOSIGNAL);
    return sent == static_cast<ssize_t>(line.size());
}

void GuestPortDialer::on_ready()
{
    if (done_)
        return;
    char buffer[max_handshake_line];
    for (;;) {
        const ssize_t got = ::recv(socket_.get(), buffer, sizeof buffer, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (got <= 0)
            return fail(vmm_answered_ ? fmt::format("guest port {}: the guest's port relay closed the connection "
                                                    "without answering",
                                                    port_)
                                      : fmt::format("guest port {}: the sandbox's guest refused the connection to "
                                                    "its port relay (vsock port {})",
                                                    port_, guest_ports_vsock_port),
                        false);
        received_.append(buffer, static_cast<size_t>(got));
        for (;;) {
            const size_t newline = received_.find('\n');
            if (newline == std::string::npos) {
                if (received_.size() > max_handshake_line)
                    return fail(fmt::format("guest port {}: the handshake's answer is over {} bytes", port_,
                                            max_handshake_line),
                                false);
                break;
            }
            const std::string line = received_.substr(0, newline);
            received_.erase(0, newline + 1);
            if (!vmm_answered_) {
                if (!line.starts_with("OK "))
                    return fail(fmt::format("guest port {}: the VMM answered '{:.64}' to CONNECT", port_, line), false);
                vmm_answered_ = true;
                if (!send_line(fmt::format("PORT {}\n", port_)))
                    return fail(fmt::format("guest port {}: sending the port to the guest's relay failed", port_),
                                false);
                continue;
            }
            if (line == "OK")
                return finish();
            if (line.starts_with("ERR "))
                return fail(line.substr(4), true);
            return fail(fmt::format("guest port {}: the guest's relay answered '{:.64}'", port_, line), false);
        }
    }
}

void GuestPortDialer::fail(const std::string& why, bool refused)
{
    if (done_)
        return;
    done_ = true;
    timer_.cancel();
    if (socket_) {
        poller_.remove(socket_.get());
        socket_.reset();
    }
    auto on_fail = std::move(handlers_.on_fail);
    handlers_ = {};
    on_fail(why, refused);
}

void GuestPortDialer::finish()
{
    done_ = true;
    timer_.cancel();
    poller_.remove(socket_.get());
    auto on_open = std::move(handlers_.on_open);
    handlers_ = {};
    on_open(DialedPort{std::move(socket_), std::exchange(received_, {})});
}

void GuestPortDialer::cancel()
{
    done_ = true;
    timer_.cancel();
    handlers_ = {};
    if (socket_) {
        poller_.remove(socket_.get());
        socket_.reset();
    }
}

} // namespace agentvm
