#pragma once

#include "cli/subcommand.hpp"

namespace agentvm {

// `agentvm run -- CMD`: a fresh VM for one command, its output streamed to ours, its exit
// status ours.
Subcommand add_run_command(CLI::App& app);

} // namespace agentvm
