// `agentvm fleet haproxy-config | peers`: the nodes of a fleet, from flags or from the current
// Slurm job, as the front door's HAProxy configuration (service/fleet/haproxy_config.hpp) or as
// serve's peers file (docs/fleet.md).
#pragma once

#include <vector>

#include "cli/subcommand.hpp"

namespace agentvm {

std::vector<Subcommand> add_fleet_commands(CLI::App& app);

} // namespace agentvm
