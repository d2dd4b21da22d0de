// Where the agent listens: "vsock:PORT" in a guest (any CID, so the host reaches it as
// the guest's CID), "unix:PATH" for tests on the host.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/fd.hpp"
#include "protocol/vsock_ports.hpp"

namespace agentvm {

struct ListenAddress {
    enum class Kind { vsock, unix_socket };
    Kind kind = Kind::vsock;
    uint32_t port = agent_vsock_port;
    std::string path;
};

// Throws Error on anything but "vsock:PORT" (1..4294967294) or "unix:PATH".
ListenAddress parse_listen_address(std::string_view text);

// A listening socket, close-on-exec. A stale unix socket file at PATH is replaced.
Fd listen_on(const ListenAddress& address);

} // namespace agentvm
