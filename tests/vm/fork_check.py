#!/usr/bin/env python3
"""Live snapshots of running episodes with a real guest: fork one into four, a fork of a fork,
five pause/resume cycles, and the faults (a changed or missing parent, a name in use, a full
disk, an episode without --snapshot-dir).

usage: fork_check.py AGENTVM_BINARY
Works in a temporary directory (removed at the end). Prints "ok <case>: <what was seen>" or
"FAIL <case>: <why>" per case; exits non-zero if any failed.
"""
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time

from checks import expect, rises, run_case
from episode_client import Episode, EpisodeError

AGENTVM = sys.argv[1]
WORK = tempfile.mkdtemp(prefix="agentvm-fork-")
SNAPS = os.path.join(WORK, "snaps")
os.mkdir(SNAPS)
CHILDREN = 4
# A background job of the persistent shell: appends a rising count every 100 ms.
COUNTER = "sh -c 'i=0; while :; do i=$((i+1)); echo $i >> /work/counter; sleep 0.1; done' >/dev/null 2>&1 &"


CONSOLES = itertools.count()


def episode(*args):
    """An episode whose guest console goes to a file of its own, so that a guest that stops
    answering says in the failure what it printed last."""
    return Episode(AGENTVM, *args, console=os.path.join(WORK, f"console-{next(CONSOLES)}.log"))


def ok(answer, what):
    expect("error" not in answer, f"{what}: {answer}")
    return answer


def shell(ep, cmd):
    answer = ok(ep.call({"op": "shell", "cmd": cmd}), cmd)
    expect(answer.get("exit_code") == 0, f"{cmd}: {answer}")
    return answer["stdout"]


def python(ep, code):
    return ok(ep.call({"op": "run_code", "code": code}), code)


def snapshot(ep, name):
    answer = ep.call({"op": "snapshot", "name": name})
    expect("snapshot" in answer, f"snapshot {name}: {answer}")
    return answer["snapshot"]


# A thread of the persistent interpreter rewrites a 16 MiB buffer page by page, pass after
# pass, the whole time, so that the snapshot is taken while the VM writes: pages [0, pos)
# hold pass v's byte and the rest pass v-1's (mod 251). A page the snapshot missed when it
# was written during the copy breaks that in a child.
CHURN = """
import threading
CHURN_PAGES = 4096
churn_fill = [bytes([v]) * 4096 for v in range(251)]
churn_buf = bytearray(CHURN_PAGES * 4096)
churn_state = {"v": 0, "pos": CHURN_PAGES, "stop": False, "passes": 0}
def churn():
    v = 0
    while not churn_state["stop"]:
        v = (v + 1) % 251
        for p in range(CHURN_PAGES):
            churn_buf[p * 4096:(p + 1) * 4096] = churn_fill[v]
            churn_state["v"], churn_state["pos"] = v, p + 1
            if churn_state["stop"]:
                break
        churn_state["passes"] += 1
churn_thread = threading.Thread(target=churn, daemon=True)
churn_thread.start()
"""
CHURN_CHECK = """
churn_state["stop"] = True
churn_thread.join()
v, pos = churn_state["v"], churn_state["pos"]
[p for p in range(CHURN_PAGES)
 if churn_buf[p * 4096:(p + 1) * 4096] != churn_fill[v if p < pos else (v - 1) % 251]][:8]
"""


def soft_dirty_kept():
    """Whether this kernel keeps soft-dirty bits (what the snapshot's "tracked" must say)."""
    import ctypes
    import mmap
    page = mmap.mmap(-1, 4096)
    page[0] = 1
    entry_at = ctypes.addressof(ctypes.c_char.from_buffer(page)) // 4096 * 8

    def dirty():
        with open("/proc/self/pagemap", "rb") as pagemap:
            pagemap.seek(entry_at)
            return bool(int.from_bytes(pagemap.read(8), "little") >> 55 & 1)
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("4")
    clean = not dirty()
    page[0] = 2
    return clean and dirty()


def counter(ep):
    return int(shell(ep, "tail -n 1 /work/counter").strip() or 0)


def counting(ep):
    """The counter job runs: its count rises."""
    return rises(lambda: counter(ep), 30, "the counter stood still")


def start_parent(*args):
    ep = episode("--snapshot-dir", SNAPS, *args)
    shell(ep, "mkdir -p /work && echo parent-file > /work/file && cd /work && export FORKVAR=parent-var")
    shell(ep, COUNTER)
    python(ep, "x = 41\nimport hashlib")
    return ep


def child_state(ep):
    """What a fork child must have kept of its parent: file, cwd, variable, job, interpreter."""
    seen = shell(ep, "cat /work/file; pwd; echo $FORKVAR; jobs | wc -l").split()
    expect(seen == ["parent-file", "/work", "parent-var", "1"], f"shell state {seen}")
    counting(ep)
    value = python(ep, "x + 1")
    expect(value.get("result") == "42", f"interpreter: {value}")
    return seen


def fork_children():
    parent = start_parent()
    children = []
    try:
        counting(parent)
        python(parent, CHURN)
        rises(lambda: int(python(parent, 'churn_state["passes"]')["result"]), 60, "the interpreter's thread stood still")
        taken = snapshot(parent, "s1")
        expect(taken["path"] == os.path.join(SNAPS, "s1"), f"path {taken}")
        tracked = soft_dirty_kept()
        expect(taken["tracked"] == tracked,
               f"the snapshot says tracked={taken['tracked']}, this kernel {'keeps' if tracked else 'keeps no'} "
               f"soft-dirty bits")
        # The parent runs on, unchanged; its churn has done its part. Each VM churning a
        # thread at once starved the others' calls past their timeout on a loaded CI host, so
        # the children start one after another, and each stops its copy of the churn first.
        python(parent, 'churn_state["stop"] = True\nchurn_thread.join()')
        child_state(parent)
        uuids, randoms = set(), set()
        for i in range(CHILDREN):
            child = episode("--snapshot", taken["path"])
            children.append(child)
            stale = python(child, CHURN_CHECK)["result"]
            expect(stale == "[]", f"child {i}: pages of the buffer written during the snapshot are stale: {stale}")
            child_state(child)
            shell(child, f"echo child-{i} > /work/mine")
            uuids.add(shell(child, "cat /proc/sys/kernel/random/uuid").strip())
            randoms.add(python(child, "import os\nos.urandom(16).hex()")["result"])
            guest = float(shell(child, "date +%s.%N"))
            expect(abs(guest - time.time()) < 3, f"child {i}'s clock is {guest - time.time():+.1f} s off")
        expect(len(uuids) == CHILDREN and len(randoms) == CHILDREN, f"shared randomness: {uuids} {randoms}")
        for i, child in enumerate(children):
            mine = shell(child, "cat /work/mine").strip()
            expect(mine == f"child-{i}", f"child {i} reads {mine!r}: the children's writes are not their own")
        expect(shell(parent, "cat /work/mine 2>/dev/null || echo none").strip() == "none",
               "a child's write reached the parent")
        return (f"parent paused {taken['pause_ms']:.1f} ms (copied {taken['copied_running_bytes'] >> 10} KiB running, "
                f"{taken['copied_paused_bytes'] >> 10} KiB paused, tracked={tracked}), stored "
                f"{taken['memory_bytes'] >> 10} KiB memory and {taken['disk_bytes'] >> 10} KiB disk; {CHILDREN} "
                f"children kept file, cwd, variable, counting job, interpreter and the buffer its thread was "
                f"rewriting, wrote their own files, drew distinct uuids and random bytes, and had the host's clock")
    finally:
        for ep in children + [parent]:
            ep.kill()


def fork_of_fork():
    parent = start_parent()
    try:
        first = snapshot(parent, "f1")
    finally:
        parent.kill()
    child = episode("--snapshot", first["path"], "--snapshot-dir", SNAPS)
    try:
        child_state(child)
        shell(child, "echo second > /work/second && export SECOND=2")
        python(child, "y = x * 2")
        second = snapshot(child, "f2")
    finally:
        child.kill()
    grandchild = episode("--snapshot", second["path"])
    try:
        child_state(grandchild)
        seen = shell(grandchild, "cat /work/second; echo $SECOND").split()
        expect(seen == ["second", "2"], f"the second layer's shell state: {seen}")
        expect(python(grandchild, "y").get("result") == "82", "the second layer's interpreter state")
    finally:
        grandchild.kill()
    return (f"a fork of a fork ({first['memory_bytes'] >> 10} KiB, then {second['memory_bytes'] >> 10} KiB of "
            f"memory) kept both layers' files, variables, job and interpreter")


def pause_resume_cycles():
    ep = start_parent()
    sizes = []
    try:
        for cycle in range(1, 6):
            shell(ep, f"echo {cycle} >> /work/cycles && export CYCLE{cycle}={cycle}")
            python(ep, f"c{cycle} = {cycle}")
            taken = snapshot(ep, f"p{cycle}")
            sizes.append(taken["memory_bytes"] >> 10)
            ep.close_stdin()
            expect(ep.wait(60) == 0, f"the episode paused in cycle {cycle} did not end cleanly")
            ep = episode("--snapshot", taken["path"], "--snapshot-dir", SNAPS)
            child_state(ep)
            seen = shell(ep, "cat /work/cycles | tr '\\n' ' '; " +
                         "; ".join(f"echo $CYCLE{i}" for i in range(1, cycle + 1))).split()
            want = [str(i) for i in range(1, cycle + 1)] * 2
            expect(seen == want, f"cycle {cycle}: shell state {seen}, want {want}")
            values = python(ep, "[" + ", ".join(f"c{i}" for i in range(1, cycle + 1)) + "]").get("result")
            expect(values == str(list(range(1, cycle + 1))), f"cycle {cycle}: interpreter {values}")
    finally:
        ep.kill()
    return f"5 pause/resume cycles lost nothing; each stored {sizes} KiB of memory"


def refused(*args):
    r = subprocess.run([AGENTVM, "episode", *args], input=b'{"id":1,"op":"shell","cmd":"true"}\n',
                       capture_output=True, timeout=300)
    return r.returncode, r.stderr.decode(errors="replace")


def broken_chains():
    parent = start_parent()
    try:
        first = snapshot(parent, "b1")
    finally:
        parent.kill()
    child = episode("--snapshot", first["path"], "--snapshot-dir", SNAPS)
    try:
        second = snapshot(child, "b2")
    finally:
        child.kill()
    manifest = os.path.join(first["path"], "manifest.json")
    original = open(manifest, "rb").read()
    with open(manifest, "wb") as f:
        f.write(original.replace(b'"vcpus": 1', b'"vcpus":  1'))
    code, err = refused("--snapshot", second["path"])
    expect(code != 0 and "altered or replaced" in err and first["path"] in err, f"altered parent: {code} {err[-600:]}")
    shutil.rmtree(first["path"])
    code, err = refused("--snapshot", second["path"])
    expect(code != 0 and "missing" in err and first["path"] in err, f"missing parent: {code} {err[-600:]}")
    return "a parent altered since, then deleted, is refused naming it"


def snapshot_faults():
    ep = start_parent()
    seen = []
    try:
        snapshot(ep, "taken")
        again = ep.call({"op": "snapshot", "name": "taken"})
        expect(again.get("error", {}).get("code") == "snapshot_failed" and "already exists" in again["error"]["message"],
               f"a name in use: {again}")
        seen.append("a name in use refused")
        # Two at once on one parent: taken one after the other, never interleaved.
        first, second = ep.send({"op": "snapshot", "name": "twin-1"}), ep.send({"op": "snapshot", "name": "twin-2"})
        answers = [ep.result(first)[1], ep.result(second)[1]]
        expect(all("snapshot" in a for a in answers), f"two snapshots at once: {answers}")
        twin = episode("--snapshot", answers[1]["snapshot"]["path"])
        try:
            child_state(twin)
        finally:
            twin.kill()
        seen.append("two snapshots requested at once both taken, one after the other")
        full = os.path.join(SNAPS, "full")
        os.mkdir(full)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", full], check=True)
        try:
            # The jailed VMM sees the directory as it was when it started; a fresh episode sees the mount.
            small = episode("--snapshot-dir", full)
            try:
                shell(small, "head -c 8M /dev/urandom > /tmp/noise")
                answer = small.call({"op": "snapshot", "name": "s"})
                expect(answer.get("error", {}).get("code") == "snapshot_failed", f"a full disk: {answer}")
                expect(os.listdir(full) == [], f"left behind on the full disk: {os.listdir(full)}")
                expect(shell(small, "echo alive").strip() == "alive", "the VM did not run on after the failure")
                seen.append(f"a full disk failed cleanly ({answer['error']['message'][:80]}), nothing left, VM runs on")
            finally:
                small.kill()
        finally:
            subprocess.run(["umount", full], check=False)
    finally:
        ep.kill()
    plain = episode()
    try:
        answer = plain.call({"op": "snapshot", "name": "s"})
        expect(answer.get("error", {}).get("code") == "unavailable", f"without --snapshot-dir: {answer}")
        seen.append("refused without --snapshot-dir")
    finally:
        plain.kill()
    return "; ".join(seen)


def main():
    results = [
        run_case("fork_children", fork_children, expected=(EpisodeError,)),
        run_case("fork_of_fork", fork_of_fork, expected=(EpisodeError,)),
        run_case("pause_resume_cycles", pause_resume_cycles, expected=(EpisodeError,)),
        run_case("broken_chains", broken_chains, expected=(EpisodeError,)),
        run_case("snapshot_faults", snapshot_faults, expected=(EpisodeError,)),
    ]
    shutil.rmtree(WORK, ignore_errors=True)
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
