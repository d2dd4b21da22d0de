#include "vmm/vm_kvm_state.hpp"

#include <sys/ioctl.h>

#include "common/error.hpp"
#include "vmm/kvm.hpp"

namespace agentvm {
namespace {

kvm_irqchip get_irqchip(int fd, uint32_t chip_id)
{
    kvm_irqchip chip{};
    chip.chip_id = chip_id;
    kvm_ioctl(fd, KVM_GET_IRQCHIP, &chip, "KVM_GET_IRQCHIP");
    return chip;
}

} // namespace

VmKvmState save_vm_kvm_state(int vm_fd)
{
    VmKvmState state;
    state.pic_master = get_irqchip(vm_fd, KVM_IRQCHIP_PIC_MASTER);
    state.pic_slave = get_irqchip(vm_fd, KVM_IRQCHIP_PIC_SLAVE);
    state.ioapic = get_irqchip(vm_fd, KVM_IRQCHIP_IOAPIC);
    kvm_ioctl(vm_fd, KVM_GET_PIT2, &state.pit, "KVM_GET_PIT2");
    kvm_ioctl(vm_fd, KVM_GET_CLOCK, &state.clock, "KVM_GET_CLOCK");
    return state;
}

void restore_vm_kvm_state(int vm_fd, const VmKvmState& state)
{
    kvm_ioctl(vm_fd, KVM_SET_IRQCHIP, &state.pic_master, "KVM_SET_IRQCHIP (PIC master)");
    kvm_ioctl(vm_fd, KVM_SET_IRQCHIP, &state.pic_slave, "KVM_SET_IRQCHIP (PIC slave)");
    kvm_ioctl(vm_fd, KVM_SET_IRQCHIP, &state.ioapic, "KVM_SET_IRQCHIP (IOAPIC)");
    // After the interrupt controllers: KVM_SET_PIT2 re-arms the PIT's timer, whose ticks go
    // to them.
    kvm_ioctl(vm_fd, KVM_SET_PIT2, &state.pit, "KVM_SET_PIT2");

    // No flags: the guest's clock runs on from the value it had at the save, as if no time
    // had passed. KVM_CLOCK_REALTIME (what KVM_GET_CLOCK reports when the host clock runs on
    // the TSC) would make KVM advance it by the wall time since the save (Linux commit
    // c68dc1b577ea): for a snapshot restored days later, a monotonic clock jumping by days
    // fires every timer at once and trips the RCU stall detector. The time of day is set
    // by the guest agent instead (its resume call). Kernels before 5.16 also refuse the
    // KVM_CLOCK_TSC_STABLE flag that KVM_GET_CLOCK reports (Firecracker clears it too).
    kvm_clock_data clock = state.clock;
    clock.flags = 0;
    kvm_ioctl(vm_fd, KVM_SET_CLOCK, &clock, "KVM_SET_CLOCK");
}

} // namespace agentvm
