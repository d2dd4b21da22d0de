"""Pieces both transports share: encoding requests, deadlines, the transport interface."""
from __future__ import annotations

import asyncio
import base64
from typing import Any, Awaitable, Callable, Dict, Mapping, Optional, Protocol

from .errors import CallTimeout

# docs/protocol.md: request lines are at most 64 MiB; calls' timeouts at most a year.
MAX_LINE_BYTES = 64 << 20
MAX_CALL_TIMEOUT = 31536000.0
MAX_OUTPUT_LIMIT = 64 << 20          # an episode's cap on "max_output"
DEFAULT_CALL_TIMEOUT = 600.0         # what an episode gives a call without "timeout"
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


def put_bytes(obj: Dict[str, Any], name: str, data: bytes) -> None:
    """Sets a byte field in the plain spelling when ``data`` is UTF-8, else as ``name_b64``."""
    try:
        obj[name] = data.decode("utf-8")
    except UnicodeDecodeError:
        obj[name + "_b64"] = base64.b64encode(data).decode("ascii")


class Transport(Protocol):
    """What a sandbox needs from its transport (embedded episode or HTTP service)."""

    sandbox_id: str
    pid: Optional[int]
    restored: Optional[bool]

    async def call(self, op: str, body: Dict[str, Any], *, on_event: Optional[OnEvent] = None,
                   soft_timeout: float, hard_timeout: Optional[float] = None,
                   on_ref: Optional[OnRef] = None) -> Dict[str, Any]: ...

    async def cancel(self, ref: Any) -> bool: ...

    async def write_file(self, path: str, chunks: Any, mode: Optional[str],
                         hard_timeout: Optional[float]) -> int: ...

    async def read_file(self, path: str, sink: Callable[[bytes], Awaitable[None]],
                        hard_timeout: Optional[float]) -> None: ...

    async def stat(self, path: str) -> Dict[str, Any]: ...

    async def list_dir(self, path: str, max_entries: Optional[int]) -> Dict[str, Any]: ...

    async def set_timeout(self, seconds: float) -> None: ...

    async def kill(self) -> None: ...

    def kill_at_exit(self) -> None: ...

    async def is_running(self) -> bool: ...

    def info(self) -> Mapping[str, Any]: ...


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
