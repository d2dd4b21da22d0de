// Inbound ports (docs/protocol.md, "Guest ports (vsock port 53)"): a sandbox has no NIC, so
// the host reaches a TCP server in the guest through the agent. Each connection to the relay
// names a port in one request line, "PORT <p>\n"; the relay connects to 127.0.0.1:p (or
// [::1]:p when that is refused), answers "OK\n" and carries the bytes both ways
// (byte_pump.hpp), or answers "ERR <reason>\n" and closes. A thread per connection, at most
// max_relayed_connections at once. Nothing a connection does ends or stalls the agent or its
// tool calls.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "guest/agent/listen_address.hpp"

namespace agentvm {

constexpr size_t max_relayed_connections = 1024;
// The request line, "\n" included, is at most this long, and comes this soon after accept.
constexpr size_t max_port_request_bytes = 16;
constexpr std::chrono::seconds port_request_timeout{10};
// An answer line, "\n" included, is at most this long: the host reads it with a small bound.
constexpr size_t max_port_answer_bytes = 64;
// Connecting to the guest's server (both tries) may take at most this long. Not less: a burst
// of connections past a server's listen backlog (Python's http.server keeps 5) has its SYNs
// dropped and resent by TCP at 1, 3, 7, 15 s..., which a client would wait out.
constexpr std::chrono::seconds port_connect_timeout{30};

// Listens at `address` (`spec` is how it was given, for the log) and serves it on a detached
// thread of its own. A failure to listen or to start that thread is reported on stderr and
// leaves the agent without the relay: its tool calls matter more, and init would only
// restart an agent that exited for it to fail again.
void start_port_relay(const ListenAddress& address, const std::string& spec);

} // namespace agentvm
