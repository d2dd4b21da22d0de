#!/usr/bin/env python3
"""Hostile code in `agentvm episode`: one case per attack of the security issue.

usage: hostile_check.py AGENTVM_BINARY [--group GROUP] [CASE...]

Every case attacks one episode and then checks what the issue asks of it:
- the attack's call ends with a clear status (timed_out, oom_killed, a signal, an error code),
  never a hang;
- where that makes sense, the same episode still answers its next call, and its VMM holds as
  many descriptors as before the attack;
- a bystander episode, started before the first case and kept for the whole run, answers a
  trivial call every second while the attack runs and keeps its own state (cwd, variable,
  file);
- the next episode starts clean: the marker file written before the attack is gone, the root
  filesystem is whole, the disk has its usual free space, no leftover process;
- the VMM left nothing behind on the host: no agentvm process but the bystander's, no child
  of ours, nothing in the episode's TMPDIR (where its disk overlay lives) nor in /dev/shm, the
  TMPDIR filesystem back to its usage, no agentvm cgroup, the bystander's VMM holding as many
  descriptors as before.

Prints "ok <case>: <what was seen>" or "FAIL <case>: <why>" for every case (none is skipped),
and exits non-zero if any case failed.
"""
import argparse
import contextlib
import hashlib
import json
import os
import resource
import shutil
import socket
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "vm"))

from agent_client import field  # noqa: E402
from checks import Failed, expect, run_case, settled  # noqa: E402
from episode_client import Episode, EpisodeError  # noqa: E402

MIB = 1 << 20
# Every attack writes this before it starts; the next episode must not have it.
MARKER = "/root/hostile-marker"
# Paths the next episode must still have (an rm -rf / or a corrupted disk would lose them).
GUEST_CANARIES = ["/usr/bin/python3", "/usr/bin/bash", "/usr/bin/sh", "/sbin/agentvm-agent",
                  "/sbin/agentvm-init", "/etc/os-release", "/usr/lib/x86_64-linux-gnu/libc.so.6"]
# The default root disk has ~529 MiB free; a filled or damaged one would have much less.
MIN_FRESH_AVAIL_KIB = 400 * 1024
# A fresh guest runs ~30 processes (most of them kernel threads); a bomb's survivors would show.
MAX_FRESH_PROCESSES = 60
# What a flood or a big request may leave in the host's TMPDIR filesystem (it is shared with
# the bystander, whose overlay grows a little).
TMP_USAGE_SLACK = 64 * MIB
# Emulated (the CI machines), a trivial call takes tens of ms, and a few seconds at worst
# while another VM is booting beside it.
BYSTANDER_MAX_LATENCY_S = 60


def outcome(r):
    return {k: r.get(k, "missing") for k in ("exit_code", "signal", "timed_out", "oom_killed")}


def error_code(r):
    return r.get("error", {}).get("code") if isinstance(r.get("error"), dict) else None


def response(ep, request, timeout=300):
    r = ep.call(request, timeout)
    expect("error" not in r, f"{json.dumps(request)[:200]}: error {r.get('error')}")
    return r


def expect_alive(ep, what="the next call"):
    r = ep.call({"op": "exec", "argv": ["echo", "alive"], "timeout": 60}, timeout=120)
    expect(field(r, "stdout") == b"alive\n" and r.get("exit_code") == 0, f"{what}: {r}")


def stderr_of(ep):
    """agentvm's stderr once it has exited (its reader thread takes it at end of file)."""
    deadline = time.monotonic() + 10
    while not ep.stderr and time.monotonic() < deadline:
        time.sleep(0.05)
    return ep.stderr


def fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def vm_hwm_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) // 1024
    return -1


def sha256_head(path, size=16 * MIB):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read(size)).hexdigest()


class Run:
    """What every case shares: the binary, the work dir, the bystander."""

    def __init__(self, agentvm):
        self.agentvm = agentvm
        self.agentvm_real = os.path.realpath(agentvm)
        self.guest_dir = os.path.join(os.path.dirname(self.agentvm_real), "guest")
        self.work = tempfile.mkdtemp(prefix="agentvm-hostile-")
        self.logs = os.path.join(self.work, "logs")
        os.mkdir(self.logs)
        self.bystander = None
        self.listener = None

    def case_tmpdir(self, case):
        path = os.path.join(self.work, "tmp-" + case)
        os.makedirs(path, exist_ok=True)
        return path

    def episode(self, case, *args, console=True):
        """An episode whose TMPDIR (so its disk overlay) is the case's own directory."""
        saved = os.environ.get("TMPDIR")
        os.environ["TMPDIR"] = self.case_tmpdir(case)
        try:
            log = os.path.join(self.logs, f"{case}-{time.monotonic_ns()}.console") if console else None
            ep = Episode(self.agentvm, *args, console=log)
            ep.console_path = log
            return ep
        finally:
            if saved is None:
                del os.environ["TMPDIR"]
            else:
                os.environ["TMPDIR"] = saved

    def cleanup(self):
        shutil.rmtree(self.work, ignore_errors=True)


class Bystander:
    """A second VM that must keep answering while the others are attacked."""

    def __init__(self, run):
        self.token = os.urandom(8).hex()
        self.ep = run.episode("bystander", console=False)
        self.lock = threading.Lock()
        r = response(self.ep, {"op": "shell", "cmd": f"cd /tmp && export BYSTANDER={self.token}"})
        expect(r["exit_code"] == 0, f"bystander set-up: {r}")
        r = self.ep.call({"op": "write_file", "path": "/root/bystander", "data": self.token})
        expect(r.get("ok") is True, f"bystander file: {r}")
        self.vmm = self.ep.vmm_pid()
        self.fds = fd_count(self.vmm)
        self.stats = None

    def ping(self):
        """One trivial call; raises Failed unless it answers, in time, with its state intact."""
        with self.lock:
            start = time.monotonic()
            try:
                r = self.ep.call({"op": "shell", "cmd": "echo $BYSTANDER $PWD; cat /root/bystander"},
                                 timeout=BYSTANDER_MAX_LATENCY_S)
            except EpisodeError as e:
                raise Failed(f"bystander: {e}") from None
            took = time.monotonic() - start
        want = f"{self.token} /tmp\n{self.token}".encode()
        expect(field(r, "stdout") == want and r.get("exit_code") == 0, f"bystander answered {r}")
        return took

    @contextlib.contextmanager
    def watching(self):
        """Pings every second while the body runs; self.stats says how it went."""
        stats = {"pings": 0, "max_s": 0.0, "errors": []}
        stop = threading.Event()

        def loop():
            while not stop.is_set():
                try:
                    took = self.ping()
                    stats["pings"] += 1
                    stats["max_s"] = max(stats["max_s"], took)
                except Exception as e:  # noqa: BLE001 - any failure is the verdict
                    stats["errors"].append(str(e))
                    return
                stop.wait(1.0)

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        try:
            yield stats
        finally:
            stop.set()
            thread.join(BYSTANDER_MAX_LATENCY_S + 10)
            self.stats = stats

    def check(self):
        s = self.stats
        expect(not s["errors"], f"bystander stopped answering during the attack: {s['errors']}")
        took = self.ping()  # and once more, after it
        return f"bystander answered {s['pings'] + 1} pings (max {max(s['max_s'], took):.2f} s)"


class HostState:
    """What the VMM could leave behind on the host."""

    def __init__(self, run, case):
        self.run = run
        self.case = case
        self.agentvm_pids = self._agentvm_pids()
        self.shm = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
        self.tmp_used = self._tmp_used()
        self.cgroups = self._agentvm_cgroups()

    def _agentvm_pids(self):
        pids = set()
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.readlink(f"/proc/{entry}/exe") == self.run.agentvm_real:
                        pids.add(int(entry))
                except OSError:
                    pass
        return pids

    def _tmp_used(self):
        st = os.statvfs(self.run.case_tmpdir(self.case))
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    @staticmethod
    def _children():
        me = str(os.getpid())
        kids = set()
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        stat = f.read()
                except OSError:
                    continue
                if stat.rsplit(")", 1)[1].split()[1] == me:
                    kids.add(int(entry))
        return kids

    @staticmethod
    def _agentvm_cgroups(root="/sys/fs/cgroup", depth=4):
        found = set()
        if depth == 0 or not os.path.isdir(root):
            return found
        try:
            entries = os.scandir(root)
        except OSError:
            return found
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                if "agentvm" in e.name:
                    found.add(e.path)
                found |= HostState._agentvm_cgroups(e.path, depth - 1)
        return found

    def check_after(self, bystander):
        live = {bystander.ep.proc.pid, bystander.vmm}
        # A VMM that has just exited may take a moment to be gone from /proc.
        deadline = time.monotonic() + 10
        while self._agentvm_pids() - live and time.monotonic() < deadline:
            time.sleep(0.2)
        extra = self._agentvm_pids() - live
        expect(not extra, f"agentvm processes left behind: {sorted(extra)}")
        kids = self._children() - live
        expect(not kids, f"child processes left behind: {sorted(kids)}")
        left = os.listdir(self.run.case_tmpdir(self.case))
        expect(not left, f"files left in the episode's TMPDIR: {left}")
        shm = (set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()) - self.shm
        expect(not shm, f"files left in /dev/shm: {sorted(shm)}")
        grown = self._tmp_used() - self.tmp_used
        expect(grown <= TMP_USAGE_SLACK,
               f"the TMPDIR filesystem holds {grown // MIB} MiB more than before (an overlay still held?)")
        cgroups = self._agentvm_cgroups() - self.cgroups
        expect(not cgroups, f"cgroups left behind: {sorted(cgroups)}")
        fds = fd_count(bystander.vmm)
        expect(fds == bystander.fds, f"the bystander's VMM holds {fds} descriptors, {bystander.fds} at its start")
        return "nothing left on the host"


def fresh_episode_clean(run, case):
    """The next episode (the default snapshot, as a harness starts it) starts clean."""
    ep = run.episode(case)
    try:
        canaries = " ".join(GUEST_CANARIES)
        script = (f"test -e {MARKER} && echo MARKER; "
                  f"for p in {canaries}; do test -e $p || echo MISSING $p; done; "
                  "echo avail $(df --output=avail -k / | tail -1); "
                  "echo processes $(ps -e --no-headers | wc -l)")
        r = response(ep, {"op": "exec", "argv": ["sh", "-c", script], "timeout": 60})
        lines = field(r, "stdout").decode().splitlines()
        expect("MARKER" not in lines, f"the attack's marker {MARKER} is in the next episode")
        missing = [line for line in lines if line.startswith("MISSING")]
        expect(not missing, f"the next episode's root filesystem lacks {missing}")
        info = dict(line.split() for line in lines if line.split()[0] in ("avail", "processes"))
        expect(int(info["avail"]) >= MIN_FRESH_AVAIL_KIB,
               f"the next episode's root disk has only {info['avail']} KiB free")
        expect(int(info["processes"]) <= MAX_FRESH_PROCESSES,
               f"the next episode runs {info['processes']} processes")
        ep.close_stdin()
        status = ep.wait(120)
        expect(status == 0, f"the next episode exited {status}: {ep.stderr[-500:]!r}")
    finally:
        ep.kill()
    return "next episode clean"


# ----- the attacks --------------------------------------------------------------------------
# Each gets its attacked episode, already answering and with MARKER written, and returns
# (what it saw, whether the episode is expected to go on). Cases whose episode goes on are
# then checked to end normally (exit 0 at end of stdin) with as many VMM descriptors as before.


def cpu_spin(run, ep):
    r = response(ep, {"op": "exec", "argv": ["python3", "-c", "while True: pass"], "timeout": 5})
    expect(r["timed_out"] is True and r["signal"] == 9, f"exec spin: {outcome(r)}")
    r = response(ep, {"op": "shell", "cmd": "while :; do :; done", "timeout": 5})
    expect(r["timed_out"] is True and r["signal"] == 9, f"shell spin: {outcome(r)}")
    r = response(ep, {"op": "exec", "argv": ["sh", "-c", "pgrep -x python3 || echo none"]})
    expect(field(r, "stdout") == b"none\n", f"a spinner survived: {r.get('stdout')!r}")
    expect_alive(ep)
    return "exec and shell spins killed at their 5 s timeout (timed_out, SIGKILL), none left", True


FORK_LOOP = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"


def fork_bomb(run, ep):
    start = time.monotonic()
    r = response(ep, {"op": "exec", "argv": ["python3", "-c", FORK_LOOP], "timeout": 10}, timeout=120)
    took = time.monotonic() - start
    expect(r["timed_out"] is True and r["signal"] == 9, f"fork bomb: {outcome(r)}")
    # Forkers still running: zombies are dead, only not yet reaped by init, which under
    # emulation may still be working through thousands of them. Every forker got its SIGKILL
    # with the group (a fork racing the kill is undone by the kernel), but under emulation a
    # few may still be on their way out when the answer comes (CI: 2 of them): they may take
    # a while; one the kill missed would stay for good.
    count = ("echo $(ps -e -o stat=,comm= | awk '$1 !~ /^Z/ && $2 == \"python3\"' | wc -l)"
             " $(ps -e --no-headers | wc -l)")

    def forkers_and_processes():
        r = response(ep, {"op": "exec", "argv": ["sh", "-c", count], "timeout": 60})
        return tuple(map(int, field(r, "stdout").split()))

    bombs, processes = settled(forkers_and_processes, lambda seen: seen[0] == 0, 30)
    gone = time.monotonic() - start - took
    expect(bombs == 0 and processes <= MAX_FRESH_PROCESSES,
           f"after the bomb: {bombs} forkers {gone:.1f} s after the answer, {processes} processes")
    expect_alive(ep)
    return (f"fork loop killed with its whole process group at its 10 s timeout ({took:.1f} s), no forker left "
            f"{gone:.1f} s after the answer, {processes} processes after"), True


# Run as a call while the bomb fills the calls' cgroup: a single process (forks would fail),
# it waits until the cgroup has refused forks, then reports what confines the calls.
CGROUP_PROBE = r"""
import json, os, time
G = "/sys/fs/cgroup/tool-calls"
def read(path):
    with open(path) as f:
        return f.read().strip()
def refused():
    return int(dict(line.split() for line in read(G + "/pids.events").splitlines())["max"])
deadline = time.monotonic() + 120
while refused() == 0 and time.monotonic() < deadline:
    time.sleep(0.5)
agents = []
for pid in os.listdir("/proc"):
    try:
        if pid.isdigit() and read(f"/proc/{pid}/comm") == "agentvm-agent":
            agents.append({"oom_score_adj": int(read(f"/proc/{pid}/oom_score_adj")),
                           "cgroup": read(f"/proc/{pid}/cgroup")})
    except OSError:
        pass  # a bomb process that just ended
print(json.dumps({"cgroup": read("/proc/self/cgroup"), "pids_max": read(G + "/pids.max"),
                  "pids_current": int(read(G + "/pids.current")), "forks_refused": refused(),
                  "own_oom_score_adj": int(read("/proc/self/oom_score_adj")), "agents": agents}))
"""


def fork_bomb_background(run, ep):
    """The classic bash bomb: its first generation backgrounds itself, so the call ends at once
    and the bomb runs on outside any call's timeout. The tool calls' cgroup holds it at its
    pids.max (forks fail with EAGAIN), while the agent, outside it, goes on answering."""
    start = time.monotonic()
    r = response(ep, {"op": "exec", "argv": ["bash", "-c", ":(){ :|:& };:"], "timeout": 10}, timeout=120)
    expect(r["timed_out"] is False, f"the bomb's call: {outcome(r)}")
    r = response(ep, {"op": "exec", "argv": ["python3", "-c", CGROUP_PROBE], "timeout": 180}, timeout=240)
    expect(r["exit_code"] == 0, f"probe: {outcome(r)} {field(r, 'stderr')[-300:]!r}")
    seen = json.loads(field(r, "stdout"))
    expect(seen["cgroup"].startswith("0::/tool-calls/exec-") and seen["pids_max"] == "1024",
           f"the call's cgroup: {seen}")
    expect(seen["forks_refused"] > 0 and seen["pids_current"] <= 1024 + 1, f"the bomb was not held: {seen}")
    expect(seen["agents"] and all(a == {"oom_score_adj": -1000, "cgroup": "0::/"} for a in seen["agents"])
           and seen["own_oom_score_adj"] == 0, f"the agent is not protected, or a call is: {seen}")
    took = time.monotonic() - start
    expect_alive(ep, "the call after the bomb")
    return (f"the bomb filled the calls' cgroup to {seen['pids_current']} of {seen['pids_max']} pids, "
            f"{seen['forks_refused']} forks refused ({took:.0f} s); the agent (oom_score_adj -1000, outside "
            "the cgroup) answered the next call"), True


HOG = "b = []\nwhile True:\n    b.append(b'x' * (16 << 20))\n"


def memory_hog(run, ep):
    r = response(ep, {"op": "exec", "argv": ["sh", "-c", "pgrep -x agentvm-agent"]})
    agent = field(r, "stdout")
    start = time.monotonic()
    r = response(ep, {"op": "exec", "argv": ["python3", "-c", HOG], "timeout": 180}, timeout=300)
    want = {"exit_code": None, "signal": 9, "timed_out": False, "oom_killed": True}
    expect(outcome(r) == want, f"exec hog: {outcome(r)}, want {want}")
    took = time.monotonic() - start
    r = response(ep, {"op": "shell", "cmd": f"python3 -c \"{HOG}\"", "timeout": 180}, timeout=300)
    expect(r["exit_code"] == 137 and r["timed_out"] is False, f"shell hog: {outcome(r)}")
    r = response(ep, {"op": "exec", "argv": ["sh", "-c", "pgrep -x agentvm-agent"]})
    expect(field(r, "stdout") == agent, f"the agent changed: pid {agent!r} then {field(r, 'stdout')!r}")
    expect_alive(ep)
    return (f"256 MiB guest: exec hog OOM-killed in {took:.1f} s (signal 9, oom_killed), shell hog exit 137, "
            "the agent untouched"), True


def stdout_flood(run, ep):
    events, r = ep.result(ep.send({"op": "exec", "argv": ["sh", "-c", "yes >&2 & exec yes"],
                                   "timeout": 8, "max_output": MIB, "stream": True}), timeout=300)
    expect("error" not in r, f"flood: {r}")
    expect(r["timed_out"] is True and r["signal"] == 9, f"flood: {outcome(r)}")
    for stream in ("stdout", "stderr"):
        kept = field(r, stream)
        streamed = b"".join(field(e, "data") for e in events if e.get("event") == stream)
        expect(r[f"{stream}_truncated"] is True and len(kept) == MIB and streamed == kept,
               f"{stream}: truncated {r[f'{stream}_truncated']}, {len(kept)} bytes kept, {len(streamed)} streamed")
    expect_alive(ep)
    return "stdout and stderr flooded for 8 s: timed_out, each capped at 1 MiB (streamed the same)", True


def stdout_flood_default_cap(run, ep):
    """Binary output with the default 16 MiB cap: NULs are valid UTF-8, each escaped as \\u0000,
    so the response line is ~96 MiB: the agent must start sending it at once (encoding it
    whole took 30 s emulated) and the watchdog must not cut it while it crosses."""
    start = time.monotonic()
    r = ep.call({"op": "exec", "argv": ["cat", "/dev/zero"], "timeout": 8}, timeout=300)
    took = time.monotonic() - start
    expect("error" not in r, f"flood: {r}")
    expect(r["timed_out"] is True and r["stdout_truncated"] is True and len(field(r, "stdout")) == 16 * MIB,
           f"flood: {outcome(r)}, {len(field(r, 'stdout'))} bytes kept")
    expect_alive(ep)
    return f"timed_out at 8 s, 16 MiB kept, the ~96 MiB response complete after {took:.1f} s; the episode went on", True


def disk_fill(run, ep):
    tmp = run.case_tmpdir("disk_fill")
    st = os.statvfs(tmp)
    used_before = (st.f_blocks - st.f_bfree) * st.f_frsize
    r = response(ep, {"op": "exec", "argv": ["dd", "if=/dev/zero", "of=/root/fill", "bs=1M"], "timeout": 600},
                 timeout=700)
    expect(r["exit_code"] == 1 and r["timed_out"] is False and b"No space left on device" in field(r, "stderr"),
           f"dd: {outcome(r)}, stderr {field(r, 'stderr')[-300:]!r}")
    filled = field(r, "stderr").decode().strip().splitlines()[-1]
    st = os.statvfs(tmp)
    grown = (st.f_blocks - st.f_bfree) * st.f_frsize - used_before
    disk = os.path.getsize(os.path.join(run.guest_dir, "rootfs.ext4"))
    expect(grown <= disk + TMP_USAGE_SLACK, f"the overlay grew {grown // MIB} MiB, the disk is {disk // MIB} MiB")
    r = ep.call({"op": "write_file", "path": "/root/more", "data": "x" * 65536})
    expect(error_code(r) == "io" and "No space" in r["error"]["message"], f"write_file on a full disk: {r}")
    expect_alive(ep)
    r = response(ep, {"op": "exec", "argv": ["sh", "-c", "rm /root/fill && echo freed > /root/more && cat /root/more"]})
    expect(field(r, "stdout") == b"freed\n", f"after freeing: {r}")
    return (f"dd stopped by ENOSPC ({filled}); host overlay grew {grown // MIB} MiB (disk {disk // MIB} MiB); "
            "write_file got 'io' ENOSPC; the episode went on and could free space"), True


def rm_rf_root(run, ep):
    r = response(ep, {"op": "exec", "argv": ["rm", "-rf", "--no-preserve-root", "/"], "timeout": 300}, timeout=400)
    expect(r["timed_out"] is False and r["exit_code"] == 1, f"rm -rf /: {outcome(r)}")
    r = ep.call({"op": "exec", "argv": ["echo", "alive"]})
    expect(error_code(r) == "not_found", f"exec after rm -rf /: {r}")
    r = ep.call({"op": "shell", "cmd": "echo alive"})
    expect(error_code(r) in ("not_found", "spawn_failed"), f"shell after rm -rf /: {r}")
    r = ep.call({"op": "write_file", "path": "/after-rm", "data": "still here"})
    expect(r.get("ok") is True, f"write_file after rm -rf /: {r}")
    events, r = ep.result(ep.send({"op": "read_file", "path": "/after-rm"}))
    expect(r.get("ok") is True and b"".join(field(e, "data") for e in events) == b"still here",
           f"read_file after rm -rf /: {r}")
    return ("rm -rf / ended (exit 1: /proc, /sys, mounts refused); next exec/shell answered not_found, "
            "write_file/read_file still served"), True


def raw_block_write(run, ep):
    images = [os.path.join(run.guest_dir, "rootfs.ext4"), os.path.join(run.guest_dir, "snapshot", "disk")]
    images = [p for p in images if os.path.exists(p)]
    before = {p: sha256_head(p) for p in images}
    r = ep.call({"op": "exec", "argv": ["sh", "-c", "dd if=/dev/urandom of=/dev/vda bs=1M count=16 conv=fsync "
                                        "&& echo 3 > /proc/sys/vm/drop_caches"], "timeout": 120}, timeout=200)
    codes = []
    if "error" in r:
        codes.append(error_code(r))
    else:
        expect(r["timed_out"] is False, f"dd to /dev/vda: {outcome(r)}")
        r = ep.call({"op": "exec", "argv": ["echo", "alive"], "timeout": 60}, timeout=120)
        if "error" in r:
            codes.append(error_code(r))
    if codes:
        # The guest broke its own disk under its own kernel: it may die of it, clearly.
        expect(codes[0] in ("vm_died", "agent_died"), f"after the raw writes: {r}")
        status = ep.wait(60)
        expect(status in (3, 4), f"episode exit {status}")
        why = stderr_of(ep).decode(errors="replace").strip().splitlines()[-1:] or [""]
        seen = f"the guest died of it: {codes[0]}, episode exit {status} ({why[0].split('error: ', 1)[-1][:160]})"
    else:
        expect(field(r, "stdout") == b"alive\n", f"after the raw writes: {r}")
        seen = "the guest went on"
    after = {p: sha256_head(p) for p in images}
    expect(after == before, "the base image or the snapshot's disk changed")
    return f"16 MiB of random bytes over /dev/vda; {seen}; base image and snapshot disk unchanged", not codes


def host_paths(run, ep):
    token = os.urandom(16).hex()
    host_file = os.path.join(run.work, "host-secret")
    with open(host_file, "w") as f:
        f.write(token)
    paths = [host_file, run.agentvm_real, os.path.realpath(os.path.join(run.guest_dir, "rootfs.ext4")),
             os.path.abspath(__file__), os.path.realpath(os.getcwd())]
    for path in paths:
        r = ep.call({"op": "read_file", "path": path})
        expect(error_code(r) == "not_found", f"read_file {path}: {r}")
    r = response(ep, {"op": "exec", "argv": ["sh", "-c", f"cat {' '.join(paths)}; grep -rs {token} /root /tmp /run /etc; "
                                             "cat /proc/mounts; ls /sys/block; ps -eo comm"], "timeout": 60})
    out = field(r, "stdout")
    expect(token.encode() not in out, "the guest read the host's file")
    fs_types = {line.split()[2] for line in out.decode().splitlines() if line.count(" ") >= 5}
    shared = fs_types & {"9p", "virtiofs", "nfs", "nfs4", "cifs", "fuse", "vboxsf"}
    expect(not shared, f"the guest mounts a host filesystem: {shared}")
    expect(b"\nagentvm\n" not in out, "the guest sees the host's agentvm process")
    expect_alive(ep)
    return f"{len(paths)} host paths not_found in the guest, no shared filesystem (mounts: {sorted(fs_types)})", True


NET_PROBE = r"""
import errno, json, socket
out = {}
def attempt(name, fn):
    try:
        fn()
        out[name] = "connected"
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, str(e))
def tcp(host):
    return lambda: socket.create_connection((host, 80), timeout=5).close()
def vsock(cid, port):
    def go():
        s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect((cid, port))
    return go
for host in ("1.1.1.1", "10.0.2.2", "169.254.169.254", "192.168.0.1"):
    attempt("tcp " + host, tcp(host))
attempt("dns", lambda: socket.getaddrinfo("example.com", 80))
for cid, port in ((2, 52), (2, 22), (2, 1234), (1, 52)):
    attempt(f"vsock {cid}:{port}", vsock(cid, port))
print(json.dumps(out))
"""


def network(run, ep):
    r = response(ep, {"op": "exec", "argv": ["python3", "-c", NET_PROBE], "timeout": 120}, timeout=200)
    expect(r["exit_code"] == 0 and r["timed_out"] is False, f"probe: {outcome(r)} {field(r, 'stderr')[-300:]!r}")
    results = json.loads(field(r, "stdout"))
    reached = [k for k, v in results.items() if v == "connected"]
    expect(not reached, f"the guest reached {reached}")
    r = response(ep, {"op": "exec", "argv": ["cat", "/proc/net/dev"]})
    ifaces = [line.split(":")[0].strip() for line in field(r, "stdout").decode().splitlines()[2:]]
    expect(ifaces == ["lo"], f"network interfaces: {ifaces}")
    expect_alive(ep)
    errors = sorted(set(results.values()))
    return f"{len(results)} attempts (TCP, DNS, vsock to the host) all failed at once ({', '.join(errors)}); only lo", True


def kill_pid1(run, ep):
    script = ("for s in KILL TERM INT HUP QUIT SEGV ABRT USR1 USR2 PWR STOP; do kill -s $s 1; done; sleep 1; "
              "kill -s CONT 1; grep State /proc/1/status")
    r = response(ep, {"op": "exec", "argv": ["sh", "-c", script], "timeout": 60})
    state = field(r, "stdout").decode().split()
    expect(r["exit_code"] == 0 and len(state) >= 2 and state[1] in ("S", "R"), f"init after the signals: {r}")
    expect_alive(ep)
    r = response(ep, {"op": "shell", "cmd": "echo shell"})
    expect(field(r, "stdout") == b"shell\n", f"shell after: {r}")
    return "11 signals to PID 1 (KILL, STOP, SEGV, ...) had no effect; the episode went on", True


def kill_agent(run, ep):
    pending = ep.send({"op": "exec", "argv": ["sleep", "1000"]})
    killer = ep.send({"op": "exec", "argv": ["sh", "-c", "kill -KILL -1"]})  # everything but init
    codes = {}
    for call_id in (pending, killer):
        _, r = ep.result(call_id, timeout=120)
        codes[call_id] = error_code(r)
    expect(set(codes.values()) == {"agent_died"}, f"pending calls got {codes}")
    status = ep.wait(60)
    expect(status == 4 and b"closed the connection" in stderr_of(ep), f"exit {status}, stderr {ep.stderr!r}")
    return "kill -KILL -1 from inside: both pending calls got agent_died, the episode exited 4", False


def sysrq(run, ep):
    r = response(ep, {"op": "shell", "cmd": "echo c > /proc/sysrq-trigger", "timeout": 30})
    expect(r["exit_code"] == 1 and b"No such file" in field(r, "stderr"), f"sysrq c: {r}")
    r = response(ep, {"op": "exec", "argv": ["sh", "-c", "echo 1 > /proc/sys/kernel/sysrq; echo b > /proc/sysrq-trigger"],
                      "timeout": 30})
    expect(r["exit_code"] != 0 and r["timed_out"] is False, f"sysrq b: {r}")
    expect_alive(ep)
    return "no /proc/sysrq-trigger (the guest kernel has no MAGIC_SYSRQ): the write fails, exit 1; the episode went on", True


def argv_env_100mib(run, ep):
    big = "x" * (100 * MIB)
    for what, request in (("argv", {"op": "exec", "argv": ["true", big]}),
                          ("env", {"op": "exec", "argv": ["true"], "env": {"X": big}})):
        call_id = ep.send(request)
        _, r = ep.result(None, timeout=300)
        expect(error_code(r) == "line_too_long", f"100 MiB {what}: {r}")
        expect_alive(ep, f"the call after the 100 MiB {what}")
        expect(not ep.by_id.get(call_id), f"the 100 MiB {what} was answered: {ep.by_id.get(call_id)}")
    del big
    # Under the line cap, 8 MiB of arguments (4 times the kernel's limit) reach the agent, and
    # execve refuses them.
    r = ep.call({"op": "exec", "argv": ["true"] + ["y" * (128 * 1024 - 1)] * 64}, timeout=300)
    expect(error_code(r) == "spawn_failed" and "Argument list too long" in r["error"]["message"], f"8 MiB argv: {r}")
    # And built in the guest: 100 MiB of argv, or one 100 MiB variable.
    probe = ("import errno, os\n"
             "for args, env in (([\"true\"] + [\"z\" * (1 << 17)] * 800, {}), ([\"true\"], {\"X\": \"x\" * (100 << 20)})):\n"
             "    try:\n"
             "        os.execve(\"/usr/bin/true\", args, env)\n"
             "    except OSError as e:\n"
             "        print(errno.errorcode[e.errno])\n")
    r = response(ep, {"op": "exec", "argv": ["python3", "-c", probe], "timeout": 120}, timeout=200)
    expect(field(r, "stdout") == b"E2BIG\nE2BIG\n", f"execve in the guest: {r}")
    expect_alive(ep)
    return ("100 MiB argv and env from the harness: line_too_long, never reached the guest; 8 MiB argv: "
            "spawn_failed E2BIG; 100 MiB argv/env built in the guest: E2BIG"), True


def json_line_100mib(run, ep):
    blob = b"x" * (100 * MIB)
    ep.send_raw(b'{"id":"huge","op":"write_file","path":"/root/huge","data":"' + blob + b'"}\n')
    _, r = ep.result(None, timeout=300)
    expect(error_code(r) == "line_too_long", f"100 MiB write_file line: {r}")
    # A longer line costs the relay no more: it gives up at the 64 MiB cap (its peak is ~96 MiB,
    # while its buffer grows from 32 to 64 MiB; guest RAM the guest touches meanwhile also
    # counts). Buffering this one whole would take over 400 MiB.
    vmm = ep.vmm_pid()
    with open(f"/proc/{vmm}/clear_refs", "w") as f:
        f.write("5")  # resets the peak to the current RSS
    hwm_before = vm_hwm_mib(vmm)
    chunk = blob[:MIB]
    for _ in range(400):
        ep.send_raw(chunk)
    ep.send_raw(b"\n")
    del blob, chunk
    _, r = ep.result(None, timeout=300)
    expect(error_code(r) == "line_too_long", f"400 MiB of garbage: {r}")
    grown = vm_hwm_mib(vmm) - hwm_before
    expect(grown < 256, f"the VMM's peak RSS grew {grown} MiB for a 400 MiB line: it buffered the line")
    r = ep.call({"op": "read_file", "path": "/root/huge"})
    expect(error_code(r) == "not_found", f"the huge write_file was served: {r}")
    expect(not ep.by_id.get("huge"), f"the huge line was answered: {ep.by_id.get('huge')}")
    expect_alive(ep)
    return (f"a 100 MiB write_file line and a 400 MiB line: line_too_long each, the write never served; "
            f"the VMM's peak RSS grew {grown} MiB for the 400 MiB line"), True


VSOCK_STORM = r"""
import collections, errno, json, resource, socket, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (8192, 8192))
port = int(sys.argv[1])
CONCURRENT = 4500  # more than the jailed VMM's RLIMIT_NOFILE (4096)
out = {}
seq = collections.Counter()
for i in range(3000):
    s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    s.settimeout(10)
    try:
        s.connect((2, port or 1000 + i % 50))
        seq["connected"] += 1
    except OSError as e:
        seq[errno.errorcode.get(e.errno, str(e))] += 1
    s.close()
out["sequential"] = dict(seq)
held = []
par = collections.Counter()
for i in range(CONCURRENT):
    s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    s.setblocking(False)
    try:
        s.connect((2, port or 2000 + i))
    except BlockingIOError:
        pass
    except OSError as e:
        par[errno.errorcode.get(e.errno, str(e))] += 1
    held.append(s)
time.sleep(3)
for s in held:
    err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    par["connected" if err == 0 else errno.errorcode.get(err, str(err))] += 1
    s.close()
out["concurrent"] = dict(par)
print(json.dumps(out))
"""


def vsock_flood(run, ep):
    fds = fd_count(ep.vmm_pid())
    r = response(ep, {"op": "exec", "argv": ["python3", "-c", VSOCK_STORM, "0"], "timeout": 300}, timeout=400)
    expect(r["exit_code"] == 0, f"storm: {outcome(r)} {field(r, 'stderr')[-300:]!r}")
    counts = json.loads(field(r, "stdout"))
    expect(all("connected" not in c for c in counts.values()), f"the guest reached the host: {counts}")
    expect_alive(ep)
    expect(fd_count(ep.vmm_pid()) == fds, f"VMM descriptors {fd_count(ep.vmm_pid())}, {fds} before")
    return f"7500 guest vsock connections to the host (4500 at once), all refused: {counts}", True


def vsock_flood_host_listener(run, ep):
    """With --vsock-uds, a host program listens on the guest's host port 5000 and accepts
    everything; the guest opens 3000 connections to it one after another, then 4500 at once."""
    accepted = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                c, _ = run.listener.accept()
                accepted.append(c)
            except socket.timeout:
                continue
            except OSError:
                return

    # The listener must not run out of descriptors before the VMM does (the jail gives the VMM
    # 4096).
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (16384, max(16384, limits[1])))
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    fds = fd_count(ep.vmm_pid())
    try:
        r = ep.call({"op": "exec", "argv": ["python3", "-c", VSOCK_STORM, "5000"], "timeout": 120}, timeout=150)
        expect("error" not in r and r["exit_code"] == 0, f"storm: {r}")
        counts = json.loads(field(r, "stdout"))
        concurrent = counts["concurrent"]
        served = concurrent.get("connected", 0)
        expect(0 < served < sum(concurrent.values()),
               f"4500 connections at once against a VMM allowed 4096 descriptors: {counts}")
        expect_alive(ep)
        deadline = time.monotonic() + 30
        while fd_count(ep.vmm_pid()) != fds and time.monotonic() < deadline:
            time.sleep(0.5)
        expect(fd_count(ep.vmm_pid()) == fds, f"VMM descriptors {fd_count(ep.vmm_pid())}, {fds} before")
    finally:
        stop.set()
        run.listener.close()
        thread.join(10)
        for c in accepted:
            c.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)
    return f"{len(accepted)} connections accepted by the host, the rest refused: {counts}", True


def vsock_listener_args(run):
    uds = os.path.join(run.work, "v.sock")
    run.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    run.listener.bind(uds + "_5000")
    run.listener.listen(4096)
    run.listener.settimeout(1)
    return ["--vsock-uds", uds]


def cpu_spin_without_timeout(run, ep):
    """Calls without "timeout" that never end: the episode's default call timeout ends them
    (--call-timeout, 5 s here; 600 s by default), whole process group and all."""
    start = time.monotonic()
    r = response(ep, {"op": "exec", "argv": ["python3", "-c", "while True: pass"]}, timeout=150)
    took = time.monotonic() - start
    expect(r["timed_out"] is True and r["signal"] == 9, f"exec spin without timeout: {outcome(r)}")
    r = response(ep, {"op": "shell", "cmd": "sleep 1000 & while :; do :; done"}, timeout=150)
    expect(r["timed_out"] is True, f"shell spin without timeout: {outcome(r)}")
    r = response(ep, {"op": "exec", "argv": ["sh", "-c", "pgrep -x python3 || pgrep -x sleep || echo none"]})
    expect(field(r, "stdout") == b"none\n", f"a spinner survived: {r.get('stdout')!r}")
    expect_alive(ep)
    return (f"exec and shell spins without timeout killed at the default (--call-timeout 5): timed_out, "
            f"the exec after {took:.1f} s"), True


class Attack:
    def __init__(self, fn, group, args=()):
        self.fn = fn
        self.name = fn.__name__
        self.group = group
        self.args = args  # extra `episode` arguments, or a function of the run returning them


ATTACKS = [
    Attack(cpu_spin, "runaway"),
    Attack(fork_bomb, "runaway"),
    Attack(fork_bomb_background, "runaway"),
    Attack(memory_hog, "runaway", ("--mem", "256")),
    Attack(stdout_flood, "runaway"),
    Attack(stdout_flood_default_cap, "runaway"),
    Attack(cpu_spin_without_timeout, "runaway", ("--call-timeout", "5")),
    Attack(disk_fill, "disk"),
    Attack(rm_rf_root, "disk"),
    Attack(raw_block_write, "disk"),
    Attack(host_paths, "escape"),
    Attack(network, "escape"),
    Attack(vsock_flood, "escape"),
    Attack(vsock_flood_host_listener, "escape", vsock_listener_args),
    Attack(kill_pid1, "escape"),
    Attack(kill_agent, "escape"),
    Attack(sysrq, "escape"),
    Attack(argv_env_100mib, "input"),
    Attack(json_line_100mib, "input"),
]

def run_attack(run, attack):
    args = attack.args(run) if callable(attack.args) else list(attack.args)
    before = HostState(run, attack.name)
    seen = []
    with run.bystander.watching():
        ep = run.episode(attack.name, *args)
        try:
            response(ep, {"op": "exec", "argv": ["true"]}, timeout=300)
            r = ep.call({"op": "write_file", "path": MARKER, "data": attack.name})
            expect(r.get("ok") is True, f"marker: {r}")
            fds = fd_count(ep.vmm_pid())
            what, goes_on = attack.fn(run, ep)
            seen.append(what)
            if goes_on:
                now = fd_count(ep.vmm_pid())
                expect(now == fds, f"the attacked VMM holds {now} descriptors, {fds} before the attack")
                ep.close_stdin()
                status = ep.wait(120)
                expect(status == 0, f"the attacked episode exited {status} at end of stdin: {ep.stderr[-500:]!r}")
            else:
                ep.wait(120)
        except Exception:
            console = ep.console_path
            tail = open(console, errors="replace").read()[-2000:] if console and os.path.exists(console) else ""
            if tail.strip():
                print(f"console tail ({attack.name}):\n{tail}")
            raise
        finally:
            ep.kill()
    seen.append(run.bystander.check())
    seen.append(fresh_episode_clean(run, attack.name))
    seen.append(before.check_after(run.bystander))
    return "; ".join(seen)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("agentvm")
    parser.add_argument("--group", choices=sorted({a.group for a in ATTACKS}))
    parser.add_argument("cases", nargs="*")
    opts = parser.parse_intermixed_args()
    unknown = set(opts.cases) - {a.name for a in ATTACKS}
    if unknown:
        parser.error(f"unknown cases {sorted(unknown)}")
    chosen = [a for a in ATTACKS if (not opts.group or a.group == opts.group)
              and (not opts.cases or a.name in opts.cases)]

    run = Run(opts.agentvm)
    passed = failed = 0
    try:
        run.bystander = Bystander(run)
        for attack in chosen:
            start = time.monotonic()
            ok = run_case(attack.name, lambda a=attack: f"{run_attack(run, a)} ({time.monotonic() - start:.0f} s)",
                          expected=(EpisodeError,))
            passed += ok
            failed += not ok
        run.bystander.ep.close_stdin()
        status = run.bystander.ep.wait(120)
        if status != 0:
            failed += 1
            print(f"FAIL bystander: exited {status}: {run.bystander.ep.stderr[-500:]!r}", flush=True)
    except (Failed, EpisodeError) as e:
        failed += 1
        print(f"FAIL set-up: {e}", flush=True)
    finally:
        if run.bystander:
            run.bystander.ep.kill()
        run.cleanup()
    print(f"hostile: {passed} passed, {failed} failed", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
