// Sandbox ids that say where a sandbox lives (docs/fleet.md): "<node>-<instance>-<random>".
// The node is serve's --node-id (by default the host's short name), so that a router in front
// of many hosts sends each sandbox's requests to its host from the id alone; the instance is
// drawn once per serve process, so that a serve restarted on the same node (kill -9, then its
// supervisor started it again) knows an id of its node that it never made: the sandbox was
// lost with the serve before it.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "service/problem.hpp"

namespace agentvm {

inline constexpr size_t max_node_id = 32;
inline constexpr size_t instance_hex = 6;
inline constexpr size_t random_hex = 16;

// Why `node` cannot be a node id ("" when it can): 1 to 32 of a-z, 0-9 and '-', starting and
// ending with a letter or digit, without "--".
std::string node_id_problem(std::string_view node);

// The host's name as a node id (node_id_from_host_name); throws Error if it cannot be read.
std::string default_node_id();
// The host's name as a node id: its first label, lower-cased, every run of other characters
// one '-', at most 32 characters; "node" when nothing is left (a host with no name, whose
// kernel says "(none)", becomes "none").
std::string node_id_from_host_name(std::string_view host);

// A new serve instance: instance_hex lower-case hex digits from getrandom.
std::string new_instance_id();

// "<node>-<instance>-<random_hex hex digits>", the random part from getrandom.
std::string new_sandbox_id(std::string_view node, std::string_view instance);

struct SandboxIdParts {
    std::string node;
    std::string instance;
};
// The node and instance of an id made by new_sandbox_id; nullopt for anything else.
std::optional<SandboxIdParts> parse_sandbox_id(std::string_view id);

// The sandbox_lost refusal for an id this serve does not have but can tell was made, rather
// than never made: an id of another node (a router sends a request here when the id's node
// is down or unreachable) or of this node under an earlier serve instance (the sandbox was
// lost with that serve). nullopt for an id of this serve, or one of no node. Callers look for
// a running, paused or remembered sandbox first.
std::optional<Refusal> lost_sandbox(std::string_view id, std::string_view node, std::string_view instance);

} // namespace agentvm
