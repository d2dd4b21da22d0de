// The VM-wide KVM state a snapshot needs besides the vCPUs: the in-kernel interrupt
// controllers (two 8259 PICs and the IOAPIC), the 8254 PIT and the kvmclock.
#pragma once

#include <linux/kvm.h>

namespace agentvm {

struct VmKvmState {
    kvm_irqchip pic_master{};  // chip_id KVM_IRQCHIP_PIC_MASTER
    kvm_irqchip pic_slave{};   // chip_id KVM_IRQCHIP_PIC_SLAVE
    kvm_irqchip ioapic{};      // chip_id KVM_IRQCHIP_IOAPIC
    kvm_pit_state2 pit{};
    kvm_clock_data clock{};    // as KVM_GET_CLOCK returned it
};

// Reads the state of a VM whose vCPUs are all stopped (see save_vcpu_state()). Throws Error
// naming the ioctl that failed.
VmKvmState save_vm_kvm_state(int vm_fd);

// Loads it into a fresh VM that has its irqchip and PIT (KVM_CREATE_IRQCHIP, KVM_CREATE_PIT2)
// and whose vCPUs have been restored but not yet run again:
//  - loading the IOAPIC re-delivers the interrupts its IRR holds to the LAPICs
//    (kvm_set_ioapic(), arch/x86/kvm/ioapic.c), so the LAPICs must hold their state by then
//    or restoring them would drop those interrupts;
//  - the guest clock runs on from KVM_SET_CLOCK, so the time between it and the vCPUs
//    resuming is time the guest sees pass (QEMU sets it as the VM starts running,
//    hw/i386/kvm/clock.c).
// Throws Error naming the ioctl that failed.
void restore_vm_kvm_state(int vm_fd, const VmKvmState& state);

} // namespace agentvm
