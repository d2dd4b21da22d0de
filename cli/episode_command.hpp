#pragma once

#include "cli/subcommand.hpp"

namespace agentvm {

// `agentvm episode`: one VM for the life of the process, tool calls as JSON lines on stdin
// and stdout (docs/protocol.md).
Subcommand add_episode_command(CLI::App& app);

} // namespace agentvm
