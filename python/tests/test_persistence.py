"""Fork, pause and resume (docs/api.md, docs/protocol.md "Live snapshots"), both transports:
children keep the parent's files, shell state, background job and interpreter and diverge;
a paused sandbox holds no VM and resumes as it was, twice over; bad arguments are refused."""
from __future__ import annotations

import asyncio
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from typing import Any, Dict, Iterator, List

import pytest

from agentvm import AgentvmError, AsyncSandbox, Sandbox, SandboxDied, _snapshots
from conftest import PYTHON_DIR, alive, run_async, wait_until


@pytest.fixture
def snapshots() -> Iterator[str]:
    # $TMPDIR: the test host's own tmpfs (the build directory reaches it over 9p).
    d = tempfile.mkdtemp(prefix="agentvm-pytest-snapshots-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def forkable(target: Dict[str, Any], snapshots: str) -> Dict[str, Any]:
    return dict(target) if target else {"snapshot_dir": snapshots}


def set_up_state(sb: Sandbox) -> None:
    sb.commands.run("mkdir -p /work && cd /work && echo parent > file && export V=7", check=True)
    sb.commands.run("sleep 1000 &", check=True)
    sb.run_code("x = 41")


def check_state(sb: Sandbox) -> None:
    assert sb.commands.run("cat file; pwd; echo $V $E; jobs | wc -l").stdout == "parent\n/work\n7 env\n1\n"
    assert sb.run_code("x + 1").result == "42"


def test_fork_children_keep_state_and_diverge(target: Dict[str, Any], snapshots: str) -> None:
    with Sandbox(envs={"E": "env"}, metadata={"task": "t1"}, **forkable(target, snapshots)) as sb:
        set_up_state(sb)
        children = sb.fork(2)
        try:
            ids = {c.sandbox_id for c in children} | {sb.sandbox_id}
            assert len(ids) == 3
            for i, child in enumerate(children):
                assert child.mode == sb.mode and child.metadata == {"task": "t1"} and child.is_running()
                check_state(child)
                child.commands.run(f"echo {i} > /work/mine", check=True)
                # The environment of exec calls is the parent's too.
                assert child.commands.run(["sh", "-c", "echo $E"]).stdout == "env\n"
            for i, child in enumerate(children):
                assert child.files.read("/work/mine") == f"{i}\n".encode()
            assert not sb.files.exists("/work/mine")
            check_state(sb)
        finally:
            for child in children:
                child.kill()


def test_pause_and_resume_twice(target: Dict[str, Any], snapshots: str) -> None:
    sb = Sandbox(envs={"E": "env"}, **forkable(target, snapshots))
    try:
        set_up_state(sb)
        episode = sb.pid
        resume_id = sb.pause()
        if target:
            assert resume_id == sb.sandbox_id
        assert not sb.is_running()
        with pytest.raises(SandboxDied) as e:
            sb.commands.run("true")
        assert e.value.code == "paused"
        if not target:
            wait_until(lambda: not alive(episode), 60, "the paused sandbox's episode ended")
        resume_args: Dict[str, Any] = {"url": target["url"]} if target else {"envs": {"E": "env"}}
        for cycle in range(2):
            sb = Sandbox.resume(resume_id, **resume_args)
            check_state(sb)
            sb.commands.run(f"echo {cycle} >> /work/cycles", check=True)
            assert sb.files.read("/work/cycles") == "".join(f"{i}\n" for i in range(cycle + 1)).encode()
            resume_id = sb.pause()
        sb = Sandbox.resume(resume_id, **resume_args)
        check_state(sb)
    finally:
        sb.kill()


def test_async_fork_and_pause(target: Dict[str, Any], snapshots: str) -> None:
    async def scenario() -> None:
        sb = await AsyncSandbox.create(**forkable(target, snapshots))
        try:
            await sb.commands.run("echo async > /tmp/a", check=True)
            (child,) = await sb.fork()
            assert (await child.commands.run("cat /tmp/a")).stdout == "async\n"
            resume_id = await child.pause()
            again = await AsyncSandbox.resume(resume_id, **({"url": target["url"]} if target else {}))
            assert (await again.commands.run("cat /tmp/a")).stdout == "async\n"
            await again.kill()
        finally:
            await sb.kill()

    run_async(scenario())


def test_fork_and_pause_arguments(target: Dict[str, Any], snapshots: str) -> None:
    with Sandbox(**forkable(target, snapshots)) as sb:
        with pytest.raises(ValueError):
            sb.fork(0)
        with pytest.raises(ValueError):
            sb.fork(65)
        with pytest.raises(TypeError):
            sb.fork("2")  # type: ignore[arg-type]
    if target:
        with pytest.raises(AgentvmError) as e:
            Sandbox.resume("sb-0000000000000000", url=target["url"])
        assert e.value.code == "not_found"
        with pytest.raises(ValueError):
            Sandbox(snapshot_dir=snapshots, **target)
    else:
        with pytest.raises(ValueError, match="not an existing directory"):
            Sandbox(snapshot_dir="/no/such/dir")
        with pytest.raises(ValueError, match="manifest.json"):
            Sandbox.resume(snapshots)


# Run by another process: resumes a paused sandbox, changes it, pauses it again, prints the id.
RESUME_ELSEWHERE = """
import sys
sys.path.insert(0, sys.argv[1])
from agentvm import Sandbox
sb = Sandbox.resume(sys.argv[2])
assert sb.commands.run("cat /work/file").stdout == "parent\\n"
sb.commands.run("echo other >> /work/file", check=True)
print(sb.pause())
"""


def test_embedded_fork_and_pause_without_snapshot_dir() -> None:
    """Without snapshot_dir= (fork and pause raised ValueError then), the client keeps the
    snapshots in a private directory of its own: kept while the parent, a child or a paused
    sandbox not yet resumed needs it, in this process or another, then removed."""
    root = _snapshots.root()
    before = set(os.listdir(root))
    running: List[Sandbox] = []
    try:
        sb = Sandbox()
        running.append(sb)
        (d,) = [os.path.join(root, n) for n in set(os.listdir(root)) - before]
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700 and stat.S_IMODE(os.stat(root).st_mode) == 0o700
        sb.commands.run("mkdir -p /work && echo parent > /work/file", check=True)
        (child,) = sb.fork()
        running.append(child)
        sb.kill()
        assert os.path.isdir(d), "removed while a child of the parent runs"
        assert child.commands.run("cat /work/file").stdout == "parent\n"
        episode = child.pid
        resume_id = child.pause()
        assert os.path.dirname(resume_id) == d
        wait_until(lambda: not alive(episode), 60, "the paused child's episode ended")
        assert os.path.isdir(d), "removed with a paused sandbox not yet resumed"
        out = subprocess.run([sys.executable, "-c", RESUME_ELSEWHERE, PYTHON_DIR, resume_id], check=True,
                             capture_output=True, text=True, timeout=600).stdout
        again_id = out.strip().splitlines()[-1]
        assert os.path.dirname(again_id) == d, out
        assert os.path.isdir(d), "removed with a paused sandbox (paused by a process that ended) not yet resumed"
        again = Sandbox.resume(again_id)
        running.append(again)
        assert again.commands.run("cat /work/file").stdout == "parent\nother\n"
        again.kill()
        assert not os.path.exists(d), "left behind with nothing needing it"
    finally:
        for s in running:
            s.kill()
