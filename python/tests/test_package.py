"""The package installs with pip from the checkout, without network, and is typed."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from conftest import PYTHON_DIR, tmp_root

pytestmark = pytest.mark.no_guest  # boots nothing: tests/run_all.sh runs it on the host


def test_pip_install_offline() -> None:
    with tempfile.TemporaryDirectory(dir=tmp_root()) as d:
        src = os.path.join(d, "src")
        shutil.copytree(PYTHON_DIR, src, ignore=shutil.ignore_patterns("__pycache__", "tests", "build", "*.egg-info"))
        target = os.path.join(d, "site")
        # --no-build-isolation: the system's setuptools builds it, nothing is downloaded.
        out = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                              "--no-index", "--target", target, src], capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout + out.stderr
        assert os.path.exists(os.path.join(target, "agentvm", "py.typed"))
        code = "import agentvm, agentvm.gym; print(agentvm.__file__, agentvm.__version__)"
        out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=target), cwd=d,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith(os.path.join(target, "agentvm", "__init__.py"))
