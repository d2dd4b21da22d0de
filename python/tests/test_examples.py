"""The examples, run as programs with small sizes, on both transports."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import REPO


def run_example(name: str, target: dict, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, os.path.join(REPO, "examples", name), *args]
    if target:
        cmd += ["--url", target["url"]]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900)


def test_rollouts(target: dict) -> None:
    out = run_example("rollouts.py", target, "--episodes", "4", "--concurrency", "4")
    assert out.returncode == 0, out.stdout + out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["episodes"] == 4
    # Episodes 0-2 are the fixer's (solved), episode 3 the lazy agent's (not).
    assert summary["rewards"] == [1.0, 1.0, 1.0, 0.0]
    assert summary["steps"][0] == ["tests fail", "tests pass"]
    assert summary["table"]["fixer"] == {"episodes": 3, "mean_reward": 1.0, "solved": 3, "errors": 0}
    assert summary["table"]["lazy"]["mean_reward"] == 0.0
    assert "episodes/s" in out.stdout


def test_swe_task(target: dict) -> None:
    out = run_example("swe_task.py", target)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["verdict"] == "PASS"
    assert report["tests_before"] != 0 and report["tests_after"] == 0
    assert "tar" in report["guest_tools"] and "python3" in report["guest_tools"]
    # The guest rootfs has no git and no patch: the Python applier is what ran.
    expected = "git apply" if "git" in report["guest_tools"] else \
        "patch -p1" if "patch" in report["guest_tools"] else "python3 apply_patch.py"
    assert report["patch_applied_with"] == expected
