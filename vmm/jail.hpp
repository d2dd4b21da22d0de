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
//     With an identity (serve gives each VM its own, --jail-uid/--jail-gid), the process then
//     becomes that unprivileged uid and gid, with no supplementary groups and umask 007: a VMM
//     a guest took over cannot read or signal another VMM, nor open another's files, even
//     where it could name them. What it must write by name after that (its vsock directory,
//     its snapshot outbox) its launcher has shared with that gid.
//     The namespaces come this late because paths resolved before them stay true: under a
//     chroot, a file opened in the old mount namespace (/proc/self/exe) no longer has a path
//     below the root in the new one.
// The per-thread seccomp filters (vmm/seccomp.hpp) come on top.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace agentvm {

struct JailDir {
    std::string path;  // absolute
    bool writable = false;
};

// The unprivileged uid and gid a VMM becomes; never 0.
struct JailIdentity {
    uid_t uid = 0;
    gid_t gid = 0;
};

struct JailSpec {
    std::vector<JailDir> dirs;  // all the host filesystem the VMM keeps
    std::optional<JailIdentity> identity;  // none: the VMM keeps its supervisor's uid
    uint64_t max_open_files = 4096;
    uint64_t max_file_bytes = 0;  // the largest file the VMM may write (console log, disk overlay, snapshot)
};

// Throws Error naming what is missing when this process could not build the jail: the
// capabilities it uses before dropping them all, CAP_SYS_ADMIN (namespaces, mounts, pivot_root)
// and CAP_SETPCAP (securebits, bounding set), effective. Root has them; a service user may be
// given them (deploy/systemd/agentvm-serve.service), its cgroup then delegated to it.
// `switches_identity`: the VMM will become a JailIdentity, which also takes CAP_SETUID and
// CAP_SETGID (in the VMM) and CAP_KILL (for the supervisor to signal a VMM of another uid).
void check_jail_privileges(bool switches_identity = false);

// Throws Error naming the step that failed.
// Keeps stdin, stdout, stderr and `keep`, the supervisor's end of their link (moved to 3 if it
// is not already; returned). lock_down() watches it to see the supervisor has not died while
// the parent-death signal was being set again after the identity switch.
int close_inherited_fds(int keep);
void lock_down(const JailSpec& spec);

} // namespace agentvm
