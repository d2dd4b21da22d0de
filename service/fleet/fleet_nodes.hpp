// The nodes of a fleet as the front door sees them (docs/fleet.md): each node's id (serve's
// --node-id, the first part of every sandbox id it makes, and the HAProxy server name), where
// its serve listens and, optionally, its HAProxy agent-check port. Pure: `agentvm fleet`
// (cli/fleet_command.cpp) reads them from flags or from Slurm's answers and hands them to the
// HAProxy configuration (haproxy_config.hpp) and to serve's peers file.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace agentvm {

struct FleetNode {
    std::string id;       // a node id (sandbox_ids.hpp, node_id_problem)
    std::string host;     // a host name, an IPv4 address, or an IPv6 address without brackets
    uint16_t port = 0;    // serve's TCP listener
    std::optional<uint16_t> agent_port;  // serve's --agent-check port, when HAProxy asks it
};

// "HOST:PORT": HOST a name, an IPv4 address or a bracketed IPv6 address ("[::1]:8080"); PORT
// 1-65535. Throws Error naming the problem. The host comes back without brackets.
std::pair<std::string, uint16_t> parse_host_port(std::string_view text);

// "HOST:PORT" again, brackets around an IPv6 address, as HAProxy and URLs want it.
std::string host_port_text(std::string_view host, uint16_t port);

// "ID=HOST:PORT" (the CLI's --node). Throws Error naming the problem.
FleetNode parse_node_spec(std::string_view text);

// The addresses of Slurm nodes from `scontrol -o show node NAME...` (one "NodeName=... "
// line a node): NodeName → NodeAddr, the name itself when a line has no NodeAddr. Nodes in
// `names` that the text does not mention keep their name as their address.
std::vector<std::pair<std::string, std::string>> slurm_node_addresses(const std::vector<std::string>& names,
                                                                      std::string_view show_node_text);

// The non-empty lines of `text`, trimmed (scontrol show hostnames' answer).
std::vector<std::string> text_lines(std::string_view text);

// Why `nodes` cannot make a fleet ("" when they can): none at all, a node id that is not one
// (node_id_problem), an id named twice, or one HOST:PORT under two ids.
std::string fleet_nodes_problem(const std::vector<FleetNode>& nodes);

// serve's peers file (--peers-file, service/fleet/peers.hpp): "ID=http://HOST:PORT" a line.
std::string peers_file_text(const std::vector<FleetNode>& nodes);

} // namespace agentvm
