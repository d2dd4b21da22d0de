// The HAProxy 2.6 configuration of a fleet's front door (docs/fleet.md): one frontend on the
// fleet's URL that sends every request naming a sandbox (its id in the path, or E2B's
// E2b-Sandbox-Id header) to the node the id names, and balances the rest (creates, lists,
// /run_code, /healthz) over the nodes by their free capacity, retrying a create another node
// refused for room. Pure: nodes and settings in, the configuration's text out; `agentvm fleet
// haproxy-config` (cli/fleet_command.cpp) writes it. tests/service/fleet_routing_check.py runs
// what it makes under the real HAProxy.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "service/fleet/fleet_nodes.hpp"

namespace agentvm {

struct HaproxySettings {
    std::vector<FleetNode> nodes;  // agent-check lines for the nodes that have an agent_port
    std::string bind_host = "0.0.0.0";  // without brackets for IPv6
    uint16_t bind_port = 8080;
    std::optional<std::string> stats_socket;  // an absolute path: HAProxy's runtime API
    std::string made_by;  // the command that made it, for the header comment
};

// Why `path` cannot be the stats socket's path ("" when it can): absolute, and without
// whitespace, quotes, '#' or '\' (HAProxy's configuration takes it unquoted).
std::string stats_socket_problem(const std::string& path);

// The configuration's text. Throws Error naming the problem when the nodes cannot make a fleet
// (fleet_nodes_problem), the bind address or the stats socket's path is not one.
std::string haproxy_config(const HaproxySettings& settings);

} // namespace agentvm
