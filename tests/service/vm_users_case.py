"""Each VMM its own uid and gid (serve's --jail-uid-range, default 1879048192:65536;
SECURITY.md): one case of serve_check.py, on its serve, so that it shares that check's
test-host boot.

Seen from outside, as the jail checks look: every VMM of serve runs as the uid and gid its
episode was given (--jail-uid), from the range, each a different one, with no groups and no
capabilities; its vsock directory and its snapshot outbox are serve's, with its group, mode
0770. Then, as one VM's uid and gid: its own directories open, another VM's vsock directory
and outbox do not (each by its own mode: from outside, serve's 0700 directories above them
close them to every VM), nor another VMM's disk overlay (the O_TMPFILE it holds, reached
through /proc), which root opens.
"""
import os
import subprocess

from checks import expect

JAIL_IDS = range(1879048192, 1879048192 + 65536)


def children(pid):
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return found


def status(pid, name):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return line.split(":", 1)[1].split()
    raise AssertionError(f"/proc/{pid}/status has no {name}")


def argument(argv, flag):
    return argv[argv.index(flag) + 1] if flag in argv else None


def vms_of(serve_pid):
    """Each of serve's VMs: its episode's arguments, its VMM's pid and /proc status, and its
    directories' stat. An episode without a VMM, or one that ends while it is read (a sandbox
    of an earlier case on its way out), is left out."""
    found = []
    for episode in children(serve_pid):
        try:
            with open(f"/proc/{episode}/cmdline", "rb") as f:
                argv = [a.decode() for a in f.read().split(b"\0") if a]
            if "episode" not in argv:
                continue
            vmm = children(episode)
            expect(len(vmm) <= 1, f"episode {episode} has children {vmm}")
            if not vmm:
                continue
            vm = {"episode": episode, "vmm": vmm[0], "uid": argument(argv, "--jail-uid"),
                  "gid": argument(argv, "--jail-gid"), "vsock": os.path.dirname(argument(argv, "--vsock-uds")),
                  "outbox": argument(argv, "--snapshot-dir")}
            vm["status"] = {name: status(vm["vmm"], name) for name in ("Uid", "Gid", "Groups", "CapEff")}
            vm["stat"] = {path: os.stat(path) for path in (vm["vsock"], vm["outbox"])}
        except FileNotFoundError:
            continue
        found.append(vm)
    return found


def overlay_fd(vmm):
    """/proc/VMM/fd/N of its disk overlay: the unnamed file it made, "(deleted)"."""
    for fd in os.listdir(f"/proc/{vmm}/fd"):
        try:
            target = os.readlink(f"/proc/{vmm}/fd/{fd}")
        except OSError:
            continue
        if target.endswith("(deleted)") and not target.startswith("/memfd:"):
            return f"/proc/{vmm}/fd/{fd}"
    raise AssertionError(f"VMM {vmm} holds no unnamed file")


def opens_as(uid, path, handed_over=False):
    """Whether uid (its gid the same number, no groups) can open path. handed_over: by its own
    permissions only, the path opened O_PATH here and opened again through that descriptor, as
    the VMs' directories lie in serve's private 0700 ones, which a VMM reaches only in its jail."""
    handle = os.open(path, os.O_PATH) if handed_over else None
    target = f"/proc/self/fd/{handle}" if handed_over else path
    try:
        r = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "python3", "-c",
                            "import os, sys; os.close(os.open(sys.argv[1], os.O_RDONLY))", target],
                           capture_output=True, text=True, timeout=60, pass_fds=(handle,) if handed_over else ())
    finally:
        if handed_over:
            os.close(handle)
    expect(r.returncode == 0 or "Permission denied" in r.stderr or "Operation not permitted" in r.stderr,
           f"opening {path} as {uid}: {r.stderr[-2000:]}")
    return r.returncode == 0


def run(serve_pid, create, delete, pool_ready):
    """pool_ready(): waits until the pool has refilled, so that no VMM is still on its way into
    its jail (where it has serve's uid yet)."""
    first, second = create()["id"], create()["id"]
    try:
        pool_ready()
        vms = vms_of(serve_pid)
        expect(len(vms) >= 2, f"serve runs {len(vms)} VMs")
        ids = set()
        for vm in vms:
            expect(vm["uid"] is not None and vm["uid"] == vm["gid"], f"episode {vm['episode']}: --jail-uid "
                   f"{vm['uid']} --jail-gid {vm['gid']}")
            expect(int(vm["uid"]) in JAIL_IDS, f"--jail-uid {vm['uid']} outside the range")
            seen = vm["status"]
            expect(seen["Uid"] == [vm["uid"]] * 4, f"VMM {vm['vmm']} uids {seen['Uid']}")
            expect(seen["Gid"] == [vm["gid"]] * 4, f"VMM {vm['vmm']} gids {seen['Gid']}")
            expect(seen["Groups"] == [], f"VMM {vm['vmm']} groups {seen['Groups']}")
            expect(int(seen["CapEff"][0], 16) == 0, f"VMM {vm['vmm']} holds capabilities")
            for path, st in vm["stat"].items():
                expect(st.st_uid == os.geteuid() and st.st_gid == int(vm["gid"]) and st.st_mode & 0o7777 == 0o770,
                       f"{path}: uid {st.st_uid} gid {st.st_gid} mode {st.st_mode & 0o7777:o}")
            ids.add(vm["uid"])
        expect(len(ids) == len(vms), f"{len(vms)} VMs share {len(ids)} uids")

        # Two that still run (not one of an earlier case's sandboxes on its way out).
        running = [vm for vm in vms if os.path.exists(f"/proc/{vm['vmm']}") and os.path.isdir(vm["outbox"])]
        expect(len(running) >= 2, f"{len(running)} of serve's VMs still run")
        one, other = running[-2], running[-1]
        overlay = overlay_fd(other["vmm"])
        with open(overlay, "rb") as f:  # root, serve's own uid here: the path is right
            expect(len(f.read(4096)) == 4096, f"{overlay} is empty")
        expect(opens_as(one["uid"], one["vsock"], True) and opens_as(one["uid"], one["outbox"], True),
               "a VM's uid cannot open its own directories")
        for path in (other["vsock"], other["outbox"]):
            expect(not opens_as(one["uid"], path, True), f"uid {one['uid']} opened another VM's {path}")
        expect(not opens_as(one["uid"], overlay), f"uid {one['uid']} opened another VM's overlay {overlay}")
        return (f"{len(vms)} VMMs, each its own uid and gid from the range ({min(ids)}..{max(ids)}), no groups, no "
                f"capabilities, its directories serve's with its group 0770; as uid {one['uid']}: its own open, "
                f"another VM's vsock directory, outbox and overlay ({overlay}) refused")
    finally:
        delete(first)
        delete(second)
