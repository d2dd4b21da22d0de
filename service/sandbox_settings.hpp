// What a user gives a sandbox when it is handed out (docs/api.md, "Create"): kept by the running
// sandbox and, while it is paused, by its record on disk, so that a resume gives it back whole.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "protocol/agent_protocol.hpp"

namespace agentvm {

// A sandbox's egress rules as its user gave them (service/egress/egress_policy.hpp parses
// them): kept as text, so that a record on disk and a facade's view show them as given.
struct EgressRules {
    std::vector<std::string> allow;
    std::vector<std::string> deny;
    bool operator==(const EgressRules&) const = default;
};

struct SandboxSettings {
    std::string id;
    bool warm = false;  // handed out from a pool's warm VMs, not started for its create
    std::chrono::milliseconds create_time{0};
    std::chrono::seconds timeout{300};
    std::optional<std::chrono::seconds> idle_timeout;
    std::map<std::string, std::string> env;
    Json metadata = Json::object();
    // At its timeout the sandbox is paused, not ended (E2B's autoPause); without a state
    // directory, or when the pause fails, it ends as any other.
    bool pause_on_timeout = false;
    // What a facade keeps with the sandbox, by facade ("e2b": the template it was created as,
    // its lifecycle): kept through pause and resume, and copied to fork children, so that a
    // facade needs no table of its own. serve reads nothing in it.
    Json facade = Json::object();
    // Where it may connect out; none: serve's default (--egress-allow, --egress-deny).
    std::optional<EgressRules> egress;
};

} // namespace agentvm
