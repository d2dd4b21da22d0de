#include "service/admission.hpp"

#include <fstream>
#include <string>

#include <fmt/format.h>

#include "common/error.hpp"

namespace agentvm {

uint64_t host_available_mib()
{
    std::ifstream meminfo("/proc/meminfo");
    std::string key;
    uint64_t kib = 0;
    std::string unit;
    while (meminfo >> key >> kib >> unit) {
        if (key == "MemAvailable:")
            return kib / 1024;
    }
    throw Error("/proc/meminfo has no MemAvailable");
}

Admission::Admission(unsigned max_sandboxes, uint64_t mem_reserve_mib, MemoryProbe available_mib,
                     std::function<size_t()> live_vms)
    : max_sandboxes_(max_sandboxes), mem_reserve_mib_(mem_reserve_mib), available_mib_(std::move(available_mib)),
      live_vms_(std::move(live_vms))
{
}

Refusal Admission::closed_refusal()
{
    return Refusal{ServiceError::draining, "serve is shutting down", std::nullopt};
}

std::optional<Refusal> Admission::admit_create(const std::function<bool()>& make_room) const
{
    // A VM on its way out no longer counts, so one stopped by make_room leaves a place.
    if (live_vms_() >= max_sandboxes_ && !make_room())
        return Refusal{ServiceError::at_capacity,
                       fmt::format("{} VMs are running, the most --max-sandboxes allows", live_vms_()), 1};
    return below_memory_reserve();
}

std::optional<Refusal> Admission::admit_restores(unsigned count) const
{
    if (closed_)
        return closed_refusal();
    if (live_vms_() + count > max_sandboxes_)
        return Refusal{ServiceError::at_capacity,
                       fmt::format("{} VMs are running and {} more would pass --max-sandboxes {}", live_vms_(), count,
                                   max_sandboxes_),
                       1};
    return below_memory_reserve();
}

bool Admission::refill_may_start() const
{
    return !closed_ && live_vms_() < max_sandboxes_ && available_mib_() >= mem_reserve_mib_;
}

std::optional<Refusal> Admission::below_memory_reserve() const
{
    const uint64_t available = available_mib_();
    if (available >= mem_reserve_mib_)
        return std::nullopt;
    return Refusal{ServiceError::memory_reserve,
                   fmt::format("the host has {} MiB available, under the {} MiB reserve (--mem-reserve)", available,
                               mem_reserve_mib_),
                   5};
}

} // namespace agentvm
