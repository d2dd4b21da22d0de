#include "vmm/virtio_slot.hpp"

#include <linux/kvm.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.hpp"
#include "core/layout.hpp"

namespace agentvm {
namespace {

Fd make_eventfd(const std::string& what)
{
    Fd fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!fd)
        throw_errno("eventfd for " + what);
    return fd;
}

void signal_eventfd(int fd, const char* what)
{
    const uint64_t one = 1;
    if (::write(fd, &one, sizeof(one)) < 0)
        SPDLOG_WARN("signalling {} failed: {}", what, std::strerror(errno));
}

} // namespace

VirtioSlot::VirtioSlot(int vm_fd, const GuestMemory& mem, EventLoop& loop, Bus& mmio,
                       VirtioDevice& device, uint64_t base, uint32_t irq)
    : loop_(loop), base_(base), irq_(irq), irqfd_(make_eventfd(fmt::format("IRQ {}", irq)))
{
    kvm_irqfd irqfd{};
    irqfd.fd = static_cast<uint32_t>(irqfd_.get());
    irqfd.gsi = irq;
    if (::ioctl(vm_fd, KVM_IRQFD, &irqfd) < 0)
        throw_errno(fmt::format("KVM_IRQFD for IRQ {}", irq));

    for (size_t q = 0; q < device.queue_count(); ++q)
        notify_fds_.push_back(make_eventfd(fmt::format("queue {} notifications at {:#x}", q, base)));

    const int irq_fd = irqfd_.get();
    std::vector<int> notify_fds;
    for (const auto& fd : notify_fds_)
        notify_fds.push_back(fd.get());
    transport_ = std::make_unique<VirtioMmioTransport>(
        mem, device, [irq_fd] { signal_eventfd(irq_fd, "a virtio interrupt"); },
        [notify_fds](uint16_t queue) {
            // A notify that reached us instead of the ioeventfd (KVM matches only the exact
            // write): hand it to the I/O thread all the same.
            if (queue < notify_fds.size())
                signal_eventfd(notify_fds[queue], "a forwarded queue notification");
        });
    mmio.insert(base, layout::virtio_mmio_size, *transport_);

    for (size_t q = 0; q < notify_fds_.size(); ++q) {
        kvm_ioeventfd ioevent{};
        ioevent.addr = base + VirtioMmioTransport::queue_notify_offset;
        ioevent.len = 4;
        ioevent.datamatch = q;
        ioevent.fd = notify_fds_[q].get();
        ioevent.flags = KVM_IOEVENTFD_FLAG_DATAMATCH;
        if (::ioctl(vm_fd, KVM_IOEVENTFD, &ioevent) < 0)
            throw_errno(fmt::format("KVM_IOEVENTFD for queue {} at {:#x}", q, base));
        const int fd = notify_fds_[q].get();
        loop_.watch_readable(fd, [this, fd, q] {
            uint64_t count = 0;
            if (::read(fd, &count, sizeof(count)) == sizeof(count))
                transport_->notify_queue(static_cast<uint16_t>(q));
        });
    }
}

VirtioSlot::~VirtioSlot()
{
    for (const auto& fd : notify_fds_)
        loop_.unwatch(fd.get());
}

void VirtioSlot::take_notifications()
{
    // The eventfds are non-blocking, and the loop's own read of one already taken finds it
    // empty and does nothing.
    for (size_t q = 0; q < notify_fds_.size(); ++q) {
        uint64_t count = 0;
        if (::read(notify_fds_[q].get(), &count, sizeof(count)) == sizeof(count))
            transport_->notify_queue(static_cast<uint16_t>(q));
    }
}

std::string VirtioSlot::cmdline_param() const
{
    return virtio_mmio_cmdline_param(base_, layout::virtio_mmio_size, irq_);
}

} // namespace agentvm
