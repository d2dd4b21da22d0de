"""Tests of the Python client against the real agentvm, both transports.

Run them where a real guest boots (the emulated test host on machines without hardware KVM),
from the repository root:

    tests/testhost/run --mem 4096 --timeout 1800 -- /usr/bin/python3 -m pytest python/tests -q

(``python/tests/run.sh`` runs exactly that; arguments after it go to pytest, e.g. ``-k files``.)

Every test that takes the ``target`` fixture runs twice: ``embedded`` (each sandbox an
``agentvm episode`` subprocess) and ``service`` (one ``build/agentvm-serve`` per session,
``--pool default=4``, on a Unix socket under ``$TMPDIR``; stopped at the end of the
session, which must exit 0 and leave neither its socket nor any episode process behind).
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, Iterator, List

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
REPO = os.path.dirname(PYTHON_DIR)
BUILD = os.path.join(REPO, "build")
sys.path.insert(0, PYTHON_DIR)

from agentvm import Sandbox  # noqa: E402

IN_TESTHOST = os.environ.get("AGENTVM_IN_TESTHOST") == "1"
SERVE_POOL = 4


def tmp_root() -> str:
    """Temp files go under the repository (shared with the test host), not /tmp."""
    path = os.path.join(BUILD, "tmp")
    os.makedirs(path, exist_ok=True)
    return path


def children(pid: int) -> List[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def descendants(pid: int) -> List[int]:
    out: List[int] = []
    todo = [pid]
    while todo:
        for c in children(todo.pop()):
            out.append(c)
            todo.append(c)
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except OSError:
        return False


def wait_until(predicate: Any, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within} s: {what}")
        time.sleep(0.1)


def unix_get(path: str, url: str) -> Any:
    """(status, body) of a GET to serve, with the package's own Unix-socket connection."""
    from agentvm._http import _UnixConnection
    c = _UnixConnection(path, 30)
    try:
        c.request("GET", url)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


class Serve:
    """One agentvm-serve for the session."""

    def __init__(self) -> None:
        # Not under build/tmp: in the test host that is a 9p share, where Unix sockets cannot
        # be bound (ENXIO); $TMPDIR is the test host's own tmpfs.
        self.dir = tempfile.mkdtemp(prefix="agentvm-pytest-serve-")
        self.socket = os.path.join(self.dir, "serve.sock")
        self.log_path = os.path.join(self.dir, "serve.log")
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [os.path.join(BUILD, "agentvm-serve"), "--log-level", "warn", "--listen", f"unix:{self.socket}",
             "--pool", f"default={SERVE_POOL}", "--mem-reserve", "256", "--state-dir", os.path.join(self.dir, "state")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.log)
        self.url = f"unix:{self.socket}"
        self.seen_episodes: set = set()
        deadline = time.monotonic() + 60
        while True:
            try:
                status, _ = unix_get(self.socket, "/healthz")
                if status == 200:
                    break
            except OSError:
                pass
            assert self.proc.poll() is None, f"serve exited {self.proc.returncode}: {self.log_text()[-2000:]}"
            assert time.monotonic() < deadline, "serve did not answer /healthz within 60 s"
            time.sleep(0.1)

    def log_text(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def note_episodes(self) -> None:
        self.seen_episodes.update(descendants(self.proc.pid))

    def stop(self) -> None:
        self.note_episodes()
        self.proc.send_signal(signal.SIGTERM)
        try:
            status = self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("serve did not stop within 120 s of SIGTERM")
        finally:
            self.log.close()
        assert status == 0, f"serve exited {status}: {self.log_text()[-2000:]}"
        assert not os.path.exists(self.socket), "serve left its socket file behind"
        left = [p for p in self.seen_episodes if alive(p)]
        assert not left, f"processes serve started are still running after it stopped: {left}"
        shutil.rmtree(self.dir, ignore_errors=True)


_serve: Dict[str, Serve] = {}


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", "no_guest: boots no guest (tests/run_all.sh runs these on the host)")


@pytest.fixture(scope="session")
def serve() -> Iterator[Serve]:
    s = Serve()
    _serve["s"] = s
    yield s
    _serve.pop("s", None)
    s.stop()


@pytest.fixture(params=["embedded", "service"])
def target(request: Any) -> Dict[str, Any]:
    """Keyword arguments that pick the transport for Sandbox / AsyncSandbox.create."""
    if request.param == "embedded":
        return {}
    s = request.getfixturevalue("serve")
    return {"url": s.url}


@pytest.fixture
def sandbox(target: Dict[str, Any]) -> Iterator[Sandbox]:
    sb = Sandbox(**target)
    try:
        yield sb
    finally:
        sb.kill()
        if "s" in _serve:
            _serve["s"].note_episodes()


@pytest.fixture(autouse=True)
def _no_ambient_service(monkeypatch: Any) -> None:
    # The transport is chosen by each test's arguments only.
    monkeypatch.delenv("AGENTVM_URL", raising=False)
    monkeypatch.delenv("AGENTVM_TOKEN", raising=False)


def run_async(coro: Any) -> Any:
    return asyncio.run(coro)


def vmm_of(episode_pid: int) -> List[int]:
    """The VMM processes of an ``agentvm episode`` (its children)."""
    return children(episode_pid)


def mem_available_mib() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    raise AssertionError("no MemAvailable in /proc/meminfo")


def dump(obj: Any) -> str:
    return json.dumps(obj, default=str)[:2000]


def history_of(sb: Sandbox) -> Any:
    """A service sandbox's call history (GET /v1/sandboxes/{id}/history)."""
    s = _serve["s"]
    status, data = unix_get(s.socket, f"/v1/sandboxes/{sb.sandbox_id}/history")
    assert status == 200, data
    return json.loads(data)
