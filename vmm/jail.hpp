// The VMM's jail, on by default (--no-jail turns it off, for debugging only).
//
// A guest that breaks out of KVM or a device model lands in the VMM process; the jail makes
// that process worth little. It is entered in two steps, since what the VMM needs on the host
// is opened while the VM is being built:
//  1. close_inherited_fds(), first thing in the VMM process (the supervisor has already put it
//     in a new PID namespace, where it sees no other process): only stdin, stdout, stderr and
//     the supervisor's pipe stay.
//  2. lock_down(), once the VM is built (kernel, disk, snapshot, /dev/kvm and the console all
//     open) and before any thread starts, so that every thread inherits it: new mount, IPC,
//     UTS and network namespaces (no network device, not even loopback up: the VMM needs
//     none); pivot_root into an empty read-only tmpfs holding only the directories the VMM
//     still uses by name (the vsock socket's, a snapshot being baked), bound at their own
//     paths; rlimits on open files and file size, no core dumps; no_new_privs; every
//     capability dropped, from the bounding set too, with root's special treatment locked off.
//     The namespaces come this late because paths resolved before them stay true: under a
//     chroot, a file opened in the old mount namespace (/proc/self/exe) no longer has a path
//     below the root in the new one.
// The per-thread seccomp filters (vmm/seccomp.hpp) come on top.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace agentvm {

struct JailDir {
    std::string path;  // absolute
    bool writable = false;
};

struct JailSpec {
    std::vector<JailDir> dirs;  // all the host filesystem the VMM keeps
    uint64_t max_open_files = 4096;
    uint64_t max_file_bytes = 0;  // the largest file the VMM may write (console log, disk overlay, snapshot)
};

// Throws Error naming what is missing when this process could not build the jail: the
// capabilities it uses before dropping them all, CAP_SYS_ADMIN (namespaces, mounts, pivot_root)
// and CAP_SETPCAP (securebits, bounding set), effective. Root has them; a service user may be
// given them (deploy/systemd/agentvm-serve.service), its cgroup then delegated to it.
void check_jail_privileges();

// Throws Error naming the step that failed.
// Keeps stdin, stdout, stderr and `keep` (moved to 3 if it is not already; returned).
int close_inherited_fds(int keep);
void lock_down(const JailSpec& spec);

} // namespace agentvm
