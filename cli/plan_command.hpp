// `agentvm plan`: its flags, handed to service/plan/capacity_plan.hpp.
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
