// Runs a VM command's body (everything from building the VM to its exit status) the way the
// options ask: under --no-jail in this process; otherwise in a jailed child process with its
// own cgroup while this process supervises it (vmm/supervisor.hpp, vmm/jail.hpp).
#pragma once

#include <functional>

#include "episode/vm_options.hpp"

namespace agentvm {

// killed_code: the status when the VMM is killed by a signal (0: 128 + the signal).
int run_supervised(VmOptions& options, int killed_code, const std::function<int()>& body);

} // namespace agentvm
