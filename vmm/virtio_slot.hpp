// One virtio-mmio device window wired into KVM: the transport on the MMIO bus, an irqfd for
// its interrupt and an ioeventfd per queue, so that neither a notification nor an interrupt
// costs a trip through a vCPU thread. Queue work runs on the event loop's thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "devices/virtio_device.hpp"
#include "devices/virtio_mmio.hpp"
#include "core/bus.hpp"
#include "core/event_loop.hpp"
#include "common/fd.hpp"
#include "core/guest_memory.hpp"

namespace agentvm {

class VirtioSlot {
public:
    // Throws Error if KVM refuses the irqfd or an ioeventfd. `device` must outlive the slot.
    VirtioSlot(int vm_fd, const GuestMemory& mem, EventLoop& loop, Bus& mmio, VirtioDevice& device,
               uint64_t base, uint32_t irq);
    ~VirtioSlot();
    VirtioSlot(const VirtioSlot&) = delete;
    VirtioSlot& operator=(const VirtioSlot&) = delete;

    VirtioMmioTransport& transport() { return *transport_; }
    // Takes now the queue notifications the guest made that the loop has not handled yet (a
    // live snapshot, once the vCPUs are parked, wants every request the guest made started).
    void take_notifications();
    // The kernel parameter that tells the guest where this device lives.
    std::string cmdline_param() const;

private:
    EventLoop& loop_;
    uint64_t base_;
    uint32_t irq_;
    Fd irqfd_;
    std::vector<Fd> notify_fds_;  // one per queue, matched on the queue index written
    std::unique_ptr<VirtioMmioTransport> transport_;
};

} // namespace agentvm
