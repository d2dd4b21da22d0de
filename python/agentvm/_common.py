"""Pieces both transports share: encoding requests, deadlines, the transport interface."""
from __future__ import annotations

import asyncio
import base64
from typing import Any, Awaitable, Callable, Dict, Iterator, Mapping, Optional, Protocol, Sequence, Union

from ._forward import Dialer
from .errors import CallTimeout

# docs/protocol.md: request lines are at most 64 MiB; calls' timeouts at most a year.
MAX_LINE_BYTES = 64 << 20
MAX_CALL_TIMEOUT = 31536000.0
MAX_OUTPUT_LIMIT = 64 << 20          # an episode's cap on "max_output"
DEFAULT_CALL_TIMEOUT = 600.0         # what an episode gives a call without "timeout"
DEFAULT_START_TIMEOUT = 180.0        # how long creating a sandbox may take
FILE_CHUNK = 4 << 20                 # write_file chunk size
# How long past a call's own timeout the client waits for the answer. The episode's watchdog
# stops a wedged VM 10 s of silence after a call's timeout, so this only fires when the
# episode process (or serve) itself does not answer.
DEFAULT_GRACE = 60.0
# While bytes keep arriving, a soft deadline that passed is extended by this much at a time
# (a long answer still crossing the pipe).
ACTIVITY_WINDOW = 10.0

OnEvent = Callable[[Dict[str, Any]], None]
OnRef = Callable[[Any], None]
# An upload: the whole of it, or the chunks of a file object as it is read.
FileData = Union[bytes, Iterator[bytes]]
# A call's "stream" field: the episode's "only" (events, not the output in the answer too) or
# serve's true; None sends none.
StreamValue = Union[str, bool, None]


def put_bytes(obj: Dict[str, Any], name: str, data: bytes) -> None:
    """Sets a byte field in the plain spelling when ``data`` is UTF-8, else as ``name_b64``."""
    try:
        obj[name] = data.decode("utf-8")
    except UnicodeDecodeError:
        obj[name + "_b64"] = base64.b64encode(data).decode("ascii")


class Transport(Protocol):
    """What a sandbox needs from its transport: the embedded episode (_episode.py) or a
    sandbox of ``agentvm serve`` (_http.py). Whatever differs between the two modes is decided
    here, so that the sandbox itself never asks which one it has."""

    kind: str  # "embedded" or "service": the sandbox's ``mode``
    sandbox_id: str
    pid: Optional[int]
    restored: Optional[bool]

    def stream_value(self, wanted: bool) -> StreamValue:
        """The ``"stream"`` field of a call whose output the caller ``wanted`` as events, or
        None to send none (the answer then carries the output)."""

    async def call(self, op: str, body: Dict[str, Any], *, on_event: Optional[OnEvent] = None,
                   soft_timeout: float, hard_timeout: Optional[float] = None,
                   on_ref: Optional[OnRef] = None) -> Dict[str, Any]:
        """One call: its answer, or the error it answered with raised. ``on_ref`` gets what
        :meth:`cancel` takes to cancel it, once that is known. The sandbox's envs are not the
        caller's concern: serve, or the episode (its ``env`` op), adds them to ``exec`` calls
        and exports them in the persistent shell."""

    async def cancel(self, ref: Any) -> bool: ...

    async def write_file(self, path: str, data: FileData, *, size: Optional[int], mode: Optional[str],
                         hard_timeout: Optional[float]) -> int:
        """Writes ``data`` (all of it, or chunks as a file object is read, ``size`` bytes in
        all when known) to ``path``; returns the bytes written."""

    async def read_file(self, path: str, sink: Callable[[bytes], Awaitable[None]],
                        hard_timeout: Optional[float]) -> None: ...

    async def stat(self, path: str) -> Dict[str, Any]: ...

    async def list_dir(self, path: str, max_entries: Optional[int], depth: int = 1) -> Dict[str, Any]: ...

    async def fork(self, count: int, start_timeout: float) -> Sequence["Transport"]:
        """``count`` new sandboxes, each this one as it is now, all started or none."""

    async def pause(self) -> str:
        """Saves the sandbox and ends its VM; returns the id it is resumed by."""

    async def set_timeout(self, seconds: float) -> None: ...

    async def kill(self) -> None: ...

    def kill_at_exit(self) -> None:
        """:meth:`kill` without the event loop, which may be gone at interpreter exit."""

    async def is_running(self) -> bool: ...

    def info(self) -> Mapping[str, Any]: ...

    def port_dialer(self) -> Dialer:
        """How a guest TCP port is reached from this host (_forward.py)."""

    def port_url(self, port: int) -> str:
        """The HTTP URL of guest port ``port`` through serve; ValueError where there is none."""

    def port_headers(self) -> Dict[str, str]:
        """The headers a request to :meth:`port_url` needs (serve's token), else empty."""


async def cancel_quietly(transport: Transport, ref: Any) -> None:
    """Cancels a call the caller gave up on; a sandbox already gone has nothing to cancel."""
    try:
        await transport.cancel(ref)
    except Exception:
        pass


async def wait_answer(fut: "asyncio.Future[Any]", *, soft: float, hard: Optional[float],
                      last_activity: Callable[[], float], what: str) -> Any:
    """Waits for ``fut`` until a deadline: ``hard`` seconds if given (fixed), else ``soft``
    seconds, extended while ``last_activity()`` (a loop time) shows bytes arriving."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    deadline = start + (hard if hard is not None else soft)
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            now = loop.time()
            if hard is None and now - last_activity() < ACTIVITY_WINDOW:
                deadline = now + ACTIVITY_WINDOW
                continue
            waited = now - start
            raise CallTimeout(f"no answer to {what} within {waited:.1f} s (client deadline)")
        try:
            return await asyncio.wait_for(asyncio.shield(fut), remaining)
        except asyncio.TimeoutError:
            if fut.done():
                return fut.result()
            continue
