// `agentvm boot`: boot a guest and stay attached to its console until it powers off.
#pragma once

#include <CLI/CLI.hpp>

#include "cli/subcommand.hpp"

namespace agentvm {

// Registers the subcommand; `run` is called by main after parsing when it was chosen.
Subcommand add_boot_command(CLI::App& app);

} // namespace agentvm
