#!/usr/bin/python3
"""Checks that tests/testhost/run ends, with what it started, when the process that started it
is killed (a test killed by `meson test`'s timeout or by hand), instead of living on under
init with its QEMU or command running.

  orphan_check.py

Twice: through the emulated test host (AGENTVM_TESTHOST=always: the runner's QEMU must go),
and run directly (AGENTVM_TESTHOST=never: the command, in its own session, must go). Each
time a parent process starts the runner with `sleep 600`, waits, and is killed with SIGKILL;
the runner and its QEMU or command must be gone within 60 s. Exit 77 (skipped) when the
test host cannot run here (a package missing).
"""
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.path.join(HERE, "run")
UNAVAILABLE = 125

PARENT = """
import subprocess, sys, time
runner = subprocess.Popen([sys.argv[1], "--timeout", "600", "--", "sleep", "600"])
print(runner.pid, flush=True)
sys.exit(runner.wait())
"""


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def orphaned(mode, started):
    """Starts the runner under a parent, waits until `started(runner)` names its QEMU or
    command, kills the parent, and returns what was seen; raises AssertionError otherwise."""
    env = dict(os.environ, AGENTVM_TESTHOST=mode, AGENTVM_TESTHOST_QUIET="1")
    parent = subprocess.Popen([sys.executable, "-c", PARENT, RUN], stdout=subprocess.PIPE, env=env)
    try:
        runner = int(parent.stdout.readline())
        deadline = time.monotonic() + 300
        held = None
        while held is None:
            if parent.poll() is not None:
                if parent.returncode == UNAVAILABLE:
                    print(f"skip {mode}: the test host cannot run here", flush=True)
                    sys.exit(77)
                raise AssertionError(f"{mode}: the runner ended by itself ({parent.returncode})")
            assert time.monotonic() < deadline, f"{mode}: the runner started nothing in 300 s"
            held = started(runner)
            time.sleep(0.5)
        name = comm(held) or "child"
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 60
        while alive(runner) or alive(held):
            assert time.monotonic() < deadline, (
                f"{mode}: 60 s after its parent was killed the runner ({'alive' if alive(runner) else 'gone'}) "
                f"and {comm(held) or held} ({'alive' if alive(held) else 'gone'}) still run")
            time.sleep(0.5)
        return f"{mode}: parent killed, the runner and its {name} were gone"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def qemu_of(runner):
    return next((c for c in children(runner) if (comm(c) or "").startswith("qemu")), None)


def command_of(runner):
    return next((c for c in children(runner) if comm(c) == "sleep"), None)


def main():
    failed = False
    for mode, started in (("always", qemu_of), ("never", command_of)):
        try:
            print("ok", orphaned(mode, started), flush=True)
        except AssertionError as e:
            print(f"FAIL {e}", flush=True)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
