// The filesystems every program in the guest expects to find.
#pragma once

namespace agentvm {

// devtmpfs at /dev, first of all: the console and /dev/null live there. False (after saying
// why) on failure. Here and below, a filesystem already mounted (by the kernel's
// DEVTMPFS_MOUNT, or an initramfs that moved its mounts over) counts as mounted.
bool mount_dev();

// /proc, /sys, /dev/pts, /dev/shm, /tmp and /run. False (after saying why) only when /proc
// is missing, which init needs for the command line; the others just warn.
bool mount_filesystems();

} // namespace agentvm
