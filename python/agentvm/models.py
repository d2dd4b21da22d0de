"""Results of calls: plain data, built from the protocol's responses."""
from __future__ import annotations

import base64
import posixpath
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

__all__ = ["CommandResult", "Execution", "ExecutionError", "FileInfo", "EntryInfo", "ProcessResult",
           "ProcessInfo", "FilesystemEvent", "CodeContext", "byte_field"]


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
    None); ``formats`` the rich forms of that value by MIME type, as the protocol gives them
    (a str; base64 for binary ones such as ``image/png``; a JSON value for JSON types), and
    ``formats_truncated`` the MIME types dropped for a bound; ``displays`` the forms of each
    ``display()`` the cell made, in order (``displays_dropped`` counts those dropped past the
    agent's bounds). ``state_lost`` is true when the interpreter ended during the cell (the
    next cell starts a fresh one). ``exit_code`` is a bash cell's status (None for Python, or
    when the shell was killed). ``duration`` is in seconds."""

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
    formats: Dict[str, Any] = field(default_factory=dict, repr=False)
    formats_truncated: List[str] = field(default_factory=list)
    displays: List[Dict[str, Any]] = field(default_factory=list, repr=False)
    displays_dropped: int = 0
    exit_code: Optional[int] = None

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
                      stderr: Optional[bytes] = None,
                      displays: Optional[List[Dict[str, Any]]] = None) -> "Execution":
        """From a response line; ``stdout``/``stderr`` as for :class:`CommandResult`,
        ``displays`` the forms of the cell's ``display`` events."""
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
            formats=dict(msg.get("formats") or {}),
            formats_truncated=[str(t) for t in msg.get("formats_truncated") or []],
            displays=list(displays or []),
            displays_dropped=int(msg.get("displays_dropped") or 0),
            exit_code=msg.get("exit_code"),
        )


def _text_field(msg: Mapping[str, Any], name: str) -> Optional[str]:
    raw = byte_field(msg, name)
    return None if raw is None else raw.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class FileInfo:
    """``files.info``: what ``stat`` says of a path (symbolic links followed), also what
    ``files.rename`` says of where it moved to (a symlink described, not followed). ``path``
    is absolute (relative paths taken from the agent's working directory), ``name`` its last
    component. ``type`` is ``file``, ``dir``, ``fifo``, ``socket``, ``char`` or ``block`` (or
    ``symlink`` from ``rename``); ``mode`` the permission bits as an int (``0o644``);
    ``mtime`` seconds since the epoch; ``uid``/``gid`` the owner's numbers, ``owner``/``group``
    their names in the guest (the number as a str when it has none); ``symlink_target`` what
    ``path`` points to when it is a symbolic link (unresolved), else None. Names that are not
    UTF-8 are decoded with ``errors="replace"``."""

    path: str
    type: str
    size: int
    mode: int
    mtime: float
    name: str = ""
    uid: int = 0
    gid: int = 0
    owner: str = ""
    group: str = ""
    symlink_target: Optional[str] = None

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"

    @classmethod
    def from_response(cls, msg: Mapping[str, Any], path: str = "") -> "FileInfo":
        """From a ``stat`` response or a ``move`` response's ``entry``; ``path`` when the
        message has none."""
        return cls(path=_text_field(msg, "path") or path, type=str(msg.get("type")), size=int(msg.get("size", 0)),
                   mode=int(str(msg.get("mode", "0")), 8), mtime=float(msg.get("mtime", 0.0)),
                   name=_text_field(msg, "name") or "", uid=int(msg.get("uid", 0)), gid=int(msg.get("gid", 0)),
                   owner=str(msg.get("owner", "")), group=str(msg.get("group", "")),
                   symlink_target=_text_field(msg, "symlink_target"))


@dataclass(frozen=True)
class EntryInfo:
    """One entry of ``files.list`` (symbolic links not followed: ``type`` may be
    ``symlink``, with its ``symlink_target``). ``name`` is relative to the listed directory
    (``sub/file`` below the first level of a ``depth`` > 1 listing), ``path`` absolute;
    ``name_bytes`` is the raw name, ``name`` it decoded with ``errors="replace"``. The other
    fields are :class:`FileInfo`'s."""

    name: str
    path: str
    type: str
    size: int
    mode: int
    name_bytes: bytes = field(repr=False, default=b"")
    mtime: float = 0.0
    uid: int = 0
    gid: int = 0
    owner: str = ""
    group: str = ""
    symlink_target: Optional[str] = None

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"

    @classmethod
    def from_response(cls, entry: Mapping[str, Any], listed: str) -> "EntryInfo":
        """From an entry of ``list_dir``'s ``entries``; ``listed`` is the listed directory
        (its ``path`` is joined from it when the entry has none)."""
        raw = byte_field(entry, "name") or b""
        name = raw.decode("utf-8", errors="replace")
        return cls(name=name, path=_text_field(entry, "path") or posixpath.join(listed, name),
                   type=str(entry.get("type")), size=int(entry.get("size", 0)),
                   mode=int(str(entry.get("mode", "0")), 8), name_bytes=raw, mtime=float(entry.get("mtime", 0.0)),
                   uid=int(entry.get("uid", 0)), gid=int(entry.get("gid", 0)), owner=str(entry.get("owner", "")),
                   group=str(entry.get("group", "")), symlink_target=_text_field(entry, "symlink_target"))


@dataclass(frozen=True)
class FilesystemEvent:
    """A change a watch saw (``files.watch_dir``; docs/protocol.md, "watch"): ``name`` is the
    path relative to the watched directory (``name_bytes`` raw), ``type`` one of ``create``
    (made, or moved in), ``write`` (a file written to was closed), ``remove`` (deleted, or
    moved out: a rename is a ``remove`` and a ``create``), ``chmod`` (mode, owner, times), or
    ``overflow``: changes were lost (the kernel's queue overflowed, the watched tree outgrew the
    watch's bounds, or the watch was suspended for a fork), ``name`` empty; list the tree again
    to know where it stands."""

    name: str
    type: str
    name_bytes: bytes = field(repr=False, default=b"")

    @property
    def is_overflow(self) -> bool:
        return self.type == "overflow"


@dataclass(frozen=True)
class CodeContext:
    """A ``run_code`` context (docs/protocol.md, "create_context"): a persistent interpreter of
    its own, named ``id`` (``default``, ``default-bash``, ``ctx-N``), for ``language``
    ``python`` or ``bash``, started in ``cwd`` at its first cell. ``running`` says whether its
    interpreter is up (False for a new one: it starts at its first cell)."""

    id: str
    language: str
    cwd: str
    running: bool = False

    @classmethod
    def from_response(cls, msg: Mapping[str, Any]) -> "CodeContext":
        """From ``create_context``'s response or an entry of ``list_contexts``."""
        return cls(id=str(msg.get("context", "")), language=str(msg.get("language", "")),
                   cwd=str(msg.get("cwd", "")), running=bool(msg.get("running", False)))


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

