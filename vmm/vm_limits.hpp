// How large a VM may be on this host, defined once: the CLI's --cpus, --mem and --disk-size,
// the VM's constructor and a snapshot's manifest are all checked against these.
#pragma once

#include <cstdint>

#include "vmm/kvm.hpp"

namespace agentvm {

// vCPUs: what this host's KVM allows, and at most what the MP table can describe.
uint32_t vcpu_limit(const Kvm& kvm);

// Guest memory in MiB: at most the host's RAM. Being a count of real MiB, it is also far below
// the point where mem_mib * 1 MiB would wrap.
uint64_t host_ram_mib();

} // namespace agentvm
