"""``files.watch_dir``, on asyncio (docs/protocol.md, "watch"): a ``watch`` call that reports
the changes under a directory as events until it is stopped (a ``cancel`` of the call; serve's
``DELETE …/calls/{seq}``), the directory goes, or the sandbox ends. Like a process's
``attach``, it never ends by itself, and a snapshot waits for every call in flight: a sandbox
object's watches are stopped for its ``fork`` and started again after it, with an ``overflow``
event for the changes they could not see meanwhile; its ``pause`` ends them (see
:func:`watches_suspended`).
"""
from __future__ import annotations

import asyncio
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any, AsyncGenerator, Callable, Deque, Dict, List, Optional, Set

from ._common import MAX_CALL_TIMEOUT, cancel_quietly
from .errors import AgentvmError
from .models import FilesystemEvent, byte_field

if TYPE_CHECKING:  # pragma: no cover
    from ._lifecycle import AsyncSandbox

# A callback of a watch's events: called with each one; what it returns is ignored.
OnFilesystemEvent = Callable[[FilesystemEvent], object]

# Events kept for a reader that falls behind (the agent bounds its side; this bounds ours).
# Past it they are dropped, an ``overflow`` event in their place.
MAX_QUEUED_EVENTS = 100_000
_OVERFLOW = FilesystemEvent(name="", type="overflow")

# The watches each sandbox object runs, stopped around its snapshots.
_watching: "weakref.WeakKeyDictionary[AsyncSandbox, Set[AsyncWatchHandle]]" = weakref.WeakKeyDictionary()


class AsyncWatchHandle:
    """A running watch of ``path``: its events come through :meth:`events` (or go to the
    ``on_event`` callback instead, when one was given) until :meth:`stop`. ``ended`` says why it
    ended once it has: ``cancelled`` (stopped), ``removed`` (the directory was removed or moved
    away), ``closed``, ``paused`` (the sandbox was paused), or ``error`` (the call failed:
    :meth:`events` raises why)."""

    def __init__(self, sandbox: AsyncSandbox, path: str, recursive: bool,
                 on_event: Optional[OnFilesystemEvent]) -> None:
        self._sb = sandbox
        self._path = path
        self._recursive = recursive
        self._on_event = on_event
        self._events: Deque[FilesystemEvent] = deque()
        self._wakeup = asyncio.Event()
        self._task: Optional["asyncio.Task[Dict[str, Any]]"] = None
        self._ref: Optional["asyncio.Future[Any]"] = None
        self._ended: Optional[str] = None
        self._error: Optional[BaseException] = None
        self._callback_error: Optional[BaseException] = None
        self._suspended = False  # stopped for a snapshot: started again after it

    # -- the call -------------------------------------------------------------------------------

    async def _start(self) -> None:
        """Starts the ``watch`` call and returns once its watches are in place (``watching``);
        an error instead of that is raised."""
        loop = asyncio.get_running_loop()
        transport = self._sb._transport
        ref: "asyncio.Future[Any]" = loop.create_future()
        watching: "asyncio.Future[None]" = loop.create_future()
        body: Dict[str, Any] = {"path": self._path, "recursive": self._recursive,
                                "stream": transport.stream_value(True)}

        def on_ref(r: Any) -> None:
            if not ref.done():
                ref.set_result(r)

        def on_event(msg: Dict[str, Any]) -> None:
            event = msg.get("event")
            if event == "watching":
                if not watching.done():
                    watching.set_result(None)
            elif event == "overflow":
                self._deliver(_OVERFLOW)
            elif event == "fs":
                raw = byte_field(msg, "name") or b""
                self._deliver(FilesystemEvent(name=raw.decode("utf-8", errors="replace"), type=str(msg.get("type")),
                                              name_bytes=raw))

        async def call() -> Dict[str, Any]:
            try:
                return await transport.call("watch", body, on_event=on_event, soft_timeout=MAX_CALL_TIMEOUT,
                                            on_ref=on_ref)
            except asyncio.CancelledError:
                # Given up on (the loop ending, the caller cancelled): stop it in the guest too.
                if ref.done() and ref.result() is not None:
                    loop.create_task(cancel_quietly(transport, ref.result()))
                raise

        task = loop.create_task(call())
        self._task, self._ref = task, ref
        _watching.setdefault(self._sb, set()).add(self)
        task.add_done_callback(self._call_ended)
        first: "Set[asyncio.Future[Any]]" = {watching, task}
        await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
        if not watching.done():
            if task.cancelled():
                raise AgentvmError("cancelled", f"the watch of {self._path!r} was cancelled before it started")
            error = task.exception()
            if error is not None:
                raise error
            raise AgentvmError("bad_answer", f"the watch of {self._path!r} answered without watching")

    def _deliver(self, event: FilesystemEvent) -> None:
        if self._on_event is not None:
            if self._callback_error is None:
                try:
                    self._on_event(event)
                except BaseException as e:  # raised by stop()
                    self._callback_error = e
            return
        n = len(self._events)
        if n >= MAX_QUEUED_EVENTS:
            return  # dropped: the overflow queued at the bound says so
        self._events.append(event if n < MAX_QUEUED_EVENTS - 1 else _OVERFLOW)
        self._wakeup.set()

    def _call_ended(self, task: "asyncio.Task[Dict[str, Any]]") -> None:
        if task is not self._task:
            return
        if task.cancelled():
            if not self._suspended:
                self._end("cancelled")
            return
        error = task.exception()
        if error is not None:
            self._end("error", error)
            return
        why = str(task.result().get("ended") or "cancelled")
        if not (self._suspended and why == "cancelled"):
            self._end(why)

    def _end(self, why: str, error: Optional[BaseException] = None) -> None:
        live = _watching.get(self._sb)
        if live is not None:
            live.discard(self)
        if self._ended is None:
            self._ended = why
            self._error = error
        self._wakeup.set()

    async def _cancel_call(self) -> None:
        """Cancels the running call and waits for it to answer."""
        task, ref = self._task, self._ref
        if task is None or ref is None or task.done():
            return
        await asyncio.wait({ref, task}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            cancelled = False
            if ref.result() is not None:
                try:
                    await self._sb._transport.cancel(ref.result())
                    cancelled = True
                except AgentvmError:
                    pass
            if not cancelled:
                # No way to name it (serve sent no call seq): ending the request stops it.
                task.cancel()
        await asyncio.wait({task})

    # -- around a snapshot ------------------------------------------------------------------------

    async def _suspend(self) -> None:
        self._suspended = True
        await self._cancel_call()

    async def _unsuspend(self, ended: Optional[str]) -> None:
        """After the snapshot: watching again (what changed meanwhile is an overflow), or ended
        with ``ended`` (the sandbox paused)."""
        self._suspended = False
        if self._ended is not None:
            return
        if ended is not None:
            return self._end(ended)
        try:
            await self._start()
        except AgentvmError as e:
            return self._end("error", e)
        self._deliver(_OVERFLOW)

    # -- the API --------------------------------------------------------------------------------

    @property
    def path(self) -> str:
        """The watched directory, as given."""
        return self._path

    @property
    def ended(self) -> Optional[str]:
        """None while it runs, else why it ended (see the class)."""
        return self._ended

    def done(self) -> bool:
        return self._ended is not None

    async def get_new_events(self) -> List[FilesystemEvent]:
        """The events that came since the last call (maybe none), without waiting: E2B's way
        of reading a watch. Once the watch failed (with the sandbox, say) and none are left,
        raises why. Empty when ``on_event`` was given."""
        out = list(self._events)
        self._events.clear()
        if not out and self._error is not None:
            raise self._error
        return out

    async def events(self) -> AsyncGenerator[FilesystemEvent, None]:
        """Its events as they come, until it ends (then the iteration ends; when the call failed,
        with the sandbox say, that error is raised). Empty when ``on_event`` was given. One
        consumer only."""
        while True:
            if self._events:
                yield self._events.popleft()
                continue
            if self._ended is not None:
                if self._error is not None:
                    raise self._error
                return
            self._wakeup.clear()
            await self._wakeup.wait()

    async def stop(self) -> None:
        """Stops watching (cancels the call in the sandbox) and returns once it has stopped;
        events that came before stay readable. Stopping an ended watch does nothing. An
        exception the ``on_event`` callback raised is raised here."""
        await self._cancel_call()
        if self._ended is None:
            self._end("cancelled")
        if self._callback_error is not None:
            error, self._callback_error = self._callback_error, None
            raise error

    async def __aenter__(self) -> "AsyncWatchHandle":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def __repr__(self) -> str:
        state = "watching" if self._ended is None else f"ended: {self._ended}"
        return f"AsyncWatchHandle(path={self._path!r}, recursive={self._recursive!r}, {state})"


async def watch(sandbox: AsyncSandbox, path: str, recursive: bool,
                on_event: Optional[OnFilesystemEvent]) -> AsyncWatchHandle:
    sandbox._check_alive()
    handle = AsyncWatchHandle(sandbox, path, recursive, on_event)
    await handle._start()
    return handle


class _Suspended:
    """``async with watches_suspended(sandbox) as held``: the sandbox object's watches stopped
    while a snapshot is taken (it waits for every call in flight), started again after, or,
    with ``held.end()`` (a pause), ended ``paused``."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox
        self._handles: List[AsyncWatchHandle] = []
        self._ended: Optional[str] = None

    def end(self) -> None:
        self._ended = "paused"

    async def __aenter__(self) -> "_Suspended":
        self._handles = list(_watching.get(self._sb, ()))
        await asyncio.gather(*(h._suspend() for h in self._handles))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.gather(*(h._unsuspend(self._ended) for h in self._handles))


def watches_suspended(sandbox: AsyncSandbox) -> _Suspended:
    return _Suspended(sandbox)
