"""Results of calls: plain data, built from the protocol's responses."""
from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

__all__ = ["CommandResult", "Execution", "ExecutionError", "FileInfo", "EntryInfo", "ProcessResult",
           "ProcessInfo", "byte_field"]


def byte_field(msg: Mapping[str, Any], name: str) -> Optional[bytes]:
    """A byte field of a protocol line in either spelling (``name`` or ``name_b64``)."""
    value = msg.get(name)
    if isinstance(value, str):
        return value.encode("utf-8")
    value = msg.get(name + "_b64")
    if isinstance(value, str):
        return base64.b64decode(value)
    return None


class _Output:
    """``stdout``/``stderr``: the output bytes of a result, decoded as UTF-8 (``errors="replace"``)."""

    stdout_bytes: bytes
    stderr_bytes: bytes

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class CommandResult(_Output):
    """How a command ended (docs/protocol.md, "exec" and "shell"), with its output.

    ``stdout``/``stderr`` are the output decoded as UTF-8 (``errors="replace"``);
    ``stdout_bytes``/``stderr_bytes`` the raw bytes. ``exit_code`` is None when an ``exec``
    command was killed by a signal (then ``signal`` is its number); a shell command killed by
    signal N has ``exit_code`` 128+N. ``duration`` is in seconds. ``cancelled`` is true for a
    call stopped with :meth:`CommandHandle.kill`.
    """

    exit_code: Optional[int]
    stdout_bytes: bytes = field(repr=False)
    stderr_bytes: bytes = field(repr=False)
    signal: Optional[int] = None
    timed_out: bool = False
    oom_killed: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration: float = 0.0
    cancelled: bool = False

    @property
    def ok(self) -> bool:
        """The command exited 0 (not killed, not timed out)."""
        return self.exit_code == 0 and self.signal is None and not self.timed_out

    def __repr__(self) -> str:
        return (f"CommandResult(exit_code={self.exit_code!r}, signal={self.signal!r}, "
                f"timed_out={self.timed_out!r}, stdout={_clip(self.stdout)!r}, "
                f"stderr={_clip(self.stderr)!r}, duration={self.duration:.3f})")

    @classmethod
    def from_response(cls, msg: Mapping[str, Any], stdout: Optional[bytes] = None,
                      stderr: Optional[bytes] = None) -> "CommandResult":
        """From a response line; ``stdout``/``stderr`` replace the response's own output
        fields (collected from stream events)."""
        if stdout is None:
            stdout = byte_field(msg, "stdout") or b""
        if stderr is None:
            stderr = byte_field(msg, "stderr") or b""
        return cls(
            exit_code=msg.get("exit_code"),
            stdout_bytes=stdout,
            stderr_bytes=stderr,
            signal=msg.get("signal"),
            timed_out=bool(msg.get("timed_out", False)),
            oom_killed=bool(msg.get("oom_killed", False)),
            stdout_truncated=bool(msg.get("stdout_truncated", False)),
            stderr_truncated=bool(msg.get("stderr_truncated", False)),
            duration=float(msg.get("duration_ms", 0)) / 1000.0,
            cancelled=bool(msg.get("cancelled", False)),
        )


@dataclass(frozen=True)
class ExecutionError:
    """The exception a ``run_code`` cell raised: its class name (qualified with its module
    unless builtin; ``InterpreterDied`` when the interpreter itself ended), ``str()`` of it,
    and the formatted traceback."""

    type: str
    message: str
    traceback: str


@dataclass(frozen=True)
class Execution(_Output):
    """The answer of a ``run_code`` cell (docs/protocol.md, "run_code").

    ``result`` is ``repr()`` of the cell's last expression (None when it has none or it is
    None); ``state_lost`` is true when the interpreter ended during the cell (the next cell
    starts a fresh one). ``duration`` is in seconds."""

    result: Optional[str]
    stdout_bytes: bytes = field(repr=False)
    stderr_bytes: bytes = field(repr=False)
    exception: Optional[ExecutionError] = None
    timed_out: bool = False
    state_lost: bool = False
    duration: float = 0.0
    result_truncated: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    cancelled: bool = False

    @property
    def error(self) -> Optional[ExecutionError]:
        """Alias of ``exception``."""
        return self.exception

    def __repr__(self) -> str:
        return (f"Execution(result={_clip(self.result or '')!r}, exception={self.exception!r}, "
                f"timed_out={self.timed_out!r}, state_lost={self.state_lost!r}, "
                f"stdout={_clip(self.stdout)!r}, stderr={_clip(self.stderr)!r})")

    @classmethod
    def from_response(cls, msg: Mapping[str, Any], stdout: Optional[bytes] = None,
                      stderr: Optional[bytes] = None) -> "Execution":
        if stdout is None:
            stdout = byte_field(msg, "stdout") or b""
        if stderr is None:
            stderr = byte_field(msg, "stderr") or b""
        exc = msg.get("exception")
        exception = None
        if isinstance(exc, dict):
            exception = ExecutionError(type=str(exc.get("type", "")), message=str(exc.get("message", "")),
                                       traceback=str(exc.get("traceback", "")))
        result = msg.get("result")
        return cls(
            result=result if isinstance(result, str) else None,
            stdout_bytes=stdout,
            stderr_bytes=stderr,
            exception=exception,
            timed_out=bool(msg.get("timed_out", False)),
            state_lost=bool(msg.get("state_lost", False)),
            duration=float(msg.get("duration_ms", 0)) / 1000.0,
            result_truncated=bool(msg.get("result_truncated", False)),
            stdout_truncated=bool(msg.get("stdout_truncated", False)),
            stderr_truncated=bool(msg.get("stderr_truncated", False)),
            cancelled=bool(msg.get("cancelled", False)),
        )


@dataclass(frozen=True)
class FileInfo:
    """``files.info``: what ``stat`` says of a path (symbolic links followed). ``type`` is
    ``file``, ``dir``, ``fifo``, ``socket``, ``char`` or ``block``; ``mode`` the permission
    bits as an int (``0o644``); ``mtime`` seconds since the epoch."""

    path: str
    type: str
    size: int
    mode: int
    mtime: float

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"


@dataclass(frozen=True)
class EntryInfo:
    """One entry of ``files.list`` (symbolic links not followed: ``type`` may be
    ``symlink``). ``name_bytes`` is the raw name; ``name`` it decoded with
    ``errors="replace"``."""

    name: str
    path: str
    type: str
    size: int
    mode: int
    name_bytes: bytes = field(repr=False, default=b"")

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"


@dataclass(frozen=True)
class ProcessResult(_Output):
    """How a process of the sandbox's table ended (docs/protocol.md, "attach"), with the output
    its attachment received: ``stdout``/``stderr`` (a pty's output is ``stdout``), decoded as
    UTF-8 (``errors="replace"``), and the raw ``_bytes``. ``exit_code`` is None when a signal
    killed it (``signal`` is its number); ``duration`` is in seconds; ``lost_bytes`` counts
    output the attachment missed by falling behind (docs/protocol.md, ``lost``)."""

    pid: int
    exit_code: Optional[int]
    stdout_bytes: bytes = field(repr=False)
    stderr_bytes: bytes = field(repr=False)
    signal: Optional[int] = None
    timed_out: bool = False
    oom_killed: bool = False
    duration: float = 0.0
    lost_bytes: int = 0

    @property
    def ok(self) -> bool:
        """The process exited 0 (not killed, not timed out)."""
        return self.exit_code == 0 and self.signal is None and not self.timed_out

    def __repr__(self) -> str:
        return (f"ProcessResult(pid={self.pid!r}, exit_code={self.exit_code!r}, signal={self.signal!r}, "
                f"timed_out={self.timed_out!r}, stdout={_clip(self.stdout)!r}, stderr={_clip(self.stderr)!r}, "
                f"duration={self.duration:.3f})")

    @classmethod
    def from_response(cls, msg: Mapping[str, Any], stdout: bytes, stderr: bytes,
                      lost_bytes: int = 0) -> "ProcessResult":
        """From an ``attach`` call's final response, with the output its events carried."""
        return cls(pid=int(msg.get("pid") or 0), exit_code=msg.get("exit_code"), stdout_bytes=stdout,
                   stderr_bytes=stderr, signal=msg.get("signal"), timed_out=bool(msg.get("timed_out", False)),
                   oom_killed=bool(msg.get("oom_killed", False)),
                   duration=float(msg.get("duration_ms", 0)) / 1000.0, lost_bytes=lost_bytes)


@dataclass(frozen=True)
class ProcessInfo:
    """One process of the sandbox's table (``commands.list``; docs/protocol.md,
    "list_processes"): ``kind`` ``spawn`` or ``exec``, ``envs`` the ones its request gave,
    ``cwd`` None for the agent's, ``started_at`` seconds since the epoch, ``stdin`` whether
    ``send_stdin`` can feed it. For one that ended (``running`` false), how: ``exit_code``,
    ``signal``, ``timed_out``, ``oom_killed`` and ``duration`` (seconds)."""

    pid: int
    tag: Optional[str]
    kind: str
    argv: List[str]
    envs: Dict[str, str]
    cwd: Optional[str]
    started_at: float
    running: bool
    stdin: bool = False
    pty: bool = False
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    timed_out: bool = False
    oom_killed: bool = False
    duration: Optional[float] = None

    @classmethod
    def from_response(cls, entry: Mapping[str, Any]) -> "ProcessInfo":
        """From an entry of ``list_processes``' ``processes``."""
        end = entry.get("end")
        end = end if isinstance(end, dict) else {}
        tag = entry.get("tag")
        cwd = entry.get("cwd")
        duration = end.get("duration_ms")
        return cls(pid=int(entry["pid"]), tag=tag if isinstance(tag, str) else None, kind=str(entry.get("kind", "")),
                   argv=[str(a) for a in entry.get("argv") or []],
                   envs={str(k): str(v) for k, v in (entry.get("env") or {}).items()},
                   cwd=cwd if isinstance(cwd, str) else None, started_at=float(entry.get("started_at", 0.0)),
                   running=bool(entry.get("running", False)), stdin=bool(entry.get("stdin", False)),
                   pty=bool(entry.get("pty", False)), exit_code=end.get("exit_code"), signal=end.get("signal"),
                   timed_out=bool(end.get("timed_out", False)), oom_killed=bool(end.get("oom_killed", False)),
                   duration=None if duration is None else float(duration) / 1000.0)


def _clip(text: str, n: int = 200) -> str:
    return text if len(text) <= n else text[:n] + f"…(+{len(text) - n})"

