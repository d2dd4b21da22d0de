#pragma once

#include "cli/subcommand.hpp"

namespace agentvm {

// `agentvm serve ...`: runs agentvm-serve, installed next to agentvm, with the same arguments
// (cli/serve_main.cpp says why it is a program of its own).
Subcommand add_serve_command(CLI::App& app);

} // namespace agentvm
