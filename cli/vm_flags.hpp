// The flags every VM-starting command shares (boot, run, episode, snapshot bake): they fill
// the command's VmOptions (episode/vm_options.hpp), which checks and applies what they say.
#pragma once

#include "episode/vm_options.hpp"

// CLI11 is header-only and slow to compile: only the files that add options include it.
namespace CLI {
class App;
} // namespace CLI

namespace agentvm {

// The flags of options.role(); once `command` is parsed, options.request() holds their values
// and which of them were given. `options` must outlive `command`.
void add_vm_flags(CLI::App& command, VmOptions& options);

} // namespace agentvm
