#include "cli/port_forward/forwarder.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.hpp"

namespace agentvm {

struct Forwarder::Connection {
    uint64_t id = 0;
    std::string peer;
    Fd client;
    std::unique_ptr<GuestDial> dial;  // until the handshake is done
    std::unique_ptr<Splice> splice;   // after
    std::chrono::steady_clock::time_point deadline;
};

namespace {

// Bytes are passed on as they come: the sender has already chosen its segments, and Nagle's
// wait on our side would only add a round trip to every small exchange.
void no_delay(int fd)
{
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // fails harmlessly on a Unix socket
}

int poll_timeout(std::chrono::steady_clock::time_point now, std::chrono::steady_clock::time_point until)
{
    if (until <= now)
        return 0;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - now).count();
    return static_cast<int>(std::min<int64_t>(left, 60'000));
}

} // namespace

Forwarder::Forwarder(int listener, GuestRoute route, uint16_t guest_port, std::chrono::milliseconds handshake_timeout)
    : listener_(listener), route_(std::move(route)), guest_port_(guest_port), handshake_timeout_(handshake_timeout)
{
}

Forwarder::~Forwarder() = default;

void Forwarder::refuse(Connection& connection, const std::string& why)
{
    uint64_t suppressed = 0;
    if (warn_limiter_.allow(&suppressed))
        spdlog::warn("connection {} from {} to guest port {}: {}; closing it{}", connection.id, connection.peer,
                     guest_port_, why,
                     suppressed ? fmt::format(" ({} more such warnings were not shown)", suppressed) : "");
}

void Forwarder::run(int stop_fd)
{
    using Clock = std::chrono::steady_clock;
    std::vector<pollfd> fds;
    for (;;) {
        const Clock::time_point now = Clock::now();
        if (accept_paused_ && now >= accept_resume_)
            accept_paused_ = false;
        fds.clear();
        fds.push_back({stop_fd, POLLIN, 0});
        fds.push_back({accept_paused_ ? -1 : listener_, POLLIN, 0});
        Clock::time_point wake = now + std::chrono::hours(1);
        if (accept_paused_)
            wake = std::min(wake, accept_resume_);
        // Two slots per connection: its client, and its far end (the dial's socket, then the
        // guest's stream). A socket with nothing to wait for gets -1, which poll skips.
        for (const auto& connection : connections_) {
            if (connection->dial) {
                fds.push_back({-1, 0, 0});
                fds.push_back({connection->dial->fd(), connection->dial->events(), 0});
                wake = std::min(wake, connection->deadline);
                continue;
            }
            const short client_events = connection->splice->client_events();
            const short guest_events = connection->splice->guest_events();
            fds.push_back({client_events ? connection->splice->client_fd() : -1, client_events, 0});
            fds.push_back({guest_events ? connection->splice->guest_fd() : -1, guest_events, 0});
        }
        if (::poll(fds.data(), fds.size(), poll_timeout(now, wake)) < 0) {
            if (errno == EINTR)
                continue;
            throw_errno("port-forward: poll");
        }
        if (fds[0].revents != 0)
            break;
        size_t slot = 2;
        for (auto it = connections_.begin(); it != connections_.end();) {
            const short client_revents = fds[slot].revents;
            const short far_revents = fds[slot + 1].revents;
            slot += 2;
            if (step(**it, client_revents, far_revents)) {
                ++it;
            } else {
                it = connections_.erase(it);
                accept_paused_ = false;  // a descriptor is free again
            }
        }
        if (fds[1].revents != 0)
            accept_all();
    }
    if (!connections_.empty())
        spdlog::info("stopping: closing {} connection{}", connections_.size(), connections_.size() == 1 ? "" : "s");
    connections_.clear();
}

void Forwarder::accept_all()
{
    // A bounded batch, so a flood of connects cannot starve the connections already open.
    for (int accepted = 0; accepted < 64; ++accepted) {
        Fd client(::accept4(listener_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
        if (!client) {
            const int err = errno;
            if (err == EAGAIN || err == EWOULDBLOCK)
                return;
            if (err == EINTR || err == ECONNABORTED || err == EPROTO)
                continue;
            // Out of descriptors or memory (or something stranger): the pending connection
            // stays queued, and accepting waits rather than spinning on it.
            uint64_t suppressed = 0;
            if (warn_limiter_.allow(&suppressed))
                spdlog::warn("accepting a connection: {}; trying again when a connection ends or in a second",
                             std::strerror(err));
            accept_paused_ = true;
            accept_resume_ = std::chrono::steady_clock::now() + std::chrono::seconds(1);
            return;
        }
        no_delay(client.get());
        auto connection = std::make_unique<Connection>();
        connection->id = next_id_++;
        connection->peer = peer_text(client.get());
        connection->client = std::move(client);
        connection->deadline = std::chrono::steady_clock::now() + handshake_timeout_;
        connection->dial = std::make_unique<GuestDial>(route_);
        spdlog::debug("connection {} from {}: dialing guest port {}", connection->id, connection->peer, guest_port_);
        if (connection->dial->state() == GuestDial::State::failed) {
            refuse(*connection, connection->dial->failure());
            continue;
        }
        connections_.push_back(std::move(connection));
    }
}

bool Forwarder::step(Connection& connection, short client_revents, short far_revents)
{
    if (connection.dial) {
        connection.dial->on_ready(far_revents);
        switch (connection.dial->state()) {
        case GuestDial::State::done:
            dialed(connection);
            return !connection.splice->finished();
        case GuestDial::State::failed:
            refuse(connection, connection.dial->failure());
            return false;
        case GuestDial::State::connecting:
        case GuestDial::State::handshaking:
            break;
        }
        if (std::chrono::steady_clock::now() >= connection.deadline) {
            connection.dial->time_out(handshake_timeout_);
            refuse(connection, connection.dial->failure());
            return false;
        }
        return true;
    }
    if (client_revents != 0 || far_revents != 0)
        connection.splice->pump();
    if (!connection.splice->finished())
        return true;
    const Splice& splice = *connection.splice;
    spdlog::debug("connection {} from {} closed: {} bytes to the guest, {} from it{}", connection.id, connection.peer,
                  splice.bytes_up(), splice.bytes_down(), splice.problem().empty() ? "" : "; " + splice.problem());
    return false;
}

void Forwarder::dialed(Connection& connection)
{
    Fd stream = connection.dial->take_stream();
    std::string early = connection.dial->take_early_bytes();
    connection.dial.reset();
    no_delay(stream.get());
    connection.splice = std::make_unique<Splice>(std::move(connection.client), std::move(stream), std::move(early));
    spdlog::debug("connection {} from {}: forwarding to guest port {}", connection.id, connection.peer, guest_port_);
    // The guest's first bytes may have come with the handshake, and the client's may be
    // waiting already.
    connection.splice->pump();
}

} // namespace agentvm
