// `agentvm port-forward`'s loop: accepts local connections and gives each its own stream to
// the guest's port (guest_dial.hpp), then copies bytes both ways (splice.hpp), until stopped.
//
// One thread and poll(2), not the VMM's io_uring EventLoop (core/event_loop.hpp): this runs
// where the user is, not where the VMM is, and that is often a container whose seccomp
// profile refuses io_uring (Docker's default since 25.0, containerd's RuntimeDefault). With
// poll, a non-blocking connect waits for writability like any other step, and each
// direction's one fixed buffer is all a connection holds (the loop's AsyncWriter queues
// copies with no bound of its own). A forward holds a handful to a few hundred connections,
// so rebuilding the poll set on each wake costs less than the copies it schedules.
#pragma once

#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <string>

#include "cli/port_forward/guest_dial.hpp"
#include "cli/port_forward/splice.hpp"
#include "common/fd.hpp"
#include "common/warn_limiter.hpp"

namespace agentvm {

class Forwarder {
public:
    // Past the guest relay's own 30 s for a server whose listen backlog is full.
    static constexpr std::chrono::milliseconds default_handshake_timeout{40000};

    // listener: a listening socket, non-blocking. guest_port: for log lines.
    Forwarder(int listener, GuestRoute route, uint16_t guest_port,
              std::chrono::milliseconds handshake_timeout = default_handshake_timeout);
    ~Forwarder();
    Forwarder(const Forwarder&) = delete;
    Forwarder& operator=(const Forwarder&) = delete;

    // Serves until stop_fd polls readable (a signalfd in the command, an eventfd in tests),
    // then closes every connection; the caller closes the listener. Throws Error when poll
    // itself fails.
    void run(int stop_fd);

private:
    struct Connection;

    void accept_all();
    // After its sockets polled: moves the connection on. False when it is over.
    bool step(Connection& connection, short client_revents, short far_revents);
    void dialed(Connection& connection);
    void refuse(Connection& connection, const std::string& why);

    int listener_;
    GuestRoute route_;
    uint16_t guest_port_;
    std::chrono::milliseconds handshake_timeout_;
    std::list<std::unique_ptr<Connection>> connections_;
    uint64_t next_id_ = 1;
    // Out of descriptors (EMFILE): accepting waits for a connection to end, or a second.
    bool accept_paused_ = false;
    std::chrono::steady_clock::time_point accept_resume_{};
    WarnLimiter warn_limiter_{20, std::chrono::seconds(10)};
};

} // namespace agentvm
