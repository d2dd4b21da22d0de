"""Sandboxes: ``AsyncSandbox`` (the implementation, on asyncio) and ``Sandbox`` (the same API,
blocking, run on the package's one background event-loop thread)."""
from __future__ import annotations

import asyncio
import codecs
import io
import math
import os
import posixpath
import re
import shlex
import uuid
from typing import (Any, AsyncGenerator, Awaitable, Generator, Callable, Dict, Iterable, Iterator, List, Mapping,
                    Optional, Sequence, Tuple, TypeVar, Union)

from . import _loop
from ._binary import find_agentvm
from ._common import (DEFAULT_CALL_TIMEOUT, DEFAULT_GRACE, FILE_CHUNK, MAX_CALL_TIMEOUT,
                      MAX_OUTPUT_LIMIT, OnEvent, Transport, put_bytes)
from ._episode import EpisodeTransport
from ._http import HttpClient, ServiceTransport
from ._snapshots import ManagedDir
from .errors import AgentvmError, CommandFailed, NotFound, SandboxDied, Timeout
from .models import CommandResult, EntryInfo, Execution, FileInfo, byte_field

__all__ = ["AsyncSandbox", "Sandbox", "AsyncCommandHandle", "CommandHandle", "EntryList"]

# A sandbox's lifetime: serve's range for "timeout" (docs/api.md), also used in embedded mode.
MAX_SANDBOX_TIMEOUT = 86400.0
DEFAULT_START_TIMEOUT = 180.0
MAX_FORK_COUNT = 64  # docs/api.md, fork
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_OCTAL_MODE = re.compile(r"^[0-7]{1,4}$")

Output = Callable[[str], Any]
Data = Union[bytes, bytearray, memoryview, str, io.IOBase, Any]


# -- argument checks: everything is refused before a byte is sent --------------------------------

def _number(name: str, value: Any, *, low: float, high: float, low_inclusive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    v = float(value)
    ok = math.isfinite(v) and (v >= low if low_inclusive else v > low) and v <= high
    if not ok:
        raise ValueError(f"{name} must be {'at least' if low_inclusive else 'above'} {low:g} and at most {high:g}, "
                         f"not {value!r}")
    return v


def _text(name: str, value: Any, *, empty_ok: bool = False) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    if not value and not empty_ok:
        raise ValueError(f"{name} must not be empty")
    if "\0" in value:
        raise ValueError(f"{name} must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{name} is not valid Unicode (it has a lone surrogate)") from None
    return value


def _envs(name: str, envs: Any) -> Dict[str, str]:
    if envs is None:
        return {}
    if not isinstance(envs, Mapping):
        raise TypeError(f"{name} must be a mapping of str to str, not {type(envs).__name__}")
    out: Dict[str, str] = {}
    for k, v in envs.items():
        if not isinstance(k, str) or not _ENV_NAME.match(k):
            raise ValueError(f"{name}: {k!r} is not a variable name (letters, digits and _, not starting with a digit)")
        out[k] = _text(f"{name}[{k!r}]", v, empty_ok=True)
    return out


def _metadata(metadata: Any) -> Dict[str, str]:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise TypeError(f"metadata must be a mapping of str to str, not {type(metadata).__name__}")
    if len(metadata) > 64:
        raise ValueError("metadata holds at most 64 entries")
    out: Dict[str, str] = {}
    for k, v in metadata.items():
        _text("metadata key", k)
        _text(f"metadata[{k!r}]", v, empty_ok=True)
        if len(k.encode()) > 256 or len(v.encode()) > 4096:
            raise ValueError(f"metadata[{k!r}]: names are at most 256 bytes, values 4096")
        out[k] = v
    return out


def _snapshot_dir(value: Any) -> Optional[str]:
    if value is None:
        return None
    path = _text("snapshot_dir", os.fspath(value))
    if not os.path.isdir(path):
        raise ValueError(f"snapshot_dir {path!r} is not an existing directory")
    return os.path.abspath(path)


def _max_output(value: Any) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_output must be an int (bytes), not {type(value).__name__}")
    if not 0 < value <= MAX_OUTPUT_LIMIT:
        raise ValueError(f"max_output must be from 1 to {MAX_OUTPUT_LIMIT} bytes (64 MiB), not {value}")
    return value


def _callback(name: str, value: Any) -> None:
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be callable, not {type(value).__name__}")


def _mode(mode: Any) -> Optional[str]:
    if mode is None:
        return None
    if isinstance(mode, bool):
        raise TypeError("mode must be an int (0o755) or a str of octal digits ('0755')")
    if isinstance(mode, int):
        if not 0 <= mode <= 0o7777:
            raise ValueError(f"mode must be from 0 to 0o7777, not {mode:#o}")
        return f"{mode:04o}"
    if isinstance(mode, str) and _OCTAL_MODE.match(mode):
        return mode
    raise ValueError(f"mode must be an int (0o755) or 1-4 octal digits ('0755'), not {mode!r}")


def _path(value: Any) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    return _text("path", value)


def _bytes_of(name: str, value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{name} must be bytes or str, not {type(value).__name__}")


def _shell_wrap(cmd: str, envs: Dict[str, str], cwd: Optional[str]) -> str:
    """A shell call with its own cwd/envs runs in a subshell, so neither leaks into the
    persistent shell: ``(cd -- DIR && export K=V && eval CMD)``."""
    parts = []
    if cwd is not None:
        parts.append("cd -- " + shlex.quote(cwd))
    if envs:
        parts.append("export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in envs.items()))
    parts.append("eval " + shlex.quote(cmd))
    return "(" + " && ".join(parts) + ")"


class _Collector:
    """Output of a streamed call: bytes kept per stream, str chunks (decoded incrementally,
    so a character split between events is whole) to callbacks and an optional queue."""

    def __init__(self, on_stdout: Optional[Output], on_stderr: Optional[Output],
                 queue: Optional["asyncio.Queue[Optional[Tuple[str, str]]]"] = None) -> None:
        self.parts: Dict[str, List[bytes]] = {"stdout": [], "stderr": []}
        self.decoders = {s: codecs.getincrementaldecoder("utf-8")(errors="replace") for s in self.parts}
        self.callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        self.queue = queue
        self.error: Optional[BaseException] = None

    def on_event(self, msg: Dict[str, Any]) -> None:
        stream = msg.get("event")
        if stream not in self.parts:
            return
        data = byte_field(msg, "data") or b""
        self.parts[stream].append(data)
        text = self.decoders[stream].decode(data)
        self._emit(stream, text)

    def _emit(self, stream: str, text: str) -> None:
        if not text:
            return
        if self.queue is not None:
            self.queue.put_nowait((stream, text))
        cb = self.callbacks[stream]
        if cb is not None and self.error is None:
            try:
                cb(text)
            except BaseException as e:  # re-raised once the call has answered
                self.error = e

    def finish(self) -> None:
        for stream, dec in self.decoders.items():
            self._emit(stream, dec.decode(b"", final=True))

    def data(self, stream: str) -> bytes:
        return b"".join(self.parts[stream])


class EntryList(List[EntryInfo]):
    """``files.list``'s answer: the entries, and whether ``max_entries`` cut the list."""

    truncated: bool = False


# -- async API ------------------------------------------------------------------------------------

class AsyncCommandHandle:
    """A command started with ``background=True``: an ``exec`` call that streams its output
    and runs until it ends, its ``timeout`` passes, or :meth:`kill`."""

    def __init__(self, sandbox: "AsyncSandbox", body: Dict[str, Any], timeout: float,
                 on_stdout: Optional[Output], on_stderr: Optional[Output]) -> None:
        loop = asyncio.get_running_loop()
        self._sandbox = sandbox
        self._queue: "asyncio.Queue[Optional[Tuple[str, str]]]" = asyncio.Queue()
        self._collector = _Collector(on_stdout, on_stderr, self._queue)
        self._ref: "asyncio.Future[Any]" = loop.create_future()
        self._task = loop.create_task(self._run(body, timeout))
        self._task.add_done_callback(self._ended)

    async def _run(self, body: Dict[str, Any], timeout: float) -> CommandResult:
        def on_ref(ref: Any) -> None:
            if not self._ref.done():
                self._ref.set_result(ref)

        msg = await self._sandbox._transport.call("exec", body, on_event=self._collector.on_event,
                                                   soft_timeout=timeout, on_ref=on_ref)
        self._collector.finish()
        return CommandResult.from_response(msg, self._collector.data("stdout"), self._collector.data("stderr"))

    def _ended(self, task: "asyncio.Task[CommandResult]") -> None:
        self._queue.put_nowait(None)
        if not self._ref.done():
            exc = None if task.cancelled() else task.exception()
            self._ref.set_exception(exc or AgentvmError("not_started", "the background command never started"))
            self._ref.exception()

    async def _started(self) -> None:
        """Waits until the call is known to the sandbox (its id sent, or serve's call seq
        received), so that :meth:`kill` can name it."""
        await asyncio.wait({self._ref, self._task}, return_when=asyncio.FIRST_COMPLETED)

    @property
    def stdout(self) -> str:
        """The command's stdout so far (all of it once it has ended)."""
        return self._collector.data("stdout").decode("utf-8", errors="replace")

    @property
    def stderr(self) -> str:
        return self._collector.data("stderr").decode("utf-8", errors="replace")

    def done(self) -> bool:
        return self._task.done()

    async def wait(self, timeout: Optional[float] = None) -> CommandResult:
        """The command's result once it has ended. ``timeout`` (seconds) bounds the wait
        (then :class:`Timeout`; the command keeps running). Errors of the call (the sandbox
        dying) are raised here."""
        if timeout is not None:
            _number("timeout", timeout, low=0, high=MAX_CALL_TIMEOUT)
        try:
            result = await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except asyncio.TimeoutError:
            raise Timeout(f"the background command did not end within {timeout:g} s") from None
        if self._collector.error is not None:
            raise self._collector.error
        return result

    async def kill(self) -> bool:
        """Kills the command with its process group and cgroup (protocol ``cancel``; serve's
        ``DELETE …/calls/{seq}``). True if it was still running; :meth:`wait` then returns
        its result with ``cancelled`` true."""
        await self._started()
        if self._task.done() or not self._ref.done() or self._ref.exception() is not None:
            return False
        ref = self._ref.result()
        if ref is None:
            raise AgentvmError("not_cancellable", "serve sent no X-Agentvm-Call header for this call")
        return await self._sandbox._transport.cancel(ref)

    async def iter_output(self) -> AsyncGenerator[Tuple[str, str], None]:
        """``("stdout"|"stderr", text)`` chunks as they come, until the command ends. One
        consumer only."""
        while True:
            item = await self._queue.get()
            if item is None:
                self._queue.put_nowait(None)  # later iterations end at once too
                return
            yield item


class AsyncCommands:
    """``sandbox.commands``."""

    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._sb = sandbox

    async def run(self, cmd: Union[str, Sequence[str]], *, timeout: Optional[float] = None,
                  envs: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                  stdin: Optional[Union[bytes, str]] = None, background: bool = False,
                  on_stdout: Optional[Output] = None, on_stderr: Optional[Output] = None,
                  max_output: Optional[int] = None, check: bool = False,
                  request_timeout: Optional[float] = None) -> Any:
        """Runs a command; see the package README. Returns a :class:`CommandResult`, or an
        :class:`AsyncCommandHandle` with ``background=True``."""
        argv: Optional[List[str]] = None
        if isinstance(cmd, str):
            _text("cmd", cmd)
        elif isinstance(cmd, (list, tuple)):
            if not cmd:
                raise ValueError("cmd must not be an empty list")
            argv = [_text(f"cmd[{i}]", a, empty_ok=i > 0) for i, a in enumerate(cmd)]
        else:
            raise TypeError(f"cmd must be a str (a shell command line) or a list of str (argv), "
                            f"not {type(cmd).__name__}")
        t = None if timeout is None else _number("timeout", timeout, low=0, high=MAX_CALL_TIMEOUT)
        rt = None if request_timeout is None else _number("request_timeout", request_timeout, low=0,
                                                          high=MAX_CALL_TIMEOUT)
        call_envs = _envs("envs", envs)
        if cwd is not None:
            cwd = _text("cwd", os.fspath(cwd) if isinstance(cwd, os.PathLike) else cwd)
        stdin_bytes = None if stdin is None else _bytes_of("stdin", stdin)
        mo = _max_output(max_output)
        _callback("on_stdout", on_stdout)
        _callback("on_stderr", on_stderr)
        if not isinstance(check, bool) or not isinstance(background, bool):
            raise TypeError("check and background must be bool")
        if background and check:
            raise ValueError("check=True has no meaning with background=True (check the result of wait())")
        if argv is None and stdin_bytes is not None and not background:
            raise ValueError("stdin needs an argv command (a list): shell calls read /dev/null")
        sb = self._sb
        sb._check_alive()

        if background:
            if argv is None:
                argv = ["bash", "-c", cmd]  # type: ignore[list-item]
            body = sb._exec_body(argv, call_envs, cwd, stdin_bytes, mo)
            bt = t if t is not None else MAX_CALL_TIMEOUT
            body["timeout"] = bt
            body["stream"] = sb._stream_value
            handle = AsyncCommandHandle(sb, body, bt, on_stdout, on_stderr)
            await handle._started()
            if handle.done() and handle._task.exception() is not None:
                raise handle._task.exception()  # type: ignore[misc]
            return handle

        ct = t if t is not None else DEFAULT_CALL_TIMEOUT
        # Service calls always stream: the answer's headers then come at once with the call's
        # seq, with which a call given up on (client deadline, cancellation) is cancelled.
        stream = on_stdout is not None or on_stderr is not None or sb.mode == "service"
        if argv is not None:
            op = "exec"
            body = sb._exec_body(argv, call_envs, cwd, stdin_bytes, mo)
        else:
            op = "shell"
            assert isinstance(cmd, str)
            line = cmd if (not call_envs and cwd is None) else _shell_wrap(cmd, call_envs, cwd)
            body = {"cmd": line}
            if mo is not None:
                body["max_output"] = mo
        body["timeout"] = ct
        collector = _Collector(on_stdout, on_stderr) if stream else None
        if collector is not None:
            body["stream"] = sb._stream_value
        if op == "shell":
            msg = await sb._shell_call(body, collector, ct, rt)
        else:
            msg = await sb._transport.call(op, body, on_event=collector.on_event if collector else None,
                                           soft_timeout=ct, hard_timeout=rt)
        if collector is not None:
            collector.finish()
            result = CommandResult.from_response(msg, collector.data("stdout"), collector.data("stderr"))
            if collector.error is not None:
                raise collector.error
        else:
            result = CommandResult.from_response(msg)
        if check and not result.ok:
            raise CommandFailed(result, f"{cmd!r}")
        return result


class AsyncFiles:
    """``sandbox.files``."""

    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._sb = sandbox

    async def write(self, path: str, data: Data, *, mode: Optional[Union[int, str]] = None,
                    request_timeout: Optional[float] = None) -> int:
        """Writes ``data`` (bytes, str as UTF-8, or a binary file object read in 4 MiB chunks)
        to ``path``, creating or truncating it; returns the bytes written."""
        path = _path(path)
        m = _mode(mode)
        rt = None if request_timeout is None else _number("request_timeout", request_timeout, low=0,
                                                          high=MAX_CALL_TIMEOUT)
        size: Optional[int] = None
        chunks: Any
        if isinstance(data, str):
            data = data.encode("utf-8")
        if isinstance(data, (bytes, bytearray, memoryview)):
            buf = bytes(data)
            chunks = buf if self._sb.mode == "service" else \
                [buf[i:i + FILE_CHUNK] for i in range(0, len(buf), FILE_CHUNK)]
        elif hasattr(data, "read"):
            size = _remaining(data)
            chunks = _file_chunks(data)
        else:
            raise TypeError(f"data must be bytes, str or a binary file object, not {type(data).__name__}")
        self._sb._check_alive()
        t = self._sb._transport
        if isinstance(t, ServiceTransport):
            return await t.write_file(path, chunks, m, rt, size=size)
        return await t.write_file(path, chunks, m, rt)

    async def read(self, path: str, *, request_timeout: Optional[float] = None) -> bytes:
        """The whole file's bytes."""
        parts: List[bytes] = []

        async def sink(chunk: bytes) -> None:
            parts.append(chunk)

        path = _path(path)
        rt = None if request_timeout is None else _number("request_timeout", request_timeout, low=0,
                                                          high=MAX_CALL_TIMEOUT)
        self._sb._check_alive()
        await self._sb._transport.read_file(path, sink, rt)
        return b"".join(parts)

    async def read_text(self, path: str) -> str:
        """The file decoded as UTF-8 (``errors="replace"``)."""
        return (await self.read(path)).decode("utf-8", errors="replace")

    async def read_stream(self, path: str, *, request_timeout: Optional[float] = None) -> AsyncGenerator[bytes, None]:
        """The file's bytes in chunks (up to 1 MiB each) as they arrive, at the consumer's pace."""
        path = _path(path)
        rt = None if request_timeout is None else _number("request_timeout", request_timeout, low=0,
                                                          high=MAX_CALL_TIMEOUT)
        self._sb._check_alive()
        queue: "asyncio.Queue[bytes]" = asyncio.Queue(maxsize=4)
        state = {"closed": False}

        async def sink(chunk: bytes) -> None:
            if state["closed"]:
                raise AgentvmError("abandoned", "the reader stopped reading")
            await queue.put(chunk)

        task = asyncio.get_running_loop().create_task(self._sb._transport.read_file(path, sink, rt))
        try:
            while True:
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    yield getter.result()
                    continue
                getter.cancel()
                while not queue.empty():
                    yield queue.get_nowait()
                task.result()
                return
        finally:
            if not task.done():
                state["closed"] = True
                task.cancel()
                while not queue.empty():
                    queue.get_nowait()
                try:
                    await task
                except BaseException:
                    pass

    async def info(self, path: str) -> FileInfo:
        """``stat`` of ``path`` (symbolic links followed); :class:`NotFound` if it does not exist."""
        path = _path(path)
        self._sb._check_alive()
        msg = await self._sb._transport.stat(path)
        return FileInfo(path=path, type=str(msg.get("type")), size=int(msg.get("size", 0)),
                        mode=int(str(msg.get("mode", "0")), 8), mtime=float(msg.get("mtime", 0.0)))

    async def exists(self, path: str) -> bool:
        try:
            await self.info(path)
        except NotFound:
            return False
        return True

    async def list(self, path: str, *, max_entries: Optional[int] = None) -> EntryList:
        """The directory's entries, sorted by name, without ``.`` and ``..`` (symbolic links not
        followed); at most ``max_entries`` (1-100000, default 10000: then ``.truncated``)."""
        path = _path(path)
        if max_entries is not None:
            if isinstance(max_entries, bool) or not isinstance(max_entries, int):
                raise TypeError("max_entries must be an int")
            if not 1 <= max_entries <= 100000:
                raise ValueError(f"max_entries must be from 1 to 100000, not {max_entries}")
        self._sb._check_alive()
        msg = await self._sb._transport.list_dir(path, max_entries)
        out = EntryList()
        for e in msg.get("entries", []):
            raw = byte_field(e, "name") or b""
            name = raw.decode("utf-8", errors="replace")
            out.append(EntryInfo(name=name, path=posixpath.join(path, name), type=str(e.get("type")),
                                 size=int(e.get("size", 0)), mode=int(str(e.get("mode", "0")), 8), name_bytes=raw))
        out.truncated = bool(msg.get("truncated", False))
        return out


def _remaining(f: Any) -> Optional[int]:
    try:
        if not f.seekable():
            return None
        pos = f.tell()
        end = f.seek(0, io.SEEK_END)
        f.seek(pos)
        return int(end - pos)
    except (AttributeError, OSError, ValueError):
        return None


def _file_chunks(f: Any) -> Iterator[bytes]:
    while True:
        chunk = f.read(FILE_CHUNK)
        if not chunk:
            return
        if isinstance(chunk, str):
            raise TypeError("the file object must be opened in binary mode")
        yield bytes(chunk)


class AsyncSandbox:
    """A sandbox, on asyncio: ``sb = await AsyncSandbox.create(...)``; see the README."""

    def __init__(self, transport: Transport, *, mode: str, envs: Dict[str, str], metadata: Dict[str, str],
                 timeout: float) -> None:
        self._transport = transport
        self.mode = mode
        self.envs = envs
        self.metadata = metadata
        self.timeout = timeout
        self.commands = AsyncCommands(self)
        self.files = AsyncFiles(self)
        self._killed = False
        self._paused = False
        # Embedded: agentvm's own arguments (without --template), which its forks start with.
        self._fork_args: List[str] = []
        # Embedded: the sandbox's envs are exported in the shell before its first call, and
        # again after a shell was killed (serve does both itself).
        self._shell_env_pending = bool(envs) and mode == "embedded"
        self._stream_value: Any = "only" if mode == "embedded" else True

    @classmethod
    async def create(cls, snapshot: Optional[str] = None, timeout: float = 300,
                     envs: Optional[Mapping[str, str]] = None, metadata: Optional[Mapping[str, str]] = None,
                     url: Optional[str] = None, token: Optional[str] = None, pool: Optional[str] = None, *,
                     binary: Optional[str] = None, start_timeout: float = DEFAULT_START_TIMEOUT,
                     grace: float = DEFAULT_GRACE, agentvm_args: Sequence[str] = (),
                     template: Optional[str] = None, snapshot_dir: Optional[str] = None) -> "AsyncSandbox":
        """A new sandbox. Service mode when ``url`` (or ``$AGENTVM_URL``) names a server
        (``unix:/path`` or ``http://host:port``), else embedded (an ``agentvm episode``
        subprocess restored from the default snapshot, or ``snapshot``). ``template`` names an
        ``agentvm template`` in either mode: embedded, the episode runs it; a service serves it
        as the pool of that name (``agentvm serve --pool NAME=N``). ``snapshot_dir`` (embedded):
        an existing directory where :meth:`fork` and :meth:`pause` write live snapshots, which
        the caller removes when done with them; without it they go to a directory the client
        keeps and removes once no sandbox of this one's lineage runs and none of its paused
        snapshots waits to be resumed (python/README.md, "Fork, pause and resume")."""
        t = _number("timeout", timeout, low=1, high=MAX_SANDBOX_TIMEOUT, low_inclusive=True)
        env = _envs("envs", envs)
        meta = _metadata(metadata)
        st = _number("start_timeout", start_timeout, low=0, high=MAX_CALL_TIMEOUT)
        g = _number("grace", grace, low=0, high=MAX_CALL_TIMEOUT)
        if template is not None:
            _text("template", template)
            if snapshot is not None:
                raise ValueError("template and snapshot both name what to run: give one")
            if pool is not None and pool != template:
                raise ValueError("template and pool both name the service's pool: give one")
        if url is None:
            url = os.environ.get("AGENTVM_URL") or None
        if url is not None:
            if template is not None:
                pool = template
            _text("url", url)
            if snapshot is not None:
                raise ValueError("snapshot is for embedded mode; a service names its snapshots as pools (pool=)")
            if binary is not None or agentvm_args or snapshot_dir is not None:
                raise ValueError("binary, agentvm_args and snapshot_dir are for embedded mode")
            if token is None:
                token = os.environ.get("AGENTVM_TOKEN") or None
            if token is not None:
                _text("token", token)
            if pool is not None:
                _text("pool", pool)
            body: Dict[str, Any] = {"timeout": t if t != int(t) else int(t)}
            if env:
                body["env"] = env
            if meta:
                body["metadata"] = meta
            if pool is not None:
                body["pool"] = pool
            service = ServiceTransport(HttpClient.get(url, token), grace=g)
            await service.create(body, st)
            return cls(service, mode="service", envs=env, metadata=meta, timeout=t)._track()
        if pool is not None:
            raise ValueError("pool is for service mode (url= or AGENTVM_URL); embedded mode takes snapshot=")
        if token is not None:
            raise ValueError("token is for service mode (url= or AGENTVM_URL)")
        if snapshot is not None:
            snapshot = _text("snapshot", os.fspath(snapshot))
        user_args = [_text("agentvm_args item", a) for a in agentvm_args]
        args = (["--template", template] if template is not None else []) + user_args
        sdir = _snapshot_dir(snapshot_dir)
        program = find_agentvm(binary)
        # Restored from a snapshot in a directory the client keeps: that one is held (and
        # written to, without snapshot_dir=), else a new one is made when none was given.
        managed = ManagedDir.of(snapshot) if snapshot is not None else None
        hold: Optional[str] = None
        why = ""
        if sdir is None and managed is not None:
            sdir = managed.path
        elif sdir is None:
            try:
                managed, hold = ManagedDir.create()
                sdir = managed.path
            except OSError as e:
                why = f"the client's own snapshot directory could not be made: {e}"
        episode = EpisodeTransport(program, snapshot=snapshot, timeout=t, extra_args=args, grace=g,
                                   snapshot_dir=sdir, managed=managed, hold=hold, no_snapshot_dir_why=why)
        await episode.start(st)
        sandbox = cls(episode, mode="embedded", envs=env, metadata=meta, timeout=t)
        sandbox._fork_args = user_args
        return sandbox._track()

    @classmethod
    async def resume(cls, sandbox_id: str, *, url: Optional[str] = None, token: Optional[str] = None,
                     timeout: float = 300, envs: Optional[Mapping[str, str]] = None,
                     binary: Optional[str] = None, start_timeout: float = DEFAULT_START_TIMEOUT,
                     grace: float = DEFAULT_GRACE, agentvm_args: Sequence[str] = (),
                     snapshot_dir: Optional[str] = None) -> "AsyncSandbox":
        """A paused sandbox, running again exactly as it was paused (:meth:`pause` returned
        ``sandbox_id``). Service mode (``url`` or ``$AGENTVM_URL``): the same sandbox under its
        id, with its settings. Embedded: ``sandbox_id`` is the paused snapshot's directory; the
        episode gets ``timeout``, ``envs`` for its exec calls (the shell kept its exports), and
        takes its own snapshots into ``snapshot_dir`` (default: the directory the paused
        snapshot is in). A snapshot the client keeps (a pause without ``snapshot_dir=``) is kept
        until it is resumed, or for a week."""
        _text("sandbox_id", sandbox_id)
        st = _number("start_timeout", start_timeout, low=0, high=MAX_CALL_TIMEOUT)
        g = _number("grace", grace, low=0, high=MAX_CALL_TIMEOUT)
        if url is None and os.sep not in sandbox_id:
            url = os.environ.get("AGENTVM_URL") or None
        if url is not None:
            if binary is not None or agentvm_args or snapshot_dir is not None or envs is not None:
                raise ValueError("binary, agentvm_args, snapshot_dir and envs are for embedded mode: a service "
                                 "resumes a sandbox with its own settings")
            if token is None:
                token = os.environ.get("AGENTVM_TOKEN") or None
            service = ServiceTransport(HttpClient.get(_text("url", url), token), grace=g)
            await service.resume(sandbox_id, st)
            described = service.described
            return cls(service, mode="service", envs={}, metadata=dict(described.get("metadata") or {}),
                       timeout=float(described.get("timeout", timeout)))._track()
        t = _number("timeout", timeout, low=1, high=MAX_SANDBOX_TIMEOUT, low_inclusive=True)
        env = _envs("envs", envs)
        if not os.path.isfile(os.path.join(sandbox_id, "manifest.json")):
            raise ValueError(f"{sandbox_id!r} is not a paused sandbox's snapshot (no manifest.json there)")
        user_args = [_text("agentvm_args item", a) for a in agentvm_args]
        sdir = _snapshot_dir(snapshot_dir if snapshot_dir is not None else os.path.dirname(os.path.abspath(sandbox_id)))
        managed = ManagedDir.of(sandbox_id)
        episode = EpisodeTransport(find_agentvm(binary), snapshot=sandbox_id, timeout=t, extra_args=user_args,
                                   grace=g, snapshot_dir=sdir, managed=managed)
        await episode.start(st)
        if managed is not None:
            # Running again (and holding the directory): no longer a paused sandbox to keep.
            managed.resumed(os.path.basename(os.path.normpath(sandbox_id)))
        sandbox = cls(episode, mode="embedded", envs=env, metadata={}, timeout=t)
        sandbox._shell_env_pending = False
        sandbox._fork_args = user_args
        return sandbox._track()

    # -- fork and pause --------------------------------------------------------------------------

    async def fork(self, count: int = 1, *, start_timeout: float = DEFAULT_START_TIMEOUT) -> List["AsyncSandbox"]:
        """``count`` new sandboxes, each this one as it is now (files, processes, the shell's
        cwd, variables and jobs, the interpreter's variables), with its timeout, envs and
        metadata; this one runs on. All start or none: if one fails, the others are killed."""
        if isinstance(count, bool) or not isinstance(count, int):
            raise TypeError("count must be an int")
        if not 1 <= count <= MAX_FORK_COUNT:
            raise ValueError(f"count must be 1 to {MAX_FORK_COUNT}")
        st = _number("start_timeout", start_timeout, low=0, high=MAX_CALL_TIMEOUT)
        self._check_alive()
        t = self._transport
        if isinstance(t, ServiceTransport):
            children = []
            for described in await t.fork(count, st):
                child_t = ServiceTransport(t.client, grace=t.grace)
                child_t.adopt(described)
                children.append(AsyncSandbox(child_t, mode="service", envs=dict(self.envs),
                                             metadata=dict(self.metadata), timeout=self.timeout)._track())
            return children
        assert isinstance(t, EpisodeTransport)
        taken = await t.live_snapshot(f"fork-{os.getpid()}-{uuid.uuid4().hex}")
        episodes = [EpisodeTransport(t.binary, snapshot=taken["path"], timeout=self.timeout,
                                     extra_args=self._fork_args, grace=t.grace, snapshot_dir=t.snapshot_dir,
                                     managed=t.managed)
                    for _ in range(count)]
        results = await asyncio.gather(*(e.start(st) for e in episodes), return_exceptions=True)
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is not None:
            await asyncio.gather(*(e.kill() for e in episodes), return_exceptions=True)
            raise failure
        children = []
        for e in episodes:
            child = AsyncSandbox(e, mode="embedded", envs=dict(self.envs), metadata=dict(self.metadata),
                                 timeout=self.timeout)
            child._shell_env_pending = self._shell_env_pending
            child._fork_args = self._fork_args
            children.append(child._track())
        return children

    async def pause(self) -> str:
        """Saves the sandbox to disk and ends its VM (it holds no memory then); returns the id
        :meth:`resume` takes: serve's sandbox id, or (embedded) the snapshot's directory.
        Calls on this object raise :class:`SandboxDied` (``paused``) afterwards."""
        self._check_alive()
        t = self._transport
        if isinstance(t, ServiceTransport):
            await t.pause()
            resume_id = self.sandbox_id
        else:
            assert isinstance(t, EpisodeTransport)
            resume_id = (await t.live_snapshot(f"pause-{os.getpid()}-{uuid.uuid4().hex}"))["path"]
            if t.managed is not None:
                # Before the episode ends and lets go of the directory.
                t.managed.paused(os.path.basename(str(resume_id)))
            await t.close()
        self._paused = True
        _loop.unregister_exit(self._kill_at_exit)
        return str(resume_id)

    # -- identity and life ---------------------------------------------------------------------

    @property
    def sandbox_id(self) -> str:
        """serve's sandbox id (``sb-…``), or ``ep-PID`` for an embedded episode."""
        return self._transport.sandbox_id

    @property
    def pid(self) -> Optional[int]:
        """The ``agentvm episode`` process behind the sandbox (on serve's host in service mode)."""
        return self._transport.pid

    @property
    def restored(self) -> Optional[bool]:
        """True when the VM was restored from a snapshot, False when it booted."""
        return self._transport.restored

    def info(self) -> Dict[str, Any]:
        """What is known of the sandbox (in service mode, serve's last description of it)."""
        return dict(self._transport.info())

    def _track(self) -> "AsyncSandbox":
        # A sandbox still open when the interpreter exits is killed then (embedded: SIGTERM;
        # service: DELETE), without the event loop, which may be gone.
        _loop.register_exit(self._kill_at_exit)
        return self

    def _kill_at_exit(self) -> None:
        if not self._killed:
            self._killed = True
            self._transport.kill_at_exit()

    def _check_alive(self) -> None:
        if self._paused:
            raise SandboxDied("paused", "the sandbox is paused: resume it (Sandbox.resume) for a running one")
        if self._killed:
            raise SandboxDied("killed", "the sandbox was killed")

    async def kill(self) -> None:
        """Ends the sandbox and its VM at once (running calls fail with :class:`SandboxDied`).
        Embedded: SIGTERM to the episode (SIGKILL if it has not ended 30 s later); service:
        ``DELETE``. Killing a dead or paused sandbox does nothing (a paused one stays paused)."""
        if self._killed or self._paused:
            return
        self._killed = True
        _loop.unregister_exit(self._kill_at_exit)
        await self._transport.kill()

    async def is_running(self) -> bool:
        if self._killed or self._paused:
            return False
        return await self._transport.is_running()

    async def set_timeout(self, seconds: float) -> None:
        """The sandbox now ends ``seconds`` from now. Service: ``POST …/timeout``. Embedded:
        a client-side timer kills the episode then; it cannot end later than the ``timeout``
        the sandbox was created with (ValueError)."""
        s = _number("seconds", seconds, low=1, high=MAX_SANDBOX_TIMEOUT, low_inclusive=True)
        self._check_alive()
        await self._transport.set_timeout(s if s != int(s) else int(s))

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.kill()

    # -- code ------------------------------------------------------------------------------------

    async def run_code(self, code: str, language: str = "python", timeout: Optional[float] = None, *,
                       on_stdout: Optional[Output] = None, on_stderr: Optional[Output] = None,
                       max_output: Optional[int] = None, request_timeout: Optional[float] = None) -> Execution:
        """Runs a cell in the sandbox's persistent Python interpreter (protocol ``run_code``)."""
        _text("code", code, empty_ok=True)
        if not isinstance(language, str):
            raise TypeError("language must be a str")
        if language != "python":
            raise ValueError(f"language {language!r} is not supported (python only)")
        ct = DEFAULT_CALL_TIMEOUT if timeout is None else _number("timeout", timeout, low=0, high=MAX_CALL_TIMEOUT)
        rt = None if request_timeout is None else _number("request_timeout", request_timeout, low=0,
                                                          high=MAX_CALL_TIMEOUT)
        mo = _max_output(max_output)
        _callback("on_stdout", on_stdout)
        _callback("on_stderr", on_stderr)
        self._check_alive()
        body: Dict[str, Any] = {"code": code, "language": language, "timeout": ct}
        if mo is not None:
            body["max_output"] = mo
        collector = None
        if on_stdout is not None or on_stderr is not None or self.mode == "service":
            collector = _Collector(on_stdout, on_stderr)
            body["stream"] = self._stream_value
        msg = await self._transport.call("run_code", body, on_event=collector.on_event if collector else None,
                                         soft_timeout=ct + 2.0, hard_timeout=rt)
        if collector is not None:
            collector.finish()
            if collector.error is not None:
                raise collector.error
            return Execution.from_response(msg, collector.data("stdout"), collector.data("stderr"))
        return Execution.from_response(msg)

    # -- internals ------------------------------------------------------------------------------

    def _exec_body(self, argv: List[str], envs: Dict[str, str], cwd: Optional[str],
                   stdin: Optional[bytes], max_output: Optional[int]) -> Dict[str, Any]:
        body: Dict[str, Any] = {"argv": argv}
        env = dict(self.envs, **envs) if self.mode == "embedded" else envs
        if env:
            body["env"] = env
        if cwd is not None:
            body["cwd"] = cwd
        if stdin is not None:
            put_bytes(body, "stdin", stdin)
        if max_output is not None:
            body["max_output"] = max_output
        return body

    async def _shell_call(self, body: Dict[str, Any], collector: Optional[_Collector], timeout: float,
                          hard: Optional[float]) -> Dict[str, Any]:
        t = self._transport
        prelude: Optional["asyncio.Task[Dict[str, Any]]"] = None
        if self._shell_env_pending:
            self._shell_env_pending = False
            exports = "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in self.envs.items())
            prelude = asyncio.get_running_loop().create_task(
                t.call("shell", {"cmd": exports, "timeout": 60}, soft_timeout=60))
            if self.mode == "embedded":
                await asyncio.sleep(0)  # its line is written first; shell calls run in order
            else:
                # Two HTTP requests from the thread pool may arrive in either order: wait.
                await asyncio.wait({prelude})
        try:
            msg = await t.call("shell", body, on_event=collector.on_event if collector else None,
                               soft_timeout=timeout, hard_timeout=hard)
        finally:
            if prelude is not None:
                try:
                    pre = await prelude
                    if pre.get("exit_code") != 0:
                        self._shell_env_pending = True
                except Exception:
                    self._shell_env_pending = True
        if self.envs and self.mode == "embedded" and (msg.get("timed_out") or msg.get("cancelled")):
            # That shell was killed; the next call starts a fresh one, which gets the envs again.
            self._shell_env_pending = True
        return msg


# -- sync API -------------------------------------------------------------------------------------

Item = TypeVar("Item")


def _sync_iter(agen: AsyncGenerator[Item, None]) -> Generator[Item, None, None]:
    """An async generator consumed from another thread, one item at a time on the loop."""

    async def next_item() -> Item:
        return await agen.__anext__()

    try:
        while True:
            try:
                yield _loop.run(next_item())
            except StopAsyncIteration:
                return
    finally:
        async def close() -> None:
            await agen.aclose()

        _loop.run(close())


class CommandHandle:
    """The blocking view of an :class:`AsyncCommandHandle`."""

    def __init__(self, handle: AsyncCommandHandle) -> None:
        self._h = handle

    @property
    def stdout(self) -> str:
        return self._h.stdout

    @property
    def stderr(self) -> str:
        return self._h.stderr

    def done(self) -> bool:
        return self._h.done()

    def wait(self, timeout: Optional[float] = None) -> CommandResult:
        return _loop.run(self._h.wait(timeout))

    def kill(self) -> bool:
        return _loop.run(self._h.kill())

    def iter_output(self) -> Generator[Tuple[str, str], None, None]:
        return _sync_iter(self._h.iter_output())


class Commands:
    def __init__(self, commands: AsyncCommands) -> None:
        self._c = commands

    def run(self, cmd: Union[str, Sequence[str]], **kwargs: Any) -> Any:
        """As :meth:`AsyncCommands.run`; callbacks run on the package's event-loop thread."""
        out = _loop.run(self._c.run(cmd, **kwargs))
        return CommandHandle(out) if isinstance(out, AsyncCommandHandle) else out


class Files:
    def __init__(self, files: AsyncFiles) -> None:
        self._f = files

    def write(self, path: str, data: Data, **kwargs: Any) -> int:
        return _loop.run(self._f.write(path, data, **kwargs))

    def read(self, path: str, **kwargs: Any) -> bytes:
        return _loop.run(self._f.read(path, **kwargs))

    def read_text(self, path: str) -> str:
        return _loop.run(self._f.read_text(path))

    def read_stream(self, path: str, **kwargs: Any) -> Generator[bytes, None, None]:
        return _sync_iter(self._f.read_stream(path, **kwargs))

    def info(self, path: str) -> FileInfo:
        return _loop.run(self._f.info(path))

    def exists(self, path: str) -> bool:
        return _loop.run(self._f.exists(path))

    def list(self, path: str, **kwargs: Any) -> EntryList:
        return _loop.run(self._f.list(path, **kwargs))


class Sandbox:
    """A sandbox, blocking: ``Sandbox(...)`` creates it (same arguments as
    :meth:`AsyncSandbox.create`). Every instance runs on the package's one background
    event-loop thread."""

    def __init__(self, snapshot: Optional[str] = None, timeout: float = 300,
                 envs: Optional[Mapping[str, str]] = None, metadata: Optional[Mapping[str, str]] = None,
                 url: Optional[str] = None, token: Optional[str] = None, pool: Optional[str] = None,
                 **kwargs: Any) -> None:
        self._sb: AsyncSandbox = _loop.run(AsyncSandbox.create(snapshot, timeout, envs, metadata, url, token,
                                                               pool, **kwargs))
        self.commands = Commands(self._sb.commands)
        self.files = Files(self._sb.files)

    @classmethod
    def create(cls, *args: Any, **kwargs: Any) -> "Sandbox":
        return cls(*args, **kwargs)

    @classmethod
    def _wrap(cls, sandbox: AsyncSandbox) -> "Sandbox":
        obj = cls.__new__(cls)
        obj._sb = sandbox
        obj.commands = Commands(sandbox.commands)
        obj.files = Files(sandbox.files)
        return obj

    @classmethod
    def resume(cls, sandbox_id: str, **kwargs: Any) -> "Sandbox":
        """As :meth:`AsyncSandbox.resume`."""
        return cls._wrap(_loop.run(AsyncSandbox.resume(sandbox_id, **kwargs)))

    def fork(self, count: int = 1, **kwargs: Any) -> List["Sandbox"]:
        """As :meth:`AsyncSandbox.fork`."""
        return [Sandbox._wrap(child) for child in _loop.run(self._sb.fork(count, **kwargs))]

    def pause(self) -> str:
        """As :meth:`AsyncSandbox.pause`."""
        return _loop.run(self._sb.pause())

    @property
    def sandbox_id(self) -> str:
        return self._sb.sandbox_id

    @property
    def pid(self) -> Optional[int]:
        return self._sb.pid

    @property
    def mode(self) -> str:
        return self._sb.mode

    @property
    def metadata(self) -> Dict[str, str]:
        return self._sb.metadata

    @property
    def envs(self) -> Dict[str, str]:
        return self._sb.envs

    @property
    def restored(self) -> Optional[bool]:
        return self._sb.restored

    def info(self) -> Dict[str, Any]:
        return self._sb.info()

    def kill(self) -> None:
        _loop.run(self._sb.kill())

    def is_running(self) -> bool:
        return _loop.run(self._sb.is_running())

    def set_timeout(self, seconds: float) -> None:
        _loop.run(self._sb.set_timeout(seconds))

    def run_code(self, code: str, language: str = "python", timeout: Optional[float] = None,
                 **kwargs: Any) -> Execution:
        return _loop.run(self._sb.run_code(code, language, timeout, **kwargs))

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()
