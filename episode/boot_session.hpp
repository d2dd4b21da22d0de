// `agentvm boot`: boot a guest and stay attached to its console until it powers off; host
// stdin goes to the console, and its end to the guest as ^D.
#pragma once

#include "episode/vm_options.hpp"

namespace agentvm {

// The VMM's work: in the jailed child, or in this process with --no-jail (run_supervised).
// `options` has the boot role. Returns the exit status; throws Error for what fails before
// the VM runs.
int run_boot(VmOptions& options);

} // namespace agentvm
