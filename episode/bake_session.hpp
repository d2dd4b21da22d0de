// `agentvm snapshot bake --out DIR`: boot once, make the bake's calls of the guest agent
// (episode/bake_calls.hpp), let the guest settle, and save the VM to DIR.
#pragma once

#include <string>
#include <vector>

#include "episode/vm_options.hpp"

namespace agentvm {

struct BakeSettings {
    VmOptions vm{VmRole::bake};
    std::string out;
    double boot_timeout_s = 60;
    bool json = false;
    std::vector<std::string> run;      // shell commands that must succeed, their writes kept
    std::vector<std::string> warm_up;  // shell commands that load caches (must succeed too)
    double step_timeout_s = 1800;
};

// The VMM's work: in the jailed child, or in this process with --no-jail (run_supervised).
// Returns the exit status; throws Error naming what failed the bake.
int run_bake(BakeSettings& settings);

} // namespace agentvm
