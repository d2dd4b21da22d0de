// What serve can tell of one sandbox's VM from the host, without asking its guest (E2B's
// getInfo and getMetrics show it): its size, read from the manifest of the snapshot its pool
// restores, and what its processes use, read from /proc. The guest's own view (its page
// cache, its filesystem's free space) is out of reach: a call into the guest would count as
// the sandbox's activity and could wait behind its other calls.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "service/pools.hpp"

namespace agentvm {

struct VmShape {
    unsigned vcpus = 0;
    uint64_t mem_mib = 0;
    uint64_t disk_bytes = 0;  // the root disk's size; 0 when the manifest records none
};

// The shape a snapshot's manifest.json records (vmm/snapshot.hpp), or nullopt for a text that
// is not one.
std::optional<VmShape> vm_shape_of_manifest(std::string_view manifest);
// The shape of pool `pool`'s VMs: from the snapshot they restore, its --snapshot, its
// --template's baked one, or else set-up's default snapshot beside `program` (the agentvm
// binary). nullopt when there is none to read (an unbaked template's VMs boot cold).
std::optional<VmShape> pool_vm_shape(const PoolConfig& pool, const std::string& program);

// utime + stime of a /proc/PID/stat text, in seconds (`ticks`: sysconf(_SC_CLK_TCK)).
std::optional<double> cpu_seconds_of_stat(std::string_view stat, long ticks);
// VmRSS of a /proc/PID/status text, in bytes.
std::optional<uint64_t> rss_bytes_of_status(std::string_view status);

// One reading of a sandbox's VM: its episode process and every process under it (the jailed
// VMM, which runs the guest's vCPUs and holds its memory).
struct VmUsage {
    double cpu_seconds = 0;    // host CPU time they have used, all of their threads
    uint64_t rss_bytes = 0;    // their resident memory: guest pages touched, and the VMM's own
    uint64_t disk_used = 0;    // bytes the disk's copy-on-write overlay stores, when readable
};
// `disk_bytes`: the root disk's size, by which the overlay (an unnamed file of that size,
// devices/cow_disk.hpp) is told from the VMM's other open files.
VmUsage measure_vm(pid_t episode, uint64_t disk_bytes);

// CPU use as a share of a sandbox's vCPUs, between one reading of it and the next: what a
// getMetrics call reports as cpuUsedPct. The first reading of a sandbox counts from its start.
class CpuMeter {
public:
    using Clock = std::chrono::steady_clock;
    // Percent of `vcpus` cores busy since the previous reading of `id` (or since `started`),
    // from 0 to 100.
    double percent(const std::string& id, double cpu_seconds, unsigned vcpus, Clock::time_point started,
                   Clock::time_point now);

private:
    struct Reading {
        double cpu_seconds;
        Clock::time_point at;
    };
    std::map<std::string, Reading> last_;
};

} // namespace agentvm
