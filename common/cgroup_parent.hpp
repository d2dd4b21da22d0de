// The environment variable through which `agentvm serve --delegated-cgroup` tells the episodes
// it starts where their VMMs' cgroups go (cgroup v2): the directory of the cgroup systemd
// delegated to serve (service/systemd/delegated_cgroup.hpp, vmm/cgroup.hpp).
#pragma once

namespace agentvm {

constexpr const char* cgroup_parent_variable = "AGENTVM_CGROUP_PARENT";

} // namespace agentvm
