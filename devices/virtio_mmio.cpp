#include "devices/virtio_mmio.hpp"

#include <linux/virtio_config.h>
// The legacy part of virtio_ring.h (vring_init) is not valid C++; we need none of it.
#ifndef VIRTIO_RING_NO_LEGACY
#define VIRTIO_RING_NO_LEGACY
#endif
#include <linux/virtio_ring.h>

#include <array>
#include <cstring>
#include <fmt/format.h>
#include <mutex>
#include <optional>
#include <string_view>

namespace agentvm {

namespace {

enum class Reg {
    MagicValue,
    Version,
    DeviceId,
    VendorId,
    DeviceFeatures,
    DeviceFeaturesSel,
    DriverFeatures,
    DriverFeaturesSel,
    QueueSel,
    QueueNumMax,
    QueueNum,
    QueueReady,
    QueueNotify,
    InterruptStatus,
    InterruptAck,
    Status,
    QueueDescLow,
    QueueDescHigh,
    QueueDriverLow,
    QueueDriverHigh,
    QueueDeviceLow,
    QueueDeviceHigh,
    ShmSel,
    ShmLenLow,
    ShmLenHigh,
    ShmBaseLow,
    ShmBaseHigh,
    ConfigGeneration,
};

enum Access : uint8_t { R = 1, W = 2, RW = 3 };

struct RegisterInfo {
    uint32_t offset;
    Reg reg;
    uint8_t access;
    std::string_view name;
};

// §4.2.2, Table "MMIO Device Register Layout". Every register is 32 bits wide.
constexpr std::array registers{
    RegisterInfo{VIRTIO_MMIO_MAGIC_VALUE, Reg::MagicValue, R, "MagicValue"},
    RegisterInfo{VIRTIO_MMIO_VERSION, Reg::Version, R, "Version"},
    RegisterInfo{VIRTIO_MMIO_DEVICE_ID, Reg::DeviceId, R, "DeviceID"},
    RegisterInfo{VIRTIO_MMIO_VENDOR_ID, Reg::VendorId, R, "VendorID"},
    RegisterInfo{VIRTIO_MMIO_DEVICE_FEATURES, Reg::DeviceFeatures, R, "DeviceFeatures"},
    RegisterInfo{VIRTIO_MMIO_DEVICE_FEATURES_SEL, Reg::DeviceFeaturesSel, W, "DeviceFeaturesSel"},
    RegisterInfo{VIRTIO_MMIO_DRIVER_FEATURES, Reg::DriverFeatures, W, "DriverFeatures"},
    RegisterInfo{VIRTIO_MMIO_DRIVER_FEATURES_SEL, Reg::DriverFeaturesSel, W, "DriverFeaturesSel"},
    RegisterInfo{VIRTIO_MMIO_QUEUE_SEL, Reg::QueueSel, W, "QueueSel"},
    RegisterInfo{VIRTIO_MMIO_QUEUE_NUM_MAX, Reg::QueueNumMax, R, "QueueNumMax"},
    RegisterInfo{VIRTIO_MMIO_QUEUE_NUM, Reg::QueueNum, W, "QueueNum"},
    RegisterInfo{VIRTIO_MMIO_QUEUE_READY, Reg::QueueReady, RW, "QueueReady"},
    RegisterInfo{VIRTIO_MMIO_QUEUE_NOTIFY, Reg::QueueNotify, W, "QueueNotify"},
    RegisterInfo{VIRTIO_MMIO_INTERRUPT_STATUS, Reg::InterruptStatus, R, "InterruptStatus"},
    RegisterInfo{VIRTIO_MMIO_INTERRUPT_ACK, Reg::InterruptAck, W, "InterruptACK"},
    RegisterInfo{VIRTIO_MMIO_STATUS, Reg::Status, RW, "Status"},
    RegisterInfo{VIRTIO_MMIO_QUEUE_DESC_LOW, Reg::QueueDescLow, W, "QueueDescLow"},
    RegisterInfo{VIRTIO_MMIO_QUEUE_DESC_HIGH, Reg::QueueDescHigh, W, "QueueDescHigh"},
    RegisterInfo{VIRTIO_MMIO_QUEUE_AVAIL_LOW, Reg::QueueDriverLow, W, "QueueDriverLow"},
    RegisterInfo{VIRTIO_MMIO_QUEUE_AVAIL_HIGH, Reg::QueueDriverHigh, W, "QueueDriverHigh"},
    RegisterInfo{VIRTIO_MMIO_QUEUE_USED_LOW, Reg::QueueDeviceLow, W, "QueueDeviceLow"},
    RegisterInfo{VIRTIO_MMIO_QUEUE_USED_HIGH, Reg::QueueDeviceHigh, W, "QueueDeviceHigh"},
    RegisterInfo{VIRTIO_MMIO_SHM_SEL, Reg::ShmSel, W, "SHMSel"},
    RegisterInfo{VIRTIO_MMIO_SHM_LEN_LOW, Reg::ShmLenLow, R, "SHMLenLow"},
    RegisterInfo{VIRTIO_MMIO_SHM_LEN_HIGH, Reg::ShmLenHigh, R, "SHMLenHigh"},
    RegisterInfo{VIRTIO_MMIO_SHM_BASE_LOW, Reg::ShmBaseLow, R, "SHMBaseLow"},
    RegisterInfo{VIRTIO_MMIO_SHM_BASE_HIGH, Reg::ShmBaseHigh, R, "SHMBaseHigh"},
    RegisterInfo{VIRTIO_MMIO_CONFIG_GENERATION, Reg::ConfigGeneration, R, "ConfigGeneration"},
};

constexpr const RegisterInfo* find_register(uint64_t offset)
{
    for (const auto& r : registers)
        if (r.offset == offset)
            return &r;
    return nullptr;
}

constexpr uint32_t status_bits = VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER |
                                 VIRTIO_CONFIG_S_FEATURES_OK | VIRTIO_CONFIG_S_DRIVER_OK |
                                 VIRTIO_CONFIG_S_NEEDS_RESET | VIRTIO_CONFIG_S_FAILED;
constexpr uint64_t version_1 = 1ull << VIRTIO_F_VERSION_1;

uint32_t low32(uint64_t v) { return static_cast<uint32_t>(v); }
uint32_t high32(uint64_t v) { return static_cast<uint32_t>(v >> 32); }
uint64_t with_low32(uint64_t v, uint32_t low) { return (v & ~0xffffffffull) | low; }
uint64_t with_high32(uint64_t v, uint32_t high) { return (v & 0xffffffffull) | (uint64_t{high} << 32); }

} // namespace

VirtioMmioTransport::VirtioMmioTransport(const GuestMemory& mem, VirtioDevice& device,
                                         std::function<void()> interrupt,
                                         std::function<void(uint16_t)> on_notify)
    : mem_(mem),
      device_(device),
      interrupt_(std::move(interrupt)),
      on_notify_(std::move(on_notify)),
      device_features_(device.device_features())
{
    if (!(device_features_ & version_1))
        throw Error("virtio device does not offer VIRTIO_F_VERSION_1");
    if (device_features_ & (1ull << VIRTIO_RING_F_INDIRECT_DESC))
        throw Error("virtio device offers indirect descriptors, which Virtqueue does not implement");
    for (size_t i = 0; i < device.queue_count(); ++i)
        queues_.emplace_back(device.queue_max_size(i));
}

Virtqueue* VirtioMmioTransport::selected_queue()
{
    return queue_sel_ < queues_.size() ? &queues_[queue_sel_] : nullptr;
}

void VirtioMmioTransport::bus_read(uint64_t offset, std::span<uint8_t> data)
{
    std::lock_guard lock(device_.mutex());
    std::fill(data.begin(), data.end(), uint8_t{0});
    if (offset >= config_offset) {
        device_.read_config(offset - config_offset, data);
        return;
    }
    if (data.size() != 4 || offset % 4 != 0) {
        guest_warn(warn_, "virtio-mmio: ignoring {}-byte read at {:#x}; registers are 32-bit", data.size(),
                   offset);
        return;
    }
    uint32_t value = 0;
    read_register(offset, value);
    std::memcpy(data.data(), &value, sizeof(value));
}

void VirtioMmioTransport::read_register(uint64_t offset, uint32_t& value)
{
    const RegisterInfo* reg = find_register(offset);
    if (!reg || !(reg->access & R)) {
        guest_warn(warn_, "virtio-mmio: read of {} at {:#x}", reg ? reg->name : "unknown register", offset);
        return;
    }
    switch (reg->reg) {
    case Reg::MagicValue:
        value = magic_value;
        break;
    case Reg::Version:
        value = version;
        break;
    case Reg::DeviceId:
        value = device_.device_type();
        break;
    case Reg::VendorId:
        value = vendor_id;
        break;
    case Reg::DeviceFeatures:
        value = device_features_sel_ == 0   ? low32(device_features_)
                : device_features_sel_ == 1 ? high32(device_features_)
                                            : 0;
        break;
    case Reg::QueueNumMax:
        // §4.2.2: 0 tells the driver the selected queue does not exist.
        value = selected_queue() ? selected_queue()->max_size() : 0;
        break;
    case Reg::QueueReady:
        value = selected_queue() && selected_queue()->ready() ? 1 : 0;
        break;
    case Reg::InterruptStatus:
        value = interrupt_status_;
        break;
    case Reg::Status:
        value = status_;
        break;
    case Reg::ShmLenLow:
    case Reg::ShmLenHigh:
    case Reg::ShmBaseLow:
    case Reg::ShmBaseHigh:
        value = 0xffffffff;  // a length of ~0 means "no such shared memory region"
        break;
    case Reg::ConfigGeneration:
        value = config_generation_;
        break;
    default:
        break;
    }
}

void VirtioMmioTransport::bus_write(uint64_t offset, std::span<const uint8_t> data)
{
    int32_t notify = -1;
    {
        std::lock_guard lock(device_.mutex());
        if (offset >= config_offset) {
            device_.write_config(offset - config_offset, data);
            return;
        }
        if (data.size() != 4 || offset % 4 != 0) {
            guest_warn(warn_, "virtio-mmio: ignoring {}-byte write at {:#x}; registers are 32-bit", data.size(),
                       offset);
            return;
        }
        uint32_t value;
        std::memcpy(&value, data.data(), sizeof(value));
        notify = write_register(offset, value);
    }
    // Outside the lock: on_notify may run the queue right here (tests) and lock again.
    if (notify >= 0) {
        if (on_notify_)
            on_notify_(static_cast<uint16_t>(notify));
    }
}

int32_t VirtioMmioTransport::write_register(uint64_t offset, uint32_t value)
{
    const RegisterInfo* reg = find_register(offset);
    if (!reg || !(reg->access & W)) {
        guest_warn(warn_, "virtio-mmio: write of {:#x} to {} at {:#x}", value,
                   reg ? reg->name : "unknown register", offset);
        return -1;
    }

    // Queue configuration is only meaningful before DRIVER_OK and while the queue is off
    // (§4.2.3.2); later writes would change rings under the device's feet.
    auto configurable_queue = [&]() -> Virtqueue* {
        Virtqueue* q = selected_queue();
        if (!q || q->ready() || (status_ & VIRTIO_CONFIG_S_DRIVER_OK)) {
            guest_warn(warn_, "virtio-mmio: ignoring {} write for queue {} (absent, ready, or DRIVER_OK set)",
                       reg->name, queue_sel_);
            return nullptr;
        }
        return q;
    };

    switch (reg->reg) {
    case Reg::DeviceFeaturesSel:
        device_features_sel_ = value;
        break;
    case Reg::DriverFeaturesSel:
        driver_features_sel_ = value;
        break;
    case Reg::DriverFeatures:
        if (status_ & VIRTIO_CONFIG_S_FEATURES_OK) {
            guest_warn(warn_, "virtio-mmio: driver features written after FEATURES_OK; ignored");
        } else if (driver_features_sel_ == 0) {
            driver_features_ = with_low32(driver_features_, value);
        } else if (driver_features_sel_ == 1) {
            driver_features_ = with_high32(driver_features_, value);
        } else if (value != 0) {
            // No feature beyond bit 63 exists to be offered; the bits are meaningless.
            guest_warn(warn_, "virtio-mmio: driver features {:#x} in word {} ignored", value,
                       driver_features_sel_);
        }
        break;
    case Reg::QueueSel:
        queue_sel_ = value;
        break;
    case Reg::QueueNum:
        if (Virtqueue* q = configurable_queue())
            q->set_size(value <= 0xffff ? static_cast<uint16_t>(value) : 0);  // 0: enable() refuses
        break;
    case Reg::QueueReady:
        if (Virtqueue* q = selected_queue(); q && !(status_ & VIRTIO_CONFIG_S_DRIVER_OK)) {
            if (value == 0) {
                q->disable();
            } else if (!q->ready()) {
                try {
                    q->enable(mem_);
                } catch (const GuestError& e) {
                    guest_warn(warn_, "virtio-mmio: queue {} not enabled: {}", queue_sel_, e.what());
                }
            }
        } else {
            guest_warn(warn_, "virtio-mmio: ignoring QueueReady for queue {}", queue_sel_);
        }
        break;
    case Reg::QueueDescLow:
        if (Virtqueue* q = configurable_queue())
            q->set_desc_addr(with_low32(q->desc_addr(), value));
        break;
    case Reg::QueueDescHigh:
        if (Virtqueue* q = configurable_queue())
            q->set_desc_addr(with_high32(q->desc_addr(), value));
        break;
    case Reg::QueueDriverLow:
        if (Virtqueue* q = configurable_queue())
            q->set_avail_addr(with_low32(q->avail_addr(), value));
        break;
    case Reg::QueueDriverHigh:
        if (Virtqueue* q = configurable_queue())
            q->set_avail_addr(with_high32(q->avail_addr(), value));
        break;
    case Reg::QueueDeviceLow:
        if (Virtqueue* q = configurable_queue())
            q->set_used_addr(with_low32(q->used_addr(), value));
        break;
    case Reg::QueueDeviceHigh:
        if (Virtqueue* q = configurable_queue())
            q->set_used_addr(with_high32(q->used_addr(), value));
        break;
    case Reg::QueueNotify:
        if (value < queues_.size() && (status_ & VIRTIO_CONFIG_S_DRIVER_OK) &&
            !(status_ & VIRTIO_CONFIG_S_NEEDS_RESET))
            return static_cast<int32_t>(value);
        guest_warn(warn_, "virtio-mmio: ignoring notify of queue {} in status {:#x}", value, status_);
        break;
    case Reg::InterruptAck:
        interrupt_status_ &= ~value;
        break;
    case Reg::Status:
        write_status(value);
        break;
    case Reg::ShmSel:
        break;  // no regions; reads of them say so whatever is selected
    default:
        break;
    }
    return -1;
}

void VirtioMmioTransport::write_status(uint32_t value)
{
    if (value == 0) {
        reset_locked();
        return;
    }
    // NEEDS_RESET is the device's bit: the driver may echo it back but not set it.
    if ((value & ~status_bits) || ((value & VIRTIO_CONFIG_S_NEEDS_RESET) && !(status_ & VIRTIO_CONFIG_S_NEEDS_RESET))) {
        guest_warn(warn_, "virtio-mmio: status {:#x} has unknown bits; ignored", value);
        return;
    }
    if (status_ & ~value) {
        guest_warn(warn_, "virtio-mmio: status {:#x} clears bits of {:#x} without a reset; ignored", value, status_);
        return;
    }
    const uint32_t added = value & ~status_;

    // §3.1.1: ACKNOWLEDGE, then DRIVER, then FEATURES_OK, then DRIVER_OK. A bit whose
    // predecessor is missing is dropped, so the driver reads back a status without it.
    auto need = [&](uint32_t bit, uint32_t before) {
        if ((added & bit) && !(value & before)) {
            guest_warn(warn_, "virtio-mmio: status bit {:#x} set before {:#x}; dropped", bit, before);
            value &= ~bit;
        }
    };
    need(VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_ACKNOWLEDGE);
    need(VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_CONFIG_S_DRIVER);
    need(VIRTIO_CONFIG_S_DRIVER_OK, VIRTIO_CONFIG_S_FEATURES_OK);

    if ((value & added & VIRTIO_CONFIG_S_FEATURES_OK) &&
        ((driver_features_ & ~device_features_) || !(driver_features_ & version_1))) {
        // §2.2.2: the device refuses by leaving FEATURES_OK clear; the driver checks.
        guest_warn(warn_, "virtio-mmio: refusing driver features {:#x} (offered {:#x}, VERSION_1 required)",
                   driver_features_, device_features_);
        value &= ~VIRTIO_CONFIG_S_FEATURES_OK;
        value &= ~VIRTIO_CONFIG_S_DRIVER_OK;
    }
    status_ = value;
    if (value & added & VIRTIO_CONFIG_S_DRIVER_OK)
        activate_locked();
}

void VirtioMmioTransport::activate_locked()
{
    const bool event_idx = driver_features_ & (1ull << VIRTIO_RING_F_EVENT_IDX);
    for (auto& q : queues_)
        q.set_event_idx(event_idx);
    VirtioContext ctx;
    ctx.mem = &mem_;
    ctx.queues = queues_;
    ctx.features = driver_features_;
    ctx.signal_used = [this] { signal_used_locked(); };
    ctx.needs_reset = [this] { needs_reset_locked(); };
    device_.activate(ctx);
}

void VirtioMmioTransport::reset_locked()
{
    device_.reset();
    for (auto& q : queues_)
        q.reset();
    status_ = 0;
    device_features_sel_ = 0;
    driver_features_sel_ = 0;
    driver_features_ = 0;
    queue_sel_ = 0;
    interrupt_status_ = 0;
}

void VirtioMmioTransport::signal_used_locked()
{
    interrupt_status_ |= VIRTIO_MMIO_INT_VRING;
    if (interrupt_)
        interrupt_();
}

void VirtioMmioTransport::needs_reset_locked()
{
    if (status_ & VIRTIO_CONFIG_S_NEEDS_RESET)
        return;
    status_ |= VIRTIO_CONFIG_S_NEEDS_RESET;
    interrupt_status_ |= VIRTIO_MMIO_INT_CONFIG;
    if (interrupt_)
        interrupt_();
}

void VirtioMmioTransport::notify_queue(uint16_t queue)
{
    std::lock_guard lock(device_.mutex());
    if (queue >= queues_.size() || !(status_ & VIRTIO_CONFIG_S_DRIVER_OK) ||
        (status_ & VIRTIO_CONFIG_S_NEEDS_RESET) || !queues_[queue].ready())
        return;
    device_.process_queue(queue);
}

uint32_t VirtioMmioTransport::status() const
{
    std::lock_guard lock(device_.mutex());
    return status_;
}

uint32_t VirtioMmioTransport::interrupt_status() const
{
    std::lock_guard lock(device_.mutex());
    return interrupt_status_;
}

uint64_t VirtioMmioTransport::driver_features() const
{
    std::lock_guard lock(device_.mutex());
    return driver_features_;
}

VirtioMmioTransport::State VirtioMmioTransport::save() const
{
    std::lock_guard lock(device_.mutex());
    State s{status_, device_features_sel_, driver_features_sel_, driver_features_, queue_sel_,
            interrupt_status_, config_generation_, {}};
    for (const auto& q : queues_)
        s.queues.push_back(q.save());
    return s;
}

void VirtioMmioTransport::restore(const State& s)
{
    std::lock_guard lock(device_.mutex());
    if (s.status & ~status_bits)
        throw Error(fmt::format("virtio-mmio state: unknown status bits in {:#x}", s.status));
    // Before FEATURES_OK the driver's request may still ask for more than was offered; the
    // device only refuses it when the driver sets FEATURES_OK.
    if ((s.status & VIRTIO_CONFIG_S_FEATURES_OK) && (s.driver_features & ~device_features_))
        throw Error(fmt::format("virtio-mmio state: negotiated features {:#x} exceed offered {:#x}",
                                s.driver_features, device_features_));
    if ((s.status & VIRTIO_CONFIG_S_FEATURES_OK) && !(s.driver_features & version_1))
        throw Error("virtio-mmio state: FEATURES_OK without VIRTIO_F_VERSION_1");
    if ((s.status & VIRTIO_CONFIG_S_DRIVER_OK) && !(s.status & VIRTIO_CONFIG_S_FEATURES_OK))
        throw Error("virtio-mmio state: DRIVER_OK without FEATURES_OK");
    if (s.interrupt_status & ~uint32_t{VIRTIO_MMIO_INT_VRING | VIRTIO_MMIO_INT_CONFIG})
        throw Error(fmt::format("virtio-mmio state: unknown interrupt bits in {:#x}", s.interrupt_status));
    if (s.queues.size() != queues_.size())
        throw Error(fmt::format("virtio-mmio state: {} queues, device has {}", s.queues.size(), queues_.size()));

    // Validate every queue before changing anything, so a bad state leaves us as we were.
    std::vector<Virtqueue> queues;
    for (size_t i = 0; i < s.queues.size(); ++i) {
        queues.emplace_back(queues_[i].max_size());
        queues.back().restore(s.queues[i], mem_);
    }

    device_.reset();
    queues_ = std::move(queues);
    status_ = s.status;
    device_features_sel_ = s.device_features_sel;
    driver_features_sel_ = s.driver_features_sel;
    driver_features_ = s.driver_features;
    queue_sel_ = s.queue_sel;
    interrupt_status_ = s.interrupt_status;
    config_generation_ = s.config_generation;
    if (status_ & VIRTIO_CONFIG_S_DRIVER_OK)
        activate_locked();
}

std::string virtio_mmio_cmdline_param(uint64_t base, uint64_t size, uint32_t irq)
{
    // The kernel parses the size with memparse(), which takes K/M/G suffixes.
    const std::string sz = size % 1024 == 0 ? fmt::format("{}K", size / 1024) : fmt::format("{}", size);
    return fmt::format("virtio_mmio.device={}@{:#x}:{}", sz, base, irq);
}

} // namespace agentvm
