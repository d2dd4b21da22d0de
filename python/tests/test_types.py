"""The package type-checks with ``mypy --strict`` (it ships py.typed, so its users' checkers
read these annotations), for the oldest Python it supports. Needs no VM. mypy is Debian's
(package python3-mypy); without it this fails, never skips: an unchecked package would pass."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from typing import Any

import pytest

from conftest import PYTHON_DIR

pytestmark = pytest.mark.no_guest  # boots nothing: tests/run_all.sh runs it on the host

OLDEST_PYTHON = "3.9"  # pyproject.toml's requires-python


def test_mypy_strict(tmp_path: Any) -> None:
    if importlib.util.find_spec("mypy") is None:
        pytest.fail(f"mypy is not installed for {sys.executable}: install Debian's package python3-mypy "
                    "(apt-get install -y python3-mypy)")
    out = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--python-version", OLDEST_PYTHON,
                          "--cache-dir", str(tmp_path / "mypy-cache"), "agentvm"],
                         cwd=PYTHON_DIR, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"mypy --strict found errors:\n{out.stdout}{out.stderr}"
