// `agentvm doctor`: prints what this host offers agentvm (episode/doctor.hpp) and exits 1 when
// something `run` and `episode` need is missing.
#pragma once

#include "cli/subcommand.hpp"

// CLI11 is header-only and slow to compile: only the files that add options include it.
namespace CLI {
class App;
} // namespace CLI

namespace agentvm {

// Registers the subcommand; `run` is called by main after parsing when it was chosen.
Subcommand add_doctor_command(CLI::App& app);

} // namespace agentvm
