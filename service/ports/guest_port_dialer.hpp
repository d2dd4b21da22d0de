// Opens a stream to a TCP port inside a sandbox's guest: the VMM's end of vsock listens on a
// Unix socket (`agentvm episode --vsock-uds`, Firecracker's hybrid convention), where
// "CONNECT 53" reaches the agent's port relay, and "PORT <p>" there connects to the guest's
// port p (docs/protocol.md, "Guest ports"). Every step is non-blocking on serve's loop and the
// whole handshake is bounded in time; the guest's lines are bounded in length.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "common/fd.hpp"
#include "core/loop_timer.hpp"
#include "protocol/vsock_ports.hpp"
#include "service/ports/socket_poller.hpp"

namespace agentvm {

// Past the relay's own 30 s for a server whose listen backlog is full (docs/protocol.md).
inline constexpr std::chrono::seconds guest_port_handshake_timeout{40};

struct DialedPort {
    Fd socket;            // non-blocking, the guest's TCP connection from here on
    std::string early;    // stream bytes that came with the relay's answer
};

class GuestPortDialer : public std::enable_shared_from_this<GuestPortDialer> {
public:
    // Exactly one of the two runs, once, on the loop: with the stream, or with why not
    // (`refused`: the guest answered, e.g. nothing listens; else the VM did not).
    struct Handlers {
        std::function<void(DialedPort)> on_open;
        std::function<void(const std::string& why, bool refused)> on_fail;
    };

    static std::shared_ptr<GuestPortDialer> dial(EventLoop& loop, SocketPoller& poller, const std::string& vsock_path,
                                                 uint16_t port, Handlers handlers);
    ~GuestPortDialer();
    GuestPortDialer(const GuestPortDialer&) = delete;
    GuestPortDialer& operator=(const GuestPortDialer&) = delete;

    // The requester went away: nothing runs any more and the socket is closed.
    void cancel();

private:
    GuestPortDialer(EventLoop& loop, SocketPoller& poller, uint16_t port, Handlers handlers);
    void start(const std::string& vsock_path);
    void on_ready();
    void on_timer();
    void fail_soon(std::string why);
    bool send_line(const std::string& line);
    void fail(const std::string& why, bool refused);
    void finish();

    SocketPoller& poller_;
    uint16_t port_;
    Handlers handlers_;
    Fd socket_;
    LoopTimer timer_;
    std::string received_;
    bool vmm_answered_ = false;  // the VMM's "OK <n>" has come: the relay speaks next
    bool done_ = false;
    std::optional<std::string> unreachable_;  // why the VM could not be reached, told on the loop
};

} // namespace agentvm
