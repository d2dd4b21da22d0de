"""The blocking API: ``Sandbox`` and its ``commands``/``files``, each method the asyncio one
of the same name and parameters (python/tests/test_signatures.py holds them to that), run on
the package's one background event-loop thread (_loop.py)."""
from __future__ import annotations

from typing import (Any, AsyncGenerator, Dict, Generator, List, Literal, Mapping, Optional, Sequence, Tuple,
                    TypeVar, Union, overload)

from . import _loop
from ._commands import AsyncCommandHandle, AsyncCommands, OnDisplay, Output
from ._common import DEFAULT_GRACE, DEFAULT_START_TIMEOUT
from ._contexts import ContextRef
from ._files import AsyncFiles, Data, EntryList
from ._http import SandboxList
from ._lifecycle import AsyncSandbox
from ._ports import AsyncPortForward, AsyncPorts
from ._processes import AsyncProcess, AsyncPty, PidOrTag, PtyOutput, Signal
from ._watch import AsyncWatchHandle, OnFilesystemEvent
from .models import CodeContext, CommandResult, Execution, FileInfo, FilesystemEvent, ProcessInfo, ProcessResult

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


class Process:
    """The blocking view of an :class:`AsyncProcess`."""

    def __init__(self, process: AsyncProcess) -> None:
        self._p = process

    @property
    def pid(self) -> int:
        return self._p.pid

    @property
    def tag(self) -> Optional[str]:
        return self._p.tag

    @property
    def stdout(self) -> str:
        return self._p.stdout

    @property
    def stderr(self) -> str:
        return self._p.stderr

    @property
    def lost_bytes(self) -> int:
        return self._p.lost_bytes

    @property
    def exit_code(self) -> Optional[int]:
        return self._p.exit_code

    def done(self) -> bool:
        return self._p.done()

    def wait(self, timeout: Optional[float] = None) -> ProcessResult:
        return _loop.run(self._p.wait(timeout))

    def iter_output(self) -> Generator[Tuple[str, str], None, None]:
        return _sync_iter(self._p.iter_output())

    def send_stdin(self, data: Union[str, bytes]) -> None:
        _loop.run(self._p.send_stdin(data))

    def close_stdin(self) -> None:
        _loop.run(self._p.close_stdin())

    def kill(self, signal: Signal = "KILL", *, group: bool = True) -> bool:
        return _loop.run(self._p.kill(signal, group=group))

    def resize(self, rows: int, cols: int) -> None:
        _loop.run(self._p.resize(rows, cols))

    def disconnect(self) -> None:
        _loop.run(self._p.disconnect())

    def __repr__(self) -> str:
        return repr(self._p)[len("Async"):]


class ProcessCommands:
    """The process half of the blocking ``sandbox.commands`` (:class:`AsyncProcessCommands`)."""

    def __init__(self, commands: AsyncCommands) -> None:
        self._c = commands

    def spawn(self, cmd: Union[str, Sequence[str]], *, envs: Optional[Mapping[str, str]] = None,
              cwd: Optional[str] = None, tag: Optional[str] = None, stdin: bool = False,
              timeout: Optional[float] = None, on_stdout: Optional[Output] = None,
              on_stderr: Optional[Output] = None) -> Process:
        """As :meth:`AsyncProcessCommands.spawn`; callbacks run on the package's event-loop thread."""
        return Process(_loop.run(self._c.spawn(cmd, envs=envs, cwd=cwd, tag=tag, stdin=stdin, timeout=timeout,
                                               on_stdout=on_stdout, on_stderr=on_stderr)))

    def list(self) -> List[ProcessInfo]:
        return _loop.run(self._c.list())

    def connect(self, pid_or_tag: PidOrTag, *, on_stdout: Optional[Output] = None,
                on_stderr: Optional[Output] = None, replay: bool = True) -> Process:
        return Process(_loop.run(self._c.connect(pid_or_tag, on_stdout=on_stdout, on_stderr=on_stderr,
                                                 replay=replay)))

    def send_stdin(self, pid_or_tag: PidOrTag, data: Union[str, bytes]) -> None:
        _loop.run(self._c.send_stdin(pid_or_tag, data))

    def close_stdin(self, pid_or_tag: PidOrTag) -> None:
        _loop.run(self._c.close_stdin(pid_or_tag))

    def kill(self, pid_or_tag: PidOrTag, signal: Signal = "KILL", *, group: bool = True) -> bool:
        return _loop.run(self._c.kill(pid_or_tag, signal, group=group))


class Pty:
    """The blocking ``sandbox.pty`` (:class:`AsyncPty`)."""

    def __init__(self, pty: AsyncPty) -> None:
        self._t = pty

    def create(self, *, rows: int = 24, cols: int = 80, cmd: Union[str, Sequence[str]] = "bash -i",
               envs: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None, tag: Optional[str] = None,
               on_data: Optional[PtyOutput] = None, timeout: Optional[float] = None) -> Process:
        """As :meth:`AsyncPty.create`; ``on_data`` runs on the package's event-loop thread."""
        return Process(_loop.run(self._t.create(rows=rows, cols=cols, cmd=cmd, envs=envs, cwd=cwd, tag=tag,
                                                on_data=on_data, timeout=timeout)))

    def send_stdin(self, pid_or_tag: PidOrTag, data: Union[str, bytes]) -> None:
        _loop.run(self._t.send_stdin(pid_or_tag, data))

    def resize(self, pid_or_tag: PidOrTag, rows: int, cols: int) -> None:
        _loop.run(self._t.resize(pid_or_tag, rows, cols))

    def kill(self, pid_or_tag: PidOrTag) -> bool:
        return _loop.run(self._t.kill(pid_or_tag))


class Commands(ProcessCommands):
    def __init__(self, commands: AsyncCommands) -> None:
        self._c = commands

    @overload
    def run(self, cmd: Union[str, Sequence[str]], *, timeout: Optional[float] = None,
            envs: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
            stdin: Optional[Union[bytes, str]] = None, background: Literal[False] = False,
            on_stdout: Optional[Output] = None, on_stderr: Optional[Output] = None,
            max_output: Optional[int] = None, check: bool = False,
            request_timeout: Optional[float] = None) -> CommandResult: ...

    @overload
    def run(self, cmd: Union[str, Sequence[str]], *, timeout: Optional[float] = None,
            envs: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
            stdin: Optional[Union[bytes, str]] = None, background: Literal[True],
            on_stdout: Optional[Output] = None, on_stderr: Optional[Output] = None,
            max_output: Optional[int] = None, check: bool = False,
            request_timeout: Optional[float] = None) -> CommandHandle: ...

    @overload
    def run(self, cmd: Union[str, Sequence[str]], *, timeout: Optional[float] = None,
            envs: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
            stdin: Optional[Union[bytes, str]] = None, background: bool = False,
            on_stdout: Optional[Output] = None, on_stderr: Optional[Output] = None,
            max_output: Optional[int] = None, check: bool = False,
            request_timeout: Optional[float] = None) -> Union[CommandResult, CommandHandle]: ...

    def run(self, cmd: Union[str, Sequence[str]], *, timeout: Optional[float] = None,
            envs: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
            stdin: Optional[Union[bytes, str]] = None, background: bool = False,
            on_stdout: Optional[Output] = None, on_stderr: Optional[Output] = None,
            max_output: Optional[int] = None, check: bool = False,
            request_timeout: Optional[float] = None) -> Union[CommandResult, CommandHandle]:
        """As :meth:`AsyncCommands.run`; callbacks run on the package's event-loop thread."""
        out = _loop.run(self._c.run(cmd, timeout=timeout, envs=envs, cwd=cwd, stdin=stdin, background=background,
                                    on_stdout=on_stdout, on_stderr=on_stderr, max_output=max_output, check=check,
                                    request_timeout=request_timeout))
        return CommandHandle(out) if isinstance(out, AsyncCommandHandle) else out


class Files:
    def __init__(self, files: AsyncFiles) -> None:
        self._f = files

    def write(self, path: str, data: Data, *, mode: Optional[Union[int, str]] = None,
              request_timeout: Optional[float] = None) -> int:
        return _loop.run(self._f.write(path, data, mode=mode, request_timeout=request_timeout))

    def read(self, path: str, *, request_timeout: Optional[float] = None) -> bytes:
        return _loop.run(self._f.read(path, request_timeout=request_timeout))

    def read_text(self, path: str) -> str:
        return _loop.run(self._f.read_text(path))

    def read_stream(self, path: str, *, request_timeout: Optional[float] = None) -> Generator[bytes, None, None]:
        return _sync_iter(self._f.read_stream(path, request_timeout=request_timeout))

    def info(self, path: str) -> FileInfo:
        return _loop.run(self._f.info(path))

    def exists(self, path: str) -> bool:
        return _loop.run(self._f.exists(path))

    def list(self, path: str, depth: int = 1, *, max_entries: Optional[int] = None) -> EntryList:
        return _loop.run(self._f.list(path, depth, max_entries=max_entries))

    def make_dir(self, path: str, *, mode: Optional[Union[int, str]] = None) -> bool:
        return _loop.run(self._f.make_dir(path, mode=mode))

    def rename(self, old_path: str, new_path: str) -> FileInfo:
        return _loop.run(self._f.rename(old_path, new_path))

    def remove(self, path: str, *, recursive: bool = True) -> None:
        _loop.run(self._f.remove(path, recursive=recursive))

    def watch_dir(self, path: str, *, recursive: bool = False,
                  on_event: Optional[OnFilesystemEvent] = None) -> WatchHandle:
        """As :meth:`AsyncFiles.watch_dir`; ``on_event`` runs on the package's event-loop thread."""
        return WatchHandle(_loop.run(self._f.watch_dir(path, recursive=recursive, on_event=on_event)))


class WatchHandle:
    """The blocking view of an :class:`AsyncWatchHandle`: :meth:`get_new_events` (as E2B's)
    takes the events that came since it was last called, without waiting; :meth:`events`
    waits for them. Use one of the two (or ``on_event``)."""

    def __init__(self, handle: AsyncWatchHandle) -> None:
        self._h = handle

    @property
    def path(self) -> str:
        return self._h.path

    @property
    def ended(self) -> Optional[str]:
        return self._h.ended

    def done(self) -> bool:
        return self._h.done()

    def get_new_events(self) -> List[FilesystemEvent]:
        return _loop.run(self._h.get_new_events())

    def events(self) -> Generator[FilesystemEvent, None, None]:
        return _sync_iter(self._h.events())

    def stop(self) -> None:
        _loop.run(self._h.stop())

    def __enter__(self) -> WatchHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return repr(self._h)[len("Async"):]


class PortForward:
    """The blocking view of an :class:`AsyncPortForward`: a local TCP listener bridged to a
    guest port until :meth:`close` (or the end of a ``with`` block, or the sandbox's kill)."""

    def __init__(self, forward: AsyncPortForward) -> None:
        self._f = forward

    @property
    def host(self) -> str:
        return self._f.host

    @property
    def port(self) -> int:
        return self._f.port

    @property
    def address(self) -> str:
        return self._f.address

    @property
    def guest_port(self) -> int:
        return self._f.guest_port

    @property
    def closed(self) -> bool:
        return self._f.closed

    def close(self) -> None:
        # The forward lives on threads of its own: closing it needs no event loop.
        self._f._forwarder.close()

    def __enter__(self) -> PortForward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return repr(self._f)[len("Async"):]


class Ports:
    """The blocking ``sandbox.ports`` (:class:`AsyncPorts`)."""

    def __init__(self, ports: AsyncPorts) -> None:
        self._p = ports

    def url(self, port: int) -> str:
        """As :meth:`AsyncPorts.url`."""
        return self._p.url(port)

    def headers(self) -> Dict[str, str]:
        return self._p.headers()

    def forward(self, guest_port: int, *, host: str = "127.0.0.1", port: int = 0) -> PortForward:
        """As :meth:`AsyncPorts.forward`."""
        return PortForward(_loop.run(self._p.forward(guest_port, host=host, port=port)))


class Sandbox:
    """A sandbox, blocking: ``Sandbox(...)`` creates it (same arguments as
    :meth:`AsyncSandbox.create`). Every instance runs on the package's one background
    event-loop thread."""

    def __init__(self, snapshot: Optional[str] = None, timeout: float = 300,
                 envs: Optional[Mapping[str, str]] = None, metadata: Optional[Mapping[str, str]] = None,
                 url: Optional[str] = None, token: Optional[str] = None, pool: Optional[str] = None, *,
                 binary: Optional[str] = None, start_timeout: float = DEFAULT_START_TIMEOUT,
                 grace: float = DEFAULT_GRACE, agentvm_args: Sequence[str] = (),
                 template: Optional[str] = None, snapshot_dir: Optional[str] = None,
                 egress: Optional[Mapping[str, Sequence[str]]] = None) -> None:
        self._sb: AsyncSandbox = _loop.run(AsyncSandbox.create(
            snapshot, timeout, envs, metadata, url, token, pool, binary=binary, start_timeout=start_timeout,
            grace=grace, agentvm_args=agentvm_args, template=template, snapshot_dir=snapshot_dir, egress=egress))
        self.commands = Commands(self._sb.commands)
        self.files = Files(self._sb.files)
        self.pty = Pty(self._sb.pty)
        self.ports = Ports(self._sb.ports)

    @classmethod
    def create(cls, snapshot: Optional[str] = None, timeout: float = 300,
               envs: Optional[Mapping[str, str]] = None, metadata: Optional[Mapping[str, str]] = None,
               url: Optional[str] = None, token: Optional[str] = None, pool: Optional[str] = None, *,
               binary: Optional[str] = None, start_timeout: float = DEFAULT_START_TIMEOUT,
               grace: float = DEFAULT_GRACE, agentvm_args: Sequence[str] = (),
               template: Optional[str] = None, snapshot_dir: Optional[str] = None,
               egress: Optional[Mapping[str, Sequence[str]]] = None) -> Sandbox:
        return cls(snapshot, timeout, envs, metadata, url, token, pool, binary=binary, start_timeout=start_timeout,
                   grace=grace, agentvm_args=agentvm_args, template=template, snapshot_dir=snapshot_dir,
                   egress=egress)

    @classmethod
    def _wrap(cls, sandbox: AsyncSandbox) -> Sandbox:
        obj = cls.__new__(cls)
        obj._sb = sandbox
        obj.commands = Commands(sandbox.commands)
        obj.files = Files(sandbox.files)
        obj.pty = Pty(sandbox.pty)
        obj.ports = Ports(sandbox.ports)
        return obj

    @classmethod
    def resume(cls, sandbox_id: str, *, url: Optional[str] = None, token: Optional[str] = None,
               timeout: float = 300, envs: Optional[Mapping[str, str]] = None,
               binary: Optional[str] = None, start_timeout: float = DEFAULT_START_TIMEOUT,
               grace: float = DEFAULT_GRACE, agentvm_args: Sequence[str] = (),
               snapshot_dir: Optional[str] = None) -> Sandbox:
        """As :meth:`AsyncSandbox.resume`."""
        return cls._wrap(_loop.run(AsyncSandbox.resume(
            sandbox_id, url=url, token=token, timeout=timeout, envs=envs, binary=binary,
            start_timeout=start_timeout, grace=grace, agentvm_args=agentvm_args, snapshot_dir=snapshot_dir)))

    @classmethod
    def list(cls, *, url: Optional[str] = None, token: Optional[str] = None) -> SandboxList:
        """As :meth:`AsyncSandbox.list`."""
        return _loop.run(AsyncSandbox.list(url=url, token=token))

    def fork(self, count: int = 1, *, start_timeout: float = DEFAULT_START_TIMEOUT) -> List[Sandbox]:
        """As :meth:`AsyncSandbox.fork`."""
        return [Sandbox._wrap(child) for child in _loop.run(self._sb.fork(count, start_timeout=start_timeout))]

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

    def run_code(self, code: str, language: Optional[str] = None, context: Optional[ContextRef] = None,
                 timeout: Optional[float] = None, *, on_stdout: Optional[Output] = None,
                 on_stderr: Optional[Output] = None, on_display: Optional[OnDisplay] = None,
                 max_output: Optional[int] = None, request_timeout: Optional[float] = None) -> Execution:
        return _loop.run(self._sb.run_code(code, language, context, timeout, on_stdout=on_stdout, on_stderr=on_stderr,
                                           on_display=on_display, max_output=max_output,
                                           request_timeout=request_timeout))

    def create_code_context(self, language: str = "python", cwd: Optional[str] = None) -> CodeContext:
        return _loop.run(self._sb.create_code_context(language, cwd))

    def list_code_contexts(self) -> List[CodeContext]:
        return _loop.run(self._sb.list_code_contexts())

    def restart_code_context(self, context: ContextRef) -> None:
        _loop.run(self._sb.restart_code_context(context))

    def remove_code_context(self, context: ContextRef) -> None:
        _loop.run(self._sb.remove_code_context(context))

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
