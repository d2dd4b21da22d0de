// One local connection's way to the guest's port: connect to the far end (a VM's
// --vsock-uds socket, or serve), then its handshake, without ever blocking, driven by the
// forwarder's poll loop; bounded by a deadline the loop enforces.
#pragma once

#include <poll.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cli/port_forward/handshake.hpp"
#include "cli/port_forward/sockets.hpp"
#include "common/fd.hpp"

namespace agentvm {

// Where every connection goes: the far end's addresses (tried in order until one connects)
// and a fresh handshake for each connection.
struct GuestRoute {
    std::vector<SocketAddress> addresses;
    std::function<std::unique_ptr<Handshake>()> handshake;
};

class GuestDial {
public:
    enum class State { connecting, handshaking, done, failed };

    // Starts the first connect; a far end that refuses at once leaves it failed already.
    explicit GuestDial(const GuestRoute& route);

    State state() const { return state_; }
    int fd() const { return fd_.get(); }
    // What to poll fd() for while connecting or handshaking.
    short events() const;
    // fd() polled with these revents.
    void on_ready(short revents);
    // The deadline passed: fails the dial.
    void time_out(std::chrono::milliseconds after);

    // failed: why, naming the far end.
    const std::string& failure() const { return failure_; }
    // done: the stream, and the guest's bytes that came with the handshake's last answer.
    Fd take_stream() { return std::move(fd_); }
    std::string take_early_bytes() { return std::move(received_); }

private:
    void connect_next();
    void start_handshake();
    void fail(std::string why);
    void read_answer();
    void write_pending();

    const GuestRoute& route_;
    size_t next_address_ = 0;
    std::string connect_errors_;
    Fd fd_;
    State state_ = State::connecting;
    std::unique_ptr<Handshake> handshake_;
    std::string pending_;   // bytes of the handshake still to write
    std::string received_;  // bytes read and not consumed by the handshake
    std::string failure_;
};

} // namespace agentvm
