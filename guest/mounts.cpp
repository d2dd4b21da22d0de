#include "guest/mounts.hpp"

#include <sys/mount.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>

#include "guest/console.hpp"

namespace agentvm {

namespace {

struct Mount {
    const char* source;
    const char* target;
    const char* type;
    unsigned long flags;
    const char* options;
    bool required;
};

constexpr unsigned long no_suid_dev_exec = MS_NOSUID | MS_NODEV | MS_NOEXEC;

constexpr Mount dev_mount = {"devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755", true};

// gid 5 is Debian's "tty" group, which owns pseudo-terminals as on any Debian system.
constexpr Mount later_mounts[] = {
    {"proc", "/proc", "proc", no_suid_dev_exec, nullptr, true},
    {"sysfs", "/sys", "sysfs", no_suid_dev_exec, nullptr, false},
    // For the tool calls' cgroups (calls_cgroup.hpp); sysfs provides the mount point.
    // favordynmods: the agent moves a process into a cgroup at every call, which otherwise
    // waits out an RCU grace period each time; forks get a little slower instead.
    {"cgroup2", "/sys/fs/cgroup", "cgroup2", no_suid_dev_exec, "favordynmods", false},
    {"devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "gid=5,mode=0620,ptmxmode=0666", false},
    {"tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777", false},
    {"tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777", false},
    {"tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755", false},
};

bool mount_one(const Mount& m)
{
    // The image has the top-level mount points; /dev/pts and /dev/shm live on devtmpfs.
    if (::mkdir(m.target, 0755) != 0 && errno != EEXIST) {
        char what[128];
        std::snprintf(what, sizeof(what), "mkdir %s", m.target);
        say_errno(what);
    }
    // EBUSY: the kernel (DEVTMPFS_MOUNT) or an initramfs mounted it there already.
    if (::mount(m.source, m.target, m.type, m.flags, m.options) == 0 || errno == EBUSY)
        return true;
    char what[128];
    std::snprintf(what, sizeof(what), "mount %s on %s", m.type, m.target);
    say_errno(what);
    return false;
}

} // namespace

bool mount_dev()
{
    return mount_one(dev_mount);
}

bool mount_filesystems()
{
    bool ok = true;
    for (const Mount& m : later_mounts)
        if (!mount_one(m) && m.required)
            ok = false;
    return ok;
}

} // namespace agentvm
