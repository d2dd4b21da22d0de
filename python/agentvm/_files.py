"""``sandbox.files``, on asyncio: uploads, downloads (whole or streamed), stat and listings,
directories made, entries renamed and removed, and watches (_watch.py)."""
from __future__ import annotations

import asyncio
import io
import os
from typing import TYPE_CHECKING, Any, AsyncGenerator, Dict, Iterator, List, Optional, Protocol, Union

from . import _validate as valid
from ._common import DEFAULT_CALL_TIMEOUT, FILE_CHUNK, MAX_CALL_TIMEOUT, FileData
from ._watch import AsyncWatchHandle, OnFilesystemEvent, watch
from .errors import AgentvmError, NotFound
from .models import EntryInfo, FileInfo

if TYPE_CHECKING:  # pragma: no cover
    from ._lifecycle import AsyncSandbox


class BinaryReader(Protocol):
    """A binary file object, as ``files.write`` reads it."""

    def read(self, size: int, /) -> bytes: ...


# What files.write takes: bytes, str (sent as UTF-8) or a binary file object.
Data = Union[bytes, bytearray, memoryview, str, BinaryReader]


class EntryList(List[EntryInfo]):
    """``files.list``'s answer: the entries, and whether ``max_entries`` cut the list."""

    truncated: bool = False


MAX_LIST_DEPTH = 64  # docs/protocol.md, list_dir's "depth"


def _request_timeout(value: Optional[float]) -> Optional[float]:
    return None if value is None else valid.number("request_timeout", value, low=0, high=MAX_CALL_TIMEOUT)


def _bounded_int(name: str, value: Any, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not 1 <= value <= high:
        raise ValueError(f"{name} must be from 1 to {high}, not {value}")
    return value


def _named_path(name: str, value: Any) -> str:
    return valid.text(name, os.fspath(value) if isinstance(value, os.PathLike) else value)


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be bool, not {type(value).__name__}")
    return value


class AsyncFiles:
    """``sandbox.files``."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    async def write(self, path: str, data: Data, *, mode: Optional[Union[int, str]] = None,
                    request_timeout: Optional[float] = None) -> int:
        """Writes ``data`` (bytes, str as UTF-8, or a binary file object read in 4 MiB chunks)
        to ``path``, creating or truncating it; returns the bytes written."""
        path = valid.path(path)
        m = valid.mode(mode)
        rt = _request_timeout(request_timeout)
        size: Optional[int] = None
        payload: FileData
        if isinstance(data, str):
            data = data.encode("utf-8")
        if isinstance(data, (bytes, bytearray, memoryview)):
            payload = bytes(data)
        elif hasattr(data, "read"):
            size = _remaining(data)
            payload = _file_chunks(data)
        else:
            raise TypeError(f"data must be bytes, str or a binary file object, not {type(data).__name__}")
        self._sb._check_alive()
        return await self._sb._transport.write_file(path, payload, size=size, mode=m, hard_timeout=rt)

    async def read(self, path: str, *, request_timeout: Optional[float] = None) -> bytes:
        """The whole file's bytes."""
        parts: List[bytes] = []

        async def sink(chunk: bytes) -> None:
            parts.append(chunk)

        path = valid.path(path)
        rt = _request_timeout(request_timeout)
        self._sb._check_alive()
        await self._sb._transport.read_file(path, sink, rt)
        return b"".join(parts)

    async def read_text(self, path: str) -> str:
        """The file decoded as UTF-8 (``errors="replace"``)."""
        return (await self.read(path)).decode("utf-8", errors="replace")

    async def read_stream(self, path: str, *, request_timeout: Optional[float] = None) -> AsyncGenerator[bytes, None]:
        """The file's bytes in chunks (up to 1 MiB each) as they arrive, at the consumer's pace."""
        path = valid.path(path)
        rt = _request_timeout(request_timeout)
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
        path = valid.path(path)
        self._sb._check_alive()
        return FileInfo.from_response(await self._sb._transport.stat(path), path)

    async def exists(self, path: str) -> bool:
        try:
            await self.info(path)
        except NotFound:
            return False
        return True

    async def list(self, path: str, depth: int = 1, *, max_entries: Optional[int] = None) -> EntryList:
        """The directory's entries, sorted by name, without ``.`` and ``..`` (symbolic links not
        followed). ``depth`` (1-64) lists subdirectories too, that many levels down, each
        directory's entries right after it, ``name`` relative to ``path`` (``sub/file``).
        At most ``max_entries`` (1-100000, default 10000: then ``.truncated``)."""
        path = valid.path(path)
        depth = _bounded_int("depth", depth, MAX_LIST_DEPTH)
        if max_entries is not None:
            _bounded_int("max_entries", max_entries, 100000)
        self._sb._check_alive()
        msg = await self._sb._transport.list_dir(path, max_entries, depth)
        out = EntryList(EntryInfo.from_response(e, path) for e in msg.get("entries", []))
        out.truncated = bool(msg.get("truncated", False))
        return out

    async def make_dir(self, path: str, *, mode: Optional[Union[int, str]] = None) -> bool:
        """Makes the directory and those missing above it (``mkdir -p``), with ``mode`` (default
        0o755, the umask not applied); False when it was there already (left as it is).
        ``AgentError`` ``exists`` when something else is in the way."""
        body: Dict[str, Any] = {"path": valid.path(path)}
        m = valid.mode(mode)
        if m is not None:
            body["mode"] = m
        return bool((await self._call("make_dir", body)).get("created"))

    async def rename(self, old_path: str, new_path: str) -> FileInfo:
        """Moves ``old_path`` to ``new_path`` (``rename(2)``, atomic: a file or symlink there is
        replaced, so is an empty directory); returns what ``new_path`` is now (a symlink
        described, not followed). ``AgentError`` ``not_empty`` onto a directory that is not
        empty, ``io`` across file systems (``EXDEV``)."""
        new_path = _named_path("new_path", new_path)
        body = {"from": _named_path("old_path", old_path), "to": new_path}
        return FileInfo.from_response((await self._call("move", body)).get("entry") or {}, new_path)

    async def remove(self, path: str, *, recursive: bool = True) -> None:
        """Removes a file, a symlink (never what it points to) or a directory with all it holds
        (``recursive=False``: an empty one only, else ``AgentError`` ``not_empty``); symlinks in
        the tree are not followed, nor other file systems entered. :class:`NotFound` when there
        is nothing at ``path``."""
        body = {"path": valid.path(path), "recursive": _flag("recursive", recursive)}
        # A big tree takes a while, without a byte meanwhile.
        await self._call("remove", body, DEFAULT_CALL_TIMEOUT if recursive else 0.0)

    async def watch_dir(self, path: str, *, recursive: bool = False,
                        on_event: Optional[OnFilesystemEvent] = None) -> AsyncWatchHandle:
        """Watches the directory (with ``recursive``, its whole tree on its file system) and
        returns once every change from then on will be reported: as
        :class:`FilesystemEvent` s from the handle's :meth:`AsyncWatchHandle.events`, or to
        ``on_event`` instead (called on the event loop). It runs until
        :meth:`AsyncWatchHandle.stop`, the directory's removal or the sandbox's end."""
        path = valid.path(path)
        valid.callback("on_event", on_event)
        return await watch(self._sb, path, _flag("recursive", recursive), on_event)

    async def _call(self, op: str, body: Dict[str, Any], soft_timeout: float = 0.0) -> Dict[str, Any]:
        self._sb._check_alive()
        return await self._sb._transport.call(op, body, soft_timeout=soft_timeout)


def _remaining(f: Any) -> Optional[int]:
    """The bytes left in a file object from where it is, when it can seek (Any: whatever it
    lacks of seekable/tell/seek means unknown)."""
    try:
        if not f.seekable():
            return None
        pos = f.tell()
        end = f.seek(0, io.SEEK_END)
        f.seek(pos)
        return int(end - pos)
    except (AttributeError, OSError, ValueError):
        return None


def _file_chunks(f: BinaryReader) -> Iterator[bytes]:
    while True:
        chunk: Union[bytes, str] = f.read(FILE_CHUNK)
        if not chunk:
            return
        if isinstance(chunk, str):
            raise TypeError("the file object must be opened in binary mode")
        yield bytes(chunk)
