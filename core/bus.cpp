#include "core/bus.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "common/error.hpp"

namespace agentvm {

void Bus::insert(uint64_t base, uint64_t len, BusDevice& device)
{
    if (len == 0 || base + len < base)
        throw Error(fmt::format("bus range at {:#x} has an invalid length {:#x}", base, len));
    for (const auto& r : ranges_) {
        if (base < r.base + r.len && r.base < base + len)
            throw Error(fmt::format("bus range [{:#x}, +{:#x}) overlaps [{:#x}, +{:#x})", base, len,
                                    r.base, r.len));
    }
    auto pos = std::lower_bound(ranges_.begin(), ranges_.end(), base,
                                [](const Range& r, uint64_t b) { return r.base < b; });
    ranges_.insert(pos, Range{base, len, &device});
}

const Bus::Range* Bus::find(uint64_t addr, uint64_t len) const
{
    auto it = std::upper_bound(ranges_.begin(), ranges_.end(), addr,
                               [](uint64_t a, const Range& r) { return a < r.base; });
    if (it == ranges_.begin())
        return nullptr;
    const Range& r = *std::prev(it);
    const uint64_t offset = addr - r.base;
    if (offset >= r.len || len > r.len - offset)
        return nullptr;
    return &r;
}

bool Bus::read(uint64_t addr, std::span<uint8_t> data) const
{
    const Range* r = find(addr, data.size());
    if (!r)
        return false;
    r->device->bus_read(addr - r->base, data);
    return true;
}

bool Bus::write(uint64_t addr, std::span<const uint8_t> data) const
{
    const Range* r = find(addr, data.size());
    if (!r)
        return false;
    r->device->bus_write(addr - r->base, data);
    return true;
}

} // namespace agentvm
