#include "service/ports/byte_tunnel.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

namespace agentvm {

namespace {

constexpr uint64_t turn_budget = 4 * 1024 * 1024;

} // namespace

std::shared_ptr<ByteTunnel> ByteTunnel::join(SocketPoller& poller, BorrowedSocket client, std::string to_guest,
                                             Fd guest, std::string to_client, std::function<void()> on_closed)
{
    std::shared_ptr<ByteTunnel> tunnel(new ByteTunnel(poller, std::move(client), std::move(guest), std::move(on_closed)));
    tunnel->to_guest_.pending = std::move(to_guest);
    tunnel->to_client_.pending = std::move(to_client);
    tunnel->start();
    return tunnel;
}

ByteTunnel::ByteTunnel(SocketPoller& poller, BorrowedSocket client, Fd guest, std::function<void()> on_closed)
    : poller_(poller), client_(std::move(client)), guest_(std::move(guest)), on_closed_(std::move(on_closed))
{
    to_guest_.from = client_.fd;
    to_guest_.to = guest_.get();
    to_client_.from = guest_.get();
    to_client_.to = client_.fd;
}

ByteTunnel::~ByteTunnel()
{
    if (!closed_) {
        poller_.remove(client_.fd);
        poller_.remove(guest_.get());
        if (client_.close)
            client_.close();
    }
}

void ByteTunnel::start()
{
    auto self = weak_from_this();
    auto on_ready = [self](uint32_t) {
        if (auto tunnel = self.lock())
            tunnel->pump();
    };
    poller_.add(client_.fd, on_ready);
    poller_.add(guest_.get(), on_ready);
    pump();
}

void ByteTunnel::pump()
{
    // Keeps the tunnel alive through close(), which lets its owner drop it.
    const auto keep = shared_from_this();
    // Until neither direction moves a byte: with edge-triggered readiness, a side left
    // unread while its buffer was full is read again once the buffer has drained. A busy
    // tunnel yields after turn_budget, asking the poller to come back, so that one large
    // transfer never holds up serve's loop.
    const uint64_t start = to_guest_.moved + to_client_.moved;
    while (!closed_) {
        const uint64_t before = to_guest_.moved + to_client_.moved;
        const size_t held = to_guest_.pending.size() + to_client_.pending.size();
        if (!move(to_guest_) || !move(to_client_))
            return;
        if (to_guest_.done && to_client_.done)
            return close();
        if (to_guest_.moved + to_client_.moved == before && to_guest_.pending.size() + to_client_.pending.size() == held)
            return;
        if (to_guest_.moved + to_client_.moved - start >= turn_budget)
            return poller_.again(guest_.get());
    }
}

bool ByteTunnel::move(Direction& direction)
{
    if (direction.done)
        return true;
    char buffer[64 * 1024];
    const uint64_t entry = direction.moved;
    for (;;) {
        if (direction.moved - entry >= turn_budget)
            return true;  // pump() asks to come back
        while (!direction.pending.empty()) {
            const ssize_t sent = ::send(direction.to, direction.pending.data(), direction.pending.size(),
                                        MSG_NOSIGNAL | MSG_DONTWAIT);
            if (sent < 0 && errno == EINTR)
                continue;
            if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return true;  // the poller tells when it can take more
            if (sent <= 0) {
                close();
                return false;
            }
            direction.pending.erase(0, static_cast<size_t>(sent));
            direction.moved += static_cast<uint64_t>(sent);
            if (on_moved_ && !on_moved_(static_cast<uint64_t>(sent))) {
                close();
                return false;
            }
        }
        if (direction.source_ended) {
            ::shutdown(direction.to, SHUT_WR);
            direction.done = true;
            return true;
        }
        const size_t room = std::min(sizeof buffer, buffer_bytes - direction.pending.size());
        const ssize_t got = ::recv(direction.from, buffer, room, MSG_DONTWAIT);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return true;
        if (got < 0) {
            close();
            return false;
        }
        if (got == 0)
            direction.source_ended = true;
        else
            direction.pending.append(buffer, static_cast<size_t>(got));
    }
}

void ByteTunnel::close()
{
    if (closed_)
        return;
    closed_ = true;
    poller_.remove(client_.fd);
    poller_.remove(guest_.get());
    guest_.reset();
    if (client_.close)
        std::exchange(client_.close, nullptr)();
    if (auto on_closed = std::exchange(on_closed_, nullptr))
        on_closed();
}

} // namespace agentvm
