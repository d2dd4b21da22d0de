// `agentvm template build | bake | list | inspect | rm`: templates, episode images baked from
// the user's own environment (templates/template_build.hpp, templates/template_store.hpp).
#pragma once

#include <vector>

#include "cli/subcommand.hpp"

namespace agentvm {

std::vector<Subcommand> add_template_commands(CLI::App& app);

} // namespace agentvm
