"""Processes as objects, on asyncio (docs/protocol.md, "Processes"): commands started by
``spawn`` outlive the call that started them, sit in the agent's table found by pid or tag from
any connection, and are followed by ``attach`` calls, which never end by themselves. This is
the process half of ``sandbox.commands`` (spawn, connect, list, send_stdin, close_stdin, kill)
and ``sandbox.pty``.

A snapshot (``fork``, ``pause``) waits until every call sent before it has answered, an
attachment included, so a sandbox object's attachments are detached for it and attached again
after (``replay`` false: output written meanwhile is not seen by them); see
:func:`attachments_suspended`.
"""
from __future__ import annotations

import asyncio
import codecs
import weakref
from typing import (TYPE_CHECKING, Any, AsyncGenerator, Callable, Dict, List, Mapping, Optional, Sequence, Set,
                    Tuple, Union)

from . import _validate as valid
from ._common import MAX_CALL_TIMEOUT, cancel_quietly, put_bytes
from .errors import AgentvmError, NotFound, SandboxDied, Timeout
from .models import ProcessInfo, ProcessResult, byte_field

if TYPE_CHECKING:  # pragma: no cover
    from ._lifecycle import AsyncSandbox

# A process is named by its guest pid (int) or the tag its spawn gave it (str).
PidOrTag = Union[int, str]
# Streamed output: str chunks (stdout, stderr) or a pty's raw bytes; what it returns is ignored.
Output = Callable[[str], object]
PtyOutput = Callable[[bytes], object]
Signal = Union[str, int]

MAX_TAG_BYTES = 256
MAX_PTY_SIDE = 4096
# docs/protocol.md, "signal": the signals a client may send, by name, and their Linux numbers.
SIGNALS = {"HUP": 1, "INT": 2, "QUIT": 3, "KILL": 9, "USR1": 10, "USR2": 12, "PIPE": 13, "ALRM": 14, "TERM": 15,
           "CONT": 18, "STOP": 19}

# The attachments each sandbox object holds, detached around its snapshots.
_attached: "weakref.WeakKeyDictionary[AsyncSandbox, Set[AsyncProcess]]" = weakref.WeakKeyDictionary()


# -- arguments --------------------------------------------------------------------------------


def selector(value: Any, name: str = "pid_or_tag") -> Dict[str, Any]:
    """``{"pid": N}`` or ``{"tag": T}``: how the protocol names a process."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a pid (int) or a tag (str), not bool")
    if isinstance(value, int):
        if not 0 < value <= 0x7FFFFFFF:
            raise ValueError(f"{name} must be a positive pid, not {value}")
        return {"pid": value}
    if isinstance(value, str):
        return {"tag": tag(value, name)}
    raise TypeError(f"{name} must be a pid (int) or a tag (str), not {type(value).__name__}")


def tag(value: Any, name: str = "tag") -> str:
    valid.text(name, value)
    if len(value.encode("utf-8")) > MAX_TAG_BYTES:
        raise ValueError(f"{name} is at most {MAX_TAG_BYTES} bytes")
    return str(value)


def argv(cmd: Any) -> List[str]:
    """A str is a bash command line (``["bash", "-c", cmd]``), a list or tuple of str an argv."""
    if isinstance(cmd, str):
        return ["bash", "-c", valid.text("cmd", cmd)]
    if isinstance(cmd, (list, tuple)):
        if not cmd:
            raise ValueError("cmd must not be an empty list")
        return [valid.text(f"cmd[{i}]", a, empty_ok=i > 0) for i, a in enumerate(cmd)]
    raise TypeError(f"cmd must be a str (a bash command line) or a list of str (argv), not {type(cmd).__name__}")


def signal_name(value: Any) -> str:
    """The protocol's name of a signal given as ``"TERM"``, ``"SIGTERM"`` or its number."""
    if isinstance(value, bool):
        raise TypeError("signal must be a name ('TERM') or a number, not bool")
    if isinstance(value, int):  # signal.Signals members too
        for name, number in SIGNALS.items():
            if number == value:
                return name
    elif isinstance(value, str):
        name = value.upper()
        name = name[3:] if name.startswith("SIG") else name
        if name in SIGNALS:
            return name
    else:
        raise TypeError(f"signal must be a name ('TERM') or a number, not {type(value).__name__}")
    raise ValueError(f"signal {value!r} is not one of {', '.join(SIGNALS)} (or its number)")


def pty_side(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not 1 <= value <= MAX_PTY_SIDE:
        raise ValueError(f"{name} must be from 1 to {MAX_PTY_SIDE}, not {value}")
    return value


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be bool, not {type(value).__name__}")
    return value


# -- a process ------------------------------------------------------------------------------------


class _Attach:
    """One ``attach`` call: its task, what :meth:`Transport.cancel` takes (``ref``), and
    whether the ``attached`` event came."""

    def __init__(self, task: "asyncio.Task[Dict[str, Any]]", ref: "asyncio.Future[Any]",
                 attached: "asyncio.Future[None]") -> None:
        self.task = task
        self.ref = ref
        self.attached = attached


class AsyncProcess:
    """A process of the sandbox's table, followed by an ``attach`` call from here on: its
    output goes to the callbacks, :attr:`stdout`/:attr:`stderr` and :meth:`iter_output`, and
    :meth:`wait` gives how it ended. :meth:`disconnect` only stops following it."""

    def __init__(self, sandbox: AsyncSandbox, named: Dict[str, Any], *, tag: Optional[str], pty: bool,
                 on_stdout: Optional[Output], on_stderr: Optional[Output], on_data: Optional[PtyOutput]) -> None:
        loop = asyncio.get_running_loop()
        self._sb = sandbox
        self._named = named
        self._pid = int(named.get("pid", 0))
        self._tag = tag
        self._pty = pty
        self._parts: Dict[str, List[bytes]] = {"stdout": [], "stderr": []}
        self._decoders = {s: codecs.getincrementaldecoder("utf-8")(errors="replace") for s in ("stdout", "stderr")}
        self._callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        self._on_data = on_data
        self._queue: "asyncio.Queue[Optional[Tuple[str, str]]]" = asyncio.Queue()
        self._callback_error: Optional[BaseException] = None
        self._lost = 0
        self._result: "asyncio.Future[ProcessResult]" = loop.create_future()
        self._attach: Optional[_Attach] = None
        self._suspended = False  # detached for a snapshot: attached again after it

    # -- following it -------------------------------------------------------------------------

    async def _follow(self, replay: bool) -> None:
        """Starts an ``attach`` call and returns once it is attached (its errors raised)."""
        loop = asyncio.get_running_loop()
        transport = self._sb._transport
        ref: "asyncio.Future[Any]" = loop.create_future()
        attached: "asyncio.Future[None]" = loop.create_future()
        body: Dict[str, Any] = dict(self._named)
        body["replay"] = replay
        body["stream"] = transport.stream_value(True)

        def on_ref(r: Any) -> None:
            if not ref.done():
                ref.set_result(r)

        def on_event(msg: Dict[str, Any]) -> None:
            event = msg.get("event")
            if event == "attached":
                self._pid = int(msg.get("pid") or self._pid)
                self._named = {"pid": self._pid}
                if not attached.done():
                    attached.set_result(None)
            elif event == "lost":
                self._lost += int(msg.get("bytes") or 0)
            elif event in ("stdout", "stderr", "pty"):
                self._output(str(event), byte_field(msg, "data") or b"")

        async def call() -> Dict[str, Any]:
            try:
                return await transport.call("attach", body, on_event=on_event, soft_timeout=MAX_CALL_TIMEOUT,
                                            on_ref=on_ref)
            except asyncio.CancelledError:
                # Given up on (the loop ending, the caller cancelled): detach in the guest too,
                # or the attachment would hold up the sandbox's snapshots.
                if ref.done() and ref.result() is not None:
                    loop.create_task(cancel_quietly(transport, ref.result()))
                raise

        task = loop.create_task(call())
        self._attach = _Attach(task, ref, attached)
        _attached.setdefault(self._sb, set()).add(self)
        task.add_done_callback(self._attach_ended)
        first: "Set[asyncio.Future[Any]]" = {attached, task}
        await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
        if not attached.done():
            if task.cancelled():
                raise AgentvmError("detached", "the attach call was cancelled before it attached")
            error = task.exception()
            if error is not None:
                raise error
            raise AgentvmError("bad_answer", "the attach call answered without attaching")

    def _output(self, stream: str, data: bytes) -> None:
        if stream == "pty":
            self._pty = True
        kept = "stdout" if stream == "pty" else stream
        self._parts[kept].append(data)
        if stream == "pty" and self._on_data is not None and self._callback_error is None:
            try:
                self._on_data(data)
            except BaseException as e:  # raised by wait()
                self._callback_error = e
        self._emit(stream, kept, self._decoders[kept].decode(data))

    def _emit(self, stream: str, kept: str, text: str) -> None:
        if not text:
            return
        self._queue.put_nowait((stream, text))
        cb = self._callbacks[kept]
        if cb is not None and self._callback_error is None:
            try:
                cb(text)
            except BaseException as e:  # raised by wait()
                self._callback_error = e

    def _attach_ended(self, task: "asyncio.Task[Dict[str, Any]]") -> None:
        error = None if task.cancelled() else task.exception()
        if error is not None:
            return self._end(error=error)
        if task.cancelled() or task.result().get("detached"):
            if not self._suspended:
                self._end(error=AgentvmError("detached", f"process {self._pid} was disconnected from (it runs on): "
                                             "commands.connect() follows it again"))
            return
        self._end(result=task.result())

    def _end(self, *, result: Optional[Dict[str, Any]] = None, error: Optional[BaseException] = None) -> None:
        live = _attached.get(self._sb)
        if live is not None:
            live.discard(self)
        if self._result.done():
            return
        for kept, decoder in self._decoders.items():
            self._emit("pty" if self._pty else kept, kept, decoder.decode(b"", final=True))
        self._queue.put_nowait(None)
        if result is not None:
            self._result.set_result(ProcessResult.from_response(result, self._data("stdout"), self._data("stderr"),
                                                                self._lost))
        else:
            self._result.set_exception(error or AgentvmError("detached", "the process is no longer followed"))
            self._result.exception()  # retrieved: nobody may wait

    def _data(self, stream: str) -> bytes:
        return b"".join(self._parts[stream])

    # -- around a snapshot ------------------------------------------------------------------------

    async def _suspend(self) -> None:
        self._suspended = True
        await self._detach()

    async def _unsuspend(self, ended: Optional[BaseException]) -> None:
        """After the snapshot: attached again, or ended with ``ended`` (the sandbox paused)."""
        self._suspended = False
        if self._result.done():
            return
        if ended is not None:
            return self._end(error=ended)
        try:
            await self._follow(replay=False)
        except AgentvmError as e:
            self._end(error=e)

    # -- the API --------------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        """The process's pid in the guest."""
        return self._pid

    @property
    def tag(self) -> Optional[str]:
        """The tag it was spawned or connected to with (None if not known here)."""
        return self._tag

    @property
    def stdout(self) -> str:
        """Its stdout so far (a pty's output), as received by this object's attachments."""
        return self._data("stdout").decode("utf-8", errors="replace")

    @property
    def stderr(self) -> str:
        return self._data("stderr").decode("utf-8", errors="replace")

    @property
    def lost_bytes(self) -> int:
        """Output bytes this object missed by falling behind (the agent's ``lost`` events)."""
        return self._lost

    @property
    def exit_code(self) -> Optional[int]:
        """Its exit code once it has ended and this object knows it (None before, or when a
        signal ended it)."""
        if self._result.done() and self._result.exception() is None:
            return self._result.result().exit_code
        return None

    def done(self) -> bool:
        """True once it has ended, or this object stopped following it."""
        return self._result.done()

    async def wait(self, timeout: Optional[float] = None) -> ProcessResult:
        """How it ended, once it has. ``timeout`` (seconds) bounds the wait (then
        :class:`Timeout`; it runs on). After :meth:`disconnect`: :class:`AgentvmError`
        (``detached``); the sandbox dying or pausing: :class:`SandboxDied`. An exception a
        callback raised is raised here."""
        if timeout is not None:
            valid.number("timeout", timeout, low=0, high=MAX_CALL_TIMEOUT)
        try:
            result = await asyncio.wait_for(asyncio.shield(self._result), timeout)
        except asyncio.TimeoutError:
            raise Timeout(f"process {self._pid} did not end within {timeout:g} s") from None
        if self._callback_error is not None:
            raise self._callback_error
        return result

    async def iter_output(self) -> AsyncGenerator[Tuple[str, str], None]:
        """``("stdout"|"stderr"|"pty", text)`` chunks as they come, until it ends or is
        disconnected from. One consumer only."""
        while True:
            item = await self._queue.get()
            if item is None:
                self._queue.put_nowait(None)  # later iterations end at once too
                return
            yield item

    async def send_stdin(self, data: Union[str, bytes]) -> None:
        """Queues ``data`` for its stdin (or pty); see :meth:`AsyncProcessCommands.send_stdin`."""
        await send_stdin(self._sb, {"pid": self._pid}, valid.bytes_of("data", data))

    async def close_stdin(self) -> None:
        """Closes its stdin once what was queued is written (it then reads end of file)."""
        await _call(self._sb, "close_stdin", {"pid": self._pid})

    async def kill(self, signal: Signal = "KILL", *, group: bool = True) -> bool:
        """Sends ``signal`` to its process group (``group=False``: to it alone). False when it
        is no longer running. :meth:`wait` then says how it ended."""
        return await kill(self._sb, {"pid": self._pid}, signal_name(signal), _flag("group", group))

    async def resize(self, rows: int, cols: int) -> None:
        """Sets its pty's size (it gets SIGWINCH); :class:`AgentError` ``bad_field`` without a pty."""
        await _call(self._sb, "resize", {"pid": self._pid, "rows": pty_side("rows", rows),
                                         "cols": pty_side("cols", cols)})

    async def disconnect(self) -> None:
        """Stops following it (cancels the attach call): it runs on, and :meth:`wait` raises
        ``detached``. ``commands.connect`` follows it again."""
        await self._detach()

    async def _detach(self) -> None:
        attach = self._attach
        if attach is None or attach.task.done():
            return
        await asyncio.wait({attach.ref, attach.task}, return_when=asyncio.FIRST_COMPLETED)
        if not attach.task.done():
            ref = attach.ref.result()
            cancelled = False
            if ref is not None:
                try:
                    await self._sb._transport.cancel(ref)
                    cancelled = True
                except AgentvmError:
                    pass
            if not cancelled:
                # No way to name it (serve sent no call seq): ending the request detaches it.
                attach.task.cancel()
        await asyncio.wait({attach.task})

    def __repr__(self) -> str:
        state = "running" if not self.done() else "ended"
        return f"AsyncProcess(pid={self._pid}, tag={self._tag!r}, {state})"


# -- sandbox.commands and sandbox.pty ----------------------------------------------------------


async def _call(sandbox: AsyncSandbox, op: str, body: Dict[str, Any]) -> Dict[str, Any]:
    sandbox._check_alive()
    return await sandbox._transport.call(op, body, soft_timeout=0.0)


async def send_stdin(sandbox: AsyncSandbox, named: Dict[str, Any], data: bytes) -> None:
    body = dict(named)
    put_bytes(body, "data", data)
    await _call(sandbox, "send_stdin", body)


async def kill(sandbox: AsyncSandbox, named: Dict[str, Any], signal: str, group: bool) -> bool:
    try:
        await _call(sandbox, "signal", {**named, "signal": signal, "group": group})
    except NotFound:
        return False
    return True


async def connect(sandbox: AsyncSandbox, named: Dict[str, Any], *, tag: Optional[str], pty: bool, replay: bool,
                  on_stdout: Optional[Output], on_stderr: Optional[Output],
                  on_data: Optional[PtyOutput]) -> AsyncProcess:
    sandbox._check_alive()
    process = AsyncProcess(sandbox, named, tag=tag, pty=pty, on_stdout=on_stdout, on_stderr=on_stderr,
                           on_data=on_data)
    await process._follow(replay)
    return process


async def spawn(sandbox: AsyncSandbox, cmd: Any, *, envs: Optional[Mapping[str, str]], cwd: Optional[str],
                tag_: Optional[str], stdin: bool, pty: Optional[Tuple[int, int]], timeout: Optional[float],
                on_stdout: Optional[Output], on_stderr: Optional[Output],
                on_data: Optional[PtyOutput]) -> AsyncProcess:
    """``spawn``, then ``attach`` with replay from its start, so callbacks see all of it."""
    body: Dict[str, Any] = {"argv": argv(cmd)}
    call_envs = valid.envs("envs", envs)
    if call_envs:
        body["env"] = call_envs
    if cwd is not None:
        body["cwd"] = valid.path(cwd)
    if tag_ is not None:
        body["tag"] = tag(tag_)
    if _flag("stdin", stdin):
        body["stdin"] = True
    if pty is not None:
        body["pty"] = {"rows": pty_side("rows", pty[0]), "cols": pty_side("cols", pty[1])}
    if timeout is not None:
        body["timeout"] = valid.number("timeout", timeout, low=0, high=MAX_CALL_TIMEOUT)
    for name, cb in (("on_stdout", on_stdout), ("on_stderr", on_stderr), ("on_data", on_data)):
        valid.callback(name, cb)
    msg = await _call(sandbox, "spawn", body)
    return await connect(sandbox, {"pid": int(msg["pid"])}, tag=tag_, pty=pty is not None, replay=True,
                         on_stdout=on_stdout, on_stderr=on_stderr, on_data=on_data)


class AsyncProcessCommands:
    """The process half of ``sandbox.commands`` (AsyncCommands has it): processes that outlive
    the call that started them, named by pid or tag."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    async def spawn(self, cmd: Union[str, Sequence[str]], *, envs: Optional[Mapping[str, str]] = None,
                    cwd: Optional[str] = None, tag: Optional[str] = None, stdin: bool = False,
                    timeout: Optional[float] = None, on_stdout: Optional[Output] = None,
                    on_stderr: Optional[Output] = None) -> AsyncProcess:
        """Starts ``cmd`` (a str runs as ``bash -c``, without the persistent shell's state; a
        list is an argv) as a process of the sandbox's table, and follows it. ``tag`` names it
        (unique among running ones: ``AgentError`` ``exists``); ``stdin=True`` gives it a pipe
        that :meth:`send_stdin` feeds (else ``/dev/null``); ``timeout`` (seconds) kills it
        when it passes (default: none). The sandbox's envs are added to ``envs``."""
        return await spawn(self._sb, cmd, envs=envs, cwd=cwd, tag_=tag, stdin=stdin, pty=None, timeout=timeout,
                           on_stdout=on_stdout, on_stderr=on_stderr, on_data=None)

    async def list(self) -> List[ProcessInfo]:
        """The sandbox's processes (running ones, and those that ended in the last 600 s, the
        newest 256), in the order they started."""
        msg = await _call(self._sb, "list_processes", {})
        return [ProcessInfo.from_response(entry) for entry in msg.get("processes") or []]

    async def connect(self, pid_or_tag: PidOrTag, *, on_stdout: Optional[Output] = None,
                      on_stderr: Optional[Output] = None, replay: bool = True) -> AsyncProcess:
        """Follows a process of the sandbox's table (started here or elsewhere): ``replay``
        starts with the oldest output it keeps (1 MiB by default), else with what comes next.
        :class:`NotFound` when there is no such process."""
        named = selector(pid_or_tag)
        valid.callback("on_stdout", on_stdout)
        valid.callback("on_stderr", on_stderr)
        return await connect(self._sb, named, tag=named.get("tag"), pty=False, replay=_flag("replay", replay),
                             on_stdout=on_stdout, on_stderr=on_stderr, on_data=None)

    async def send_stdin(self, pid_or_tag: PidOrTag, data: Union[str, bytes]) -> None:
        """Queues ``data`` for the process's stdin (it reads it in the order sent). Errors:
        :class:`NotFound` (no such running process), ``AgentError`` ``stdin_closed`` (spawned
        without ``stdin``, or closed), ``limit`` (8 MiB wait unread)."""
        await send_stdin(self._sb, selector(pid_or_tag), valid.bytes_of("data", data))

    async def close_stdin(self, pid_or_tag: PidOrTag) -> None:
        """Closes the process's stdin once what was queued is written."""
        await _call(self._sb, "close_stdin", selector(pid_or_tag))

    async def kill(self, pid_or_tag: PidOrTag, signal: Signal = "KILL", *, group: bool = True) -> bool:
        """Sends ``signal`` (``"TERM"``, ``"SIGTERM"``, 15; default KILL) to the process's
        group (``group=False``: the process alone). False when there is no such running process."""
        return await kill(self._sb, selector(pid_or_tag), signal_name(signal), _flag("group", group))


class AsyncPty:
    """``sandbox.pty``: processes on a pseudo-terminal."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    async def create(self, *, rows: int = 24, cols: int = 80, cmd: Union[str, Sequence[str]] = "bash -i",
                     envs: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None, tag: Optional[str] = None,
                     on_data: Optional[PtyOutput] = None, timeout: Optional[float] = None) -> AsyncProcess:
        """Starts ``cmd`` (a str runs as ``bash -c``) on a terminal of ``rows`` x ``cols``
        (its stdin, stdout and stderr; ``TERM`` is ``xterm-256color`` unless ``envs`` sets it)
        and follows it: ``on_data`` gets its output as bytes. Input goes through
        :meth:`send_stdin` (end of input is ``"\\x04"``)."""
        return await spawn(self._sb, cmd, envs=envs, cwd=cwd, tag_=tag, stdin=False, pty=(rows, cols),
                           timeout=timeout, on_stdout=None, on_stderr=None, on_data=on_data)

    async def send_stdin(self, pid_or_tag: PidOrTag, data: Union[str, bytes]) -> None:
        """Queues ``data`` as the terminal's input."""
        await send_stdin(self._sb, selector(pid_or_tag), valid.bytes_of("data", data))

    async def resize(self, pid_or_tag: PidOrTag, rows: int, cols: int) -> None:
        """Sets the terminal's size (the process gets SIGWINCH)."""
        await _call(self._sb, "resize", {**selector(pid_or_tag), "rows": pty_side("rows", rows),
                                         "cols": pty_side("cols", cols)})

    async def kill(self, pid_or_tag: PidOrTag) -> bool:
        """SIGKILL to the terminal's process group; False when it is no longer running."""
        return await kill(self._sb, selector(pid_or_tag), "KILL", True)


class _Suspended:
    """``async with attachments_suspended(sandbox) as held``: this sandbox object's
    attachments detached while a snapshot is taken (it waits for every call in flight),
    attached again after, or, with ``held.end(error)`` (a pause), ended with it."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox
        self._processes: List[AsyncProcess] = []
        self._ended: Optional[BaseException] = None

    def end(self, error: BaseException) -> None:
        self._ended = error

    async def __aenter__(self) -> "_Suspended":
        self._processes = list(_attached.get(self._sb, ()))
        await asyncio.gather(*(p._suspend() for p in self._processes))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.gather(*(p._unsuspend(self._ended) for p in self._processes))


def attachments_suspended(sandbox: AsyncSandbox) -> _Suspended:
    return _Suspended(sandbox)


def paused_error() -> SandboxDied:
    return SandboxDied("paused", "the sandbox was paused: resume it and connect to the process again")
