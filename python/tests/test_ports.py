"""Inbound ports (python/README.md, "Ports"), no guest: ``ports.forward`` against fake far ends
written here, which answer as the contracts say the real ones do (a hybrid-vsock socket with
the guest's port forwarder behind it; serve's ``Upgrade: agentvm-tcp``), and ``ports.url``. Bytes
both ways (8 MiB by their hash), half-closes each way, refusals (the local connection closed,
the reason logged), 20 connections at once, and nothing left behind by ``close()``: no thread,
no file descriptor. The embedded sandbox runs a fake ``agentvm episode`` that listens on the
``--vsock-uds`` socket it is given."""
from __future__ import annotations

import asyncio
import hashlib
import http.server
import json
import logging
import os
import socket
import socketserver
import stat
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

from agentvm import AsyncPortForward, AsyncSandbox, PortForward, Sandbox, SandboxDied
from agentvm import _forward
from agentvm._forward import Forwarder, HybridVsockDialer

pytestmark = pytest.mark.no_guest  # boots nothing: tests/run_all.sh runs it on the host

SB_ID = "n1-0a1b2c-00000000000000ff"
TOKEN = "ports-token"
BIG = 8 << 20


# -- helpers ---------------------------------------------------------------------------------------


def forward_threads() -> List[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("agentvm-forward")]


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def wait_until(predicate: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within} s: {what}")
        time.sleep(0.02)


def recv_all(sock: socket.socket) -> bytes:
    parts = []
    while True:
        data = sock.recv(1 << 16)
        if not data:
            return b"".join(parts)
        parts.append(data)


def read_line(sock: socket.socket) -> bytes:
    """One line, a byte at a time (a fake must not read past its handshake)."""
    line = b""
    while not line.endswith(b"\n"):
        byte = sock.recv(1)
        if not byte:
            break
        line += byte
    return line


def echo(sock: socket.socket) -> None:
    """Sends back what comes, and passes the end of stream on."""
    while True:
        data = sock.recv(1 << 16)
        if not data:
            break
        sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)


def connect(address: Tuple[str, int]) -> socket.socket:
    return socket.create_connection(address, timeout=30)


def roundtrip(address: Tuple[str, int], payload: bytes) -> bytes:
    """Sends ``payload`` then an end of stream, while reading everything that comes back."""
    with connect(address) as c:
        def send() -> None:
            c.sendall(payload)
            c.shutdown(socket.SHUT_WR)

        sender = threading.Thread(target=send)
        sender.start()
        got = recv_all(c)
        sender.join()
    return got


def assert_closed_by_forward(address: Tuple[str, int]) -> None:
    with connect(address) as c:
        try:
            assert c.recv(1) == b""
        except ConnectionResetError:
            pass


# -- fake far ends ---------------------------------------------------------------------------------


class FakeFarEnd:
    """A listener answering each connection on a thread of its own with ``serve``."""

    def __init__(self, family: int, address: Any) -> None:
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind(address)
        self.sock.listen(64)
        self.address = self.sock.getsockname()
        self.threads: List[threading.Thread] = []
        self.seen: List[Any] = []
        self.connections = 0
        self.acceptor = threading.Thread(target=self._accept, daemon=True)
        self.acceptor.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            t = threading.Thread(target=self._handle, args=(conn,), daemon=True)
            t.start()
            self.threads.append(t)

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            try:
                self.serve(conn)
            except OSError:
                pass

    def serve(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        getattr(self, "let_go", threading.Event()).set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.acceptor.join(5)
        for t in self.threads:
            t.join(5)


class FakeHybrid(FakeFarEnd):
    """The episode's ``--vsock-uds`` socket with the guest's port forwarder behind it."""

    def __init__(self, path: str, mode: str = "echo") -> None:
        super().__init__(socket.AF_UNIX, path)
        self.path = path
        self.mode = mode
        self.let_go = threading.Event()

    def serve(self, conn: socket.socket) -> None:
        line = read_line(conn)
        self.seen.append(line)
        if line != b"CONNECT 53\n":
            return
        if self.mode == "silent":
            conn.recv(1)  # never answers; the client gives up
            return
        conn.sendall(b"OK 1\n")
        line = read_line(conn)
        self.seen.append(line)
        if self.mode == "refuse":
            conn.sendall(b"ERR nothing listens on guest port 9\n")
        elif self.mode == "greet":
            conn.sendall(b"OK\nwelcome\n")  # stream bytes in the same write as the answer
            echo(conn)
        elif self.mode == "linger":
            conn.sendall(b"OK\n")
            self.seen.append(recv_all(conn))
            self.let_go.wait(30)  # the connection stays open this way
        elif self.mode == "talk_first":
            conn.sendall(b"OK\nhello")
            conn.shutdown(socket.SHUT_WR)
            self.seen.append(recv_all(conn))
        else:
            conn.sendall(b"OK\n")
            echo(conn)


@pytest.fixture
def sock_dir() -> Iterator[str]:
    # Not under build/tmp (a 9p share in the test host cannot hold sockets).
    d = tempfile.mkdtemp(prefix="agentvm-test-ports-")
    yield d
    for name in os.listdir(d):
        os.unlink(os.path.join(d, name))
    os.rmdir(d)


def hybrid(sock_dir: str, mode: str = "echo") -> FakeHybrid:
    return FakeHybrid(os.path.join(sock_dir, f"vsock-{mode}"), mode)


class FakeServe(socketserver.ThreadingMixIn, http.server.HTTPServer):
    """serve, as far as a sandbox with ports needs it: create, delete, and the upgrade of
    ``GET …/tcp/{port}``, answered as ``mode`` says."""

    daemon_threads = True

    def __init__(self, mode: str = "echo") -> None:
        super().__init__(("127.0.0.1", 0), ServeHandler)
        self.mode = mode
        self.upgrades: List[Tuple[str, Dict[str, str]]] = []
        self.deleted = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class UnixFakeServe(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, mode: str = "echo") -> None:
        super().__init__(path, ServeHandler)
        self.mode = mode
        self.upgrades: List[Tuple[str, Dict[str, str]]] = []
        self.deleted = False
        self.url = f"unix:{path}"

    def get_request(self) -> Tuple[socket.socket, Any]:
        conn, _ = self.socket.accept()
        return conn, ("unix", 0)  # http.server wants a (host, port) to log


class ServeHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def answer(self, status: int, doc: Any) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/v1/sandboxes":
            return self.answer(201, {"id": SB_ID, "state": "running", "pid": 1, "restored": True})
        self.answer(404, {"error": "not_found", "message": self.path})

    def do_DELETE(self) -> None:
        self.server.deleted = True  # type: ignore[attr-defined]
        self.answer(200, {"id": SB_ID, "state": "deleted"})

    def do_GET(self) -> None:
        server: Any = self.server
        prefix = f"/v1/sandboxes/{SB_ID}/tcp/"
        if not self.path.startswith(prefix):
            return self.answer(404, {"error": "not_found", "message": self.path})
        server.upgrades.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
        self.close_connection = True
        if server.mode == "502":
            return self.answer(502, {"error": {"code": "refused", "message": "nothing listens on guest port 9"}})
        if server.mode == "flat_error":
            return self.answer(404, {"error": "not_found", "message": f"no sandbox {SB_ID}"})
        if server.mode == "wrong_upgrade":
            self.send_response(101, "Switching Protocols")
            self.send_header("Connection", "Upgrade")
            self.send_header("Upgrade", "websocket")
            self.end_headers()
            return
        self.send_response(101, "Switching Protocols")
        self.send_header("Connection", "Upgrade")
        self.send_header("Upgrade", "agentvm-tcp")
        self.end_headers()
        conn = self.connection
        if server.mode == "greet":
            conn.sendall(b"welcome\n")
        try:
            echo(conn)
        except OSError:
            pass


@pytest.fixture
def serve() -> Iterator[FakeServe]:
    s = FakeServe()
    thread = threading.Thread(target=s.serve_forever, daemon=True)
    thread.start()
    yield s
    s.shutdown()
    s.server_close()


@pytest.fixture
def service_sandbox(serve: FakeServe) -> Iterator[Sandbox]:
    sb = Sandbox(url=serve.url, token=TOKEN)
    yield sb
    sb.kill()


def addr(fwd: Any) -> Tuple[str, int]:
    return (fwd.host, fwd.port)


# -- embedded: the hybrid-vsock far end --------------------------------------------------------------


def test_hybrid_bytes_both_ways_and_half_close(sock_dir: str) -> None:
    far = hybrid(sock_dir)
    fwd = Forwarder(HybridVsockDialer(far.path), 8000, "127.0.0.1", 0, sandbox_id="ep-1")
    try:
        assert fwd.host == "127.0.0.1" and fwd.port > 0 and fwd.address == f"127.0.0.1:{fwd.port}"
        assert roundtrip(addr(fwd), b"ping") == b"ping"
        assert far.seen[:2] == [b"CONNECT 53\n", b"PORT 8000\n"]
        payload = os.urandom(BIG)
        got = roundtrip(addr(fwd), payload)
        assert len(got) == BIG and hashlib.sha256(got).digest() == hashlib.sha256(payload).digest()
        # The local end's half-close reached the guest (the echo ended), and the guest's came back.
        with connect(addr(fwd)) as c:
            c.sendall(b"abc")
            c.shutdown(socket.SHUT_WR)
            assert recv_all(c) == b"abc"
    finally:
        fwd.close()
        far.stop()


def test_hybrid_guest_closes_first_local_goes_on_sending(sock_dir: str) -> None:
    far = hybrid(sock_dir, "talk_first")
    fwd = Forwarder(HybridVsockDialer(far.path), 8000, "127.0.0.1", 0, sandbox_id="ep-1")
    try:
        with connect(addr(fwd)) as c:
            assert recv_all(c) == b"hello"  # the guest's end of stream, while ours is open
            c.sendall(b"after the guest's EOF")
            c.shutdown(socket.SHUT_WR)
            assert c.recv(1) == b""
        wait_until(lambda: len(far.seen) == 3, 10, "the guest reading to its end")
        assert far.seen[2] == b"after the guest's EOF"
    finally:
        fwd.close()
        far.stop()


def test_close_ends_a_connection_half_closed_locally(sock_dir: str) -> None:
    # Our end has ended, the guest's has not: close() must still end that direction.
    far = hybrid(sock_dir, "linger")
    fwd = Forwarder(HybridVsockDialer(far.path), 8000, "127.0.0.1", 0, sandbox_id="ep-1")
    try:
        with connect(addr(fwd)) as c:
            c.sendall(b"done")
            c.shutdown(socket.SHUT_WR)
            wait_until(lambda: b"done" in far.seen, 10, "the guest reading our end of stream")
            started = time.monotonic()
            fwd.close()
            assert time.monotonic() - started < 3 and forward_threads() == []
            assert recv_all(c) == b""
    finally:
        fwd.close()
        far.stop()


def test_hybrid_stream_bytes_that_came_with_the_answer(sock_dir: str) -> None:
    far = hybrid(sock_dir, "greet")
    fwd = Forwarder(HybridVsockDialer(far.path), 25, "127.0.0.1", 0, sandbox_id="ep-1")
    try:
        assert roundtrip(addr(fwd), b"ehlo\n") == b"welcome\nehlo\n"
    finally:
        fwd.close()
        far.stop()


def test_hybrid_refusal_closes_that_connection_and_logs_why(sock_dir: str, caplog: Any) -> None:
    far = hybrid(sock_dir, "refuse")
    fwd = Forwarder(HybridVsockDialer(far.path), 9, "127.0.0.1", 0, sandbox_id="ep-1")
    try:
        with caplog.at_level(logging.WARNING, logger="agentvm.ports"):
            assert_closed_by_forward(addr(fwd))
            assert_closed_by_forward(addr(fwd))  # the forward goes on listening
        messages = [r.getMessage() for r in caplog.records if r.name == "agentvm.ports"]
        assert len(messages) == 2, messages
        assert "nothing listens on guest port 9" in messages[0] and "port 9" in messages[0]
        assert far.seen[:2] == [b"CONNECT 53\n", b"PORT 9\n"]
    finally:
        fwd.close()
        far.stop()


def test_hybrid_unreachable_and_silent_far_ends(sock_dir: str, caplog: Any, monkeypatch: Any) -> None:
    # No socket there (the episode has ended): refused at once, logged.
    fwd = Forwarder(HybridVsockDialer(os.path.join(sock_dir, "gone")), 80, "127.0.0.1", 0, sandbox_id="ep-1")
    try:
        with caplog.at_level(logging.WARNING, logger="agentvm.ports"):
            assert_closed_by_forward(addr(fwd))
        assert any("cannot connect" in r.getMessage() for r in caplog.records)
    finally:
        fwd.close()
    # A far end that never answers: given up on at the handshake's deadline.
    monkeypatch.setattr(_forward, "HANDSHAKE_TIMEOUT", 0.5)
    far = hybrid(sock_dir, "silent")
    fwd = Forwarder(HybridVsockDialer(far.path), 80, "127.0.0.1", 0, sandbox_id="ep-1")
    try:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="agentvm.ports"):
            started = time.monotonic()
            assert_closed_by_forward(addr(fwd))
            assert time.monotonic() - started < 5
        assert any("within 0.5 s" in r.getMessage() for r in caplog.records)
    finally:
        fwd.close()
        far.stop()


def test_hybrid_twenty_connections_at_once(sock_dir: str) -> None:
    far = hybrid(sock_dir)
    fwd = Forwarder(HybridVsockDialer(far.path), 8000, "127.0.0.1", 0, sandbox_id="ep-1")
    try:
        many_at_once(addr(fwd))
    finally:
        fwd.close()
        far.stop()


def many_at_once(address: Tuple[str, int], n: int = 20) -> None:
    """``n`` connections open together, each with its own bytes, all answered right."""
    payloads = [os.urandom(256 << 10) + b"%d" % i for i in range(n)]
    socks = [connect(address) for _ in range(n)]
    results: List[Optional[bytes]] = [None] * n

    def one(i: int) -> None:
        def send() -> None:
            socks[i].sendall(payloads[i])
            socks[i].shutdown(socket.SHUT_WR)

        sender = threading.Thread(target=send)
        sender.start()
        results[i] = recv_all(socks[i])
        sender.join()

    try:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert all(r == p for r, p in zip(results, payloads))
    finally:
        for s in socks:
            s.close()


def test_close_leaves_no_thread_or_fd_behind(sock_dir: str) -> None:
    far = hybrid(sock_dir)
    try:
        time.sleep(0.1)
        threads_before, fds_before = threading.active_count(), fd_count()
        fwd = Forwarder(HybridVsockDialer(far.path), 8000, "127.0.0.1", 0, sandbox_id="ep-1")
        assert roundtrip(addr(fwd), b"x" * 1000) == b"x" * 1000
        # Connections still open at close: one idle, one half-way through a transfer.
        idle = connect(addr(fwd))
        busy = connect(addr(fwd))
        busy.sendall(b"y" * 100000)
        wait_until(lambda: len(forward_threads()) >= 5, 10, "both connections bridged")
        fwd.close()
        assert forward_threads() == [], "close() returned with forward threads alive"
        for c in (idle, busy):
            c.settimeout(10)
            try:
                recv_all(c)  # ended by the forward: end of stream (after what was in flight), or a reset
            except ConnectionResetError:
                pass
            c.close()
        with pytest.raises(ConnectionRefusedError):
            connect(addr(fwd))
        fwd.close()  # twice is fine
        wait_until(lambda: threading.active_count() == threads_before, 10,
                   f"{threading.active_count()} threads, {threads_before} before")
        wait_until(lambda: fd_count() == fds_before, 10, f"{fd_count()} fds, {fds_before} before")
    finally:
        far.stop()


# -- service: serve's upgrade ----------------------------------------------------------------------


def test_service_bytes_both_ways_through_the_upgrade(serve: FakeServe, service_sandbox: Sandbox) -> None:
    with service_sandbox.ports.forward(8000) as fwd:
        assert isinstance(fwd, PortForward)
        assert fwd.guest_port == 8000 and fwd.address == f"127.0.0.1:{fwd.port}"
        assert roundtrip(addr(fwd), b"ping") == b"ping"
        path, headers = serve.upgrades[0]
        assert path == f"/v1/sandboxes/{SB_ID}/tcp/8000"
        assert headers["connection"] == "Upgrade" and headers["upgrade"] == "agentvm-tcp"
        assert headers["authorization"] == f"Bearer {TOKEN}"
        assert headers["host"] == serve.url[len("http://"):]
        payload = os.urandom(BIG)
        got = roundtrip(addr(fwd), payload)
        assert len(got) == BIG and hashlib.sha256(got).digest() == hashlib.sha256(payload).digest()
        with connect(addr(fwd)) as c:
            c.sendall(b"half")
            c.shutdown(socket.SHUT_WR)
            assert recv_all(c) == b"half"
        many_at_once(addr(fwd))
    assert fwd.closed and forward_threads() == []


def test_service_stream_bytes_right_after_the_head(serve: FakeServe, service_sandbox: Sandbox) -> None:
    serve.mode = "greet"
    with service_sandbox.ports.forward(25) as fwd:
        assert roundtrip(addr(fwd), b"ehlo\n") == b"welcome\nehlo\n"


@pytest.mark.parametrize("mode, expected", [("502", "502: refused: nothing listens on guest port 9"),
                                            ("flat_error", f"404: not_found: no sandbox {SB_ID}"),
                                            ("wrong_upgrade", "serve switched to 'websocket', not agentvm-tcp")])
def test_service_refusal_closes_that_connection_and_logs_why(serve: FakeServe, service_sandbox: Sandbox,
                                                             caplog: Any, mode: str, expected: str) -> None:
    serve.mode = mode
    with service_sandbox.ports.forward(9) as fwd:
        with caplog.at_level(logging.WARNING, logger="agentvm.ports"):
            assert_closed_by_forward(addr(fwd))
        messages = [r.getMessage() for r in caplog.records if r.name == "agentvm.ports"]
        assert len(messages) == 1 and expected in messages[0], messages
        serve.mode = "echo"
        assert roundtrip(addr(fwd), b"still there") == b"still there"


def test_service_over_serves_unix_socket(sock_dir: str) -> None:
    s = UnixFakeServe(os.path.join(sock_dir, "serve.sock"))
    thread = threading.Thread(target=s.serve_forever, daemon=True)
    thread.start()
    try:
        sb = Sandbox(url=s.url)
        try:
            with pytest.raises(ValueError, match="TCP listener.*ports.forward"):
                sb.ports.url(8000)
            assert sb.ports.headers() == {}
            with sb.ports.forward(8000) as fwd:
                assert roundtrip(addr(fwd), b"over unix") == b"over unix"
            assert s.upgrades[0][1]["host"] == "localhost" and "authorization" not in s.upgrades[0][1]
        finally:
            sb.kill()
    finally:
        s.shutdown()
        s.server_close()


def test_service_url_and_headers(serve: FakeServe, service_sandbox: Sandbox) -> None:
    assert service_sandbox.ports.url(8000) == f"{serve.url}/v1/sandboxes/{SB_ID}/ports/8000/"
    assert service_sandbox.ports.headers() == {"Authorization": f"Bearer {TOKEN}"}
    no_token = Sandbox(url=serve.url + "/")
    try:
        assert no_token.ports.url(65535) == f"{serve.url}/v1/sandboxes/{SB_ID}/ports/65535/"
        assert no_token.ports.headers() == {}
    finally:
        no_token.kill()


def test_ports_are_checked_before_anything(serve: FakeServe, service_sandbox: Sandbox) -> None:
    ports = service_sandbox.ports
    for bad in (0, 65536, -1):
        with pytest.raises(ValueError, match="1 to 65535"):
            ports.url(bad)
        with pytest.raises(ValueError, match="guest_port must be from 1 to 65535"):
            ports.forward(bad)
    for wrong in ("80", 80.0, True, None):
        with pytest.raises(TypeError, match="must be an int"):
            ports.url(wrong)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="guest_port must be an int"):
            ports.forward(wrong)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="port must be from 0 to 65535"):
        ports.forward(80, port=70000)
    with pytest.raises(TypeError):
        ports.forward(80, host=None)  # type: ignore[arg-type]
    assert serve.upgrades == [] and forward_threads() == []


def test_kill_closes_the_forwards(serve: FakeServe) -> None:
    sb = Sandbox(url=serve.url, token=TOKEN)
    fwd = sb.ports.forward(8000)
    other = sb.ports.forward(8001)
    conn = connect(addr(fwd))
    conn.sendall(b"x")
    assert conn.recv(1) == b"x"
    sb.kill()
    assert serve.deleted and fwd.closed and other.closed and forward_threads() == []
    conn.settimeout(10)
    assert recv_all(conn) == b""
    conn.close()
    with pytest.raises(ConnectionRefusedError):
        connect(addr(fwd))
    with pytest.raises(SandboxDied):
        sb.ports.forward(8000)


def test_async_forward(serve: FakeServe) -> None:
    async def main() -> None:
        sb = await AsyncSandbox.create(url=serve.url, token=TOKEN)
        async with await sb.ports.forward(8000, port=0) as fwd:
            assert isinstance(fwd, AsyncPortForward)
            loop = asyncio.get_running_loop()
            got = await loop.run_in_executor(None, roundtrip, addr(fwd), b"async")
            assert got == b"async"
        assert fwd.closed and forward_threads() == []
        await fwd.close()  # twice is fine
        kept = await sb.ports.forward(8000)
        await sb.kill()
        assert kept.closed and forward_threads() == []

    asyncio.run(main())


# -- embedded: a fake agentvm episode ----------------------------------------------------------------


FAKE_EPISODE = r'''#!{python}
"""A fake agentvm episode: ready at once, its --vsock-uds socket served as the VMM and the
guest's port forwarder would (CONNECT 53, PORT P, then an echo), every request refused."""
import json, os, socket, sys, threading

args = sys.argv[1:]
with open({record!r}, "w") as f:
    json.dump(args, f)
path = args[args.index("--vsock-uds") + 1]

def line(c):
    out = b""
    while not out.endswith(b"\n"):
        b = c.recv(1)
        if not b:
            break
        out += b
    return out

def handle(c):
    with c:
        if line(c) != b"CONNECT 53\n":
            return
        c.sendall(b"OK 1\n")
        port = line(c)
        c.sendall(b"OK\n" + b"guest port " + port)
        while True:
            data = c.recv(65536)
            if not data:
                break
            c.sendall(data)
        c.shutdown(socket.SHUT_WR)

srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(path)
srv.listen(16)

def accept():
    while True:
        c, _ = srv.accept()
        threading.Thread(target=handle, args=(c,), daemon=True).start()

threading.Thread(target=accept, daemon=True).start()
print(json.dumps({{"event": "ready", "restored": True}}), flush=True)
for request in sys.stdin:
    msg = json.loads(request)
    print(json.dumps({{"id": msg["id"], "error": {{"code": "unknown_op", "message": "fake"}}}}), flush=True)
os.unlink(path)
'''


@pytest.fixture
def fake_episode(tmp_path: Any) -> Tuple[str, str]:
    record = str(tmp_path / "argv.json")
    script = tmp_path / "agentvm"
    script.write_text(FAKE_EPISODE.format(python=sys.executable, record=record))
    script.chmod(0o755)
    return str(script), record


def test_embedded_forward_through_the_episodes_vsock_socket(fake_episode: Tuple[str, str], tmp_path: Any) -> None:
    binary, record = fake_episode
    sb = Sandbox(binary=binary, snapshot_dir=str(tmp_path))
    try:
        with open(record) as f:
            argv = json.load(f)
        assert argv.count("--vsock-uds") == 1
        path = argv[argv.index("--vsock-uds") + 1]
        private = os.path.dirname(path)
        assert stat.S_IMODE(os.stat(private).st_mode) == 0o700 and os.stat(private).st_uid == os.getuid()
        with pytest.raises(ValueError, match="service mode.*ports.forward"):
            sb.ports.url(8000)
        assert sb.ports.headers() == {}
        with sb.ports.forward(8000) as fwd:
            assert roundtrip(addr(fwd), b"embedded") == b"guest port PORT 8000\nembedded"
        left = sb.ports.forward(8001)
    finally:
        sb.kill()
    assert left.closed and forward_threads() == []
    assert not os.path.exists(private), "the episode's vsock directory outlived it"


def test_embedded_takes_the_callers_vsock_socket(fake_episode: Tuple[str, str], tmp_path: Any) -> None:
    binary, record = fake_episode
    mine = tempfile.mkdtemp(prefix="agentvm-test-vsock-")
    try:
        path = os.path.join(mine, "v.sock")
        sb = Sandbox(binary=binary, snapshot_dir=str(tmp_path), agentvm_args=["--vsock-uds", path])
        try:
            with open(record) as f:
                argv = json.load(f)
            assert argv.count("--vsock-uds") == 1 and argv[argv.index("--vsock-uds") + 1] == path
            with sb.ports.forward(80) as fwd:
                assert roundtrip(addr(fwd), b"x") == b"guest port PORT 80\nx"
        finally:
            sb.kill()
        assert os.path.isdir(mine), "the caller's directory was removed"
    finally:
        for name in os.listdir(mine):
            os.unlink(os.path.join(mine, name))
        os.rmdir(mine)
