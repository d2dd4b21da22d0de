// virtio-mmio transport, modern register layout (virtio 1.2 §4.2.2, Version 2).
//
// Emulates: the register file (magic, version, ids, 64-bit feature negotiation through the
// select registers, queue setup, notify, interrupt status/ack, status, config generation)
// and the device config space at 0x100; the device status state machine of §2.1 / §3.1.1,
// with FEATURES_OK refused when the driver asks for features we did not offer or omits
// VIRTIO_F_VERSION_1.
// Leaves out: the legacy (Version 1) registers, shared memory regions (SHM_* read as
// "no region"), VIRTIO_F_RING_RESET (queues are only set up before DRIVER_OK),
// VIRTIO_F_NOTIFICATION_DATA.
//
// Threads: bus_read/bus_write arrive on vCPU threads; notify_queue and the device's I/O
// completions run on the event-loop thread. Everything takes the device's mutex().
// Normally a QueueNotify write never exits: the VMM registers a KVM ioeventfd on
// base + queue_notify_offset with datamatch = queue index and calls notify_queue() from the
// loop when it fires. A write that does reach bus_write goes to on_notify, which the VMM
// routes to the loop thread (tests may call notify_queue directly).
#pragma once

#include <linux/virtio_mmio.h>

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "devices/virtio_device.hpp"
#include "devices/virtqueue.hpp"
#include "core/bus.hpp"
#include "core/guest_memory.hpp"

namespace agentvm {

class VirtioMmioTransport : public BusDevice {
public:
    static constexpr uint32_t magic_value = 0x74726976;  // "virt"
    static constexpr uint32_t version = 2;
    static constexpr uint32_t vendor_id = 0x4d564741;    // "AGVM", informational only
    static constexpr uint64_t queue_notify_offset = VIRTIO_MMIO_QUEUE_NOTIFY;
    static constexpr uint64_t config_offset = VIRTIO_MMIO_CONFIG;

    struct State {
        uint32_t status = 0;
        uint32_t device_features_sel = 0;
        uint32_t driver_features_sel = 0;
        uint64_t driver_features = 0;
        uint32_t queue_sel = 0;
        uint32_t interrupt_status = 0;
        uint32_t config_generation = 0;
        std::vector<Virtqueue::State> queues;

        bool operator==(const State&) const = default;
    };

    // interrupt: raise the device's interrupt line (the VMM writes an irqfd); called with
    // the lock held, so it must not call back into the transport.
    // on_notify: a QueueNotify write reached bus_write; called without the lock held.
    // device and mem must outlive the transport.
    VirtioMmioTransport(const GuestMemory& mem, VirtioDevice& device, std::function<void()> interrupt,
                        std::function<void(uint16_t queue)> on_notify);

    void bus_read(uint64_t offset, std::span<uint8_t> data) override;
    void bus_write(uint64_t offset, std::span<const uint8_t> data) override;

    // The driver notified `queue` (ioeventfd fired). Event-loop thread only.
    void notify_queue(uint16_t queue);

    uint32_t status() const;
    uint32_t interrupt_status() const;
    uint64_t driver_features() const;
    size_t queue_count() const { return queues_.size(); }

    // Quiesce first (no device I/O in flight). The device's own State is saved beside this
    // one; restore the device first, then the transport, which re-activates the device when
    // the saved status has DRIVER_OK. Afterwards the VMM should notify_queue() every queue
    // from the loop thread, in case the driver queued buffers the device had not yet seen.
    State save() const;
    // Throws Error when the state does not fit this device (queue count, features, sizes).
    void restore(const State& state);

private:
    void read_register(uint64_t offset, uint32_t& value);
    // Returns the queue to notify after the lock is dropped, or -1.
    int32_t write_register(uint64_t offset, uint32_t value);
    void write_status(uint32_t value);
    void reset_locked();
    void activate_locked();
    void signal_used_locked();
    void needs_reset_locked();
    Virtqueue* selected_queue();

    const GuestMemory& mem_;
    VirtioDevice& device_;
    std::function<void()> interrupt_;
    std::function<void(uint16_t)> on_notify_;
    const uint64_t device_features_;

    // Guarded by device_.mutex().
    uint32_t status_ = 0;
    uint32_t device_features_sel_ = 0;
    uint32_t driver_features_sel_ = 0;
    uint64_t driver_features_ = 0;
    uint32_t queue_sel_ = 0;
    uint32_t interrupt_status_ = 0;
    uint32_t config_generation_ = 0;
    std::vector<Virtqueue> queues_;
    WarnLimiter warn_;
};

// The kernel command-line parameter that makes Linux probe a virtio-mmio device without a
// device tree or ACPI: "virtio_mmio.device=4K@0xd0000000:5".
std::string virtio_mmio_cmdline_param(uint64_t base, uint64_t size, uint32_t irq);

} // namespace agentvm
