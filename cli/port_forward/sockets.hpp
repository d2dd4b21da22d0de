// The sockets of `agentvm port-forward`: addresses resolved once at start, the listening
// socket (and the Unix socket file it owns), and the non-blocking connects to the far end.
// Every socket here is non-blocking and close-on-exec.
#pragma once

#include <sys/socket.h>

#include <string>
#include <vector>

#include "cli/port_forward/address.hpp"
#include "common/fd.hpp"

namespace agentvm {

struct SocketAddress {
    sockaddr_storage storage{};
    socklen_t length = 0;
    std::string text;  // for messages: unix:PATH, HOST:PORT or [IPV6]:PORT

    const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
};

// A Unix endpoint's one address, or every address a TCP endpoint's host resolves to, in the
// resolver's order. Throws Error naming the host that could not be resolved.
std::vector<SocketAddress> resolve(const Endpoint& endpoint, bool passive = false);

// The address of a socket's peer (getpeername), for log lines; "" when it has none.
std::string peer_text(int fd);

// The listening socket. A Unix socket's file is created mode 0600 (what reaches it reaches
// the guest's port) and removed by the destructor if it is still the one created.
class Listener {
public:
    // Throws Error: the address is in use, a Unix path is taken by something else, ...
    explicit Listener(const Endpoint& endpoint);
    ~Listener();
    Listener(const Listener&) = delete;
    Listener& operator=(const Listener&) = delete;

    int fd() const { return fd_.get(); }
    // Where it listens, the port the kernel picked included: 127.0.0.1:40123, unix:PATH.
    const std::string& text() const { return text_; }

private:
    Fd fd_;
    std::string text_;
    std::string unix_path_;
    dev_t unix_dev_ = 0;
    ino_t unix_ino_ = 0;
};

// Starts a non-blocking connect. Returns the socket, with *in_progress true when the connect
// finishes later (the socket polls writable; SO_ERROR then says how it went); or an empty Fd
// with *err set.
Fd start_connect(const SocketAddress& address, bool* in_progress, int* err);

} // namespace agentvm
