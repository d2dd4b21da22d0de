// Port-I/O and MMIO dispatch: address ranges mapped to devices.
//
// A Bus is filled while the VM is built and is read-only once vCPUs run, so lookups need no
// lock; each device guards its own state.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace agentvm {

class BusDevice {
public:
    virtual ~BusDevice() = default;
    // offset is relative to the base the device was inserted at; data.size() is 1, 2, 4 or 8.
    virtual void bus_read(uint64_t offset, std::span<uint8_t> data) = 0;
    virtual void bus_write(uint64_t offset, std::span<const uint8_t> data) = 0;
};

class Bus {
public:
    // Throws Error if [base, base+len) overlaps a range already inserted or len is 0.
    void insert(uint64_t base, uint64_t len, BusDevice& device);

    // False when no device claims the whole access; a read then leaves data as it was.
    bool read(uint64_t addr, std::span<uint8_t> data) const;
    bool write(uint64_t addr, std::span<const uint8_t> data) const;

private:
    struct Range {
        uint64_t base;
        uint64_t len;
        BusDevice* device;
    };
    const Range* find(uint64_t addr, uint64_t len) const;

    std::vector<Range> ranges_;  // sorted by base
};

} // namespace agentvm
