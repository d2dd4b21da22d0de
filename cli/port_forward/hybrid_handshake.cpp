#include "cli/port_forward/hybrid_handshake.hpp"

#include <fmt/format.h>

namespace agentvm {

std::string HybridVsockHandshake::opening()
{
    return fmt::format("CONNECT {}\n", port_forward_vsock_port);
}

HandshakeStep HybridVsockHandshake::advance(std::string& received, bool eof)
{
    using Kind = HandshakeStep::Kind;
    const size_t newline = received.find('\n');
    if (newline == std::string::npos || newline >= max_handshake_line) {
        if (received.size() >= max_handshake_line)
            return {Kind::refused, fmt::format("a line longer than {} bytes in answer to {}: '{}'", max_handshake_line,
                                               stage_ == Stage::connect_answer ? "CONNECT" : "PORT",
                                               printable(received, max_handshake_line))};
        if (!eof)
            return {};
        if (stage_ == Stage::connect_answer)
            // The VMM closes a CONNECT to a port nothing listens on (vmm/vsock_host.cpp).
            return {Kind::refused, fmt::format("the VM closed the connection on CONNECT {}: nothing in the guest "
                                               "listens on vsock port {} (its port-forward service)",
                                               port_forward_vsock_port, port_forward_vsock_port)};
        return {Kind::refused,
                fmt::format("the guest's port-forward service closed the connection on PORT {}", guest_port_)};
    }
    const std::string line = received.substr(0, newline);
    received.erase(0, newline + 1);
    if (stage_ == Stage::connect_answer) {
        const bool ok = line.size() > 3 && line.starts_with("OK ") &&
                        line.find_first_not_of("0123456789", 3) == std::string::npos;
        if (!ok)
            return {Kind::refused, fmt::format("the VM refused CONNECT {}: '{}'", port_forward_vsock_port,
                                               printable(line))};
        stage_ = Stage::port_answer;
        return {Kind::send, fmt::format("PORT {}\n", guest_port_)};
    }
    if (line == "OK")
        return {Kind::done, {}};
    if (line.starts_with("ERR ") || line == "ERR")
        return {Kind::refused, fmt::format("the guest refused port {}: {}", guest_port_,
                                           line.size() > 4 ? printable(line.substr(4)) : "(no reason given)")};
    return {Kind::refused, fmt::format("the guest answered PORT {} with '{}'", guest_port_, printable(line))};
}

} // namespace agentvm
