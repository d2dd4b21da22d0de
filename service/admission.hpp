// Admission control (docs/api.md, "Pools and admission control"): whether serve may start one
// more VM. Never more than max_sandboxes VMs (warm, starting, handed out; not those stopping),
// never into the host's memory reserve, and nothing once serve drains. A create refused here is
// answered 429 or 503, never left to the host's OOM killer; refill asks too, so it yields to
// live demand.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>

#include "service/problem.hpp"

namespace agentvm {

// MiB the host can still give without swapping (MemAvailable). Throws Error when it cannot be
// read.
using MemoryProbe = std::function<uint64_t()>;
// The host's own, from /proc/meminfo.
uint64_t host_available_mib();

class Admission {
public:
    // `live_vms`: the VMs that count against max_sandboxes now.
    Admission(unsigned max_sandboxes, uint64_t mem_reserve_mib, MemoryProbe available_mib,
              std::function<size_t()> live_vms);

    // SIGTERM: from now on nothing is admitted, refill included.
    void close() { closed_ = true; }
    bool closed() const { return closed_; }
    // What everything is answered once closed.
    static Refusal closed_refusal();

    // A create that needs a VM started. When every place is taken, `make_room` may stop a
    // spare VM (a warm one of another pool) and says whether it did.
    std::optional<Refusal> admit_create(const std::function<bool()>& make_room) const;
    // `count` VMs restored from a live snapshot (fork, resume), which take no one's place.
    std::optional<Refusal> admit_restores(unsigned count) const;
    // Whether a refill may start one more VM. Throws Error when memory cannot be read.
    bool refill_may_start() const;

    uint64_t available_mib() const { return available_mib_(); }
    uint64_t reserve_mib() const { return mem_reserve_mib_; }

private:
    // The 503 a VM start gets while the host has less than the reserve available.
    std::optional<Refusal> below_memory_reserve() const;

    unsigned max_sandboxes_;
    uint64_t mem_reserve_mib_;
    MemoryProbe available_mib_;
    std::function<size_t()> live_vms_;
    bool closed_ = false;
};

} // namespace agentvm
