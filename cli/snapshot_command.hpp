#pragma once

#include "cli/subcommand.hpp"

namespace agentvm {

// `agentvm snapshot bake --out DIR`: boot once, wait for the agent, save the VM to DIR.
Subcommand add_snapshot_command(CLI::App& app);

} // namespace agentvm
