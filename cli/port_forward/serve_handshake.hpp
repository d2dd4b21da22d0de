// The way to a guest's TCP port through `agentvm serve`: the upgrade request, then its answer
// (upgrade_head.hpp). A 101 makes the connection the guest's stream, and whatever came after
// the head is already the guest's bytes; any other answer is read with its body, up to
// max_upgrade_head bytes, for serve's error.
#pragma once

#include <optional>

#include "cli/port_forward/handshake.hpp"
#include "cli/port_forward/upgrade_head.hpp"

namespace agentvm {

class ServeUpgradeHandshake final : public Handshake {
public:
    explicit ServeUpgradeHandshake(std::string request) : request_(std::move(request)) {}

    std::string opening() override { return request_; }
    HandshakeStep advance(std::string& received, bool eof) override;

private:
    HandshakeStep refusal_with_body(std::string& received, bool eof);

    std::string request_;
    std::optional<UpgradeHead> refusal_;  // an answer other than 101, whose body is being read
};

} // namespace agentvm
