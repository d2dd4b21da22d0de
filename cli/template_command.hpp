// `agentvm template build | bake | list | inspect | rm`: their flags, handed to
// episode/template_session.hpp.
#pragma once

#include <vector>

#include "cli/subcommand.hpp"

namespace agentvm {

std::vector<Subcommand> add_template_commands(CLI::App& app);

} // namespace agentvm
