// The supervisor: the agentvm process the user started, which runs the VMM as its child.
//
// The child is created in a new PID namespace (a namespace applies to children only, so the
// VMM cannot enter one itself) and in the VMM's cgroup. The parent stays small and outside the
// jail, so that whatever becomes of the VMM — it exits, it is killed by its memory limit or
// by a seccomp filter, it wedges past its deadline — someone is left to say what happened,
// pass on its status, and remove its cgroup. The child dies with the parent
// (PR_SET_PDEATHSIG), so no VMM outlives the process its user knows about.
#pragma once

#include <chrono>
#include <functional>
#include <optional>

#include "vmm/cgroup.hpp"

namespace agentvm {

struct Supervision {
    VmCgroup* cgroup = nullptr;  // may be null: no limits
    // The VMM is killed (SIGKILL) if it is still running this long after it was started.
    std::optional<std::chrono::milliseconds> hard_deadline;
    // The status to report when the VMM was killed by a signal; 0: 128 + the signal.
    int killed_code = 0;
};

// In the parent: runs `vmm` in the child and returns the status to exit with (the child's own,
// or killed_code for a child ended by a signal, after saying why). In the child: enters the
// VMM's namespaces and cgroup, runs `vmm` and returns its result, which the caller returns from
// main. SIGINT, SIGTERM and SIGHUP sent to the parent are passed on to the VMM. Throws Error
// when the child cannot be created (nothing is left behind then).
int supervise(const Supervision& supervision, const std::function<int()>& vmm);

} // namespace agentvm
