#include "vmm/jail.hpp"

#include <fcntl.h>
#include <linux/capability.h>
#include <linux/close_range.h>
#include <linux/securebits.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <ctime>
#include <filesystem>
#include <utility>

#include <fmt/format.h>

#include "common/capabilities.hpp"
#include "common/error.hpp"
#include "common/fd.hpp"

namespace agentvm {
namespace {

// Any directory every Linux host has: the new root is mounted over it, in the VMM's own mount
// namespace only, and the directories to keep are reached through descriptors opened before.
constexpr const char* staging = "/tmp";

// The supervisor's end of the link the VMM keeps (close_inherited_fds), or -1 outside one.
int supervisor_link = -1;

void check(int rc, const std::string& what)
{
    if (rc != 0)
        throw_errno("jail: " + what);
}

void make_dirs(const std::string& path)
{
    std::error_code ec;
    std::filesystem::create_directories(path, ec);
    if (ec)
        throw Error(fmt::format("jail: creating '{}' in the new root: {}", path, ec.message()));
}

void set_limit(int resource, uint64_t value, const char* name)
{
    const rlimit limit{value, value};
    check(::setrlimit(resource, &limit), fmt::format("setting {} to {}", name, value));
}

// Root keeps no special treatment from here on, for this thread and all it starts, and no
// capability can come back. The effective set stays, for become() and then clear_capabilities().
void lock_capabilities()
{
    // SECBIT_NO_SETUID_FIXUP: a uid switch leaves the capability sets as they are, so the
    // switch may come before clear_capabilities() empties them.
    check(::prctl(PR_SET_SECUREBITS, SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP |
                                         SECBIT_NO_SETUID_FIXUP_LOCKED | SECBIT_KEEP_CAPS_LOCKED),
          "locking the securebits");
    for (unsigned long cap = 0; ::prctl(PR_CAPBSET_READ, cap) >= 0; ++cap)
        check(::prctl(PR_CAPBSET_DROP, cap), fmt::format("dropping capability {} from the bounding set", cap));
    check(::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clearing the ambient capabilities");
}

void clear_capabilities()
{
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct none[_LINUX_CAPABILITY_U32S_3] = {};
    check(static_cast<int>(::syscall(SYS_capset, &header, none)), "dropping every capability");
}

void become(const JailIdentity& identity)
{
    if (identity.uid == 0 || identity.gid == 0)
        throw Error("jail: the VMM's uid and gid must not be 0");
    check(::setgroups(0, nullptr), "dropping the supplementary groups");
    check(::setresgid(identity.gid, identity.gid, identity.gid), fmt::format("becoming gid {}", identity.gid));
    check(::setresuid(identity.uid, identity.uid, identity.uid), fmt::format("becoming uid {}", identity.uid));
    // What it creates (live snapshots) its launcher reads through the directory's group.
    ::umask(007);
    // A change of uid clears the parent-death signal: set it again, then make sure the
    // supervisor did not die in between (its end of the link is then closed).
    check(::prctl(PR_SET_PDEATHSIG, SIGKILL), "setting the parent-death signal again");
    if (supervisor_link >= 0) {
        pollfd hangup{supervisor_link, 0, 0};
        if (::poll(&hangup, 1, 0) < 0 || (hangup.revents & POLLHUP) != 0)
            ::_exit(1);
    }
}

// After become(): each directory kept writable must be writable to the identity, or the VMM
// would fail later, at its first snapshot or socket, with a less clear error.
void check_writable(const std::vector<JailDir>& dirs, const JailIdentity& identity)
{
    for (const auto& dir : dirs)
        if (dir.writable && ::access(dir.path.c_str(), W_OK | X_OK) != 0)
            throw_errno(fmt::format("jail: uid {} gid {} cannot write '{}', which the VMM needs: give it that "
                                    "group (chgrp {} and chmod g+rwx)",
                                    identity.uid, identity.gid, dir.path, identity.gid));
}

} // namespace

void check_jail_privileges(bool switches_identity)
{
    std::vector<Capability> needed{{CAP_SYS_ADMIN, "CAP_SYS_ADMIN"}, {CAP_SETPCAP, "CAP_SETPCAP"}};
    if (switches_identity)
        needed.insert(needed.end(), {{CAP_SETUID, "CAP_SETUID"}, {CAP_SETGID, "CAP_SETGID"}, {CAP_KILL, "CAP_KILL"}});
    const std::vector<std::string> missing = missing_capabilities(needed);
    if (!missing.empty())
        throw Error(fmt::format("the VMM's jail needs {} (namespaces, pivot_root, the securebits{}), which root has: "
                                "run agentvm as root, give its user the capabilities (deploy/systemd/"
                                "agentvm-serve.service), or use --no-jail to debug without the jail",
                                fmt::join(missing, " and "),
                                switches_identity ? ", the VMM's own uid and gid, signals to it" : ""));
}

int close_inherited_fds(int keep)
{
    constexpr int kept = 3;
    if (keep != kept) {
        check(::dup3(keep, kept, O_CLOEXEC) < 0 ? -1 : 0, "keeping the supervisor's pipe");
        Fd(keep).reset();
    }
    check(static_cast<int>(::syscall(SYS_close_range, kept + 1U, ~0U, 0U)), "closing inherited file descriptors");
    supervisor_link = kept;
    return kept;
}

void lock_down(const JailSpec& spec)
{
    // Log lines carry local time; the zone file is out of reach once the root has moved.
    ::tzset();
    // The new root's directories stay searchable after an identity switch.
    ::umask(022);
    set_limit(RLIMIT_NOFILE, spec.max_open_files, "RLIMIT_NOFILE");
    if (spec.max_file_bytes > 0) {
        set_limit(RLIMIT_FSIZE, spec.max_file_bytes, "RLIMIT_FSIZE");
        // A write past the limit then fails with EFBIG, which the writer reports, rather than
        // killing the VMM.
        std::signal(SIGXFSZ, SIG_IGN);
    }
    set_limit(RLIMIT_CORE, 0, "RLIMIT_CORE");  // a core dump would hold guest memory

    check(::unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET), "unsharing namespaces");
    // Nothing mounted for the jail may show up on the host, nor the host's later mounts here.
    check(::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr), "making the mounts private");

    // Parents before children, so a directory inside another kept one is bound on top of it.
    std::vector<JailDir> dirs = spec.dirs;
    std::sort(dirs.begin(), dirs.end(), [](const JailDir& a, const JailDir& b) { return a.path < b.path; });
    std::vector<Fd> sources;
    for (const auto& dir : dirs) {
        if (dir.path.empty() || dir.path.front() != '/')
            throw Error(fmt::format("jail: '{}' is not an absolute path", dir.path));
        sources.emplace_back(::open(dir.path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
        if (!sources.back())
            throw_errno(fmt::format("jail: opening '{}'", dir.path));
    }
    check(::mount("agentvm-jail", staging, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755,size=16k"),
          "mounting the new root");
    constexpr unsigned long hardened = MS_NOSUID | MS_NODEV | MS_NOEXEC;
    for (size_t i = 0; i < dirs.size(); ++i) {
        const std::string target = std::string(staging) + dirs[i].path;
        make_dirs(target);
        const std::string source = fmt::format("/proc/self/fd/{}", sources[i].get());
        // Not recursive: what is mounted below a kept directory stays out, and so does the new
        // root itself when it covers one (a snapshot baked into /tmp/...).
        check(::mount(source.c_str(), target.c_str(), nullptr, MS_BIND, nullptr),
              fmt::format("binding '{}'", dirs[i].path));
        check(::mount(nullptr, target.c_str(), nullptr,
                      MS_BIND | MS_REMOUNT | hardened | (dirs[i].writable ? 0 : MS_RDONLY), nullptr),
              fmt::format("restricting '{}'", dirs[i].path));
    }
    sources.clear();
    check(::chdir(staging), "entering the new root");
    // pivot_root(".", ".") stacks the old root under the new one, where it is detached at once.
    check(static_cast<int>(::syscall(SYS_pivot_root, ".", ".")), "pivot_root");
    check(::umount2(".", MNT_DETACH), "detaching the host's root");
    check(::chdir("/"), "entering the new root");
    check(::mount(nullptr, "/", nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY | hardened, nullptr),
          "making the new root read-only");

    check(::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "setting no_new_privs");
    lock_capabilities();
    if (spec.identity)
        become(*spec.identity);
    clear_capabilities();
    if (spec.identity)
        check_writable(spec.dirs, *spec.identity);
}

} // namespace agentvm
