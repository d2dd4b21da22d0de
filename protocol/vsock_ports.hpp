// The vsock ports the guest agent and the host meet on (docs/protocol.md): one definition for
// both ends, the agent (guest/) and the host's episode, serve and VMM users.
#pragma once

#include <cstdint>

namespace agentvm {

// The agent's tool calls: it listens, the host connects.
inline constexpr uint32_t agent_vsock_port = 52;
// The agent's port relay (guest TCP ports reached from the host): it listens, the host connects.
inline constexpr uint32_t guest_ports_vsock_port = 53;
// The host's egress proxy: the agent's egress relay connects to this host port, which the VMM
// turns into "<--vsock-uds>_3128".
inline constexpr uint32_t egress_vsock_port = 3128;
// The guest's 127.0.0.1 TCP port where the egress relay listens, which HTTP_PROXY names.
inline constexpr uint16_t egress_proxy_tcp_port = 3128;

} // namespace agentvm
