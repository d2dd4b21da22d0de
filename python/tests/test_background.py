"""background=True: processes that keep running across later calls, their output, kill()."""
from __future__ import annotations

import asyncio
import time

import pytest

from agentvm import AsyncSandbox, Sandbox, Timeout
from conftest import run_async


def test_background_survives_later_calls_and_is_killed(sandbox: Sandbox) -> None:
    h = sandbox.commands.run("echo $$ > /tmp/bg.pid; i=0; while true; do echo tick$i; i=$((i+1)); sleep 0.2; done",
                             background=True)
    # Later calls run while it does.
    for _ in range(3):
        assert sandbox.commands.run("echo other").stdout == "other\n"
    deadline = time.monotonic() + 60
    while not sandbox.files.exists("/tmp/bg.pid"):
        assert time.monotonic() < deadline, "the background command never wrote its pid"
        time.sleep(0.2)
    pid = sandbox.files.read("/tmp/bg.pid").decode().strip()
    assert sandbox.commands.run(["kill", "-0", pid]).exit_code == 0, "the background process is not running"
    assert not h.done()
    chunks = []
    for stream, text in h.iter_output():
        chunks.append((stream, text))
        if "tick2" in "".join(t for _, t in chunks):
            break
    assert all(s == "stdout" for s, _ in chunks)
    assert h.kill() is True
    result = h.wait()
    assert result.cancelled and result.signal == 9
    assert result.stdout.startswith("tick0\ntick1\n")
    assert h.stdout == result.stdout
    assert h.kill() is False, "killing an ended command should report it was not running"
    deadline = time.monotonic() + 60
    while sandbox.commands.run(["kill", "-0", pid]).exit_code == 0:
        assert time.monotonic() < deadline, "the killed background process still runs"
        time.sleep(0.5)


def test_background_ends_by_itself(sandbox: Sandbox) -> None:
    seen: list = []
    h = sandbox.commands.run(["sh", "-c", "sleep 0.5; echo done; echo warn >&2; exit 4"], background=True,
                             on_stdout=seen.append)
    r = h.wait()
    assert (r.exit_code, r.stdout, r.stderr, r.cancelled) == (4, "done\n", "warn\n", False)
    assert "".join(seen) == "done\n"
    # Chunks nobody consumed yet are still there for iter_output.
    queued = list(h.iter_output())
    assert sorted(queued) == [("stderr", "warn\n"), ("stdout", "done\n")]
    long = sandbox.commands.run("sleep 30", background=True)
    with pytest.raises(Timeout):
        long.wait(timeout=0.5)
    assert not long.done()
    assert long.kill() is True
    assert long.wait().cancelled


def test_background_output_iterates_to_the_end(sandbox: Sandbox) -> None:
    h = sandbox.commands.run(["sh", "-c", "for i in 1 2 3; do echo $i; echo e$i >&2; sleep 0.1; done"],
                             background=True)
    got = {"stdout": "", "stderr": ""}
    for stream, text in h.iter_output():
        got[stream] += text
    assert got == {"stdout": "1\n2\n3\n", "stderr": "e1\ne2\ne3\n"}
    assert h.done() and h.wait().exit_code == 0


def test_background_async(target: dict) -> None:
    async def main() -> None:
        async with await AsyncSandbox.create(**target) as sb:
            handles = [await sb.commands.run(["sh", "-c", f"sleep 600; echo {i}"], background=True) for i in range(3)]
            r = await sb.commands.run("ps -eo args | grep -c '^sleep 600'")
            assert r.stdout.strip() == "3", r
            assert all(await asyncio.gather(*(h.kill() for h in handles)))
            results = await asyncio.gather(*(h.wait() for h in handles))
            assert all(x.cancelled for x in results)
            out = []
            h = await sb.commands.run("echo a; sleep 0.3; echo b", background=True)
            async for stream, text in h.iter_output():
                out.append(text)
            assert "".join(out) == "a\nb\n"

    run_async(main())


def test_background_str_is_bash_c_without_the_shells_state(sandbox: Sandbox) -> None:
    sandbox.commands.run("cd /tmp && export Z=1")
    h = sandbox.commands.run('pwd; echo "[$Z][$W]"', background=True, cwd="/etc", envs={"W": "w"})
    assert h.wait().stdout == "/etc\n[][w]\n"
    assert sandbox.commands.run('pwd; echo "[$Z]"').stdout == "/tmp\n[1]\n"
