// Egress (docs/protocol.md, "Egress proxy"): a sandbox has no NIC, so its tools reach the
// outside only through the host's egress proxy, and only where the sandbox's policy allows.
// The agent listens on the guest's 127.0.0.1:egress_proxy_tcp_port (what HTTP_PROXY and
// HTTPS_PROXY name in every call of a sandbox with a policy) and carries each connection's
// bytes, unchanged, to the host over vsock (host port egress_vsock_port; both in
// protocol/vsock_ports.hpp): the host reads the proxy request, decides and connects; the
// agent decides nothing. When the host takes no
// connection there (a sandbox without a policy), the agent answers the tool itself with a 403
// saying so. A thread per connection, at most max_egress_connections at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "guest/agent/listen_address.hpp"

namespace agentvm {

constexpr size_t max_egress_connections = 256;

// The answer to a tool when the host takes no egress connection: a whole HTTP/1.1 403, closed.
std::string egress_off_answer();

// Listens on 127.0.0.1:`port` and relays every connection to `host` ("vsock:P" connects to
// the host's CID, "unix:PATH" for the host tests), on a detached thread of its own. A
// failure to listen is reported on stderr and leaves the agent without egress.
void start_egress_relay(uint16_t port, const ListenAddress& host, const std::string& host_spec);

} // namespace agentvm
