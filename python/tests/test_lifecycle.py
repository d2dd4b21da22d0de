"""Sandbox life: identity, envs, metadata, kill, lifetimes, a VM killed under calls, start
failures, the binary lookup, and the service's own refusals."""
from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from agentvm import (AgentvmError, AsyncSandbox, BinaryNotFound, Sandbox, SandboxDied, ServiceError,
                     StartFailed)
from conftest import (BUILD, PYTHON_DIR, alive, descendants, run_async, tmp_root, unix_get, vmm_of,
                      wait_until)


def test_identity_kill_and_context_manager(target: dict) -> None:
    with Sandbox(**target) as sb:
        assert sb.is_running()
        assert sb.mode == ("service" if target else "embedded")
        # A service's ids name its node and serve instance: "<node>-<6 hex>-<16 hex>".
        assert re.fullmatch(r"[a-z0-9-]+-[0-9a-f]{6}-[0-9a-f]{16}" if target else r"ep-.+", sb.sandbox_id)
        assert isinstance(sb.pid, int) and alive(sb.pid)
        assert sb.restored is True
        episode = sb.pid
    assert not sb.is_running()
    with pytest.raises(SandboxDied) as e:
        sb.commands.run("echo after")
    assert e.value.code == "killed"
    sb.kill()  # again: nothing to do
    wait_until(lambda: not alive(episode), 60, "the killed sandbox's episode process ended")


def test_envs_and_metadata(target: dict) -> None:
    with Sandbox(envs={"TASK": "42", "SPACED": "a b"}, metadata={"rollout": "7"}, **target) as sb:
        assert sb.commands.run(["sh", "-c", "echo $TASK:$SPACED"]).stdout == "42:a b\n"
        assert sb.commands.run("echo $TASK:$SPACED").stdout == "42:a b\n"
        assert sb.commands.run(["sh", "-c", "echo $TASK"], envs={"TASK": "own"}).stdout == "own\n"
        assert sb.commands.run("echo $TASK", envs={"TASK": "own"}).stdout == "own\n"
        assert sb.commands.run("echo $TASK").stdout == "42\n"
        assert sb.metadata == {"rollout": "7"}
        if target:
            assert sb.info()["metadata"] == {"rollout": "7"}
        # The shell's envs come back after a shell was killed by a timeout (a fresh bash).
        assert sb.commands.run("sleep 30", timeout=1).timed_out
        assert sb.commands.run("echo $TASK").stdout == "42\n"


def test_vm_killed_fails_pending_calls_at_once(target: dict) -> None:
    async def main() -> None:
        sb = await AsyncSandbox.create(**target)
        try:
            calls = [asyncio.ensure_future(sb.commands.run("sleep 600")),
                     asyncio.ensure_future(sb.commands.run(["sleep", "600"])),
                     asyncio.ensure_future(sb.commands.run(["sleep", "600"], on_stdout=print))]
            await sb.commands.run(["true"])  # the others are running by now
            assert sb.pid is not None
            vmms = vmm_of(sb.pid)
            assert vmms, f"the episode {sb.pid} has no VMM child"
            for pid in vmms:
                os.kill(pid, signal.SIGKILL)
            done, pending = await asyncio.wait(calls, timeout=120)
            assert not pending, "calls still pending 120 s after their VM was killed (their timeout is 600 s)"
            for t in done:
                exc = t.exception()
                assert isinstance(exc, SandboxDied), repr(exc)
                assert exc.code == "vm_died", repr(exc)
                assert exc.message
            with pytest.raises(SandboxDied):
                await sb.commands.run("echo after")
            with pytest.raises(SandboxDied):
                await sb.files.read("/etc/hostname")
            assert not await sb.is_running()
        finally:
            await sb.kill()

    run_async(main())


def test_lifetime_ends_the_sandbox(target: dict) -> None:
    sb = Sandbox(timeout=3, **target)
    try:
        assert sb.commands.run("echo alive").stdout == "alive\n"
        wait_until(lambda: not sb.is_running(), 120, "a sandbox with timeout=3 ended")
        with pytest.raises(SandboxDied) as e:
            sb.commands.run("echo late")
        assert e.value.code == ("timeout" if target else "episode_timeout")
    finally:
        sb.kill()


def test_set_timeout(target: dict) -> None:
    sb = Sandbox(timeout=600, **target)
    try:
        sb.set_timeout(2)
        wait_until(lambda: not sb.is_running(), 120, "set_timeout(2) ended the sandbox")
        with pytest.raises(SandboxDied):
            sb.commands.run("echo late")
    finally:
        sb.kill()
    sb = Sandbox(timeout=5, **target)
    try:
        if target:
            sb.set_timeout(600)  # extended: serve moves the end
            time.sleep(7)
            assert sb.is_running() and sb.commands.run("echo on").stdout == "on\n"
        else:
            with pytest.raises(ValueError, match="cannot outlive"):
                sb.set_timeout(600)
    finally:
        sb.kill()


def test_start_failures_name_the_cause(target: dict) -> None:
    if target:
        with pytest.raises(ServiceError) as e:
            Sandbox(pool="no-such-pool", **target)
        assert (e.value.status, e.value.code) == (404, "unknown_pool")
        with pytest.raises(AgentvmError) as e2:
            Sandbox(url="unix:" + os.path.join(tmp_root(), "no-such.sock"))
        assert e2.value.code == "connection" and "no-such.sock" in e2.value.message
    else:
        missing = os.path.join(tmp_root(), "no-such-snapshot")
        with pytest.raises(StartFailed) as e3:
            Sandbox(snapshot=missing)
        assert missing in e3.value.message


def test_binary_lookup(target: dict) -> None:
    """Embedded mode: AGENTVM_BIN, then PATH, then the checkout's build/agentvm, and an error
    naming each place. Service mode needs no binary: with none anywhere it still works."""
    with tempfile.TemporaryDirectory(dir=tmp_root()) as d:
        pkg = os.path.join(d, "agentvm")
        shutil.copytree(os.path.join(PYTHON_DIR, "agentvm"), pkg)
        env = dict(os.environ, PATH=os.path.join(d, "empty-bin"), PYTHONPATH=d)
        env.pop("AGENTVM_BIN", None)
        if target:
            env["AGENTVM_URL"] = target["url"]
        code = ("import agentvm\n"
                "try:\n"
                "    with agentvm.Sandbox() as sb:\n"
                "        print('ran', sb.commands.run('echo hi').stdout.strip())\n"
                "except agentvm.BinaryNotFound as e:\n"
                "    print('notfound', e.looked)\n")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        if target:
            assert out.stdout.strip() == "ran hi", out.stdout
        else:
            assert out.stdout.startswith("notfound"), out.stdout
            assert "AGENTVM_BIN (not set)" in out.stdout and "in PATH" in out.stdout
            assert os.path.normpath(os.path.join(d, "..", "build", "agentvm")) in out.stdout
            # AGENTVM_BIN is used first: a fake that fails says so through StartFailed.
            fake = os.path.join(d, "fake-agentvm")
            with open(fake, "w") as f:
                f.write("#!/bin/sh\necho 'agentvm: error: fake binary was run' >&2\nexit 1\n")
            os.chmod(fake, 0o755)
            env["AGENTVM_BIN"] = fake
            code2 = ("import agentvm\ntry:\n    agentvm.Sandbox()\nexcept agentvm.StartFailed as e:\n"
                     "    print('startfailed', e.message)\n")
            out = subprocess.run([sys.executable, "-c", code2], env=env, capture_output=True, text=True, timeout=60)
            assert "startfailed" in out.stdout and "fake binary was run" in out.stdout, out
            # binary= before everything.
            env["AGENTVM_BIN"] = os.path.join(BUILD, "agentvm")
            code3 = code2.replace("agentvm.Sandbox()", f"agentvm.Sandbox(binary={fake!r})")
            out = subprocess.run([sys.executable, "-c", code3], env=env, capture_output=True, text=True, timeout=60)
            assert "fake binary was run" in out.stdout, out
            env.pop("AGENTVM_BIN")
            # And PATH before the checkout.
            os.makedirs(os.path.join(d, "bin"))
            os.symlink(fake, os.path.join(d, "bin", "agentvm"))
            env["PATH"] = os.path.join(d, "bin")
            out = subprocess.run([sys.executable, "-c", code2], env=env, capture_output=True, text=True, timeout=60)
            assert "fake binary was run" in out.stdout, out


def test_service_token_capacity_and_env() -> None:
    """A serve of its own with a token and room for one sandbox: AGENTVM_URL/AGENTVM_TOKEN pick
    it, a missing token is 401, a second sandbox 429 at_capacity with Retry-After."""
    d = tempfile.mkdtemp(prefix="agentvm-pytest-serve2-")  # not on a 9p share: a socket lives here
    sock = os.path.join(d, "s.sock")
    token_file = os.path.join(d, "token")
    with open(token_file, "w") as f:
        f.write("sekret\n")
    os.chmod(token_file, 0o600)
    log = open(os.path.join(d, "log"), "wb")
    proc = subprocess.Popen([os.path.join(BUILD, "agentvm-serve"), "--listen", f"unix:{sock}", "--token-file",
                             token_file, "--pool", "default=0", "--max-sandboxes", "1", "--mem-reserve", "256",
                             "--state-dir", os.path.join(d, "state")],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
    try:
        wait_until(lambda: os.path.exists(sock), 60, "the second serve listens")
        url = f"unix:{sock}"
        with pytest.raises(ServiceError) as e:
            Sandbox(url=url)
        assert (e.value.status, e.value.code) == (401, "unauthorized")
        with pytest.raises(ServiceError):
            Sandbox(url=url, token="wrong")
        os.environ["AGENTVM_URL"] = url
        os.environ["AGENTVM_TOKEN"] = "sekret"
        try:
            with Sandbox() as sb:
                assert sb.mode == "service"
                assert sb.commands.run("echo in").stdout == "in\n"
                with pytest.raises(ServiceError) as e2:
                    Sandbox()
                assert (e2.value.status, e2.value.code, e2.value.retry_after) == (429, "at_capacity", 1.0)
        finally:
            del os.environ["AGENTVM_URL"]
            del os.environ["AGENTVM_TOKEN"]
        episodes = descendants(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(120)
        log.close()
    assert status == 0
    assert not os.path.exists(sock)
    assert not [p for p in episodes if alive(p)]
    shutil.rmtree(d, ignore_errors=True)


def test_agentvm_args(target: dict) -> None:
    if target:
        with pytest.raises(ValueError):
            Sandbox(agentvm_args=["--guest-pids", "77"], **target)
        return
    with Sandbox(agentvm_args=["--guest-pids", "77"]) as sb:
        assert sb.commands.run(["cat", "/sys/fs/cgroup/tool-calls/pids.max"]).stdout == "77\n"


def test_open_sandboxes_end_with_the_program(target: dict) -> None:
    """A program that exits without kill(): its sandboxes end with it."""
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    if target:
        env["AGENTVM_URL"] = target["url"]
    code = ("import agentvm\nsb = agentvm.Sandbox()\nsb.commands.run('true')\n"
            "print(sb.sandbox_id, sb.pid)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    sandbox_id, pid = out.stdout.split()
    wait_until(lambda: not alive(int(pid)), 60, f"the episode {pid} of an exited program ended")
    if target:
        status, data = unix_get(target["url"][len("unix:"):], f"/v1/sandboxes/{sandbox_id}")
        assert status == 404 and b"deleted" in data, (status, data)
