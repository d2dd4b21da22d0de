#!/bin/busybox sh
# /init of the test host (L1). Runs under the emulated AMD CPU, with Debian's kernel.
# Loads virtio/9p/kvm modules, mounts the host's root (read-only) plus the writable
# shares over 9p, chroots into it with fresh /proc /sys /dev (holding L1's /dev/kvm) and
# runs the command the runner wrote to the "run" share. Its stdout/stderr go to two
# virtio-serial ports (raw, no tty processing); its exit status to run/status.
/bin/busybox mkdir -p /proc /sys /dev /tmp /newroot /run-share
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev

fail() {
    echo "testhost(L1): $*" >/dev/ttyS0
    ls /dev /sys/bus/virtio/drivers/* >/dev/ttyS0 2>&1
    echo "testhost(L1): $*" >/dev/vport0p2 2>/dev/null
    reboot -f
}

# Without ACPI, QEMU's microvm names its virtio-mmio devices on the kernel command line
# (virtio_mmio.device=...); a module loaded by insmod gets them as arguments.
MMIO=
for a in $(cat /proc/cmdline); do
    case "$a" in virtio_mmio.device=*) MMIO="$MMIO device=${a#virtio_mmio.device=}" ;; esac
done
while read -r m args; do
    [ "$m" = virtio_mmio ] && args="$args $MMIO"
    insmod "/lib/modules/$m.ko" $args || fail "insmod $m failed"
done </modules.list

# virtio-mmio devices probe asynchronously after insmod; wait for the ports and shares.
i=0
while [ ! -e /dev/vport0p2 ] || ! grep -q run /sys/bus/virtio/drivers/9pnet_virtio/*/mount_tag 2>/dev/null; do
    i=$((i + 1)); [ $i -gt 300 ] && fail "virtio devices did not appear"; usleep 10000
done

P9="trans=virtio,version=9p2000.L,msize=512000"
mount -t 9p -o "$P9,cache=none" run /run-share || fail "mount run share"
mount -t 9p -o "$P9,ro,cache=loose" root /newroot || fail "mount host root"
mount -t proc proc /newroot/proc
mount -t sysfs sys /newroot/sys
# agentvm puts every VMM in a cgroup of its own (cgroup v2, as on a systemd host).
mount -t cgroup2 cgroup2 /newroot/sys/fs/cgroup
mount -t devtmpfs dev /newroot/dev
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts /newroot/dev/pts
mount -t tmpfs -o mode=1777 tmpfs /newroot/dev/shm
mount -t tmpfs -o mode=1777 tmpfs /newroot/tmp
mount -t tmpfs -o mode=1777 tmpfs /newroot/var/tmp
mount -t tmpfs -o mode=755 tmpfs /newroot/run
# Writable shares: "tag path" per line, parents before children.
while read -r tag path; do
    [ -n "$tag" ] || continue
    mkdir -p "/newroot$path" 2>/dev/null
    mount -t 9p -o "$P9,cache=mmap" "$tag" "/newroot$path" || fail "mount $path"
done </run-share/shares
mkdir -p /newroot/tmp/.testhost
mount --bind /run-share /newroot/tmp/.testhost

echo 1 >/run-share/started
# In a subshell, so a "Killed" notice from this shell goes to the console, not CMD's stderr.
(exec chroot /newroot /bin/sh /tmp/.testhost/cmd.sh) </dev/null >/dev/vport0p1 2>/dev/vport0p2
echo $? >/run-share/status
sync
reboot -f
