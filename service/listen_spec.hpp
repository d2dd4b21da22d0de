// Where serve listens, from --listen: unix:PATH or tcp:HOST:PORT ([IPv6]:PORT in brackets).
#pragma once

#include <cstdint>
#include <string>

namespace agentvm {

struct ListenSpec {
    bool tcp = false;
    std::string path;  // unix
    std::string host;  // tcp, without brackets
    uint16_t port = 0;

    // 127.0.0.0/8, ::1 or localhost.
    bool loopback() const;
    std::string text() const;
};

// Throws Error naming the problem.
ListenSpec parse_listen_spec(const std::string& text);

} // namespace agentvm
