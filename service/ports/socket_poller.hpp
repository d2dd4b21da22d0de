// Readiness of many non-blocking sockets on serve's event loop through one epoll fd, which the
// loop watches (as it watches MHD's): the guest-port connections read and write their sockets
// directly when told they are ready, so no read or write is ever in flight on the loop's ring
// when a connection closes, and closing one is just closing its socket.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>

#include "core/event_loop.hpp"
#include "common/fd.hpp"

namespace agentvm {

class SocketPoller {
public:
    // events: EPOLLIN, EPOLLOUT, EPOLLRDHUP, EPOLLHUP, EPOLLERR as epoll reports them.
    using OnReady = std::function<void(uint32_t events)>;

    explicit SocketPoller(EventLoop& loop);
    ~SocketPoller();
    SocketPoller(const SocketPoller&) = delete;
    SocketPoller& operator=(const SocketPoller&) = delete;

    // Edge-triggered: on_ready runs when fd becomes readable or writable (or hangs up), and the
    // owner reads and writes until EAGAIN. Throws Error if epoll refuses the fd.
    void add(int fd, OnReady on_ready);
    // Before the fd is closed; on_ready is not called for it again, even within this turn.
    void remove(int fd);
    // Reports fd's readiness again on the loop's next turn, as if it had just become ready:
    // for an owner that stopped before EAGAIN to let others run.
    void again(int fd);
    size_t watched() const { return watched_.size(); }

private:
    void dispatch();

    EventLoop& loop_;
    Fd epoll_;
    // shared_ptr: a callback may remove its own fd (and so its own OnReady) while it runs.
    std::unordered_map<int, std::shared_ptr<OnReady>> watched_;
};

} // namespace agentvm
