// What kind of KVM this host offers. agentvm's real guests need hardware-assisted KVM; a host
// with PVM (the kvm_pvm software hypervisor) runs only tiny freestanding guests, so the CLI
// refuses to boot Linux there and points at the test host instead.
#pragma once

#include <string>

namespace agentvm {

enum class HostKvm { hardware, pvm, none };

HostKvm detect_host_kvm();

// One line a user can act on when host cannot boot a Linux guest; empty for hardware KVM.
std::string host_kvm_problem(HostKvm kind);

} // namespace agentvm
