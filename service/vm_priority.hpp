// Refill yields to demand: a pool's VMs start at a low CPU weight (agentvm --cpu-weight, the
// VMM's cgroup), so restoring them takes only the host CPU that sandboxes in use leave; a VM
// handed out gets the default weight back. Measured in the test host (one emulated core): a
// sandbox's first call took 350-1,100 ms while a refill restored beside it at equal weight,
// 130-300 ms without one.
#pragma once

#include <sys/types.h>

namespace agentvm {

inline constexpr unsigned pool_cpu_weight = 10;
inline constexpr unsigned default_cpu_weight = 100;  // cgroup v2's own default

// Whether the host has cgroup v2, where serve can give a handed-out VM its weight back.
bool cpu_weights_supported();
// Sets cpu.weight of the cgroup each child of the episode (its VMM) runs in to the default.
// A failure is logged, not thrown: the sandbox then merely runs at the pool's weight.
void restore_cpu_weight(pid_t episode);

} // namespace agentvm
