#!/usr/bin/env python3
"""`agentvm episode` with a real guest: every behaviour the tool-call protocol promises.

usage: episode_check.py AGENTVM_BINARY [SCENARIO...]
Runs each scenario (all by default) and prints "ok <scenario>: <what was seen>" or
"FAIL <scenario>: <why>" for each; exits non-zero if any failed. Scenarios that need a
fresh VM start their own episode; the rest share one.
"""
import base64
import hashlib
import json
import os
import sys
import tempfile
import time

from agent_client import field
from checks import expect, run_case
from episode_client import Episode, EpisodeError

AGENTVM = sys.argv[1]
TMP = tempfile.mkdtemp(prefix="agentvm-episode-")


def outcome(r):
    return {k: r.get(k, "missing") for k in ("exit_code", "signal", "timed_out")}


def exec_ok(ep, argv, **extra):
    r = ep.call({"op": "exec", "argv": argv, **extra})
    expect("error" not in r, f"{argv}: error {r.get('error')}")
    return r


def basics(ep):
    r = exec_ok(ep, ["sh", "-c", "echo out; echo err >&2; exit 7"])
    expect(outcome(r) == {"exit_code": 7, "signal": None, "timed_out": False}, f"exit: {outcome(r)}")
    expect(field(r, "stdout") == b"out\n" and field(r, "stderr") == b"err\n",
           f"streams mixed: {r.get('stdout')!r} / {r.get('stderr')!r}")
    r = exec_ok(ep, ["sh", "-c", "kill -TERM $$"])
    expect(r["signal"] == 15 and r["exit_code"] is None, f"signal: {outcome(r)}")
    r = exec_ok(ep, ["cat"], stdin_b64="AP8Kbm90IHV0Zi04")
    expect(field(r, "stdout") == b"\x00\xff\nnot utf-8", f"stdin: {r}")
    r = exec_ok(ep, ["sh", "-c", "echo $GREETING; pwd"], env={"GREETING": "hello"}, cwd="/etc")
    expect(field(r, "stdout") == b"hello\n/etc\n", f"env/cwd: {r.get('stdout')!r}")
    ids = [ep.send({"op": "exec", "argv": ["echo", "streamed"], "stream": True})]
    events, final = ep.result(ids[0])
    expect([e["event"] for e in events] == ["stdout"] and field(events[0], "data") == b"streamed\n",
           f"stream events: {events}")
    return "exit code 7, signal 15, stderr apart, binary stdin, env and cwd, streamed events"


def sequential(ep):
    for i in range(200):
        r = exec_ok(ep, ["echo", str(i)])
        expect(field(r, "stdout") == f"{i}\n".encode(), f"call {i}: {r}")
    return "200 calls answered in order"


def concurrent(ep):
    # Each call waits until all 16 have started: serialized calls would never get there,
    # and the calls' own timeout ends them (timed_out) instead of hanging the test.
    script = ("mkdir -p /tmp/barrier; touch /tmp/barrier/$N; "
              "while [ $(ls /tmp/barrier | wc -l) -lt 16 ]; do sleep 0.05; done; echo $N")
    ids = [ep.send({"op": "exec", "argv": ["sh", "-c", script], "env": {"N": str(i)}, "timeout": 120})
           for i in range(16)]
    for i, call_id in enumerate(ids):
        _, r = ep.result(call_id)
        expect(outcome(r) == {"exit_code": 0, "signal": None, "timed_out": False}
               and field(r, "stdout") == f"{i}\n".encode(), f"call {i}: {r}")
    return "16 pipelined calls ran at once (each saw all 16 started)"


def big_file(ep):
    chunk = 4 << 20
    data = hashlib.sha256(b"seed").digest() * (64 * (1 << 20) // 32)
    path = "/root/big.bin"
    ids = [ep.send({"op": "write_file", "path": path, "data_b64": base64.b64encode(
        data[off:off + chunk]).decode(), "append": off > 0}) for off in range(0, len(data), chunk)]
    for call_id in ids:
        _, r = ep.result(call_id)
        expect(r.get("ok") is True, f"write_file: {r}")
    r = exec_ok(ep, ["sha256sum", path])
    want = hashlib.sha256(data).hexdigest()
    expect(field(r, "stdout").split()[0].decode() == want, f"guest sha256 {r.get('stdout')!r} != {want}")
    events, r = ep.result(ep.send({"op": "read_file", "path": path}))
    expect(r.get("ok") is True and r.get("size") == len(data), f"read_file: {r}")
    back = b"".join(field(e, "data") for e in events)
    expect(hashlib.sha256(back).hexdigest() == want, "read_file bytes differ")
    return f"64 MiB written in {len(ids)} chunks and read back, sha256 {want[:12]}… on both sides"


def capped_output(ep):
    r = exec_ok(ep, ["sh", "-c", "head -c 104857600 /dev/zero | tr '\\0' x"], max_output=1 << 20,
                timeout=600)
    expect(outcome(r) == {"exit_code": 0, "signal": None, "timed_out": False}, f"100 MiB: {outcome(r)}")
    expect(r.get("stdout_truncated") is True and len(field(r, "stdout")) == 1 << 20,
           f"truncated {r.get('stdout_truncated')}, {len(field(r, 'stdout'))} bytes kept")
    return "100 MiB printed, 1 MiB kept, truncated flag set, command ran to the end"


def timeout_kills_group(ep):
    # setsid: a process that left the call's process group (and session) still dies with the
    # call's cgroup.
    r = exec_ok(ep, ["sh", "-c", "sleep 1000 & setsid sleep 1000 & sleep 1000"], timeout=1)
    expect(r.get("timed_out") is True and r.get("signal") == 9, f"timeout: {outcome(r)}")
    r = exec_ok(ep, ["sh", "-c", "pgrep -x sleep || echo none"])
    expect(field(r, "stdout") == b"none\n", f"a sleep survived the timeout: {r.get('stdout')!r}")
    r = ep.call({"op": "shell", "cmd": "setsid sleep 1000 & sleep 1000", "timeout": 1})
    expect(r.get("timed_out") is True, f"shell timeout: {outcome(r)}")
    r = exec_ok(ep, ["sh", "-c", "pgrep -x sleep || echo none"])
    expect(field(r, "stdout") == b"none\n", f"a shell's sleep survived the timeout: {r.get('stdout')!r}")
    return "all three sleeps, a setsid one included, killed at the 1 s timeout, in exec and shell; episode went on"


def malformed_lines(ep):
    cases = [
        (b"hello\n", None, "bad_json"),
        (b"[1,2]\n", None, "bad_json"),
        (b'{"op":"exec","argv":["true"]}\n', None, "missing_field"),
        (b'{"id":"m1","op":"reboot"}\n', "m1", "unknown_op"),
        (b'{"id":"m2","op":"exec"}\n', "m2", "missing_field"),
        (b'{"id":"m3","op":"exec","argv":["true"],"timeout":-1}\n', "m3", "bad_field"),
        (b'{"id":"m4","op":"exec","argv":["true"],"max_output":1000000000}\n', "m4", "bad_field"),
    ]
    for raw, call_id, code in cases:
        ep.send_raw(raw)
        _, r = ep.result(call_id, timeout=120)
        expect(r.get("error", {}).get("code") == code, f"{raw!r}: {r}")
    # An id still in use by a running call is refused; the running call is unaffected.
    ep.send({"id": "dup", "op": "exec", "argv": ["sleep", "1"]})
    ep.send({"id": "dup", "op": "exec", "argv": ["true"]})
    _, first = ep.result("dup")
    _, second = ep.result("dup")
    codes = sorted([str(first.get("error", {}).get("code")), str(second.get("error", {}).get("code"))])
    expect(codes == ["None", "bad_field"], f"duplicate id: {first} / {second}")
    r = exec_ok(ep, ["echo", "still here"])
    expect(field(r, "stdout") == b"still here\n", "episode did not go on")
    return f"{len(cases)} malformed lines and a duplicate id answered with error codes; episode went on"


def shell_state(ep):
    r = ep.call({"op": "shell", "cmd": "mkdir -p /root/w && cd /root/w && export MARK=kept && "
                                        "(sleep 1000 &) && echo $$ > /root/shellpid"})
    expect(r.get("exit_code") == 0, f"first shell call: {r}")
    r = ep.call({"op": "shell", "cmd": "echo $PWD $MARK; pgrep -x sleep | wc -l"})
    expect(field(r, "stdout") == b"/root/w kept\n1\n", f"state not kept: {r.get('stdout')!r}")
    return "cd, export and a background process carried to the next call"


def big_response(ep):
    """64 MiB of control bytes, 384 MiB on the wire (each escaped as \\u0001), pass through
    the relay whole under the default --vmm-mem, and the VMM lives on."""
    size = 64 << 20
    exec_ok(ep, ["true"])  # the VMM is up
    vmm = ep.vmm_pid()
    call_id = ep.send({"op": "exec", "argv": ["sh", "-c", f"head -c {size} /dev/zero | tr '\\0' '\\1'"],
                       "max_output": size, "timeout": 600})
    # Read raw, not through json.loads, which would hold the line three times over in the
    # test host; other calls' lines (none are running) would be kept for them.
    prefix = f'{{"id":{call_id},'.encode()
    deadline = time.monotonic() + 900
    while True:
        raw = ep.lines.get(timeout=max(1, deadline - time.monotonic()))
        expect(raw is not None, f"the episode ended: {ep.stderr.decode(errors='replace')[-2000:]}")
        if raw.startswith(prefix):
            break
        msg = json.loads(raw)
        ep.by_id.setdefault(msg.get("id"), []).append(msg)
    start = raw.find(b'"stdout":"')
    expect(start > 0, f"no plain stdout in {raw[:300]!r}")
    start += len(b'"stdout":"')
    end = start + 6 * size
    # Counted in place: a slice or a comparison string would be another 384 MiB each.
    expect(raw.count(b"\\u0001", start, end) == size and raw[end:end + 1] == b'"',
           f"stdout is not {size} escaped \\x01 bytes: {raw[start:start + 60]!r}…, {len(raw)} bytes in all")
    r = json.loads(raw[:start] + raw[end:])
    expect(outcome(r) == {"exit_code": 0, "signal": None, "timed_out": False}
           and r.get("stdout_truncated") is False, f"response: {r}")
    wire = len(raw)
    del raw
    expect(ep.vmm_pid() == vmm, "the VMM is another process now")
    r = exec_ok(ep, ["echo", "after"])
    expect(field(r, "stdout") == b"after\n", f"the episode did not go on: {r}")
    return f"64 MiB of \\x01 arrived whole ({wire >> 20} MiB line); the same VMM answered the next call"


def resume_refused(ep):
    """A harness's resume is refused by the relay: the guest clock and pids.max stay as they were."""
    ahead = int(time.time()) + 86400  # a day ahead: unmistakable had it been applied
    r = ep.call({"op": "resume", "time_ns": ahead * 10**9, "pids_max": 1,
                 "entropy_b64": base64.b64encode(os.urandom(64)).decode()})
    expect(r.get("error", {}).get("code") == "unknown_op", f"resume: {r}")
    r = exec_ok(ep, ["sh", "-c", "date +%s; cat /sys/fs/cgroup/tool-calls/pids.max"])
    guest, pids_max = field(r, "stdout").split()
    expect(int(guest) < ahead - 3600, f"guest clock {int(guest)} moved toward {ahead}")
    expect(pids_max == b"1024", f"pids.max is {pids_max!r}")
    return "answered unknown_op; guest clock and pids.max (1024) untouched"


def fresh_episode():
    """A second episode starts clean: no file, directory, variable or process of the first."""
    ep = Episode(AGENTVM)
    try:
        r = ep.call({"op": "shell", "cmd": "echo $PWD ${MARK:-unset}; ls /root; pgrep -x sleep | wc -l"})
        expect(field(r, "stdout") == b"/root unset\n0\n", f"new episode not clean: {r.get('stdout')!r}")
        ep.close_stdin()
        expect(ep.wait() == 0, f"exit {ep.proc.returncode} at end of stdin")
    finally:
        ep.kill()
    return "new episode: home cwd, no variable, no files, no sleep"


def eof_answers_pipelined():
    """Requests written all at once, then EOF: every one is answered before exit 0."""
    ep = Episode(AGENTVM)
    try:
        ids = [ep.send({"op": "exec", "argv": ["sh", "-c", f"sleep 0.{i}; echo {i}"]}) for i in range(5)]
        ep.close_stdin()
        for i, call_id in enumerate(ids):
            _, r = ep.result(call_id)
            expect(field(r, "stdout") == f"{i}\n".encode(), f"call {i}: {r}")
        expect(ep.wait() == 0, f"exit {ep.proc.returncode}")
    finally:
        ep.kill()
    return "5 pipelined calls answered after stdin closed; exit 0"


def close_op():
    ep = Episode(AGENTVM)
    try:
        slow = ep.send({"op": "exec", "argv": ["sh", "-c", "sleep 0.5; echo done"]})
        close = ep.send({"op": "close"})
        ep.send({"op": "exec", "argv": ["echo", "ignored"]})
        _, r = ep.result(slow)
        expect(field(r, "stdout") == b"done\n", f"call before close: {r}")
        _, r = ep.result(close)
        expect(r.get("ok") is True, f"close: {r}")
        expect(ep.wait() == 0, f"exit {ep.proc.returncode} after close")
        expect(ep.lines.get(timeout=10) is None, "a line after close")
    finally:
        ep.kill()
    return "close waited for the running call, answered, and ended the episode (exit 0)"


def announce_ready():
    """--announce-ready: the first line says the agent answers, before any call is sent."""
    ep = Episode(AGENTVM, "--announce-ready", "--cold")
    try:
        first = ep.lines.get(timeout=600)
        expect(first is not None, f"the episode ended: {ep.stderr.decode(errors='replace')[-2000:]}")
        expect(json.loads(first) == {"event": "ready", "restored": False}, f"first line {first!r}")
        r = exec_ok(ep, ["echo", "after"])
        expect(field(r, "stdout") == b"after\n", f"the call after it: {r}")
        ep.close_stdin()
        expect(ep.wait() == 0, f"exit {ep.proc.returncode}")
    finally:
        ep.kill()
    return "a cold boot announced {\"event\":\"ready\",\"restored\":false} first, then served a call"


def agent_killed():
    console = os.path.join(TMP, "agent_killed.console")
    ep = Episode(AGENTVM, console=console)
    try:
        exec_ok(ep, ["true"])
        pending = ep.send({"op": "exec", "argv": ["sleep", "1000"]})
        killer = ep.send({"op": "exec", "argv": ["pkill", "-KILL", "-x", "agentvm-agent"]})
        errors = {}
        for call_id in (pending, killer):
            _, r = ep.result(call_id)
            errors[call_id] = r.get("error", {}).get("code")
        expect(set(errors.values()) == {"agent_died"}, f"pending calls got {errors}")
        status = ep.wait()
        expect(status == 4, f"exit {status}")
        expect(b"closed the connection" in ep.stderr, f"stderr: {ep.stderr!r}")
    finally:
        ep.kill()
    return "agent SIGKILLed mid-call: both pending calls got agent_died, exit 4, stderr says why"


def vm_dies():
    ep = Episode(AGENTVM)
    try:
        exec_ok(ep, ["true"])
        pending = ep.send({"op": "exec", "argv": ["sleep", "1000"]})
        # reboot(2) with RB_AUTOBOOT from inside: the guest is gone at once, mid-call.
        ep.send({"op": "exec", "argv": ["python3", "-c",
                                        "import ctypes; ctypes.CDLL(None).reboot(0x01234567)"]})
        _, r = ep.result(pending)
        expect(r.get("error", {}).get("code") == "vm_died", f"pending call got {r}")
        status = ep.wait()
        expect(status == 4, f"exit {status}")
        expect(b"the guest powered off" in ep.stderr, f"stderr: {ep.stderr!r}")
    finally:
        ep.kill()
    return "guest rebooted mid-call: pending call got vm_died, exit 4, stderr says why"


def episode_timeout():
    ep = Episode(AGENTVM, "--episode-timeout", "20")
    try:
        exec_ok(ep, ["true"])
        pending = ep.send({"op": "exec", "argv": ["sleep", "1000"]})
        _, r = ep.result(pending, timeout=120)
        expect(r.get("error", {}).get("code") == "episode_timeout", f"pending call got {r}")
        status = ep.wait()
        expect(status == 5, f"exit {status}")
        expect(b"--episode-timeout" in ep.stderr, f"stderr: {ep.stderr!r}")
    finally:
        ep.kill()
    return "--episode-timeout 20: the running call got episode_timeout, exit 5, stderr says why"


def proc_fields(path):
    fields = {}
    for line in open(path):
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def jailed():
    ep = Episode(AGENTVM)
    try:
        exec_ok(ep, ["true"])
        vmm = ep.vmm_pid()
        status = proc_fields(f"/proc/{vmm}/status")
        expect(int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0
               and int(status["CapBnd"], 16) == 0, f"capabilities left: {status}")
        expect(status["NoNewPrivs"] == "1", "no_new_privs is not set")
        threads = 0
        for tid in os.listdir(f"/proc/{vmm}/task"):
            task = proc_fields(f"/proc/{vmm}/task/{tid}/status")
            if task["Name"].startswith("iou-"):
                continue  # io_uring's workers run no user code
            threads += 1
            expect(task["Seccomp"] == "2", f"thread {task['Name']} ({tid}) has no seccomp filter")
        expect(threads >= 2, f"only {threads} thread(s) checked")
        for ns in ("pid", "mnt", "net", "ipc", "uts"):
            expect(os.readlink(f"/proc/{vmm}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}"),
                   f"the VMM shares our {ns} namespace")
        root = os.listdir(f"/proc/{vmm}/root")
        expect(root == [], f"the VMM's root holds {root}")
        cgroup = open(f"/proc/{vmm}/cgroup").read()
        expect("agentvm" in cgroup, f"the VMM is in no agentvm cgroup: {cgroup}")
        limits = open(f"/proc/{vmm}/limits").read()
        expect(any(l.startswith("Max open files") and l.split()[3] == "4096" for l in limits.splitlines()),
               f"limits: {limits}")
        exec_ok(ep, ["true"])
        ep.close_stdin()
        expect(ep.wait() == 0, "the episode did not end cleanly")
    finally:
        ep.kill()
    return (f"VMM {vmm}: no capabilities, no_new_privs, {threads} threads filtered, own pid/mnt/net/ipc/uts "
            "namespaces, an empty root, an agentvm cgroup, 4096 files")


SHARED = [basics, sequential, concurrent, big_file, capped_output, big_response, timeout_kills_group,
          malformed_lines, shell_state, resume_refused]
OWN = [fresh_episode, eof_answers_pipelined, close_op, announce_ready, agent_killed, vm_dies, episode_timeout, jailed]


def run(name, fn, *args):
    return run_case(name, fn, *args, expected=(EpisodeError,))


def main():
    wanted = set(sys.argv[2:])
    chosen = lambda fn: not wanted or fn.__name__ in wanted
    good = True
    shared = [fn for fn in SHARED if chosen(fn)]
    if shared:
        console = os.path.join(TMP, "shared.console")
        ep = Episode(AGENTVM, console=console)
        try:
            for fn in shared:
                good &= run(fn.__name__, fn, ep)
            ep.close_stdin()
            status = ep.wait()
            if status != 0:
                good = False
                print(f"FAIL shared episode exit: {status}; stderr {ep.stderr!r}")
        finally:
            ep.kill()
        if not good and os.path.exists(console):
            print("console tail:\n" + open(console, errors="replace").read()[-3000:])
    for fn in OWN:
        if chosen(fn):
            good &= run(fn.__name__, fn)
    sys.exit(0 if good else 1)


if __name__ == "__main__":
    main()
