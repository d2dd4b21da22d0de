// One KVM vCPU: its fd, its kvm_run page, and the state ioctls. The run loop that owns a
// thread lives in Vm; this class only enters the guest once per call and decodes the exit.
#pragma once

#include <linux/kvm.h>

#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

#include "vmm/exit.hpp"
#include "common/fd.hpp"
#include "vmm/kvm.hpp"

namespace agentvm {

class Vcpu {
public:
    Vcpu(const Kvm& kvm, int vm_fd, uint32_t index);
    ~Vcpu();
    Vcpu(const Vcpu&) = delete;
    Vcpu& operator=(const Vcpu&) = delete;

    uint32_t index() const { return index_; }
    // For the snapshot state ioctls (vcpu_state.hpp); only while no thread runs the vCPU.
    int fd() const { return fd_.get(); }

    void set_cpuid(const std::vector<kvm_cpuid_entry2>& entries);
    void set_msrs(const std::vector<std::pair<uint32_t, uint64_t>>& msrs);
    kvm_regs regs() const;
    void set_regs(const kvm_regs& regs);
    kvm_sregs sregs() const;
    void set_sregs(const kvm_sregs& sregs);
    void set_fpu(const kvm_fpu& fpu);
    // LINT0 as ExtINT (the PIC's path) and LINT1 as NMI, as the MP table announces.
    void set_local_interrupts();

    // Enters the guest until the next exit that needs userspace. Returns InterruptedExit when
    // kicked. Throws Error if KVM_RUN itself fails (not a guest condition).
    Exit run();

    // Makes the current or next run() return InterruptedExit. Callable from any thread.
    void request_exit();
    // Clears a previous request_exit() before running again.
    void clear_exit_request();

private:
    uint32_t index_;
    Fd fd_;
    kvm_run* run_ = nullptr;
    size_t run_size_ = 0;
};

// MSR values for a vCPU at the kernel's 64-bit entry.
std::vector<std::pair<uint32_t, uint64_t>> boot_msrs();

} // namespace agentvm
