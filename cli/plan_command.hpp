// `agentvm plan`: from a training configuration, the sandboxes, warm pool, host memory and
// cores it needs, using what a sandbox costs on this host (cli/host_calibration.hpp).
#pragma once

#include "cli/subcommand.hpp"

// CLI11 is header-only and slow to compile: only the files that add options include it.
namespace CLI {
class App;
} // namespace CLI

namespace agentvm {

// Registers the subcommand; `run` is called by main after parsing when it was chosen.
Subcommand add_plan_command(CLI::App& app);

} // namespace agentvm
