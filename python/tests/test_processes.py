"""Processes as objects (docs/protocol.md, "Processes"; python/README.md, "Processes"), both
transports: a tagged server spawned, listed, followed from a second connection, forked (the
child's copy is the child's) and stopped by SIGTERM it traps; stdin fed in hundreds of pieces;
a pty sized and resized; the errors, ended processes, and a process across pause and resume.
Few tests, each doing much: every one boots sandboxes."""
from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any, Callable, Dict, List, Union

import pytest

from agentvm import (AgentError, AgentvmError, AsyncSandbox, NotFound, Process, Sandbox, SandboxDied, _loop)
from conftest import run_async

# Each piece of stdin is a call: ~20 ms embedded, ~40 ms through serve in the emulated test host.
STDIN_PIECES = 400
# A server that says it is ready, then idles; SIGTERM makes it say goodbye and exit 0. `wait`
# (not a foreground sleep) lets the trap run at once.
SERVER = "trap 'echo bye; exit 0' TERM; echo ready; while :; do sleep 0.2 & wait $!; done"


def until(predicate: Callable[[], bool], what: str, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, f"not within {within} s: {what}"
        time.sleep(0.05)


def other_connection(sb: Sandbox, target: Dict[str, Any]) -> Sandbox:
    """The same sandbox through another client: in service mode a new HTTP client (connections
    of its own) for its id. An embedded sandbox has one way in, its episode: the same object."""
    if not target:
        return sb
    from agentvm._http import HttpClient, ServiceTransport

    async def make() -> AsyncSandbox:
        transport = ServiceTransport(HttpClient(target["url"], None))
        transport.sandbox_id = sb.sandbox_id
        return AsyncSandbox(transport, envs={}, metadata={}, timeout=300)

    return Sandbox._wrap(_loop.run(make()))  # not tracked: it never kills the sandbox


def entry(sb: Sandbox, pid_or_tag: Union[int, str]) -> Any:
    found = [p for p in sb.commands.list() if pid_or_tag in (p.pid, p.tag)]
    assert found, f"{pid_or_tag!r} is not in the process table"
    return found[-1]


def test_server_listed_followed_elsewhere_forked_and_terminated(target: Dict[str, Any]) -> None:
    seen: List[str] = []
    with Sandbox(**target) as sb:
        server = sb.commands.spawn(SERVER, tag="srv", envs={"WHO": "server"}, cwd="/tmp", on_stdout=seen.append)
        assert isinstance(server, Process) and server.tag == "srv" and server.pid > 1
        until(lambda: server.stdout == "ready\n", "the server said it is ready")
        info = entry(sb, "srv")
        assert (info.pid, info.kind, info.argv, info.envs, info.cwd, info.running, info.stdin, info.pty) == \
            (server.pid, "spawn", ["bash", "-c", SERVER], {"WHO": "server"}, "/tmp", True, False, False), info
        assert info.exit_code is None and info.started_at > 1.6e9

        # Followed from elsewhere (its output replayed), then let go of: it runs on.
        other = other_connection(sb, target)
        follower = other.commands.connect("srv")
        assert follower.pid == server.pid
        until(lambda: follower.stdout == "ready\n", "the second attachment replayed the output")
        follower.disconnect()
        assert follower.done()
        with pytest.raises(AgentvmError) as e:
            follower.wait()
        assert e.value.code == "detached"
        assert entry(other, "srv").running

        # A fork's child has its own copy, which its own attachment follows; the parent's runs on.
        [child] = sb.fork()
        try:
            assert entry(child, "srv").running and entry(child, "srv").pid == server.pid
            copy = child.commands.connect("srv", replay=False)
            assert child.commands.kill("srv", "TERM") is True
            ended = copy.wait(timeout=60)
            assert (ended.exit_code, ended.signal, ended.stdout, ended.ok) == (0, None, "bye\n", True), ended
            assert not entry(child, "srv").running
        finally:
            child.kill()
        assert entry(sb, "srv").running and not server.done()

        # The parent's object followed it across the fork (attached again after the snapshot).
        assert sb.commands.kill("srv", "SIGTERM") is True
        result = server.wait(timeout=60)
        assert (result.pid, result.exit_code, result.signal, result.stdout, result.lost_bytes) == \
            (server.pid, 0, None, "ready\nbye\n", 0), result
        assert "".join(seen) == "ready\nbye\n" and server.exit_code == 0
        info = entry(sb, server.pid)
        assert not info.running and info.exit_code == 0 and info.duration is not None
        assert sb.commands.kill("srv") is False, "an ended process cannot be signalled"


def test_stdin_in_pieces_and_a_pty(target: Dict[str, Any]) -> None:
    async def main() -> None:
        async with await AsyncSandbox.create(**target) as sb:
            # Text and bytes that are not UTF-8 (sent as data_b64), in order, through both ways in.
            pieces: List[Union[str, bytes]] = [f"line {i} é\n" if i % 2 else bytes([i % 256, 0xff, 0xfe])
                                               for i in range(STDIN_PIECES)]
            summer = await sb.commands.spawn(["sha256sum"], stdin=True, tag="sum")
            assert entry_async(await sb.commands.list(), summer.pid).stdin
            for i, piece in enumerate(pieces):
                if i % 3:
                    await summer.send_stdin(piece)
                else:
                    await sb.commands.send_stdin("sum", piece)
            await summer.close_stdin()
            result = await summer.wait(timeout=120)
            data = b"".join(p.encode() if isinstance(p, str) else p for p in pieces)
            assert result.ok and result.stdout == f"{hashlib.sha256(data).hexdigest()}  -\n", result

            chunks: List[bytes] = []

            async def screen_shows(text: bytes) -> None:
                deadline = time.monotonic() + 60
                while text not in b"".join(chunks):
                    assert time.monotonic() < deadline, f"{text!r} not on the terminal: {b''.join(chunks)[-500:]!r}"
                    await asyncio.sleep(0.05)

            term = await sb.pty.create(rows=24, cols=80, on_data=chunks.append, tag="term")
            await term.send_stdin("stty size; echo T=$TERM\n")
            await screen_shows(b"24 80")
            await screen_shows(b"T=xterm-256color")
            await sb.pty.resize(term.pid, 50, 160)
            await sb.pty.send_stdin("term", "stty size\n")
            await screen_shows(b"50 160")
            assert entry_async(await sb.commands.list(), term.pid).pty
            assert await sb.pty.kill(term.pid) is True
            ended = await term.wait(timeout=60)
            assert (ended.exit_code, ended.signal) == (None, 9), ended
            assert ended.stdout_bytes == b"".join(chunks) and ended.stderr == ""
            assert await sb.pty.kill(term.pid) is False

    run_async(main())


def entry_async(processes: List[Any], pid: int) -> Any:
    found = [p for p in processes if p.pid == pid]
    assert found, f"{pid} is not in the process table"
    return found[-1]


def test_errors_ended_processes_and_pause(target: Dict[str, Any]) -> None:
    with Sandbox(**target) as sb:
        bad: List[Any] = [
            (lambda: sb.commands.spawn(42), TypeError),  # type: ignore[arg-type]
            (lambda: sb.commands.spawn([]), ValueError),
            (lambda: sb.commands.spawn("true", tag=""), ValueError),
            (lambda: sb.commands.spawn("true", tag="t" * 257), ValueError),
            (lambda: sb.commands.spawn("true", stdin="yes"), TypeError),  # type: ignore[arg-type]
            (lambda: sb.commands.spawn("true", timeout=0), ValueError),
            (lambda: sb.commands.spawn("true", on_stdout="print"), TypeError),  # type: ignore[arg-type]
            (lambda: sb.commands.kill(True), TypeError),
            (lambda: sb.commands.kill(0), ValueError),
            (lambda: sb.commands.kill(1, "BOGUS"), ValueError),
            (lambda: sb.commands.kill(1, 11), ValueError),  # SEGV: not sendable
            (lambda: sb.commands.connect(None), TypeError),  # type: ignore[arg-type]
            (lambda: sb.commands.send_stdin(1, 5), TypeError),  # type: ignore[arg-type]
            (lambda: sb.pty.create(rows=0), ValueError),
            (lambda: sb.pty.create(cols=5000), ValueError),
            (lambda: sb.pty.resize(1, 24, "80"), TypeError),  # type: ignore[arg-type]
        ]
        before = sb.commands.list()
        for call, exc in bad:
            with pytest.raises(exc):
                call()
        assert sb.commands.list() == before, "a refused call reached the sandbox"

        assert sb.commands.kill(99999) is False and sb.commands.kill("nobody", "TERM") is False
        with pytest.raises(NotFound):
            sb.commands.connect("nobody")
        with pytest.raises(NotFound):
            sb.commands.spawn(["/no/such/program"])
        nap = sb.commands.spawn(["sleep", "600"], tag="nap")
        with pytest.raises(AgentError) as e:
            sb.commands.spawn(["true"], tag="nap")
        assert e.value.code == "exists"
        with pytest.raises(AgentError) as e:
            nap.send_stdin("x")
        assert e.value.code == "stdin_closed"
        with pytest.raises(AgentError) as e:
            sb.pty.resize("nap", 10, 10)
        assert e.value.code == "bad_field"

        three = sb.commands.spawn(["sh", "-c", "echo out; echo err >&2; exit 3"])
        result = three.wait(timeout=60)
        assert (result.exit_code, result.stdout, result.stderr, result.ok) == (3, "out\n", "err\n", False)
        info = entry(sb, three.pid)
        assert (info.running, info.exit_code, info.signal, info.kind) == (False, 3, None, "spawn")
        # An ended process is still there to connect to: its output, then how it ended.
        again = sb.commands.connect(three.pid).wait(timeout=60)
        assert (again.exit_code, again.stdout, again.stderr) == (3, "out\n", "err\n")
        with pytest.raises(NotFound):
            sb.commands.send_stdin(three.pid, "late")

        # Paused with an attachment open (detached for the snapshot), resumed: it still runs.
        resume_id = sb.pause()
        with pytest.raises(SandboxDied) as died:
            nap.wait(timeout=60)
        assert died.value.code == "paused"
        resumed = Sandbox.resume(resume_id, **({"url": target["url"]} if target else {}))
        try:
            follower = resumed.commands.connect("nap")
            assert follower.pid == nap.pid and not follower.done() and entry(resumed, "nap").running
            assert resumed.commands.kill("nap") is True
            assert follower.wait(timeout=60).signal == 9
            info = entry(resumed, "nap")
            assert (info.running, info.exit_code, info.signal) == (False, None, 9)
        finally:
            resumed.kill()
