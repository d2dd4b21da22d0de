"""Service transport: a sandbox of ``agentvm serve`` over its HTTP API (docs/api.md).

HTTP is spoken by the standard library's ``http.client`` (the standard library has no asyncio
HTTP client, and this package parses no HTTP itself). Its calls block, so they run on one
bounded thread pool shared by the whole process (``AGENTVM_HTTP_THREADS``, default 256
threads, created only as requests need them); the coroutines wait on them. Connections are
kept alive and reused, per service (URL and token). A request whose client deadline passes is
aborted by shutting its socket down, which wakes its thread.
"""
from __future__ import annotations

import asyncio
import functools
import http.client
import json
import os
import re
import socket
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from ._common import (DEFAULT_GRACE, MAX_LINE_BYTES, FileData, OnEvent, OnRef, StreamValue, cancel_quietly,
                      wait_answer)
from ._forward import Dialer, ServeDialer
from .errors import (AgentvmError, CallTimeout, SandboxDied, SandboxLost, ServiceError, error_from_protocol)

_executor_lock = threading.Lock()
_executor: Optional[ThreadPoolExecutor] = None
_clients_lock = threading.Lock()
_clients: Dict[Tuple[str, Optional[str]], "HttpClient"] = {}
# serve closes a connection idle for 60 s; one idle longer than this is not reused.
_IDLE_REUSE = 30.0
_ENDED = re.compile(r"^sandbox \S+ has ended \((\w+)")
_AGENT_STATUSES = (400, 422, 502)


def executor() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            n = int(os.environ.get("AGENTVM_HTTP_THREADS", "256"))
            _executor = ThreadPoolExecutor(max_workers=max(1, n), thread_name_prefix="agentvm-http")
        return _executor


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: Optional[float]) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.unix_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class _Ctx:
    """One request in flight: its connection (to abort it) and when bytes last came."""

    def __init__(self) -> None:
        self.conn: Optional[http.client.HTTPConnection] = None
        self.aborted = False
        self.last_rx = 0.0
        self.lock = threading.Lock()

    def abort(self) -> None:
        with self.lock:
            self.aborted = True
            conn = self.conn
        if conn is not None and conn.sock is not None:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class Response:
    def __init__(self, status: int, headers: Dict[str, str], data: bytes) -> None:
        self.status = status
        self.headers = headers
        self.data = data

    def json(self) -> Any:
        return json.loads(self.data)


def parse_url(url: str) -> Tuple[str, str, Optional[int], str]:
    """(kind, host-or-socket-path, port, path prefix) of ``unix:/path``, ``http://host:port``
    or ``https://host:port``."""
    if url.startswith("unix:"):
        path = url[len("unix:"):]
        if path.startswith("//"):
            path = path[2:]
        if not path:
            raise ValueError(f"url {url!r}: unix: needs a socket path")
        return "unix", path, None, ""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"url {url!r} is neither unix:/path nor http://host:port")
    return parts.scheme, parts.hostname, parts.port, parts.path.rstrip("/")


class HttpClient:
    """The connections to one serve, shared by every sandbox created with the same URL and
    token in this process."""

    def __init__(self, url: str, token: Optional[str]) -> None:
        self.url = url
        self.token = token
        self.kind, self.host, self.port, self.prefix = parse_url(url)
        self._idle: List[Tuple[http.client.HTTPConnection, float]] = []
        self._lock = threading.Lock()

    @classmethod
    def get(cls, url: str, token: Optional[str]) -> "HttpClient":
        key = (url, token)
        with _clients_lock:
            client = _clients.get(key)
            if client is None:
                client = _clients[key] = cls(url, token)
            return client

    def _connect(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        if self.kind == "unix":
            return _UnixConnection(self.host, timeout)
        if self.kind == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def _acquire(self, timeout: Optional[float], fresh: bool) -> Tuple[http.client.HTTPConnection, bool]:
        now = time.monotonic()
        if not fresh:
            with self._lock:
                while self._idle:
                    conn, since = self._idle.pop()
                    if now - since < _IDLE_REUSE and conn.sock is not None:
                        conn.sock.settimeout(timeout)
                        return conn, True
                    conn.close()
        return self._connect(timeout), False

    def _release(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < 64:
                self._idle.append((conn, time.monotonic()))
                return
        conn.close()

    def headers(self, extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
        h = {"Accept": "application/json"}
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        if extra:
            h.update(extra)
        return h

    # -- blocking, on a worker thread ----------------------------------------------------------

    def blocking(self, method: str, path: str, body: Any, headers: Dict[str, str], ctx: _Ctx,
                 sock_timeout: Optional[float], on_response: Optional[Callable[[http.client.HTTPResponse], Any]],
                 ) -> Response:
        """One request. ``on_response`` (if given) consumes a 2xx body itself and its return
        value is the Response's data; otherwise the body is read whole."""
        retryable = body is None or isinstance(body, (bytes, bytearray))
        attempt = 0
        while True:
            attempt += 1
            conn, reused = self._acquire(sock_timeout, fresh=not retryable)
            with ctx.lock:
                if ctx.aborted:
                    conn.close()
                    raise ConnectionAbortedError("the request was aborted")
                ctx.conn = conn
            try:
                try:
                    # An iterable body without Content-Length goes chunked (http.client's rule).
                    conn.request(method, self.prefix + path, body=body, headers=headers)
                except (BrokenPipeError, ConnectionResetError) as send_error:
                    # serve refuses some requests before reading their body (and closes the
                    # connection): its answer may be waiting to be read.
                    if reused and retryable and attempt == 1:
                        conn.close()
                        continue
                    try:
                        resp = conn.getresponse()
                    except Exception:
                        raise send_error from None
                else:
                    try:
                        resp = conn.getresponse()
                    except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                        if reused and retryable and attempt == 1 and not ctx.aborted:
                            conn.close()
                            continue
                        raise
                ctx.last_rx = time.monotonic()
                hdrs = {k.lower(): v for k, v in resp.getheaders()}
                if on_response is not None and 200 <= resp.status < 300:
                    data = on_response(resp)
                    # read1() does not close a Content-Length body it has read to its end, and
                    # an unclosed response makes the connection's next request fail.
                    if not resp.isclosed():
                        resp.read()
                else:
                    data = resp.read()
                if resp.will_close or ctx.aborted or not resp.isclosed():
                    conn.close()
                else:
                    self._release(conn)
                return Response(resp.status, hdrs, data)
            except BaseException:
                conn.close()
                raise

    # -- async ------------------------------------------------------------------------------------

    async def request(self, method: str, path: str, *, body: Any = None, json_body: Any = None,
                      headers: Optional[Mapping[str, str]] = None, soft: float, hard: Optional[float] = None,
                      on_response: Optional[Callable[[http.client.HTTPResponse], Any]] = None,
                      ctx: Optional[_Ctx] = None, what: str = "") -> Response:
        h = self.headers(headers)
        if json_body is not None:
            try:
                body = json.dumps(json_body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
            except UnicodeEncodeError as e:
                raise ValueError(f"a string in the request is not valid Unicode (lone surrogate?): {e}") from None
            h["Content-Type"] = "application/json"
            if len(body) > MAX_LINE_BYTES:
                raise ValueError(f"the request would be {len(body)} bytes; the protocol allows {MAX_LINE_BYTES} "
                                 f"(64 MiB)")
        live = ctx = ctx or _Ctx()
        limit = hard if hard is not None else soft
        sock_timeout = None if limit > 1e6 else limit + 30.0
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(executor(), functools.partial(
            self.blocking, method, path, body, h, ctx, sock_timeout, on_response))
        fut.add_done_callback(_retrieve)
        try:
            resp: Response = await wait_answer(fut, soft=soft, hard=hard, last_activity=lambda: live.last_rx,
                                               what=what or f"{method} {path}")
            return resp
        except (CallTimeout, asyncio.CancelledError):
            ctx.abort()
            raise
        except (OSError, http.client.HTTPException) as e:
            if ctx.aborted:
                raise CallTimeout(f"{what or method + ' ' + path}: aborted") from None
            raise AgentvmError("connection", f"{method} {self.url}{path}: {e!r}") from e


def _retrieve(fut: "asyncio.Future[Any]") -> None:
    if not fut.cancelled():
        fut.exception()


def http_error(resp: Response) -> AgentvmError:
    """The exception for a non-2xx answer of serve."""
    node: Optional[str] = None
    try:
        doc = json.loads(resp.data)
        code = str(doc["error"])
        message = str(doc.get("message", ""))
        node = doc["node"] if isinstance(doc.get("node"), str) else None
    except (ValueError, KeyError, TypeError, AttributeError):
        code = f"http_{resp.status}"
        message = resp.data[:500].decode("utf-8", errors="replace")
    status = resp.status
    if code == "sandbox_lost":
        return SandboxLost(code, message, status=status, node=node)
    if status == 404 and code == "not_found":
        m = _ENDED.match(message)
        if m:
            return SandboxDied(m.group(1), message, status=status)
        if message.startswith("no sandbox "):
            return SandboxDied("not_found", message, status=status)
    if status in _AGENT_STATUSES and code not in ("bad_json",) or status == 500 and code == "start_failed":
        return error_from_protocol(code, message, status=status)
    retry = resp.headers.get("retry-after")
    retry_after: Optional[float] = None
    if retry is not None:
        try:
            retry_after = float(retry)
        except ValueError:
            retry_after = None
    return ServiceError(code, message, status=status, retry_after=retry_after)


def _ndjson_reader(on_line: Callable[[Dict[str, Any]], None], ctx: _Ctx
                   ) -> Callable[[http.client.HTTPResponse], bytes]:
    """Consumes an NDJSON body: each event line goes to ``on_line`` (on the worker thread) as
    soon as it has arrived, since a silent stream (an attach to a quiet process) may send no
    next line for a long time; the last line that is not an event is returned (the call's
    answer or a streamed error)."""

    def consume(resp: http.client.HTTPResponse) -> bytes:
        pending: List[bytes] = []
        last = b""

        def take(line: bytes) -> bytes:
            if last:
                on_line(json.loads(last))
            msg = json.loads(line)
            if isinstance(msg, dict) and "event" in msg:
                on_line(msg)
                return b""
            return line

        while True:
            chunk = resp.read1(1 << 16)
            if not chunk:
                break
            ctx.last_rx = time.monotonic()
            start = 0
            while True:
                nl = chunk.find(b"\n", start)
                if nl < 0:
                    if start < len(chunk):
                        pending.append(chunk[start:])
                    break
                pending.append(chunk[start:nl])
                line = b"".join(pending)
                pending = []
                start = nl + 1
                if not line.strip():
                    continue
                last = take(line)
        tail = b"".join(pending)
        if tail.strip():
            last = take(tail)
        return last

    return consume


class ServiceTransport:
    """One sandbox of ``agentvm serve``."""

    kind = "service"

    def __init__(self, client: HttpClient, *, grace: float = DEFAULT_GRACE) -> None:
        self.client = client
        self.grace = grace
        self.sandbox_id = ""
        self.pid: Optional[int] = None
        self.restored: Optional[bool] = None
        self.described: Dict[str, Any] = {}
        self._gone: Optional[SandboxDied] = None

    def _path(self, action: str = "") -> str:
        return f"/v1/sandboxes/{urllib.parse.quote(self.sandbox_id, safe='')}" + (f"/{action}" if action else "")

    async def _json(self, method: str, path: str, body: Any = None, *, soft: float = 0.0,
                    hard: Optional[float] = None, ok: Iterable[int] = (200,)) -> Any:
        resp = await self.client.request(method, path, json_body=body, soft=soft + self.grace, hard=hard)
        if resp.status not in tuple(ok):
            err = http_error(resp)
            if isinstance(err, SandboxDied):
                self._gone = err
            raise err
        return resp.json()

    @classmethod
    async def create(cls, client: HttpClient, body: Dict[str, Any], *, grace: float,
                     start_timeout: float) -> "ServiceTransport":
        """A new sandbox: ``POST /v1/sandboxes`` with ``body``."""
        service = cls(client, grace=grace)
        service._adopt(await service._json("POST", "/v1/sandboxes", body, hard=start_timeout, ok=(201,)))
        return service

    @classmethod
    async def resume(cls, client: HttpClient, sandbox_id: str, *, grace: float,
                     start_timeout: float) -> "ServiceTransport":
        """The paused sandbox ``sandbox_id``, running again."""
        service = cls(client, grace=grace)
        service.sandbox_id = sandbox_id
        service._adopt(await service._json("POST", service._path("resume"), {}, hard=start_timeout))
        return service

    def stream_value(self, wanted: bool) -> StreamValue:
        # Always: the answer's headers then come at once with the call's seq, with which a call
        # given up on (client deadline, cancellation) is cancelled.
        return True

    async def call(self, op: str, body: Dict[str, Any], *, on_event: Optional[OnEvent] = None,
                   soft_timeout: float, hard_timeout: Optional[float] = None,
                   on_ref: Optional[OnRef] = None) -> Dict[str, Any]:
        if self._gone is not None:
            raise _again(self._gone)
        loop = asyncio.get_running_loop()
        ctx = _Ctx()
        stream = bool(body.get("stream"))

        seq: List[Optional[int]] = [None]

        def on_response(resp: http.client.HTTPResponse) -> bytes:
            header = resp.getheader("X-Agentvm-Call")
            seq[0] = int(header) if header is not None and header.isdigit() else None
            if on_ref is not None:
                # None when serve sends no call seq: such a call cannot be cancelled.
                loop.call_soon_threadsafe(on_ref, seq[0])
            if not stream:
                return resp.read()
            if on_event is None:
                raise AssertionError("a streamed call needs on_event")
            handler: OnEvent = on_event

            def to_loop(m: Dict[str, Any]) -> None:
                loop.call_soon_threadsafe(handler, m)

            return _ndjson_reader(to_loop, ctx)(resp)

        try:
            resp = await self.client.request("POST", self._path(op), json_body=body,
                                             soft=soft_timeout + self.grace, hard=hard_timeout,
                                             on_response=on_response, ctx=ctx, what=f"{op} call")
        except (CallTimeout, asyncio.CancelledError):
            # Given up on: stop it in the sandbox too (serve only forgets a call whose client went).
            if seq[0] is not None:
                loop.create_task(cancel_quietly(self, seq[0]))
            raise
        if not 200 <= resp.status < 300:
            err = http_error(resp)
            if isinstance(err, SandboxDied):
                self._gone = err
            raise err
        # Events were queued with call_soon_threadsafe before this answer: let them run first.
        await asyncio.sleep(0)
        try:
            msg = json.loads(resp.data)
        except ValueError as e:
            raise AgentvmError("bad_answer", f"{op}: serve's answer is not JSON: {resp.data[:200]!r}") from e
        if not isinstance(msg, dict):
            raise AgentvmError("bad_answer", f"{op}: serve's answer is not a JSON object")
        if "error" in msg and isinstance(msg["error"], str):
            # A streamed call's error after the stream started: {"error": CODE, "message": TEXT}.
            err = error_from_protocol(msg["error"], str(msg.get("message", "")))
            if isinstance(err, SandboxDied):
                self._gone = err
            raise err
        return msg

    async def cancel(self, ref: Any) -> bool:
        doc = await self._json("DELETE", self._path(f"calls/{int(ref)}"))
        return bool(doc.get("running"))

    async def stat(self, path: str) -> Dict[str, Any]:
        q = urllib.parse.urlencode({"path": path})
        doc: Dict[str, Any] = await self._json("GET", self._path("files/stat") + "?" + q)
        return doc

    async def list_dir(self, path: str, max_entries: Optional[int], depth: int = 1) -> Dict[str, Any]:
        params: Dict[str, Any] = {"path": path}
        if max_entries is not None:
            params["max_entries"] = max_entries
        if depth != 1:
            params["depth"] = depth
        doc: Dict[str, Any] = await self._json("GET", self._path("files/list") + "?" + urllib.parse.urlencode(params))
        return doc

    async def write_file(self, path: str, data: FileData, *, size: Optional[int], mode: Optional[str],
                         hard_timeout: Optional[float]) -> int:
        """One ``PUT …/files`` streaming the body (chunked when a file object's size is unknown)."""
        params = {"path": path}
        if mode is not None:
            params["mode"] = mode
        headers = {"Content-Type": "application/octet-stream"}
        ctx = _Ctx()
        body: Union[bytes, Iterable[bytes]]
        if isinstance(data, bytes):
            body = data
        else:
            if size is not None:
                headers["Content-Length"] = str(size)
            body = _touching(data, ctx)
        resp = await self.client.request("PUT", self._path("files") + "?" + urllib.parse.urlencode(params),
                                         body=body, headers=headers, soft=self.grace, hard=hard_timeout, ctx=ctx,
                                         what=f"upload of {path!r}")
        if resp.status != 200:
            raise http_error(resp)
        return int(resp.json().get("bytes", 0))

    async def read_file(self, path: str, sink: Callable[[bytes], Awaitable[None]],
                        hard_timeout: Optional[float]) -> None:
        loop = asyncio.get_running_loop()
        ctx = _Ctx()

        def consume(resp: http.client.HTTPResponse) -> bytes:
            while True:
                try:
                    chunk = resp.read1(1 << 20)
                except http.client.IncompleteRead as e:
                    raise AgentvmError("io", f"reading {path!r} failed midway (the download was cut)") from e
                if not chunk:
                    return b""
                ctx.last_rx = time.monotonic()
                # Waits for the sink: the download goes at the consumer's pace.
                asyncio.run_coroutine_threadsafe(sink(chunk), loop).result()

        resp = await self.client.request("GET", self._path("files") + "?" + urllib.parse.urlencode({"path": path}),
                                         headers={"Accept": "application/octet-stream"}, soft=self.grace,
                                         hard=hard_timeout, on_response=consume, ctx=ctx,
                                         what=f"download of {path!r}")
        if resp.status != 200:
            raise http_error(resp)

    async def set_timeout(self, seconds: float) -> None:
        self.described = await self._json("POST", self._path("timeout"), {"timeout": seconds})

    def _adopt(self, described: Dict[str, Any]) -> None:
        """This transport is now for the sandbox serve described (a new one, a fork's child, a resume)."""
        self.described = described
        self.sandbox_id = str(described["id"])
        self.pid = described.get("pid")
        self.restored = described.get("restored")

    async def fork(self, count: int, start_timeout: float) -> List["ServiceTransport"]:
        doc = await self._json("POST", self._path("fork"), {"count": count}, hard=start_timeout, ok=(201,))
        children = []
        for described in doc["sandboxes"]:
            child = ServiceTransport(self.client, grace=self.grace)
            child._adopt(described)
            children.append(child)
        return children

    async def pause(self) -> str:
        """serve keeps the paused sandbox (across its restarts) under its own id."""
        await self._json("POST", self._path("pause"), {}, soft=120.0)
        self._gone = SandboxDied("paused", f"sandbox {self.sandbox_id} is paused: resume it first")
        return self.sandbox_id

    async def kill(self) -> None:
        if not self.sandbox_id:
            return
        try:
            await self._json("DELETE", self._path())
        except SandboxDied:
            pass
        if self._gone is None or self._gone.code != "killed":
            self._gone = SandboxDied("killed", "the sandbox was killed")

    def kill_at_exit(self) -> None:
        """kill() without the event loop or the thread pool, for interpreter exit."""
        if not self.sandbox_id or self._gone is not None:
            return
        self.client.blocking("DELETE", self._path(), None, self.client.headers(), _Ctx(), 30.0, None)
        self._gone = SandboxDied("killed", "the sandbox was killed")

    async def is_running(self) -> bool:
        if self._gone is not None:
            return False
        try:
            self.described = await self._json("GET", self._path())
        except SandboxDied:
            return False
        return self.described.get("state") == "running"

    def info(self) -> Mapping[str, Any]:
        return dict(self.described)

    def port_dialer(self) -> Dialer:
        """A new connection to serve per forwarded connection, upgraded to the guest port's
        stream (``GET …/tcp/{port}``, ``Upgrade: agentvm-tcp``)."""
        if self._gone is not None:
            raise _again(self._gone)
        c = self.client
        if c.kind == "https":
            raise ValueError(f"ports.forward speaks plain HTTP to serve, not TLS ({c.url}): reach serve at an "
                             "http:// or unix: URL")
        return ServeDialer(c.kind, c.host, c.port, c.prefix, c.token, self._path())

    def port_url(self, port: int) -> str:
        if self.client.kind == "unix":
            raise ValueError(f"ports.url needs serve on a TCP listener (http://host:port); {self.client.url} is a "
                             f"Unix socket: use ports.forward({port}) for a local TCP port instead")
        return self.client.url.rstrip("/") + self._path(f"ports/{port}") + "/"

    def port_headers(self) -> Dict[str, str]:
        return {"Authorization": f"Bearer {self.client.token}"} if self.client.token else {}


def _again(gone: SandboxDied) -> SandboxDied:
    """A new exception saying again why the sandbox is gone, of the same class (a lost sandbox
    stays :class:`SandboxLost`)."""
    if isinstance(gone, SandboxLost):
        return SandboxLost(gone.code, gone.message, status=gone.status, node=gone.node)
    return SandboxDied(gone.code, gone.message, status=gone.status)


UNREACHED_HEADER = "agentvm-unreached-nodes"


class SandboxList(List[Dict[str, Any]]):
    """:meth:`AsyncSandbox.list`'s answer: serve's sandbox objects (docs/api.md, as
    :meth:`info` gives them), and ``unreached_nodes``: the nodes of a fleet whose sandboxes are
    missing from it, each with why (``{"n3": "could not connect"}``; empty when every node
    answered, or when serve has no peers)."""

    unreached_nodes: Dict[str, str]

    def __init__(self, sandboxes: Iterable[Dict[str, Any]] = (),
                 unreached_nodes: Optional[Mapping[str, str]] = None) -> None:
        super().__init__(sandboxes)
        self.unreached_nodes = dict(unreached_nodes or {})


def _unreached_from_header(value: str) -> Dict[str, str]:
    """``Agentvm-Unreached-Nodes: n2 (could not connect); n3 (…)`` as {node: problem}."""
    out: Dict[str, str] = {}
    for part in value.split("; "):
        node, sep, problem = part.partition(" (")
        if node and sep:
            out[node] = problem[:-1] if problem.endswith(")") else problem
    return out


async def list_sandboxes(client: HttpClient) -> SandboxList:
    """``GET /v1/sandboxes``: every sandbox of the service (of the whole fleet when serve has
    peers), with the nodes that could not be heard."""
    resp = await client.request("GET", "/v1/sandboxes", soft=30.0)
    if resp.status != 200:
        raise http_error(resp)
    try:
        doc = resp.json()
        sandboxes = doc["sandboxes"]
        if not isinstance(sandboxes, list):
            raise TypeError("not a list")
    except (ValueError, KeyError, TypeError) as e:
        raise AgentvmError("bad_answer", f"GET /v1/sandboxes: serve's answer is not a list: {resp.data[:200]!r}") from e
    unreached: Dict[str, str] = {}
    listed = doc.get("unreached")
    if isinstance(listed, list):
        for entry in listed:
            if isinstance(entry, dict) and isinstance(entry.get("node"), str):
                unreached[entry["node"]] = str(entry.get("problem", ""))
    elif resp.headers.get(UNREACHED_HEADER):
        unreached = _unreached_from_header(resp.headers[UNREACHED_HEADER])
    return SandboxList(sandboxes, unreached)


def _touching(chunks: Iterable[bytes], ctx: _Ctx) -> Iterable[bytes]:
    """The chunks of an upload; each one sent counts as activity for the client deadline."""
    for c in chunks:
        ctx.last_rx = time.monotonic()
        yield c
