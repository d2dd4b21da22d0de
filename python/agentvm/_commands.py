"""Running things in a sandbox, on asyncio: commands (``sandbox.commands``: shell or argv, in
the foreground or the background) and code cells (``sandbox.run_code``), with their output
streamed to callbacks."""
from __future__ import annotations

import asyncio
import codecs
import os
import shlex
from typing import (TYPE_CHECKING, Any, AsyncGenerator, Callable, Dict, List, Literal, Mapping, Optional,
                    Sequence, Tuple, Union, overload)

from . import _contexts as contexts
from . import _validate as valid
from ._common import DEFAULT_CALL_TIMEOUT, MAX_CALL_TIMEOUT, OnEvent, Transport, put_bytes
from ._contexts import ContextRef
from ._processes import AsyncProcessCommands
from .errors import AgentvmError, CommandFailed, Timeout
from .models import CodeContext, CommandResult, Execution, byte_field

if TYPE_CHECKING:  # pragma: no cover
    from ._lifecycle import AsyncSandbox

# A callback of streamed output: called with each str chunk; what it returns is ignored.
Output = Callable[[str], object]
# A callback of a run_code cell's display() calls: called with each one's forms by MIME type.
OnDisplay = Callable[[Dict[str, Any]], object]


class Collector:
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


def _streaming(transport: Transport, body: Dict[str, Any], on_stdout: Optional[Output],
               on_stderr: Optional[Output]) -> Optional[Collector]:
    """The collector of a call's output when the transport streams it (then ``body`` asks
    for that), else None: the answer carries the output."""
    stream = transport.stream_value(on_stdout is not None or on_stderr is not None)
    if stream is None:
        return None
    body["stream"] = stream
    return Collector(on_stdout, on_stderr)


def _on_event(collector: Optional[Collector]) -> Optional[OnEvent]:
    return None if collector is None else collector.on_event


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


def _exec_body(argv: List[str], envs: Dict[str, str], cwd: Optional[str], stdin: Optional[bytes],
               max_output: Optional[int]) -> Dict[str, Any]:
    body: Dict[str, Any] = {"argv": argv}
    if envs:
        body["env"] = envs
    if cwd is not None:
        body["cwd"] = cwd
    if stdin is not None:
        put_bytes(body, "stdin", stdin)
    if max_output is not None:
        body["max_output"] = max_output
    return body


class AsyncCommandHandle:
    """A command started with ``background=True``: an ``exec`` call that streams its output
    and runs until it ends, its ``timeout`` passes, or :meth:`kill`."""

    def __init__(self, sandbox: AsyncSandbox, body: Dict[str, Any], timeout: float,
                 on_stdout: Optional[Output], on_stderr: Optional[Output]) -> None:
        loop = asyncio.get_running_loop()
        self._sandbox = sandbox
        self._queue: "asyncio.Queue[Optional[Tuple[str, str]]]" = asyncio.Queue()
        self._collector = Collector(on_stdout, on_stderr, self._queue)
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
            valid.number("timeout", timeout, low=0, high=MAX_CALL_TIMEOUT)
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


class AsyncCommands(AsyncProcessCommands):
    """``sandbox.commands``: ``run`` here, the process half (spawn, connect, list, ...) from
    _processes.py."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    @overload
    async def run(self, cmd: Union[str, Sequence[str]], *, timeout: Optional[float] = None,
                  envs: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                  stdin: Optional[Union[bytes, str]] = None, background: Literal[False] = False,
                  on_stdout: Optional[Output] = None, on_stderr: Optional[Output] = None,
                  max_output: Optional[int] = None, check: bool = False,
                  request_timeout: Optional[float] = None) -> CommandResult: ...

    @overload
    async def run(self, cmd: Union[str, Sequence[str]], *, timeout: Optional[float] = None,
                  envs: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                  stdin: Optional[Union[bytes, str]] = None, background: Literal[True],
                  on_stdout: Optional[Output] = None, on_stderr: Optional[Output] = None,
                  max_output: Optional[int] = None, check: bool = False,
                  request_timeout: Optional[float] = None) -> AsyncCommandHandle: ...

    @overload
    async def run(self, cmd: Union[str, Sequence[str]], *, timeout: Optional[float] = None,
                  envs: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                  stdin: Optional[Union[bytes, str]] = None, background: bool = False,
                  on_stdout: Optional[Output] = None, on_stderr: Optional[Output] = None,
                  max_output: Optional[int] = None, check: bool = False,
                  request_timeout: Optional[float] = None) -> Union[CommandResult, AsyncCommandHandle]: ...

    async def run(self, cmd: Union[str, Sequence[str]], *, timeout: Optional[float] = None,
                  envs: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                  stdin: Optional[Union[bytes, str]] = None, background: bool = False,
                  on_stdout: Optional[Output] = None, on_stderr: Optional[Output] = None,
                  max_output: Optional[int] = None, check: bool = False,
                  request_timeout: Optional[float] = None) -> Union[CommandResult, AsyncCommandHandle]:
        """Runs a command; see the package README. Returns a :class:`CommandResult`, or an
        :class:`AsyncCommandHandle` with ``background=True``."""
        shell_line: Optional[str] = None  # None: an argv command
        if isinstance(cmd, str):
            shell_line = valid.text("cmd", cmd)
            argv = ["bash", "-c", shell_line]  # what it runs as in the background
        elif isinstance(cmd, (list, tuple)):
            if not cmd:
                raise ValueError("cmd must not be an empty list")
            argv = [valid.text(f"cmd[{i}]", a, empty_ok=i > 0) for i, a in enumerate(cmd)]
        else:
            raise TypeError(f"cmd must be a str (a shell command line) or a list of str (argv), "
                            f"not {type(cmd).__name__}")
        t = None if timeout is None else valid.number("timeout", timeout, low=0, high=MAX_CALL_TIMEOUT)
        rt = None if request_timeout is None else valid.number("request_timeout", request_timeout, low=0,
                                                               high=MAX_CALL_TIMEOUT)
        call_envs = valid.envs("envs", envs)
        if cwd is not None:
            cwd = valid.text("cwd", os.fspath(cwd) if isinstance(cwd, os.PathLike) else cwd)
        stdin_bytes = None if stdin is None else valid.bytes_of("stdin", stdin)
        mo = valid.max_output(max_output)
        valid.callback("on_stdout", on_stdout)
        valid.callback("on_stderr", on_stderr)
        if not isinstance(check, bool) or not isinstance(background, bool):
            raise TypeError("check and background must be bool")
        if background and check:
            raise ValueError("check=True has no meaning with background=True (check the result of wait())")
        if shell_line is not None and stdin_bytes is not None and not background:
            raise ValueError("stdin needs an argv command (a list): shell calls read /dev/null")
        sb = self._sb
        sb._check_alive()
        transport = sb._transport

        if background:
            body = _exec_body(argv, call_envs, cwd, stdin_bytes, mo)
            bt = t if t is not None else MAX_CALL_TIMEOUT
            body["timeout"] = bt
            body["stream"] = transport.stream_value(True)
            handle = AsyncCommandHandle(sb, body, bt, on_stdout, on_stderr)
            await handle._started()
            if handle.done():
                error = handle._task.exception()
                if error is not None:
                    raise error
            return handle

        ct = t if t is not None else DEFAULT_CALL_TIMEOUT
        if shell_line is None:
            body = _exec_body(argv, call_envs, cwd, stdin_bytes, mo)
        else:
            line = shell_line if (not call_envs and cwd is None) else _shell_wrap(shell_line, call_envs, cwd)
            body = {"cmd": line}
            if mo is not None:
                body["max_output"] = mo
        body["timeout"] = ct
        collector = _streaming(transport, body, on_stdout, on_stderr)
        msg = await transport.call("exec" if shell_line is None else "shell", body, on_event=_on_event(collector),
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


async def run_code(sandbox: AsyncSandbox, code: str, language: Optional[str], context: Optional[ContextRef],
                   timeout: Optional[float], *, on_stdout: Optional[Output], on_stderr: Optional[Output],
                   on_display: Optional[OnDisplay], max_output: Optional[int],
                   request_timeout: Optional[float]) -> Execution:
    """``sandbox.run_code``: a cell in a persistent interpreter, ``context``'s or the default
    one of ``language`` (default Python)."""
    valid.text("code", code, empty_ok=True)
    lang = None if language is None else contexts.language(language)
    ctx = None if context is None else contexts.context_id(context)
    if isinstance(context, CodeContext) and lang is not None and lang != context.language:
        raise ValueError(f"language {lang!r} is not the context's ({context.language!r})")
    ct = DEFAULT_CALL_TIMEOUT if timeout is None else valid.number("timeout", timeout, low=0, high=MAX_CALL_TIMEOUT)
    rt = None if request_timeout is None else valid.number("request_timeout", request_timeout, low=0,
                                                           high=MAX_CALL_TIMEOUT)
    mo = valid.max_output(max_output)
    valid.callback("on_stdout", on_stdout)
    valid.callback("on_stderr", on_stderr)
    valid.callback("on_display", on_display)
    sandbox._check_alive()
    transport = sandbox._transport
    body: Dict[str, Any] = {"code": code, "timeout": ct}
    if lang is not None:
        body["language"] = lang
    if ctx is not None:
        body["context"] = ctx
    if mo is not None:
        body["max_output"] = mo
    collector = _streaming(transport, body, on_stdout, on_stderr)
    displays: List[Dict[str, Any]] = []
    errors: List[BaseException] = []

    def on_event(msg: Dict[str, Any]) -> None:
        # display events come whether or not the call streams its output.
        if msg.get("event") == "display":
            forms = msg.get("formats")
            forms = dict(forms) if isinstance(forms, dict) else {}
            displays.append(forms)
            if on_display is not None and not errors:
                try:
                    on_display(forms)
                except BaseException as e:  # re-raised once the call has answered
                    errors.append(e)
        elif collector is not None:
            collector.on_event(msg)

    msg = await transport.call("run_code", body, on_event=on_event, soft_timeout=ct + 2.0, hard_timeout=rt)
    if collector is not None:
        collector.finish()
        if collector.error is not None:
            raise collector.error
    if errors:
        raise errors[0]
    if collector is not None:
        return Execution.from_response(msg, collector.data("stdout"), collector.data("stderr"), displays)
    return Execution.from_response(msg, displays=displays)
