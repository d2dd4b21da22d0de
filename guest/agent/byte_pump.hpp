// The data path of the port relay (port_relay.hpp): copies a byte stream both ways between
// two connected stream sockets, unchanged, until both directions have ended or either side
// fails. Each direction holds at most pump_buffer_bytes; while its buffer is full the pump
// stops reading that direction's source, so a slow reader stalls only its own pair of
// sockets, and the agent's memory per relayed connection stays bounded.
#pragma once

#include <cstddef>
#include <string_view>

namespace agentvm {

constexpr size_t pump_buffer_bytes = 64 * 1024;

// How a pump ended: cleanly (both directions reached end-of-file and were passed on), or
// with the errno of the call that failed (a reset peer shows as ECONNRESET or EPIPE).
struct PumpEnd {
    bool clean = true;
    int error = 0;
    const char* call = "";
};

// Relays between the connected sockets `a` and `b`, which stay the caller's to close. `to_a`
// and `to_b` (at most pump_buffer_bytes each) are sent ahead of what the other side sends.
// End-of-file from one side becomes shutdown(SHUT_WR) on the other. Never blocks on one
// socket while the other has work: it polls both, and sends and receives with MSG_DONTWAIT.
PumpEnd pump_bytes(int a, int b, std::string_view to_a, std::string_view to_b);

} // namespace agentvm
