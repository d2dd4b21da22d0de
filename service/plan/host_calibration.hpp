// What one sandbox costs on this host, measured by running a few: the `agentvm plan`
// calibration. Each run is an `agentvm episode` restored from the default snapshot (what serve
// runs per sandbox): its start to the agent's readiness, the memory only it holds once idle
// (Private_Dirty of the episode and its VMM), and the host CPU a tool call costs.
#pragma once

#include <string>

namespace agentvm {

struct SandboxCosts {
    double restore_s = 0;       // start to ready, median
    double restore_cpu_s = 0;   // host CPU used until ready, median
    double idle_private_mib = 0;  // Private_Dirty once idle, median
    double call_cpu_s = 0;      // host CPU per `exec true` round trip, median
    bool restored = false;      // false: no default snapshot, the VMs booted
    int runs = 0;
};

// Runs `runs` episodes of `program` one after another, `calls` calls each. Throws Error when
// one does not start or answer.
SandboxCosts calibrate(const std::string& program, int runs, int calls);

} // namespace agentvm
