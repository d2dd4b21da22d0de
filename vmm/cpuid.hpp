// CPUID as each vCPU sees it: KVM_GET_SUPPORTED_CPUID, adjusted for a Linux guest with one
// socket of N single-threaded cores. Pure: tests drive it with hand-made tables.
#pragma once

#include <linux/kvm.h>

#include <cstdint>
#include <vector>

namespace agentvm {

struct CpuidOptions {
    uint32_t vcpu_index = 0;
    uint32_t vcpu_count = 1;
    bool tsc_deadline = false;  // KVM_CAP_TSC_DEADLINE_TIMER: KVM emulates it, CPUID must say so
};

std::vector<kvm_cpuid_entry2> adjust_cpuid(std::vector<kvm_cpuid_entry2> entries,
                                           const CpuidOptions& options);

} // namespace agentvm
