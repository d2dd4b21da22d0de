#!/bin/busybox sh
# /init of the test host (L1). Runs under the emulated AMD CPU, with Debian's kernel.
# Loads virtio/9p/kvm modules, mounts the host's root (read-only) plus the writable
# shares over 9p, chroots into it with fresh /proc /sys /dev (holding L1's /dev/kvm) and
# runs the command the runner wrote to the "run" share. Its stdout/stderr are pipes that
# relays copy to two virtio-serial ports (raw, no tty processing); its stdin is /dev/null or,
# when the runner forwards its own, a pipe fed from a third port. Its exit status goes to
# run/status, what the relays did to run/streams.
/bin/busybox mkdir -p /proc /sys /dev /tmp /newroot /run-share
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
# For virtio_console's per-port byte counts (virtio-ports/vport0pN: bytes_sent).
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null

fail() {
    echo "testhost(L1): $*" >/dev/ttyS0
    ls /dev /sys/bus/virtio/drivers/* >/dev/ttyS0 2>&1
    echo "testhost(L1): $*" >/dev/vport0p2 2>/dev/null
    reboot -f
}

# Loopback, as any booted system has it (the kernel gives lo 127.0.0.1/8 and ::1 when it goes
# up): without it a server CMD starts on 127.0.0.1 (agentvm serve --listen tcp:...) is
# unreachable to its clients in the same run (ENETUNREACH).
ip link set lo up || fail "ip link set lo up failed"

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
if [ -e /run-share/stdin ]; then
    i=0
    while [ ! -e /dev/vport0p3 ]; do
        i=$((i + 1)); [ $i -gt 300 ] && fail "stdin port did not appear"; usleep 10000
    done
fi
mount -t 9p -o "$P9,ro,cache=loose" root /newroot || fail "mount host root"
mount -t proc proc /newroot/proc
mount -t sysfs sys /newroot/sys
# agentvm puts every VMM in a cgroup of its own (cgroup v2, as on a systemd host).
mount -t cgroup2 cgroup2 /newroot/sys/fs/cgroup
mount -t devtmpfs dev /newroot/dev
# What udev would add: /dev/fd and /dev/std{in,out,err} (devtmpfs has none of them).
ln -s /proc/self/fd /newroot/dev/fd
ln -s /proc/self/fd/0 /newroot/dev/stdin
ln -s /proc/self/fd/1 /newroot/dev/stdout
ln -s /proc/self/fd/2 /newroot/dev/stderr
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
# CMD never writes to a port itself: a port takes at most 32 KiB per write(2), so a program
# that writes a big buffer once and does not retry the short write (print() under
# PYTHONUNBUFFERED=1, a bare os.write) would lose the rest; and a port allows one open at
# a time (EBUSY), so /dev/stdout could not be reopened. CMD's stdout and stderr are pipes
# instead, each copied to its port by a relay (busybox dd: it retries short writes and
# exits non-zero on a write error). A relay opens its pipe before its port, so a port that
# cannot be opened ends the relay with the pipe closed (CMD gets EPIPE) instead of a hang.
mkfifo /out.fifo /err.fifo
dd bs=64k </out.fifo >/dev/vport0p1 2>/out.relay & OUT=$!
dd bs=64k </err.fifo >/dev/vport0p2 2>/err.relay & ERR=$!
run_cmd() {
    # In a subshell, so a "Killed" notice from this shell goes to the console, not CMD's stderr.
    (exec chroot /newroot /bin/sh /tmp/.testhost/cmd.sh) >/out.fifo 2>/err.fifo
    echo $? >/cmd.status
    # CMD is done, as on power-off: kill whatever it left running (and the stdin relay), so
    # the pipes reach EOF once the relays have copied everything CMD wrote.
    read -r me _ </proc/self/stat
    for p in /proc/[0-9]*; do
        p=${p#/proc/}
        case " 1 $me $OUT $ERR " in *" $p "*) ;; *) kill -9 "$p" 2>/dev/null ;; esac
    done
}
if [ -e /run-share/stdin ]; then
    # The runner's stdin arrives on port 3 (the host closing it is EOF) and reaches CMD
    # through an unnamed pipe: unlike a named one, reopening it (/dev/stdin) never waits.
    dd bs=64k </dev/vport0p3 2>/dev/ttyS0 | run_cmd
else
    (run_cmd) </dev/null
fi
rc=$(cat /cmd.status)
wait $OUT; out_rc=$?
wait $ERR; err_rc=$?
# "stream relay-exit bytes-sent-to-port relay-messages": the runner checks that it received
# exactly bytes-sent, and fails loudly otherwise.
sent() {
    n=$(sed -n 's/^bytes_sent: //p' "/sys/kernel/debug/virtio-ports/$1" 2>/dev/null)
    echo "${n:--}"
}
relaylog() { grep -v -e ' records in$' -e ' records out$' "$1" | tr '\n' ' '; }
{
    echo "stdout $out_rc $(sent vport0p1) $(relaylog /out.relay)"
    echo "stderr $err_rc $(sent vport0p2) $(relaylog /err.relay)"
} >/run-share/streams
echo $rc >/run-share/status
sync
reboot -f
