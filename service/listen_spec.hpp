// Where serve listens, from --listen: unix:PATH or tcp:HOST:PORT ([IPv6]:PORT in brackets), or a
// socket systemd passed it (service/systemd/listen_fds.hpp), described by what it is bound to.
#pragma once

#include <cstdint>
#include <string>

namespace agentvm {

struct ListenSpec {
    bool tcp = false;
    std::string path;  // unix
    std::string host;  // tcp, without brackets
    uint16_t port = 0;
    int inherited_fd = -1;  // a listening socket serve was given, not one to make

    // 127.0.0.0/8, ::1 or localhost.
    bool loopback() const;
    std::string text() const;
};

// Throws Error naming the problem.
ListenSpec parse_listen_spec(const std::string& text);

} // namespace agentvm
