"""The snapshot directories the client keeps for embedded sandboxes created without
``snapshot_dir=`` (agentvm/_snapshots.py), without a VM: where they go and with what mode, what
keeps one (a live holder, a paused snapshot within its retention) and what lets it go (its
holders ended or died, its paused snapshots resumed or expired). test_persistence.py checks the
same through real sandboxes."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from typing import Any

import pytest

from agentvm import _snapshots
from agentvm._snapshots import ManagedDir

pytestmark = pytest.mark.no_guest  # boots nothing: tests/run_all.sh runs it on the host


@pytest.fixture
def runtime(tmp_path: Any, monkeypatch: Any) -> str:
    """A temp dir of the test's own: the root goes there."""
    d = str(tmp_path / "tmp")
    os.mkdir(d, 0o700)
    monkeypatch.setenv("TMPDIR", d)
    monkeypatch.setattr("tempfile.tempdir", None)
    return d


def mode_of(path: str) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_private_dirs_in_the_temp_dir(runtime: str) -> None:
    d, hold = ManagedDir.create()
    assert os.path.dirname(d.path) == os.path.join(runtime, f"agentvm-snapshots-{os.geteuid()}")
    assert mode_of(os.path.dirname(d.path)) == 0o700 and mode_of(d.path) == 0o700
    d.release(hold)
    assert not os.path.exists(d.path)


def test_refuses_a_root_others_can_enter(runtime: str) -> None:
    taken = os.path.join(runtime, f"agentvm-snapshots-{os.geteuid()}")
    os.mkdir(taken)
    os.chmod(taken, 0o777)
    with pytest.raises(PermissionError, match="private to this user"):
        ManagedDir.create()


def test_kept_while_held_or_paused(runtime: str) -> None:
    d, first = ManagedDir.create()
    second = d.hold()
    assert second is not None
    d.release(first)
    assert os.path.isdir(d.path), "released while another sandbox still holds it"
    d.paused("pause-1")
    d.release(second)
    assert os.path.isdir(d.path), "removed with a paused snapshot waiting in it"
    # Resumed: held again, the paused mark gone; released, nothing is left to keep it.
    third = d.hold()
    assert third is not None
    d.resumed("pause-1")
    d.release(third)
    assert not os.path.exists(d.path)
    assert d.hold() is None, "a removed directory was held again"


def test_expired_pause_and_dead_holders_let_it_go(runtime: str, monkeypatch: Any) -> None:
    d, hold = ManagedDir.create()
    d.paused("pause-1", retention=0.5)
    d.release(hold)
    assert os.path.isdir(d.path)
    time.sleep(0.6)
    assert d.hold() is None, "a paused snapshot past its retention kept its directory"
    assert not os.path.exists(d.path)

    # A process that held a directory and died (no release, e.g. SIGKILL): the next
    # directory made sweeps it away. A pid reused by another process does not count.
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from agentvm._snapshots import ManagedDir; "
            "d, _ = ManagedDir.create(); print(d.path)")
    python_dir = os.path.dirname(os.path.dirname(os.path.abspath(_snapshots.__file__)))
    left = subprocess.run([sys.executable, "-c", code, python_dir], check=True, capture_output=True,
                          text=True).stdout.strip()
    assert os.path.isdir(left)
    reused = os.path.join(left, ".held", f"{os.getpid()}-0-0")
    open(reused, "wb").close()
    monkeypatch.setattr(_snapshots, "_last_sweep", None)  # a process sweeps once a minute
    d2, hold2 = ManagedDir.create()
    assert not os.path.exists(left), "a dead process's directory survived the sweep"
    d2.release(hold2)
    assert os.listdir(_snapshots.root()) == []
