"""A guest's TCP port as a local one: a listener on this host whose every connection is bridged,
bytes unchanged both ways, to a TCP port in the sandbox (python/README.md, "Ports").

A sandbox has no network device: its ports are reached over vsock, through one of two far ends
(the dialers below, one per transport):

- embedded: the episode's ``--vsock-uds`` socket (Firecracker's hybrid convention, docs/cli.md,
  "The guest's vsock and disk"): ``CONNECT 53`` answered ``OK <n>``, which reaches the guest's
  port forwarder, then ``PORT <P>`` answered ``OK`` (the stream is now the TCP connection to
  guest port P) or ``ERR <reason>``. Lines of at most 64 bytes.
- service: a connection to serve upgraded, ``GET /v1/sandboxes/{id}/tcp/{P}`` with
  ``Upgrade: agentvm-tcp`` answered ``101 Switching Protocols`` (the bytes after the head are
  the stream's), or an error status with serve's JSON error.

Threads and blocking sockets, not the event loop, since the bytes never go through it: one
thread accepts; each connection then has two, one per direction, each holding at most one chunk
of 64 KiB, so a slow reader on one side holds back the writer on the other and never this
process's memory. An end of stream one way is passed on as ``shutdown(SHUT_WR)`` of the other
socket (the other way goes on); an error either way ends the connection both ways. A handshake
that fails (refused, a malformed answer, none within 40 s) closes that local connection only,
logged with its reason on the ``agentvm.ports`` logger.
"""
from __future__ import annotations

import json
import logging
import re
import selectors
import socket
import threading
import time
from typing import Callable, Dict, List, Optional, Protocol, Set, Tuple

log = logging.getLogger("agentvm.ports")

# Past the guest relay's own 30 s for a server whose listen backlog is full.
HANDSHAKE_TIMEOUT = 40.0
GUEST_FORWARDER_PORT = 53     # the guest's port forwarder, on vsock
MAX_LINE = 64                 # a hybrid handshake line, its newline included
MAX_HEAD = 16 << 10           # serve's answer head, and the error body after it
CHUNK = 64 << 10              # the most one direction of a connection holds
MAX_CONNECTIONS = 512         # at once per forward; past it a new connection is closed at once
UPGRADE = "agentvm-tcp"
_CONNECTED = re.compile(rb"OK [0-9]+")
_STATUS = re.compile(rb"HTTP/1\.[01] ([0-9]{3})(?: [^\r\n]*)?")


class Refused(Exception):
    """The far end did not give a stream to the guest port (the reason is the message)."""


class Dialer(Protocol):
    """How a transport reaches a guest TCP port."""

    where: str  # for log lines: what is connected to

    def connect(self, timeout: float) -> socket.socket:
        """A socket connected to the far end (not yet handshaken)."""

    def handshake(self, sock: socket.socket, port: int, deadline: float) -> bytes:
        """Asks the far end for guest port ``port`` (before ``deadline``, a ``time.monotonic()``);
        returns the stream's bytes that came with the answer. Raises :class:`Refused`."""


def _recv(sock: socket.socket, size: int, deadline: float, what: str) -> bytes:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise Refused(f"no {what} within {HANDSHAKE_TIMEOUT:g} s")
    sock.settimeout(remaining)
    try:
        return sock.recv(size)
    except socket.timeout:
        raise Refused(f"no {what} within {HANDSHAKE_TIMEOUT:g} s") from None


class _Lines:
    """Reads the handshake's lines; what comes after the last one is the stream's."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.buf = b""

    def line(self, what: str, eof: str) -> bytes:
        while True:
            nl = self.buf.find(b"\n", 0, MAX_LINE)
            if nl >= 0:
                line, self.buf = self.buf[:nl], self.buf[nl + 1:]
                return line
            if len(self.buf) >= MAX_LINE:
                raise Refused(f"the {what} is longer than {MAX_LINE} bytes: {self.buf[:MAX_LINE]!r}")
            data = _recv(self.sock, 4096, self.deadline, what)
            if not data:
                raise Refused(eof)
            self.buf += data


class HybridVsockDialer:
    """Embedded mode: the episode's ``--vsock-uds`` socket, then the guest's port forwarder."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.where = path

    def connect(self, timeout: float) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(self.path)
        except BaseException:
            sock.close()
            raise
        return sock

    def handshake(self, sock: socket.socket, port: int, deadline: float) -> bytes:
        lines = _Lines(sock, deadline)
        sock.sendall(b"CONNECT %d\n" % GUEST_FORWARDER_PORT)
        line = lines.line(f"answer to CONNECT {GUEST_FORWARDER_PORT}",
                          f"the VM refused vsock port {GUEST_FORWARDER_PORT} (the guest's port forwarder "
                          f"does not listen)")
        if not _CONNECTED.fullmatch(line):
            raise Refused(f"CONNECT {GUEST_FORWARDER_PORT} was answered {line!r}, not OK <n>")
        sock.sendall(b"PORT %d\n" % port)
        line = lines.line("answer to PORT", "the guest's port forwarder closed the connection without an answer")
        if line == b"OK":
            return lines.buf
        if line.startswith(b"ERR "):
            raise Refused(line[4:].decode("utf-8", errors="replace"))
        raise Refused(f"PORT {port} was answered {line!r}, neither OK nor ERR <reason>")


class ServeDialer:
    """Service mode: a new connection to serve, upgraded to the guest port's stream."""

    def __init__(self, kind: str, host: str, port: Optional[int], prefix: str, token: Optional[str],
                 sandbox_path: str) -> None:
        self.kind = kind            # "unix" (host is the socket's path) or "http"
        self.host = host
        self.port = port
        self.prefix = prefix
        self.token = token
        self.sandbox_path = sandbox_path  # /v1/sandboxes/{id}, quoted
        if kind == "unix":
            self.where = f"unix:{host}"
            self.host_header = "localhost"
        else:
            name = f"[{host}]" if ":" in host else host
            self.where = f"{name}:{port or 80}"
            self.host_header = name if port is None else f"{name}:{port}"

    def connect(self, timeout: float) -> socket.socket:
        if self.kind == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(timeout)
                sock.connect(self.host)
            except BaseException:
                sock.close()
                raise
            return sock
        sock = socket.create_connection((self.host, self.port or 80), timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def request(self, port: int) -> bytes:
        lines = [f"GET {self.prefix}{self.sandbox_path}/tcp/{port} HTTP/1.1", f"Host: {self.host_header}",
                 "Connection: Upgrade", f"Upgrade: {UPGRADE}"]
        if self.token:
            lines.append(f"Authorization: Bearer {self.token}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8")

    def handshake(self, sock: socket.socket, port: int, deadline: float) -> bytes:
        sock.sendall(self.request(port))
        buf = b""
        while True:
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(buf) > MAX_HEAD:
                raise Refused(f"serve's answer head is longer than {MAX_HEAD} bytes")
            data = _recv(sock, 4096, deadline, "answer from serve")
            if not data:
                raise Refused("serve closed the connection without an answer" if not buf
                              else f"serve closed the connection in its answer's head: {buf[:200]!r}")
            buf += data
        head, rest = buf[:end], buf[end + 4:]
        status_line, _, header_text = head.partition(b"\r\n")
        m = _STATUS.fullmatch(status_line)
        if m is None:
            raise Refused(f"serve's answer is not HTTP: {status_line[:200]!r}")
        status = int(m.group(1))
        headers: Dict[str, str] = {}
        for raw in header_text.split(b"\r\n"):
            name, sep, value = raw.partition(b":")
            if sep:
                headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
        if status == 101:
            upgrade = headers.get("upgrade", "")
            if upgrade.lower() != UPGRADE:
                raise Refused(f"serve switched to {upgrade!r}, not {UPGRADE}")
            return rest
        raise Refused(f"serve answered {status}: {self._error(sock, headers, rest, deadline)}")

    @staticmethod
    def _error(sock: socket.socket, headers: Dict[str, str], body: bytes, deadline: float) -> str:
        """The error of an answer that is not 101, from its JSON body (at most 16 KiB read)."""
        try:
            length: Optional[int] = int(headers["content-length"])
        except (KeyError, ValueError):
            length = None
        want = MAX_HEAD if length is None else min(length, MAX_HEAD)
        try:
            while len(body) < want:
                data = _recv(sock, want - len(body), deadline, "error body from serve")
                if not data:
                    break
                body += data
        except (Refused, OSError):
            pass
        try:
            doc = json.loads(body)
            err = doc["error"]
            # serve's {"error": CODE, "message": TEXT}, or {"error": {"code": CODE, "message": TEXT}}.
            code, message = (err.get("code"), err.get("message")) if isinstance(err, dict) \
                else (err, doc.get("message"))
            return f"{code}: {message}"
        except (ValueError, TypeError, KeyError, AttributeError):
            return body[:500].decode("utf-8", errors="replace") or "(no body)"


class _Link:
    """One accepted connection and its far end, used by up to two threads (one per direction):
    the last one to let go closes both sockets, so that :meth:`abort` from another thread never
    shuts down a descriptor that was closed and reused."""

    def __init__(self, local: socket.socket, peer: str) -> None:
        self.local = local
        self.peer = peer
        self.far: Optional[socket.socket] = None
        self.lock = threading.Lock()
        self.users = 1
        self.aborted = False
        self.closed = False

    def set_far(self, far: socket.socket) -> bool:
        """Adopts the far socket; False when the link was aborted meanwhile (it is then closed)."""
        with self.lock:
            if not self.aborted:
                self.far = far
                return True
        far.close()
        return False

    def abort(self) -> None:
        """Ends the connection both ways: wakes whichever thread waits on either socket."""
        with self.lock:
            self.aborted = True
            if self.closed:
                return
            for sock in (self.local, self.far):
                if sock is not None:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

    def release(self) -> bool:
        """One thread is done with the link; True when it was the last (both sockets closed)."""
        with self.lock:
            self.users -= 1
            if self.users > 0:
                return False
            self.closed = True
        for sock in (self.local, self.far):
            if sock is not None:
                sock.close()
        return True


class Forwarder:
    """A local TCP listener on ``host:port`` (0: any free port) whose connections reach guest
    port ``guest_port`` through ``dialer``, until :meth:`close`."""

    def __init__(self, dialer: Dialer, guest_port: int, host: str, port: int, *, sandbox_id: str) -> None:
        self.dialer = dialer
        self.guest_port = guest_port
        self.sandbox_id = sandbox_id
        family, _, _, _, address = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)[0]
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(address)
            listener.listen(128)
            listener.setblocking(False)
            self._wake_r, self._wake_w = socket.socketpair()
        except BaseException:
            listener.close()
            raise
        self._listener = listener
        bound = listener.getsockname()
        self.host: str = bound[0]
        self.port: int = bound[1]
        self.address = f"[{self.host}]:{self.port}" if family == socket.AF_INET6 else f"{self.host}:{self.port}"
        self._lock = threading.Lock()
        self._closing = False
        self._closed = False
        self._links: Set[_Link] = set()
        self._threads: List[threading.Thread] = []
        self._on_closed: List[Callable[[], None]] = []
        self._acceptor = threading.Thread(target=self._accept_loop, daemon=True,
                                          name=f"agentvm-forward-{self.port}")
        try:
            self._acceptor.start()
        except BaseException:
            self._release_listener()
            raise

    def __repr__(self) -> str:
        state = "closed" if self._closing else "open"
        return f"<forward {self.address} -> {self.sandbox_id} port {self.guest_port}, {state}>"

    # -- closing ----------------------------------------------------------------------------------

    @property
    def closing(self) -> bool:
        return self._closing

    def begin_close(self) -> None:
        """Stops accepting and ends every connection; the acceptor thread finishes the rest."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def on_closed(self, callback: Callable[[], None]) -> None:
        """``callback`` (on the acceptor thread, or here when closed already) once every thread
        but the acceptor's last steps is gone and every socket closed."""
        with self._lock:
            if not self._closed:
                self._on_closed.append(callback)
                return
        callback()

    def join(self) -> None:
        if threading.current_thread() is not self._acceptor:
            self._acceptor.join()

    def close(self) -> None:
        """:meth:`begin_close`, and waits until the forward's threads have ended. A connection
        still connecting to the far end holds this up for at most the handshake timeout."""
        self.begin_close()
        self.join()

    def _release_listener(self) -> None:
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()

    # -- threads ------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        sel = selectors.DefaultSelector()
        try:
            sel.register(self._listener, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while not self._closing:
                for key, _ in sel.select():
                    if key.fileobj is self._listener and not self._closing:
                        self._accept()
        except Exception:
            log.exception("port forward %s: accepting failed; the forward is closed", self.address)
        finally:
            sel.close()
            self._finish()

    def _accept(self) -> None:
        try:
            local, peer = self._listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        except OSError as e:
            # Out of descriptors (EMFILE, ENFILE): the connection waits in the backlog; do not spin.
            log.warning("port forward %s: cannot accept a connection: %s", self.address, e)
            time.sleep(0.1)
            return
        local.setblocking(True)
        if local.family in (socket.AF_INET, socket.AF_INET6):
            local.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        link = _Link(local, _peer_name(peer))
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            full = len(self._links) >= MAX_CONNECTIONS
            if not full:
                self._links.add(link)
        if full:
            log.warning("port forward %s: connection from %s closed: %d connections are open already",
                        self.address, link.peer, MAX_CONNECTIONS)
            local.close()
            return
        self._start(link, self._serve, (link,), "dial")

    def _start(self, link: _Link, target: Callable[..., None], args: Tuple[object, ...], what: str) -> bool:
        """Starts one of a link's threads, unless the forward is closing (the link is then let go)."""
        thread = threading.Thread(target=target, args=args, daemon=True, name=f"agentvm-forward-{self.port}-{what}")
        with self._lock:
            if not self._closing:
                try:
                    thread.start()
                except RuntimeError as e:  # no more threads to be had
                    log.warning("port forward %s: connection from %s closed: %s", self.address, link.peer, e)
                else:
                    self._threads.append(thread)
                    return True
        self._drop(link)
        return False

    def _drop(self, link: _Link) -> None:
        # Kept while a direction still runs, so that close() ends it too.
        if link.release():
            with self._lock:
                self._links.discard(link)

    def _serve(self, link: _Link) -> None:
        """A new connection: the handshake with the far end, then the local-to-far direction
        here and the other on a thread of its own."""
        deadline = time.monotonic() + HANDSHAKE_TIMEOUT
        try:
            try:
                far = self.dialer.connect(HANDSHAKE_TIMEOUT)
            except OSError as e:
                raise Refused(f"cannot connect to {self.dialer.where}: {e}") from None
            if not link.set_far(far):
                self._drop(link)
                return
            try:
                first = self.dialer.handshake(far, self.guest_port, deadline)
            except OSError as e:
                raise Refused(f"the handshake with {self.dialer.where} failed: {e}") from None
            far.settimeout(None)
        except Refused as e:
            if not link.aborted:
                log.warning("port forward %s -> sandbox %s port %d: connection from %s closed: %s",
                            self.address, self.sandbox_id, self.guest_port, link.peer, e)
            self._drop(link)
            return
        except Exception:
            log.exception("port forward %s: connection from %s closed", self.address, link.peer)
            self._drop(link)
            return
        with link.lock:
            link.users = 2
        if not self._start(link, self._pump, (link, far, link.local, first), "in"):
            self._drop(link)  # _start let go of the other direction's share; this is ours
            return
        self._pump(link, link.local, far, b"")

    def _pump(self, link: _Link, src: socket.socket, dst: socket.socket, first: bytes) -> None:
        """One direction, until its end of stream (passed on) or an error (the whole connection
        ends)."""
        try:
            if first:
                dst.sendall(first)
            while True:
                data = src.recv(CHUNK)
                if not data:
                    break
                dst.sendall(data)
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        except OSError:
            link.abort()
        finally:
            self._drop(link)

    def _finish(self) -> None:
        """The acceptor's last steps: no more connections, every one ended, every thread gone."""
        with self._lock:
            self._closing = True
            links = list(self._links)
            threads = list(self._threads)
        for link in links:
            link.abort()
        for thread in threads:
            thread.join()
        self._release_listener()
        with self._lock:
            self._closed = True
            callbacks, self._on_closed = self._on_closed, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("port forward %s: a close callback failed", self.address)


def _peer_name(peer: object) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"[{peer[0]}]:{peer[1]}" if ":" in str(peer[0]) else f"{peer[0]}:{peer[1]}"
    return str(peer) or "a local client"
