// `agentvm boot`: boot a guest and stay attached to its console until it powers off.
#pragma once


#include "cli/subcommand.hpp"

// CLI11 is header-only and slow to compile: only the files that add options include it.
namespace CLI {
class App;
} // namespace CLI

namespace agentvm {

// Registers the subcommand; `run` is called by main after parsing when it was chosen.
Subcommand add_boot_command(CLI::App& app);

} // namespace agentvm
