"""``sandbox.files``, on asyncio: uploads, downloads (whole or streamed), stat and listings."""
from __future__ import annotations

import asyncio
import io
import posixpath
from typing import TYPE_CHECKING, Any, AsyncGenerator, Iterator, List, Optional, Protocol, Union

from . import _validate as valid
from ._common import FILE_CHUNK, MAX_CALL_TIMEOUT, FileData
from .errors import AgentvmError, NotFound
from .models import EntryInfo, FileInfo, byte_field

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


def _request_timeout(value: Optional[float]) -> Optional[float]:
    return None if value is None else valid.number("request_timeout", value, low=0, high=MAX_CALL_TIMEOUT)


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
        path = valid.path(path)
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
