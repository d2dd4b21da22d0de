// A cgroup per VMM, holding its host CPU quota, memory and process-count limits.
//
// Moving a process into a group is slow (the kernel waits out an RCU grace period: 0.5 to 13 ms
// measured on these hosts, more under load), so the supervisor moves the VMM in while the VMM
// goes on: a restored VM does not wait for it, so what it allocates and touches in its first
// milliseconds is counted in agentvm's own group instead (guest RAM stays bounded by --mem).
// A cold boot, which writes the kernel image into guest memory and is slow anyway, waits
// (wait_joined) before it builds the VM.
//
// cgroup v2 where the host runs it unified (/sys/fs/cgroup/cgroup.controllers exists), v1
// otherwise (one hierarchy per controller under /sys/fs/cgroup/<controller>). The group is
// made by the supervisor before the VMM process exists and removed by it after the VMM has
// ended, so a VMM that is killed (by its memory limit, by SIGKILL) leaves nothing behind; a
// supervisor killed with SIGKILL does, and the next supervisor to create a group removes it:
//   v1: <controller mount>/<agentvm's own cgroup>/agentvm-<supervisor pid>, per controller;
//   v2: /sys/fs/cgroup/agentvm/vm-<supervisor pid>. Under v2 a group with processes cannot
//       hand controllers to children, and agentvm's own group usually has processes, so the
//       parent "agentvm" sits at the root (which is exempt), where its controllers are enabled.
//       Under `agentvm serve --delegated-cgroup` (systemd's Delegate=yes) the parent is
//       serve's own cgroup instead, named by $AGENTVM_CGROUP_PARENT (common/cgroup_parent.hpp):
//       serve has moved itself into a leaf below it, and a service's user may write nowhere
//       else in the hierarchy.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/fd.hpp"

namespace agentvm {

struct CgroupLimits {
    double cpu_cores = 0;      // CPU quota in cores (0: none)
    uint64_t memory_bytes = 0; // hard limit on the VMM's memory, guest RAM included (0: none)
    uint64_t max_pids = 0;     // threads and processes (0: none)
    unsigned cpu_weight = 0;   // share of contended CPU, 1-10000 as v2's cpu.weight (0: default)
};

class VmCgroup {
public:
    // Creates the (empty) group for the VMM the calling process supervises, after removing
    // those that supervisors killed before they could left beside it. Throws Error naming the
    // problem (no cgroup filesystem, a controller missing, no permission).
    static VmCgroup create();
    VmCgroup(VmCgroup&& other) noexcept;
    VmCgroup(const VmCgroup&) = delete;
    ~VmCgroup();

    bool unified() const { return unified_; }
    // In the supervisor: moves process `pid` in.
    void add(pid_t pid) const;
    // In the VMM process: `joined` is readable once the supervisor has moved it in.
    void await_join(Fd joined) { joined_ = std::move(joined); }
    // Blocks until the supervisor has moved this process in (at once if it has already been
    // waited for). Throws Error if the supervisor could not.
    void wait_joined();
    void limit(const CgroupLimits& limits) const;
    // After the VMM has ended: whether its memory limit was hit (a kill would then be the
    // kernel's OOM killer acting on the limit).
    bool memory_limit_hit() const;
    // The VMM process's copy must not remove the group it runs in; only the supervisor's does.
    void disown() { owned_ = false; }
    // Where the group lives (one directory per v1 controller), for messages and tests.
    const std::vector<std::string>& dirs() const { return dirs_; }

private:
    VmCgroup(bool unified, std::vector<std::string> dirs) : unified_(unified), dirs_(std::move(dirs)) {}
    VmCgroup& operator=(VmCgroup&&) = delete;
    std::string dir_for(const char* controller) const;
    void remove();

    bool unified_;
    std::vector<std::string> dirs_;
    bool owned_ = true;
    Fd joined_;
};

} // namespace agentvm
