// The KVM state of one x86 vCPU: everything KVM needs to resume it, in a fresh VM, exactly
// where it stopped. What Firecracker and cloud-hypervisor save, less what agentvm never
// turns on (nested virtualization, SMM, Hyper-V, TSC scaling).
#pragma once

#include <linux/kvm.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "vmm/kvm.hpp"

namespace agentvm {

struct Msr {
    uint32_t index = 0;
    uint64_t value = 0;
    bool operator==(const Msr&) const = default;
};

struct VcpuState {
    std::vector<kvm_cpuid_entry2> cpuid;
    kvm_mp_state mp_state{};
    kvm_regs regs{};
    kvm_sregs sregs{};
    // struct kvm_xsave as KVM lays it out, as long as KVM_CAP_XSAVE2 says (at least 4 KiB).
    std::vector<uint8_t> xsave;
    kvm_xcrs xcrs{};
    kvm_debugregs debugregs{};
    kvm_lapic_state lapic{};
    std::vector<Msr> msrs;
    kvm_vcpu_events events{};
};

// Bounds on a state, so that one read from a file cannot make us allocate without limit.
// KVM itself refuses more CPUID entries (KVM_MAX_CPUID_ENTRIES) and never lists more than a
// few hundred MSRs; the largest XSAVE area today (with AMX) is about 11 KiB.
inline constexpr size_t max_cpuid_entries = 256;
inline constexpr size_t max_msrs = 4096;
inline constexpr size_t min_xsave_bytes = 4096;
inline constexpr size_t max_xsave_bytes = 64 * 1024;

// Reads the whole state of a vCPU. The caller guarantees that no thread is in KVM_RUN on it
// and that its last exit was completed: for I/O and MMIO exits KVM finishes the instruction
// only on the next KVM_RUN and keeps that pending work where userspace cannot save it, so
// the vCPU must first re-enter once with kvm_run.immediate_exit set, which completes it and
// returns EINTR without running guest code (Documentation/virt/kvm/api.rst, "struct
// kvm_run"). Every other vCPU of the VM must be stopped too: KVM_GET_VCPU_EVENTS is not safe
// while they run. Throws Error naming the ioctl that failed.
VcpuState save_vcpu_state(const Kvm& kvm, int vcpu_fd);

// Loads a saved state into a vCPU that has never run, created in a VM that has its in-kernel
// irqchip. Throws Error naming the ioctl that failed, or the MSR that KVM refused.
void restore_vcpu_state(const Kvm& kvm, int vcpu_fd, const VcpuState& state);

} // namespace agentvm
