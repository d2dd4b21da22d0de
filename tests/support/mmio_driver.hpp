// A test's side of a virtio-mmio transport: 32-bit register access and feature negotiation
// up to FEATURES_OK, in the order a driver follows (virtio 1.2 §3.1.1).
#pragma once

#include <linux/virtio_config.h>
#include <linux/virtio_mmio.h>

#include <cstdint>
#include <span>

#include "devices/virtio_mmio.hpp"

namespace agentvm::test {

class MmioDriver {
public:
    explicit MmioDriver(VirtioMmioTransport& transport) : transport_(transport) {}

    // Starts from a sentinel, so a read the transport leaves untouched is visible.
    uint32_t rd(uint64_t offset) const
    {
        uint32_t v = 0xdeadbeef;
        transport_.bus_read(offset, std::span(reinterpret_cast<uint8_t*>(&v), 4));
        return v;
    }
    void wr(uint64_t offset, uint32_t v) const
    {
        transport_.bus_write(offset, std::span(reinterpret_cast<const uint8_t*>(&v), 4));
    }
    void negotiate(uint64_t features) const
    {
        wr(VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE);
        wr(VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER);
        wr(VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0);
        wr(VIRTIO_MMIO_DRIVER_FEATURES, static_cast<uint32_t>(features));
        wr(VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
        wr(VIRTIO_MMIO_DRIVER_FEATURES, static_cast<uint32_t>(features >> 32));
        wr(VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK);
    }

private:
    VirtioMmioTransport& transport_;
};

} // namespace agentvm::test
