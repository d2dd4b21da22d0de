// serve's --delegated-cgroup: under systemd's Delegate=yes, the cgroup systemd made for the
// service is serve's to divide, and on cgroup v2 the only part of the hierarchy a service
// running as its own user may write. Under v2 a group that holds processes cannot hand
// controllers to its children, so serve moves itself into a leaf, "serve", of that group,
// enables the cpu, memory and pids controllers for its children, and tells the episodes it
// starts ($AGENTVM_CGROUP_PARENT, common/cgroup_parent.hpp) to make their VMMs' groups there,
// beside that leaf (vmm/cgroup.hpp). On cgroup v1 it does nothing: there a VMM's groups are
// made inside the agentvm process's own groups already, which are serve's delegated ones.
#pragma once

namespace agentvm {

// Throws Error naming the file when serve may not write its group (not delegated: Delegate=yes
// missing).
void enter_delegated_cgroup();

} // namespace agentvm
