#!/usr/bin/env python3
"""The guest kernel's OOM killer ending an exec call, in a real guest.

usage: oom_check.py AGENTVM_BINARY
Boots the default guest with 256 MiB (it has no swap) and has the agent run a python3 that
allocates memory until the kernel's OOM killer ends it. The response must say so:
"oom_killed": true, "signal": 9, "timed_out": false. The agent must go on answering: a
SIGKILL that is not the OOM killer's comes back with "oom_killed": false, and the kernel log
names the python3 it killed. Then SIGTERM ends the VM. Prints "oom ok" or exits non-zero
with why.
"""
import os
import re
import sys
import tempfile
import time

from agent_client import AgentError, boot, connect, field, stop_with_sigterm

AGENTVM = sys.argv[1]
GUEST_MIB = 256
# b"x" * n writes every byte: the pages are really used, not merely reserved, which is what
# runs the kernel out of memory (allocations alone always succeed under default overcommit).
HOG = "b = []\nwhile True:\n    b.append(b'x' * (16 << 20))\n"
# Only a backstop, so that a guest whose OOM killer never fires ends the call (as timed_out,
# a failure here) rather than hangs it; emulated, the hog needs well under a minute.
HOG_TIMEOUT_S = 600


def fail(why, console=None):
    if console and os.path.exists(console):
        why += "\nconsole:\n" + open(console, errors="replace").read()[-2000:]
    sys.exit("oom_check: " + why)


def outcome(response):
    """The fields that say how a command ended ("missing" where the response lacks one)."""
    return {k: response.get(k, "missing") for k in ("exit_code", "signal", "timed_out", "oom_killed")}


with tempfile.TemporaryDirectory(prefix="agentvm-oom-") as tmp:
    proc, uds, console = boot(AGENTVM, tmp, "--mem", str(GUEST_MIB))
    try:
        c = connect(uds, proc)

        start = time.monotonic()
        r = c.call({"id": 1, "op": "exec", "argv": ["python3", "-c", HOG], "timeout": HOG_TIMEOUT_S})
        hog_s = time.monotonic() - start
        want = {"exit_code": None, "signal": 9, "timed_out": False, "oom_killed": True}
        if outcome(r) != want:
            fail(f"memory hog: got {outcome(r)}, want {want}; stderr {field(r, 'stderr')[-500:]!r}", console)

        r = c.call({"id": 2, "op": "exec", "argv": ["sh", "-c", "kill -9 $$"]})
        want = {"exit_code": None, "signal": 9, "timed_out": False, "oom_killed": False}
        if outcome(r) != want:
            fail(f"after the OOM kill, a plain SIGKILL: got {outcome(r)}, want {want}", console)

        r = c.call({"id": 3, "op": "exec", "argv": ["dmesg"]})
        log = field(r, "stdout")
        if r.get("exit_code") != 0 or not re.search(rb"Out of memory: Killed process \d+ \(python3", log):
            fail(f"the kernel log does not name the python3 it killed: {outcome(r)}, "
                 f"log tail {log[-1500:]!r}", console)
    except AgentError as e:
        fail(str(e), console)
    finally:
        stopped = stop_with_sigterm(proc)
    if not stopped:
        fail(f"agentvm exited {proc.returncode} on SIGTERM", console)
    print(f"oom ok: python3 OOM-killed in a {GUEST_MIB} MiB guest after {hog_s:.1f} s "
          "(signal 9, oom_killed true, not timed out), plain SIGKILL not taken for OOM, "
          "kernel log names it, SIGTERM teardown")
