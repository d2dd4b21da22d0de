"""commands.run: shell and argv calls, results as data, streaming, limits, timeouts."""
from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from agentvm import (AgentError, AsyncSandbox, CallTimeout, CommandFailed, CommandResult, NotFound,
                     Sandbox)
from conftest import descendants, run_async


def test_shell_state_persists(sandbox: Sandbox) -> None:
    r = sandbox.commands.run("mkdir -p /tmp/w && cd /tmp/w && export X=41 && f() { echo $((X + 1)); }")
    assert r.exit_code == 0, r
    r = sandbox.commands.run("pwd; echo $X; f")
    assert r.stdout == "/tmp/w\n41\n42\n"
    assert r.stderr == ""
    assert isinstance(r.duration, float) and r.duration >= 0


def test_nonzero_exit_is_data_and_check_raises(sandbox: Sandbox) -> None:
    r = sandbox.commands.run("echo out; echo oops >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr, r.signal, r.timed_out) == (3, "out\n", "oops\n", None, False)
    assert not r.ok
    with pytest.raises(CommandFailed) as e:
        sandbox.commands.run(["sh", "-c", "echo bad >&2; exit 5"], check=True)
    assert e.value.result.exit_code == 5
    assert e.value.result.stderr == "bad\n"
    assert "bad" in str(e.value)
    ok = sandbox.commands.run(["true"], check=True)
    assert ok.exit_code == 0


def test_argv_env_cwd_stdin(sandbox: Sandbox) -> None:
    r = sandbox.commands.run(["sh", "-c", 'echo "$A:$B"; pwd; cat'], envs={"A": "1", "B": "two words"},
                             cwd="/etc", stdin=b"from stdin\n")
    assert r.stdout == "1:two words\n/etc\nfrom stdin\n", r
    r = sandbox.commands.run(["cat"], stdin="text é\n")
    assert r.stdout == "text é\n"


def test_shell_envs_and_cwd_do_not_leak(sandbox: Sandbox) -> None:
    sandbox.commands.run("cd /tmp")
    r = sandbox.commands.run("pwd; echo \"[$Y]\"; cd /; exit 7", envs={"Y": "it's \"quoted\" $HOME"}, cwd="/etc")
    assert r.exit_code == 7
    assert r.stdout == "/etc\n[it's \"quoted\" $HOME]\n"
    r = sandbox.commands.run("pwd; echo \"[$Y]\"")
    assert r.stdout == "/tmp\n[]\n", "the call's cwd/envs leaked into the persistent shell"
    r = sandbox.commands.run("pwd", cwd="/no/such/dir")
    assert r.exit_code == 1 and "No such file or directory" in r.stderr and r.stdout == ""


def test_signal_and_binary_output(sandbox: Sandbox) -> None:
    r = sandbox.commands.run(["sh", "-c", "kill -TERM $$"])
    assert r.exit_code is None and r.signal == signal.SIGTERM
    r = sandbox.commands.run("sh -c 'kill -TERM $$'")
    assert r.exit_code == 128 + signal.SIGTERM and r.signal is None
    # Killing the persistent shell itself: how bash ended, and a fresh shell next.
    sandbox.commands.run("cd /tmp")
    r = sandbox.commands.run("kill -TERM $BASHPID")
    assert r.exit_code is None and r.signal == signal.SIGTERM
    assert sandbox.commands.run("pwd").stdout != "/tmp\n"
    r = sandbox.commands.run(["printf", "\\000\\377\\376ok"])
    assert r.stdout_bytes == b"\x00\xff\xfeok"
    assert r.stdout == "\x00\ufffd\ufffdok"


def test_not_found_and_spawn_failed(sandbox: Sandbox) -> None:
    with pytest.raises(NotFound) as e:
        sandbox.commands.run(["/no/such/program"])
    assert e.value.code == "not_found"
    with pytest.raises(NotFound):
        sandbox.commands.run(["true"], cwd="/no/such/dir")
    with pytest.raises(AgentError) as e2:
        sandbox.commands.run(["/etc/hostname"])
    assert e2.value.code == "spawn_failed"
    # The sandbox goes on.
    assert sandbox.commands.run("echo still").stdout == "still\n"


def test_streaming_callbacks(sandbox: Sandbox) -> None:
    out: list = []
    err: list = []
    r = sandbox.commands.run("for i in 1 2 3; do echo line$i; echo e$i >&2; sleep 0.2; done",
                             on_stdout=out.append, on_stderr=err.append)
    assert "".join(out) == "line1\nline2\nline3\n" == r.stdout
    assert "".join(err) == "e1\ne2\ne3\n" == r.stderr
    assert all(isinstance(c, str) for c in out + err)
    assert len(out) >= 2, f"expected the output in several chunks as it came: {out}"
    # A multi-byte character split across events still arrives whole.
    chunks: list = []
    r = sandbox.commands.run(["python3", "-c",
                              "import os,time\nb='é'.encode()\nos.write(1,b[:1]);time.sleep(0.3);os.write(1,b[1:])"],
                             on_stdout=chunks.append)
    assert "".join(chunks) == "é" and r.stdout == "é"


def test_callback_exception_is_raised(sandbox: Sandbox) -> None:
    def boom(text: str) -> None:
        raise RuntimeError("callback failed")

    with pytest.raises(RuntimeError, match="callback failed"):
        sandbox.commands.run("echo hi", on_stdout=boom)
    assert sandbox.commands.run("echo ok").stdout == "ok\n"


def test_max_output_truncates(sandbox: Sandbox) -> None:
    r = sandbox.commands.run(["sh", "-c", "head -c 100000 /dev/zero | tr '\\0' x"], max_output=1000)
    assert r.stdout == "x" * 1000 and r.stdout_truncated and not r.stderr_truncated
    streamed: list = []
    r = sandbox.commands.run("head -c 50000 /dev/zero | tr '\\0' y", max_output=100, on_stdout=streamed.append)
    assert "".join(streamed) == "y" * 100 == r.stdout and r.stdout_truncated


def test_call_timeout_kills_and_reports(sandbox: Sandbox) -> None:
    r = sandbox.commands.run(["sh", "-c", "echo started; sleep 30"], timeout=1)
    assert r.timed_out and r.stdout == "started\n"
    assert r.exit_code is None and r.signal == signal.SIGKILL
    r = sandbox.commands.run("sleep 30", timeout=1)
    assert r.timed_out
    with pytest.raises(CommandFailed):
        sandbox.commands.run("sleep 30", timeout=1, check=True)
    assert sandbox.commands.run("echo after").stdout == "after\n"


def test_client_deadline_raises_and_cancels(sandbox: Sandbox) -> None:
    with pytest.raises(CallTimeout) as e:
        sandbox.commands.run(["sh", "-c", "echo $$ > /tmp/sleeper.pid; exec sleep 300"], timeout=600,
                             request_timeout=2)
    assert e.value.code == "client_timeout"
    # The call given up on was cancelled in the sandbox: its process goes.
    pid = sandbox.files.read("/tmp/sleeper.pid").decode().strip()
    deadline = time.monotonic() + 60
    while sandbox.commands.run(["kill", "-0", pid]).exit_code == 0:
        assert time.monotonic() < deadline, "the process of a call past its client deadline still runs"
        time.sleep(0.5)


def test_client_deadline_when_the_episode_is_frozen(target: dict) -> None:
    """Nothing answers at all (the episode process stopped): the client's own deadline, the
    call's timeout plus the grace, still ends the wait."""
    sb = Sandbox(grace=2, **target)
    try:
        assert sb.pid is not None
        frozen = [sb.pid] + descendants(sb.pid)  # the episode and its VMM (which relays)
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        try:
            with pytest.raises(CallTimeout):
                sb.commands.run("echo never", timeout=1)
        finally:
            for pid in frozen:
                os.kill(pid, signal.SIGCONT)
    finally:
        sb.kill()


def test_async_commands(target: dict) -> None:
    async def main() -> None:
        async with await AsyncSandbox.create(**target) as sb:
            results = await asyncio.gather(*(sb.commands.run(["sh", "-c", f"sleep 0.5; echo {i}"]) for i in range(8)))
            assert [r.stdout for r in results] == [f"{i}\n" for i in range(8)]
            r = await sb.commands.run("cd /tmp && echo $PWD")
            assert isinstance(r, CommandResult) and r.stdout == "/tmp\n"
            r = await sb.commands.run("pwd")
            assert r.stdout == "/tmp\n"

    run_async(main())
