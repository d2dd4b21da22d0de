"""A gym-style environment over a sandbox (no gym dependency): one episode per sandbox, an
action is a tool call, the reward comes from a grader run in the sandbox.

    env = AgentvmEnv(task="make test.py pass", setup_files={"/work/test.py": ...},
                     grader="cd /work && python3 test.py", max_steps=20)
    obs = env.reset()
    obs, reward, terminated, truncated, info = env.step({"tool": "shell", "cmd": "ls /work"})
    ...
    obs, reward, terminated, truncated, info = env.step({"tool": "submit"})
    env.close()

Actions (dicts): ``{"tool":"shell","cmd":STR[,"timeout":S]}``, ``{"tool":"exec","argv":[...]
[,"timeout":S,"cwd":DIR]}``, ``{"tool":"write_file","path":P,"content":STR|BYTES}``,
``{"tool":"read_file","path":P}``, ``{"tool":"run_code","code":STR[,"timeout":S]}``,
``{"tool":"submit"}``. Observations are text.
"""
from __future__ import annotations

import inspect
import posixpath
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

from . import _loop
from .errors import AgentError, SandboxDied
from .models import CommandResult, Execution
from ._lifecycle import AsyncSandbox

__all__ = ["AgentvmEnv", "AsyncAgentvmEnv", "default_reward", "TOOLS"]

TOOLS = ("shell", "exec", "write_file", "read_file", "run_code", "submit")
Grader = Union[str, Sequence[str], Callable[[AsyncSandbox], Any]]
StepResult = Tuple[str, float, bool, bool, Dict[str, Any]]


def default_reward(result: CommandResult) -> float:
    """The grader's reward: its stdout's last non-empty line if that is a number, else 1.0
    when it exited 0 and 0.0 otherwise."""
    lines = [ln.strip() for ln in result.stdout.splitlines() if ln.strip()]
    if lines:
        try:
            return float(lines[-1])
        except ValueError:
            pass
    return 1.0 if result.ok else 0.0


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"[…{len(text) - limit} characters cut…]\n" + text[-limit:]


def _command_text(r: CommandResult) -> str:
    parts = [r.stdout]
    if r.stderr:
        parts.append(("\n" if r.stdout and not r.stdout.endswith("\n") else "") + "[stderr]\n" + r.stderr)
    if r.timed_out:
        parts.append("\n[timed out]")
    elif r.signal is not None:
        parts.append(f"\n[killed by signal {r.signal}]")
    else:
        parts.append(f"\n[exit code {r.exit_code}]")
    return "".join(parts)


def _execution_text(e: Execution) -> str:
    parts = [e.stdout]
    if e.stderr:
        parts.append("[stderr]\n" + e.stderr)
    if e.result is not None:
        parts.append(f"[result] {e.result}\n")
    if e.exception is not None:
        parts.append(e.exception.traceback or f"{e.exception.type}: {e.exception.message}\n")
    if e.timed_out:
        parts.append("[timed out]\n")
    if e.state_lost:
        parts.append("[the interpreter restarted: its state is lost]\n")
    return "".join(parts)


class AsyncAgentvmEnv:
    """The environment on asyncio; :class:`AgentvmEnv` is the blocking one."""

    def __init__(self, *, grader: Grader, task: str = "", setup_files: Optional[Mapping[str, Any]] = None,
                 setup_commands: Sequence[Union[str, Sequence[str]]] = (), max_steps: int = 20,
                 reward_fn: Callable[[CommandResult], float] = default_reward, grade_on_truncation: bool = True,
                 step_timeout: float = 60.0, grader_timeout: float = 120.0, max_observation: int = 16384,
                 sandbox_options: Optional[Mapping[str, Any]] = None) -> None:
        if not (isinstance(grader, (str, list, tuple)) or callable(grader)):
            raise TypeError("grader must be a shell command (str), an argv (list) or a callable taking the sandbox")
        if isinstance(grader, (list, tuple)) and not all(isinstance(a, str) for a in grader):
            raise TypeError("a grader argv must be a list of str")
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError("max_steps must be a positive int")
        if not callable(reward_fn):
            raise TypeError("reward_fn must be callable")
        if not isinstance(task, str):
            raise TypeError("task must be a str")
        self.grader = grader
        self.task = task
        self.setup_files = dict(setup_files or {})
        self.setup_commands = list(setup_commands)
        self.max_steps = max_steps
        self.reward_fn = reward_fn
        self.grade_on_truncation = grade_on_truncation
        self.step_timeout = step_timeout
        self.grader_timeout = grader_timeout
        self.max_observation = max_observation
        self.sandbox_options = dict(sandbox_options or {})
        self.sandbox: Optional[AsyncSandbox] = None
        self.steps = 0
        self.done = True

    async def reset(self) -> str:
        """A fresh sandbox (the previous one is killed), with ``setup_files`` written (their
        directories made first) and then ``setup_commands`` run (each must exit 0); returns the
        task text as the observation."""
        await self.close()
        self.sandbox = await AsyncSandbox.create(**self.sandbox_options)
        try:
            dirs = sorted({posixpath.dirname(p) for p in self.setup_files} - {"", "/"})
            if dirs:
                await self.sandbox.commands.run(["mkdir", "-p", "--", *dirs], check=True)
            for path, content in self.setup_files.items():
                await self.sandbox.files.write(path, content)
            for cmd in self.setup_commands:
                await self.sandbox.commands.run(cmd, check=True, timeout=self.grader_timeout)
        except BaseException:
            await self.close()
            raise
        self.steps = 0
        self.done = False
        return self.task

    async def _grade(self) -> Tuple[float, Dict[str, Any]]:
        assert self.sandbox is not None
        if callable(self.grader) and not isinstance(self.grader, (str, list, tuple)):
            value = self.grader(self.sandbox)
            if inspect.isawaitable(value):
                value = await value
            return float(value), {}
        result = await self.sandbox.commands.run(self.grader, timeout=self.grader_timeout)
        return float(self.reward_fn(result)), {"grade": result}

    async def step(self, action: Mapping[str, Any]) -> StepResult:
        """Runs one tool call: ``(observation, reward, terminated, truncated, info)``. The
        reward is 0.0 until ``submit`` (terminated) or the ``max_steps``-th step (truncated,
        graded too unless ``grade_on_truncation=False``). A malformed action or a failing tool
        is an observation (``info["error"]``), not an exception; a dead sandbox terminates the
        episode with reward 0.0."""
        if self.sandbox is None or self.done:
            raise RuntimeError("call reset() first (no episode is running)")
        if not isinstance(action, Mapping):
            raise TypeError(f"an action is a dict with a 'tool', not {type(action).__name__}")
        self.steps += 1
        info: Dict[str, Any] = {"step": self.steps, "tool": action.get("tool")}
        sb = self.sandbox
        tool = action.get("tool")
        obs = ""
        try:
            if tool == "submit":
                reward, extra = await self._grade()
                info.update(extra)
                self.done = True
                return f"submitted; reward {reward:g}", reward, True, False, info
            obs = await self._tool(sb, tool, action, info)
        except SandboxDied as e:
            self.done = True
            info["error"] = e.code
            return f"error: the sandbox ended ({e.code}): {e.message}", 0.0, True, False, info
        except AgentError as e:
            info["error"] = e.code
            obs = f"error: {e.code}: {e.message}"
        except (ValueError, TypeError, KeyError) as e:
            info["error"] = "bad_action"
            obs = f"error: bad action: {e}"
        obs = _clip(obs, self.max_observation)
        if self.steps >= self.max_steps:
            self.done = True
            reward = 0.0
            if self.grade_on_truncation:
                try:
                    reward, extra = await self._grade()
                    info.update(extra)
                except SandboxDied as e:
                    info["error"] = e.code
            return obs, reward, False, True, info
        return obs, 0.0, False, False, info

    async def _tool(self, sb: AsyncSandbox, tool: Any, action: Mapping[str, Any], info: Dict[str, Any]) -> str:
        timeout = action.get("timeout", self.step_timeout)
        if tool == "shell":
            r = await sb.commands.run(action["cmd"], timeout=timeout)
            info["result"] = r
            return _command_text(r)
        if tool == "exec":
            argv = action["argv"]
            if not isinstance(argv, list):
                raise TypeError("exec's argv must be a list of str")
            r = await sb.commands.run(argv, timeout=timeout, cwd=action.get("cwd"))
            info["result"] = r
            return _command_text(r)
        if tool == "write_file":
            n = await sb.files.write(action["path"], action["content"])
            return f"wrote {n} bytes to {action['path']}"
        if tool == "read_file":
            data = await sb.files.read(action["path"])
            return data.decode("utf-8", errors="replace")
        if tool == "run_code":
            e = await sb.run_code(action["code"], timeout=timeout)
            info["result"] = e
            return _execution_text(e)
        info["error"] = "unknown_tool"
        return f"error: unknown tool {tool!r} (tools: {', '.join(TOOLS)})"

    async def close(self) -> None:
        """Kills the sandbox (if any)."""
        sb, self.sandbox = self.sandbox, None
        self.done = True
        if sb is not None:
            await sb.kill()

    async def __aenter__(self) -> "AsyncAgentvmEnv":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AgentvmEnv:
    """The blocking environment (same arguments as :class:`AsyncAgentvmEnv`), run on the
    package's background event-loop thread."""

    def __init__(self, **kwargs: Any) -> None:
        self._env = AsyncAgentvmEnv(**kwargs)

    @property
    def sandbox(self) -> Optional[AsyncSandbox]:
        """The current episode's sandbox (its async object; use the env's own methods to act)."""
        return self._env.sandbox

    @property
    def steps(self) -> int:
        return self._env.steps

    def reset(self) -> str:
        return _loop.run(self._env.reset())

    def step(self, action: Mapping[str, Any]) -> StepResult:
        return _loop.run(self._env.step(action))

    def close(self) -> None:
        _loop.run(self._env.close())

    def __enter__(self) -> "AgentvmEnv":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
