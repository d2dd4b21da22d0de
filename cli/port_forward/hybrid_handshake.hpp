// The way to a guest's TCP port through a VM's --vsock-uds socket: Firecracker's hybrid
// vsock handshake to the guest's port-forward service on vsock port 53 (`CONNECT 53` answered
// `OK <n>`; the VMM's side is vmm/vsock_host.cpp), then that service's own request,
// `PORT <P>`, answered `OK` (the stream is now the guest's TCP connection to port P) or
// `ERR <reason>`. Every line ends in '\n' and has at most 64 bytes.
#pragma once

#include <cstdint>

#include "cli/port_forward/handshake.hpp"

namespace agentvm {

// The guest's port-forward service listens on this vsock port.
inline constexpr uint32_t port_forward_vsock_port = 53;
inline constexpr size_t max_handshake_line = 64;

class HybridVsockHandshake final : public Handshake {
public:
    explicit HybridVsockHandshake(uint16_t guest_port) : guest_port_(guest_port) {}

    std::string opening() override;
    HandshakeStep advance(std::string& received, bool eof) override;

private:
    enum class Stage { connect_answer, port_answer };

    uint16_t guest_port_;
    Stage stage_ = Stage::connect_answer;
};

} // namespace agentvm
