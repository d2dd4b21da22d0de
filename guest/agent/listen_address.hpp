// Where the agent listens: "vsock:PORT" in a guest (any CID, so the host reaches it as
// the guest's CID), "unix:PATH" for tests on the host.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/fd.hpp"

namespace agentvm {

constexpr uint32_t default_agent_port = 52;
// The port relay's (port_relay.hpp): the host reaches the guest's TCP servers through it.
constexpr uint32_t default_ports_port = 53;

struct ListenAddress {
    enum class Kind { vsock, unix_socket };
    Kind kind = Kind::vsock;
    uint32_t port = default_agent_port;
    std::string path;
};

// Throws Error on anything but "vsock:PORT" (1..4294967294) or "unix:PATH".
ListenAddress parse_listen_address(std::string_view text);

// A listening socket, close-on-exec. A stale unix socket file at PATH is replaced.
Fd listen_on(const ListenAddress& address);

} // namespace agentvm
