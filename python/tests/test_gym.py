"""The gym-style environment, end to end."""
from __future__ import annotations

import pytest

from agentvm.gym import AgentvmEnv, AsyncAgentvmEnv
from conftest import run_async

TASK = "make /task/check.py print ok"
SETUP = {"/task/check.py": "import sys\nsys.exit(1)\n"}
GRADER = "cd /task && python3 check.py && echo 0.75"


def test_episode_solved_by_submit(target: dict) -> None:
    env = AgentvmEnv(task=TASK, setup_files=SETUP, setup_commands=["test -f /task/check.py"], grader=GRADER,
                     max_steps=10, sandbox_options=target)
    try:
        assert env.reset() == TASK
        obs, reward, terminated, truncated, info = env.step({"tool": "shell", "cmd": "cd /task && python3 check.py"})
        assert (reward, terminated, truncated) == (0.0, False, False)
        assert "[exit code 1]" in obs and info["result"].exit_code == 1
        obs, *_ = env.step({"tool": "read_file", "path": "/task/check.py"})
        assert obs == SETUP["/task/check.py"]
        obs, *_ = env.step({"tool": "write_file", "path": "/task/check.py", "content": "print('ok')\n"})
        assert obs.startswith("wrote 12 bytes")
        obs, *_ = env.step({"tool": "exec", "argv": ["python3", "check.py"], "cwd": "/task"})
        assert obs.startswith("ok\n")
        obs, _, _, _, info = env.step({"tool": "run_code", "code": "6 * 7"})
        assert "[result] 42" in obs and info["result"].result == "42"
        obs, _, terminated, _, info = env.step({"tool": "teleport"})
        assert info["error"] == "unknown_tool" and not terminated and "unknown tool" in obs
        obs, _, _, _, info = env.step({"tool": "shell"})
        assert info["error"] == "bad_action"
        obs, _, _, _, info = env.step({"tool": "read_file", "path": "/no/such"})
        assert info["error"] == "not_found"
        obs, reward, terminated, truncated, info = env.step({"tool": "submit"})
        assert (reward, terminated, truncated) == (0.75, True, False)
        assert info["grade"].stdout == "ok\n0.75\n"
        with pytest.raises(RuntimeError):
            env.step({"tool": "shell", "cmd": "true"})
        with pytest.raises(TypeError):
            env.reset()
            env.step("ls")  # type: ignore[arg-type]
        # reset() starts a fresh sandbox: the fix is gone.
        env.reset()
        obs, *_ = env.step({"tool": "shell", "cmd": "cat /task/check.py"})
        assert "sys.exit(1)" in obs
    finally:
        env.close()
    assert env.sandbox is None


def test_truncation_is_graded_and_default_reward(target: dict) -> None:
    async def main() -> None:
        async with AsyncAgentvmEnv(task="t", grader=["sh", "-c", "test -f /tmp/done"], max_steps=2,
                                   sandbox_options=target) as env:
            await env.reset()
            _, r, term, trunc, _ = await env.step({"tool": "shell", "cmd": "echo one"})
            assert (r, term, trunc) == (0.0, False, False)
            _, r, term, trunc, info = await env.step({"tool": "shell", "cmd": "touch /tmp/done"})
            # The max_steps-th step truncates; the grader (exit 0, no number) gives 1.0.
            assert (r, term, trunc) == (1.0, False, True)
            assert info["grade"].exit_code == 0
            await env.reset()
            await env.step({"tool": "run_code", "code": "x = 1"})
            _, r, term, trunc, _ = await env.step({"tool": "run_code", "code": "x"})
            assert (r, term, trunc) == (0.0, False, True)  # /tmp/done is not in the new sandbox

        async def grade(sb: object) -> float:
            # A callable grader gets the sandbox and returns the reward.
            return float((await sb.files.read("/tmp/score")).decode())  # type: ignore[attr-defined]

        async with AsyncAgentvmEnv(task="t", grader=grade, max_steps=5, sandbox_options=target) as env:
            await env.reset()
            await env.step({"tool": "write_file", "path": "/tmp/score", "content": "0.25"})
            _, r, term, trunc, _ = await env.step({"tool": "submit"})
            assert (r, term, trunc) == (0.25, True, False)

    run_async(main())


def test_sandbox_death_terminates(target: dict) -> None:
    env = AgentvmEnv(task="t", grader="true", max_steps=5, sandbox_options=dict(target, timeout=2))
    try:
        env.reset()
        obs, reward, terminated, truncated, info = env.step({"tool": "shell", "cmd": "sleep 60", "timeout": 90})
        assert terminated and reward == 0.0 and not truncated
        # Embedded: the episode's time limit; service: serve stops the VM under the call.
        assert info["error"] == ("stopped" if target else "episode_timeout"), info
        assert obs.startswith("error: the sandbox ended")
    finally:
        env.close()
