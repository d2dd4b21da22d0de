#!/usr/bin/env python3
"""agentvm-serve's inbound ports (docs/api.md, "Ports"; issue 29) without VMs: HTTP requests,
WebSocket-style upgrades and raw byte streams carried to TCP ports inside a sandbox, through
the native API (/v1/sandboxes/ID/ports/P/..., /v1/sandboxes/ID/tcp/P) and E2B's
E2b-Sandbox-Id/E2b-Sandbox-Port headers: targets and headers as sent, 64 MiB bodies both ways
by hash, HEAD, half-closes, guests and clients going away mid-answer, concurrency, a slow
reader beside a quick one, 1,000 connections leaving no descriptor or thread behind, every
refusal, and the per-sandbox cap of 256 connections.

usage: ports_check.py AGENTVM_SERVE_BINARY
Prints "ok <case>: <what was seen>" or "FAIL <case>: <why>" per case; exits non-zero if any
failed. Needs no KVM: serve runs from a copy of its binary beside fake_episode.py as its
`agentvm`, which with --vsock-uds plays the VMM's vsock end and the guest's port relay, the
"guest" being this host's loopback: a sandbox's guest port P is 127.0.0.1:P here, where this
check's own servers (threads) listen. One serve on TCP loopback with a token, one with
--no-auth; FAKE_EPISODE_SILENT_PORT names a port the fake accepts and never answers.
"""
import base64
import hashlib
import http.client
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "vm"))
sys.path.insert(0, HERE)
from checks import expect, run_case  # noqa: E402
from serve_client import free_port  # noqa: E402
import serve_client  # noqa: E402

SERVE = sys.argv[1]
TMP = tempfile.mkdtemp(prefix="agentvm-ports-")
TOKEN = "ports-check-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
FAKE = f"#!/bin/sh\nexec {sys.executable} {os.path.join(HERE, 'fake_episode.py')} \"$@\"\n"
MIB = 1024 * 1024
WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
# 64 MiB of random bytes, made once: what the guest answers /big with and what uploads send.
BIG = os.urandom(64 * MIB)
BIG_SHA = hashlib.sha256(BIG).hexdigest()
SIZED = bytes(range(256)) * 400  # 102,400 bytes, answered with a Content-Length
SILENT_PORT = free_port()  # the fake episode accepts it and never answers (the cap's case)


def make_bin(name, script):
    bin_dir = os.path.join(TMP, name)
    os.mkdir(bin_dir)
    try:
        os.link(SERVE, os.path.join(bin_dir, "agentvm-serve"))
    except OSError:
        shutil.copy2(SERVE, os.path.join(bin_dir, "agentvm-serve"))
    path = os.path.join(bin_dir, "agentvm")
    with open(path, "w") as f:
        f.write(script)
    os.chmod(path, 0o755)
    return bin_dir


# ---------------------------------------------------------------------------------------------
# The "guest": an HTTP server and a raw TCP server on this host's loopback.

def read_head(sock, limit=64 * 1024):
    """(head bytes, what came after it) from sock; (None, data) at EOF before a whole head."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        if not piece:
            return None, data
        data += piece
        if len(data) > limit:
            raise ValueError(f"a head over {limit} bytes")
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def parse_head(head):
    lines = head.decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.append((name.strip(), value.strip()))
    return lines[0], headers


def header(headers, name):
    """The first value of `name` in a list of (name, value), or None."""
    for n, v in headers:
        if n.lower() == name.lower():
            return v
    return None


class Reader:
    """Reads a socket with bytes already read in front."""

    def __init__(self, sock, early=b""):
        self.sock = sock
        self.buf = early

    def some(self, most=65536):
        if self.buf:
            piece, self.buf = self.buf[:most], self.buf[most:]
            return piece
        return self.sock.recv(most)

    def exact(self, n):
        parts = []
        while n:
            piece = self.some(min(n, 1 << 20))
            if not piece:
                raise EOFError(f"EOF with {n} bytes still to come")
            parts.append(piece)
            n -= len(piece)
        return b"".join(parts)

    def line(self):
        while b"\r\n" not in self.buf:
            piece = self.sock.recv(65536)
            if not piece:
                raise EOFError("EOF inside a chunk's size line")
            self.buf += piece
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def body(self, headers, sink):
        """Feeds a body (chunked or by Content-Length) to sink; returns its framing."""
        if (header(headers, "Transfer-Encoding") or "").lower() == "chunked":
            while True:
                size = int(self.line().split(b";")[0], 16)
                if size == 0:
                    while self.line():
                        pass
                    return "chunked"
                while size:
                    piece = self.some(min(size, 1 << 20))
                    if not piece:
                        raise EOFError("EOF inside a chunk")
                    sink(piece)
                    size -= len(piece)
                self.exact(2)
        length = int(header(headers, "Content-Length") or 0)
        while length:
            piece = self.some(min(length, 1 << 20))
            if not piece:
                raise EOFError("EOF inside the body")
            sink(piece)
            length -= len(piece)
        return "length" if header(headers, "Content-Length") else "none"


class Guest:
    """What a server in the guest sees and does: an HTTP server answering by path, and a raw
    TCP server answering by its first line. Each connection is a thread; what they saw is kept
    by key for the cases to look at."""

    def __init__(self):
        self.http = self._listen()
        self.raw = self._listen()
        self.http_port = self.http.getsockname()[1]
        self.raw_port = self.raw.getsockname()[1]
        self.lock = threading.Lock()
        self.seen = {}
        self.events = {}
        self.open_conns = set()
        for listener, handler in ((self.http, self.serve_http), (self.raw, self.serve_raw)):
            threading.Thread(target=self.accept, args=(listener, handler), daemon=True).start()

    @staticmethod
    def _listen():
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen(512)
        return s

    def accept(self, listener, handler):
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=self.run, args=(handler, conn), daemon=True).start()

    def run(self, handler, conn):
        with self.lock:
            self.open_conns.add(conn)
        try:
            with conn:
                handler(conn)
        except (OSError, EOFError, ValueError):
            pass
        finally:
            with self.lock:
                self.open_conns.discard(conn)

    def record(self, key, value):
        with self.lock:
            self.seen[key] = value
            event = self.events.setdefault(key, threading.Event())
        event.set()

    def wait(self, key, timeout):
        with self.lock:
            event = self.events.setdefault(key, threading.Event())
        if not event.wait(timeout):
            return None
        with self.lock:
            return self.seen[key]

    def forget(self, key):
        with self.lock:
            self.seen.pop(key, None)
            self.events.pop(key, None)

    def stop(self):
        for listener in (self.http, self.raw):
            listener.close()
        with self.lock:
            conns = list(self.open_conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # -- HTTP -------------------------------------------------------------------------------

    @staticmethod
    def answer(conn, status, headers, body=b"", head_only=False):
        text = f"HTTP/1.1 {status}\r\n" + "".join(f"{n}: {v}\r\n" for n, v in headers) + "\r\n"
        conn.sendall(text.encode("latin-1") + (b"" if head_only else body))

    def serve_http(self, conn):
        head, early = read_head(conn)
        if head is None:
            return
        request_line, headers = parse_head(head)
        method, target, _ = request_line.split(" ", 2)
        path = target.split("?", 1)[0]
        reader = Reader(conn, early)
        key = header(headers, "X-Case")
        if path == "/hash":
            digest = hashlib.sha256()
            count = [0]

            def sink(piece):
                digest.update(piece)
                count[0] += len(piece)
            framing = reader.body(headers, sink)
            seen = {"sha256": digest.hexdigest(), "bytes": count[0], "framing": framing,
                    "content_length": header(headers, "Content-Length")}
            body = json.dumps(seen).encode()
            return self.answer(conn, "200 OK", [("Content-Type", "application/json"),
                                                ("Content-Length", len(body))], body)
        reader.body(headers, lambda piece: None)
        if path == "/big":
            return self.answer(conn, "200 OK", [("Content-Type", "application/octet-stream"),
                                                ("Content-Length", len(BIG))], BIG, method == "HEAD")
        if path == "/sized":
            return self.answer(conn, "200 OK", [("Content-Type", "text/plain"), ("X-Guest-Sized", "yes"),
                                                ("Content-Length", len(SIZED))], SIZED, method == "HEAD")
        if path == "/chunked":
            # No length known in advance: HEAD says so too, with no body (RFC 9110, 9.3.2).
            return self.answer(conn, "200 OK", [("Content-Type", "text/plain"), ("Transfer-Encoding", "chunked")],
                               b"6\r\nhello \r\n5\r\nworld\r\n0\r\n\r\n", method == "HEAD")
        if path == "/half":
            # The server dies half-way through its answer.
            self.answer(conn, "200 OK", [("Content-Type", "application/octet-stream"),
                                         ("Content-Length", 1_000_000)], BIG[:500_000])
            conn.shutdown(socket.SHUT_RDWR)
            return
        if path == "/endless":
            # An answer far longer than any client reads; when the send fails, serve closed us.
            self.answer(conn, "200 OK", [("Content-Length", 1 << 40)])
            try:
                while True:
                    conn.sendall(BIG[:MIB])
            except OSError as e:
                self.record(key, {"closed_at": time.monotonic(), "error": type(e).__name__})
            return
        if path == "/ws":
            return self.websocket(conn, reader, headers, key)
        # Anything else: an echo of what the server was asked.
        seen = {"method": method, "target": target, "headers": headers}
        if key:
            self.record(key, seen)
        body = json.dumps(seen).encode()
        self.answer(conn, "200 OK", [("Content-Type", "application/x-guest-echo; charset=latin-1"),
                                     ("X-Guest-Custom", "custom-value-42"), ("Keep-Alive", "timeout=99"),
                                     ("Content-Length", len(body))], body, method == "HEAD")

    def websocket(self, conn, reader, headers, key):
        self.record(key + "-head", headers)
        ws_key = header(headers, "Sec-WebSocket-Key") or ""
        accept = base64.b64encode(hashlib.sha1((ws_key + WS_GUID).encode()).digest()).decode()
        self.answer(conn, "101 Switching Protocols", [("Upgrade", "websocket"), ("Connection", "Upgrade"),
                                                      ("Sec-WebSocket-Accept", accept), ("X-Guest-Ws", "yes")])
        # Echo to the client's end, then a last word after a pause, then close.
        while True:
            piece = reader.some()
            if not piece:
                break
            conn.sendall(piece)
        time.sleep(0.3)
        conn.sendall(b"GUEST-FINAL-BYTES")
        self.record(key, "eof")

    # -- raw TCP ----------------------------------------------------------------------------

    def serve_raw(self, conn):
        line = b""
        while not line.endswith(b"\n"):
            piece = conn.recv(1)
            if not piece:
                return
            line += piece
        words = line.decode().split()
        if words[0] == "ECHO":
            # Echo to EOF, recording what came; then close.
            digest = hashlib.sha256()
            count = 0
            while True:
                piece = conn.recv(65536)
                if not piece:
                    break
                digest.update(piece)
                count += len(piece)
                conn.sendall(piece)
            if len(words) > 1:
                self.record(words[1], {"sha256": digest.hexdigest(), "bytes": count})
        elif words[0] == "CLOSE":
            conn.sendall(b"bye")
        elif words[0] == "SINK":
            while conn.recv(65536):
                pass
            self.record(words[1], {"eof_at": time.monotonic()})


# ---------------------------------------------------------------------------------------------
# serve and its clients

class Server:
    def __init__(self, name, bin_dir, *args, token=True):
        self.port = free_port()
        if token:
            token_file = os.path.join(TMP, "token")
            with open(token_file, "w") as f:
                f.write(TOKEN + "\n")
            os.chmod(token_file, 0o600)
            extra = ["--token-file", token_file]
        else:
            extra = ["--no-auth"]
        self.serve = serve_client.Serve(
            os.path.join(bin_dir, "agentvm-serve"), "--listen", f"tcp:127.0.0.1:{self.port}", *extra,
            "--pool", "default=0", "--mem-reserve", "0", "--node-id", "node-p", *args,
            log_level="info", log_path=os.path.join(TMP, f"{name}.log"))
        self.serve.wait_listening(lambda: self.http(timeout=5))
        self.pid = self.serve.proc.pid
        self.auth = AUTH if token else {}

    def http(self, timeout=10):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def call(self, method, path, body=None, headers=None, timeout=15, auth=True):
        conn = self.http(timeout)
        try:
            conn.request(method, path, body=body, headers={**(self.auth if auth else {}), **(headers or {})})
            r = conn.getresponse()
            return r.status, r.getheaders(), r.read()
        finally:
            conn.close()

    def create(self):
        status, _, data = self.call("POST", "/v1/sandboxes", json.dumps({}).encode(),
                                    {"Content-Type": "application/json"}, timeout=30)
        expect(status == 201, f"create answered {status}: {data[:300]!r}")
        return json.loads(data)["id"]

    def raw(self, timeout=10):
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout)

    def request_head(self, method, target, headers=()):
        lines = [f"{method} {target} HTTP/1.1", f"Host: 127.0.0.1:{self.port}"]
        lines += [f"{n}: {v}" for n, v in {**self.auth, **dict(headers)}.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def fds(self):
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def threads(self):
        return len(os.listdir(f"/proc/{self.pid}/task"))

    def stop(self):
        return self.serve.stop(timeout=30)


def native_error(status, data, want_status, want_code):
    expect(status == want_status, f"answered {status}, not {want_status}: {data[:300]!r}")
    try:
        doc = json.loads(data)
    except ValueError:
        expect(False, f"a {status} whose body is not JSON: {data[:300]!r}")
    expect(set(doc) == {"error", "message"} and doc["error"] == want_code and isinstance(doc["message"], str)
           and doc["message"], f"{status} {doc}, not {{'error': {want_code!r}, 'message': ...}}")
    return doc["message"]


def e2b_error(status, data, want_status):
    expect(status == want_status, f"answered {status}, not {want_status}: {data[:300]!r}")
    try:
        doc = json.loads(data)
    except ValueError:
        expect(False, f"a {status} whose body is not JSON: {data[:300]!r}")
    expect(set(doc) == {"code", "message"} and doc["code"] == want_status and doc["message"],
           f"{status} {doc}, not E2B's {{'code': {want_status}, 'message': ...}}")
    return doc["message"]


def open_tcp(server, sandbox, port, early=b"", timeout=10):
    """A raw stream to the guest's `port` (/tcp/P, upgraded); returns (socket, bytes already
    read after the 101's head)."""
    sock = server.raw(timeout)
    sock.sendall(server.request_head("GET", f"/v1/sandboxes/{sandbox}/tcp/{port}",
                                     [("Connection", "Upgrade"), ("Upgrade", "agentvm-tcp")]) + early)
    head, rest = read_head(sock)
    expect(head is not None, f"/tcp/{port}: serve closed the connection without answering ({rest[:200]!r})")
    status_line, headers = parse_head(head)
    expect(status_line.split(" ")[1] == "101",
           f"/tcp/{port} answered {status_line!r}: {rest[:300]!r}")
    expect((header(headers, "Upgrade") or "").lower() == "agentvm-tcp", f"the 101's headers: {headers}")
    return sock, rest


def read_to_eof(sock, early=b"", timeout=10):
    sock.settimeout(timeout)
    data = [early]
    while True:
        piece = sock.recv(1 << 20)
        if not piece:
            return b"".join(data)
        data.append(piece)


def send_all_then_shut(sock, data, errors):
    try:
        view = memoryview(data)
        while view:
            sent = sock.send(view[:1 << 20])
            view = view[sent:]
        sock.shutdown(socket.SHUT_WR)
    except OSError as e:
        errors.append(e)


# ---------------------------------------------------------------------------------------------
# The cases

def target_and_headers(ctx):
    server, sandbox, guest = ctx["auth"], ctx["sandbox"], ctx["guest"]
    port = guest.http_port
    raw_path = "/echo/a%20b%2Fc/%E2%9C%93;p=1"
    query = "?q=1&x=%2F+y&e=%3D&empty"
    status, headers, data = server.call(
        "GET", f"/v1/sandboxes/{sandbox}/ports/{port}{raw_path}{query}",
        headers={"Host": "myapp.example:8080", "X-Client-Custom": "hello there", "X-Case": "target",
                 "Keep-Alive": "timeout=5", "TE": "trailers", "Proxy-Authorization": "Basic eDp5"})
    expect(status == 200, f"answered {status}: {data[:300]!r}")
    seen = json.loads(data)
    expect(seen["target"] == raw_path + query,
           f"the guest was asked for {seen['target']!r}, not {raw_path + query!r} as sent")
    got = dict(headers)
    expect(got.get("X-Guest-Custom") == "custom-value-42", f"the guest's own header did not come back: {headers}")
    expect(got.get("Content-Type") == "application/x-guest-echo; charset=latin-1",
           f"Content-Type came back as {got.get('Content-Type')!r}")
    expect("Keep-Alive" not in got or got["Keep-Alive"] != "timeout=99",
           f"the guest's hop-by-hop Keep-Alive reached the client: {headers}")
    guest_headers = seen["headers"]
    names = {n.lower() for n, _ in guest_headers}
    expect("authorization" not in names, f"the guest saw Authorization: {guest_headers}")
    expect(header(guest_headers, "Host") == "myapp.example:8080",
           f"the guest saw Host {header(guest_headers, 'Host')!r}")
    expect(header(guest_headers, "X-Client-Custom") == "hello there", f"X-Client-Custom lost: {guest_headers}")
    leaked = names & {"keep-alive", "te", "proxy-authorization"}
    expect(not leaked, f"hop-by-hop headers reached the guest: {sorted(leaked)} in {guest_headers}")
    # /ports/P alone and /ports/P?q are the guest's "/" and "/?q"; Basic auth works the same.
    basic = "Basic " + base64.b64encode(f"agentvm:{TOKEN}".encode()).decode()
    bare = {}
    for suffix, want in (("", "/"), ("?only=query", "/?only=query"), ("/", "/")):
        status, _, data = server.call("GET", f"/v1/sandboxes/{sandbox}/ports/{port}{suffix}", auth=False,
                                      headers={"Authorization": basic})
        expect(status == 200, f"/ports/{port}{suffix} with Basic auth answered {status}: {data[:300]!r}")
        seen = json.loads(data)
        expect(seen["target"] == want, f"/ports/{port}{suffix} asked the guest for {seen['target']!r}, not {want!r}")
        expect(header(seen["headers"], "Authorization") is None, "Basic's Authorization reached the guest")
        bare[suffix or "(none)"] = seen["target"]
    return (f"guest asked for {raw_path + query!r} with Host 'myapp.example:8080', no Authorization or hop-by-hop "
            f"headers; client got X-Guest-Custom and Content-Type as sent; bare paths {bare}")


def bodies_64mib(ctx):
    server, sandbox, guest = ctx["auth"], ctx["sandbox"], ctx["guest"]
    base = f"/v1/sandboxes/{sandbox}/ports/{guest.http_port}"
    seen = []
    # With a Content-Length.
    started = time.monotonic()
    status, _, data = server.call("POST", base + "/hash", body=BIG,
                                  headers={"Content-Type": "application/octet-stream"}, timeout=60)
    expect(status == 200, f"the 64 MiB POST answered {status}: {data[:300]!r}")
    doc = json.loads(data)
    expect(doc["bytes"] == len(BIG) and doc["sha256"] == BIG_SHA,
           f"the guest got {doc['bytes']} bytes hashing {doc['sha256'][:16]}, not {len(BIG)} / {BIG_SHA[:16]}")
    expect(doc["framing"] == "length" and doc["content_length"] == str(len(BIG)),
           f"a Content-Length body reached the guest as {doc['framing']} (Content-Length {doc['content_length']})")
    seen.append(f"Content-Length POST {time.monotonic() - started:.1f} s")
    # Chunked, in pieces of uneven sizes.
    started = time.monotonic()

    def pieces():
        at, size = 0, 1
        while at < len(BIG):
            yield BIG[at:at + size]
            at += size
            size = size * 7 % (3 * MIB) + 1
    conn = server.http(60)
    try:
        conn.request("POST", base + "/hash", body=pieces(), headers={**AUTH, "Transfer-Encoding": "chunked"},
                     encode_chunked=True)
        r = conn.getresponse()
        status, data = r.status, r.read()
    finally:
        conn.close()
    expect(status == 200, f"the 64 MiB chunked POST answered {status}: {data[:300]!r}")
    doc = json.loads(data)
    expect(doc["bytes"] == len(BIG) and doc["sha256"] == BIG_SHA,
           f"the chunked body reached the guest as {doc['bytes']} bytes hashing {doc['sha256'][:16]}")
    expect(doc["framing"] == "chunked", f"a chunked body reached the guest framed by {doc['framing']}")
    seen.append(f"chunked POST {time.monotonic() - started:.1f} s")
    # A 64 MiB answer.
    started = time.monotonic()
    conn = server.http(60)
    try:
        conn.request("GET", base + "/big", headers=AUTH)
        r = conn.getresponse()
        expect(r.status == 200, f"GET /big answered {r.status}")
        digest = hashlib.sha256()
        count = 0
        while True:
            piece = r.read(1 << 20)
            if not piece:
                break
            digest.update(piece)
            count += len(piece)
    finally:
        conn.close()
    expect(count == len(BIG) and digest.hexdigest() == BIG_SHA,
           f"GET /big brought {count} bytes hashing {digest.hexdigest()[:16]}")
    seen.append(f"GET {time.monotonic() - started:.1f} s")
    return "64 MiB each way, sha256 equal: " + ", ".join(seen)


def head_and_length(ctx):
    server, sandbox, guest = ctx["auth"], ctx["sandbox"], ctx["guest"]
    target = f"/v1/sandboxes/{sandbox}/ports/{guest.http_port}/sized"
    problems = []
    # HEAD on a raw socket: the head, and not one byte after it.
    sock = server.raw()
    try:
        sock.sendall(server.request_head("HEAD", target))
        head, rest = read_head(sock)
        expect(head is not None, f"HEAD: no answer ({rest!r})")
        status_line, headers = parse_head(head)
        expect(" 200 " in status_line + " ", f"HEAD answered {status_line!r}")
        expect(header(headers, "X-Guest-Sized") == "yes", f"HEAD's headers: {headers}")
        sock.settimeout(0.5)
        try:
            extra = rest + sock.recv(65536)
        except socket.timeout:
            extra = rest
        head_length = header(headers, "Content-Length")
        head_chunked = header(headers, "Transfer-Encoding")
        if extra:
            problems.append(f"the answer to HEAD carried {len(extra)} bytes after its head: {extra[:80]!r} "
                            f"(head: {head.decode('latin-1')!r})")
        if head_length != str(len(SIZED)) or head_chunked:
            problems.append(f"HEAD: the guest's Content-Length: {len(SIZED)} came back as Content-Length "
                            f"{head_length!r}, Transfer-Encoding {head_chunked!r}")
    finally:
        sock.close()
    # GET: the guest's Content-Length passed on, not re-framed as chunked.
    sock = server.raw()
    try:
        sock.sendall(server.request_head("GET", target))
        head, rest = read_head(sock)
        expect(head is not None, f"GET: no answer ({rest!r})")
        status_line, headers = parse_head(head)
        expect(" 200 " in status_line + " ", f"GET answered {status_line!r}")
        length = header(headers, "Content-Length")
        chunked = header(headers, "Transfer-Encoding")
        if chunked or length != str(len(SIZED)):
            problems.append(f"GET: the guest answered with Content-Length: {len(SIZED)}, the client got "
                            f"Content-Length {length!r}, Transfer-Encoding {chunked!r}: serve must pass a guest's "
                            f"Content-Length on")
        body = []
        Reader(sock, rest).body(headers, body.append)
        body = b"".join(body)
        expect(body == SIZED, f"the sized body differs ({len(body)} bytes)")
    finally:
        sock.close()
    # A guest answering without a length (chunked): HEAD still has no body, GET the whole one.
    chunked_target = f"/v1/sandboxes/{sandbox}/ports/{guest.http_port}/chunked"
    sock = server.raw()
    try:
        sock.sendall(server.request_head("HEAD", chunked_target))
        head, rest = read_head(sock)
        expect(head is not None and " 200 " in parse_head(head)[0] + " ", f"HEAD /chunked: {head!r} {rest!r}")
        sock.settimeout(0.5)
        try:
            extra = rest + sock.recv(65536)
        except socket.timeout:
            extra = rest
        if extra:
            problems.append(f"the answer to HEAD of a chunked answer carried {len(extra)} bytes after its head: "
                            f"{extra[:80]!r} (head: {head.decode('latin-1')!r})")
    finally:
        sock.close()
    status, _, data = server.call("GET", chunked_target)
    if status != 200 or data != b"hello world":
        problems.append(f"GET /chunked: {status} {data[:80]!r}")
    expect(not problems, "; ".join(problems))
    return (f"HEAD: headers, Content-Length {head_length}, no body; GET: Content-Length {length}, {len(body)} bytes; "
            f"a chunked answer: HEAD without body, GET whole")


def websocket_upgrade(ctx):
    server, sandbox, guest = ctx["auth"], ctx["sandbox"], ctx["guest"]
    ws_key = base64.b64encode(os.urandom(16)).decode()
    sock = server.raw(timeout=20)
    try:
        sock.sendall(server.request_head("GET", f"/v1/sandboxes/{sandbox}/ports/{guest.http_port}/ws?room=1", [
            ("Connection", "Upgrade"), ("Upgrade", "websocket"), ("Sec-WebSocket-Key", ws_key),
            ("Sec-WebSocket-Version", "13"), ("X-Case", "ws")]))
        head, rest = read_head(sock)
        expect(head is not None, f"the upgrade got no answer ({rest[:200]!r})")
        status_line, headers = parse_head(head)
        expect(status_line.split(" ")[1] == "101", f"the upgrade answered {status_line!r}: {rest[:300]!r}")
        accept = base64.b64encode(hashlib.sha1((ws_key + WS_GUID).encode()).digest()).decode()
        expect((header(headers, "Upgrade") or "").lower() == "websocket"
               and "upgrade" in (header(headers, "Connection") or "").lower(),
               f"the 101's Upgrade/Connection: {headers}")
        expect(header(headers, "Sec-WebSocket-Accept") == accept and header(headers, "X-Guest-Ws") == "yes",
               f"the guest's 101 headers did not come back: {headers}")
        guest_head = guest.wait("ws-head", 5)
        expect(guest_head is not None, "the guest never saw the upgrade")
        expect((header(guest_head, "Upgrade") or "").lower() == "websocket"
               and "upgrade" in (header(guest_head, "Connection") or "").lower()
               and header(guest_head, "Sec-WebSocket-Key") == ws_key
               and header(guest_head, "Authorization") is None,
               f"the guest's view of the upgrade: {guest_head}")
        # 1 MiB echoed, writing and reading at once.
        payload = os.urandom(MIB)
        errors = []

        def write():
            try:
                sock.sendall(payload)
            except OSError as e:
                errors.append(e)
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        echoed = Reader(sock, rest).exact(len(payload))
        writer.join(10)
        expect(not errors, f"sending 1 MiB: {errors}")
        expect(echoed == payload, "the 1 MiB echo differs")
        # Half-close: the guest still says its last word after our end, then closes.
        sock.shutdown(socket.SHUT_WR)
        tail = read_to_eof(sock, timeout=10)
        expect(tail == b"GUEST-FINAL-BYTES", f"after our half-close the client got {tail[:80]!r}, then EOF")
        expect(guest.wait("ws", 5) == "eof", "the guest never saw our EOF")
    finally:
        sock.close()
    return ("101 with Upgrade: websocket and the guest's Sec-WebSocket-Accept; 1 MiB echoed; after SHUT_WR the "
            "guest's 17 last bytes, then EOF")


def raw_tcp(ctx):
    server, sandbox, guest = ctx["auth"], ctx["sandbox"], ctx["guest"]
    port = guest.raw_port
    # Bytes right after the request's head are the stream's.
    sock, early = open_tcp(server, sandbox, port, early=b"ECHO\nsent-with-the-head")
    try:
        got = Reader(sock, early).exact(len(b"sent-with-the-head"))
        expect(got == b"sent-with-the-head", f"the early bytes came back as {got!r}")
        sock.shutdown(socket.SHUT_WR)
        expect(read_to_eof(sock) == b"", "bytes after the echo")
    finally:
        sock.close()
    # 16 MiB both ways.
    payload = BIG[:16 * MIB]
    sock, early = open_tcp(server, sandbox, port, early=b"ECHO raw16\n", timeout=30)
    errors = []
    started = time.monotonic()
    try:
        writer = threading.Thread(target=send_all_then_shut, args=(sock, payload, errors), daemon=True)
        writer.start()
        back = read_to_eof(sock, early, timeout=30)
        writer.join(10)
    finally:
        sock.close()
    took = time.monotonic() - started
    expect(not errors, f"sending 16 MiB: {errors}")
    expect(hashlib.sha256(back).hexdigest() == hashlib.sha256(payload).hexdigest(),
           f"the echo of 16 MiB came back as {len(back)} bytes of another hash")
    there = guest.wait("raw16", 5)
    expect(there == {"sha256": hashlib.sha256(payload).hexdigest(), "bytes": len(payload)},
           f"the guest got {there}")
    # The guest closes: the client sees EOF.
    sock, early = open_tcp(server, sandbox, port, early=b"CLOSE\n")
    try:
        started_eof = time.monotonic()
        got = read_to_eof(sock, early, timeout=5)
        expect(got == b"bye", f"the guest's last word came as {got!r}")
        guest_close = time.monotonic() - started_eof
    finally:
        sock.close()
    # The client closes: the guest sees EOF.
    sock, early = open_tcp(server, sandbox, port, early=b"SINK raw-client-close\nsome bytes")
    time.sleep(0.2)
    closed = time.monotonic()
    sock.close()
    there = guest.wait("raw-client-close", 5)
    expect(there is not None, "the guest never saw EOF after the client closed")
    return (f"early bytes arrived; 16 MiB both ways equal by sha256 in {took:.1f} s; guest close -> client EOF in "
            f"{guest_close * 1000:.0f} ms; client close -> guest EOF in {(there['eof_at'] - closed) * 1000:.0f} ms")


def refusals(ctx):
    server, sandbox, guest, open_serve = ctx["auth"], ctx["sandbox"], ctx["guest"], ctx["open"]
    seen = []
    # Nothing listens: 502 at once, naming the port.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    started = time.monotonic()
    status, _, data = server.call("GET", f"/v1/sandboxes/{sandbox}/ports/{dead}/x")
    took = time.monotonic() - started
    message = native_error(status, data, 502, "port_unreachable")
    expect(took < 2, f"the 502 took {took:.1f} s")
    expect(str(dead) in message, f"the 502's message does not name port {dead}: {message!r}")
    sock = server.raw()
    try:
        sock.sendall(server.request_head("GET", f"/v1/sandboxes/{sandbox}/tcp/{dead}",
                                         [("Connection", "Upgrade"), ("Upgrade", "agentvm-tcp")]))
        head, rest = read_head(sock)
        expect(head is not None, "/tcp to a dead port: closed unanswered")
        status_line, headers = parse_head(head)
        length = int(header(headers, "Content-Length") or 0)
        body = Reader(sock, rest).exact(length) if length else rest
        tcp_message = native_error(int(status_line.split(" ")[1]), body, 502, "port_unreachable")
        expect(str(dead) in tcp_message, f"/tcp's 502 does not name port {dead}: {tcp_message!r}")
    finally:
        sock.close()
    seen.append(f"dead port 502 in {took * 1000:.0f} ms ({message!r})")
    # Ports that are not ports, and serve's own.
    for bad in ("0", "65536", "abc", "08", "-1", "49983", "49999"):
        for kind in ("ports", "tcp"):
            extra = {"Connection": "Upgrade", "Upgrade": "agentvm-tcp"} if kind == "tcp" else {}
            path = f"/v1/sandboxes/{sandbox}/{kind}/{bad}" + ("/" if kind == "ports" else "")
            status, _, data = server.call("GET", path, headers=extra)
            try:
                native_error(status, data, 400, "bad_field")
            except Exception as e:
                raise type(e)(f".../{kind}/{bad}: {e}")
    seen.append("ports 0 65536 abc 08 -1 49983 49999: 400 bad_field on /ports and /tcp")
    # /tcp without the Upgrade header.
    status, _, data = server.call("GET", f"/v1/sandboxes/{sandbox}/tcp/{guest.raw_port}")
    native_error(status, data, 400, "bad_field")
    status, _, data = server.call("GET", f"/v1/sandboxes/{sandbox}/tcp/{guest.raw_port}",
                                  headers={"Connection": "Upgrade", "Upgrade": "websocket"})
    native_error(status, data, 400, "bad_field")
    seen.append("/tcp without (or with another) Upgrade 400")
    # An unknown sandbox; no token; a wrong token.
    status, _, data = server.call("GET", f"/v1/sandboxes/nosuch/ports/{guest.http_port}/")
    native_error(status, data, 404, "not_found")
    status, _, data = server.call("GET", f"/v1/sandboxes/{sandbox}/ports/{guest.http_port}/", auth=False,
                                  headers={"X-Case": "no-token"})
    expect(status == 401, f"without a token: {status} {data[:200]!r}")
    status, _, data = server.call("GET", f"/v1/sandboxes/{sandbox}/ports/{guest.http_port}/", auth=False,
                                  headers={"Authorization": "Bearer wrong", "X-Case": "no-token"})
    expect(status == 401, f"with a wrong token: {status} {data[:200]!r}")
    expect(guest.wait("no-token", 0.5) is None, "a request without the token reached the guest")
    seen.append("unknown sandbox 404, no/wrong token 401 (the guest saw nothing)")
    # Without a token (--no-auth): loopback clients only.
    open_sandbox = ctx["open_sandbox"]
    status, _, data = open_serve.call("GET", f"/v1/sandboxes/{open_sandbox}/ports/{guest.http_port}/open")
    expect(status == 200 and json.loads(data)["target"] == "/open",
           f"--no-auth from loopback: {status} {data[:200]!r}")
    status, _, data = open_serve.call("GET", f"/v1/sandboxes/{open_sandbox}/ports/{guest.http_port}/open",
                                      headers={"Host": "evil.example", "X-Case": "rebind"})
    native_error(status, data, 403, "forbidden")
    status, _, data = open_serve.call("GET", f"/v1/sandboxes/{open_sandbox}/ports/{guest.http_port}/open",
                                      headers={"Origin": "https://evil.example", "X-Case": "rebind"})
    native_error(status, data, 403, "forbidden")
    expect(guest.wait("rebind", 0.5) is None, "a foreign Host or Origin reached the guest")
    seen.append("--no-auth: loopback 200, foreign Host or Origin 403")
    return "; ".join(seen)


def cut_short(ctx):
    server, sandbox, guest = ctx["auth"], ctx["sandbox"], ctx["guest"]
    base = f"/v1/sandboxes/{sandbox}/ports/{guest.http_port}"
    # The guest's server dies half-way through a Content-Length answer: however serve frames
    # it, the client must see the answer cut (short of its length, or no last chunk), at once.
    sock = server.raw(timeout=10)
    started = time.monotonic()
    count = [0]
    try:
        sock.sendall(server.request_head("GET", base + "/half"))
        head, rest = read_head(sock)
        expect(head is not None, f"/half: closed unanswered ({rest[:200]!r})")
        status_line, headers = parse_head(head)
        expect(" 200 " in status_line + " ", f"/half answered {status_line!r}")
        framing = (f"Content-Length {header(headers, 'Content-Length')}" if header(headers, "Content-Length")
                   else f"Transfer-Encoding {header(headers, 'Transfer-Encoding')}")
        try:
            Reader(sock, rest).body(headers, lambda piece: count.__setitem__(0, count[0] + len(piece)))
            outcome = "a whole answer"
        except (EOFError, ConnectionError) as e:
            outcome = f"{type(e).__name__} ({e})"
        except socket.timeout:
            expect(False, f"the cut answer hung: {count[0]} bytes, then nothing for 10 s")
    finally:
        sock.close()
    took = time.monotonic() - started
    expect(outcome != "a whole answer",
           f"a guest that died after 500,000 of its 1,000,000 bytes: the client got {count[0]} bytes as a whole "
           f"answer ({framing}), not a cut one")
    expect(count[0] <= 500_000, f"the client got {count[0]} bytes of the 500,000 the guest sent")
    expect(took < 5, f"the cut took {took:.1f} s to show")
    # The client goes away mid-answer: the guest's connection closes soon after.
    sock = server.raw()
    try:
        sock.sendall(server.request_head("GET", base + "/endless", [("X-Case", "endless")]))
        head, rest = read_head(sock)
        expect(head is not None and b" 200 " in head.split(b"\r\n")[0] + b" ", f"/endless: {head!r}")
        reader = Reader(sock, rest)
        reader.exact(4 * MIB)
    finally:
        sock.close()
    left = time.monotonic()
    there = guest.wait("endless", 10)
    expect(there is not None, "10 s after the client went away the guest is still sending")
    after = there["closed_at"] - left
    expect(after < 5, f"the guest's connection closed {after:.1f} s after the client went away")
    return (f"guest died mid-answer: the client got {framing}, {count[0]} bytes and {outcome} in "
            f"{took * 1000:.0f} ms; "
            f"client went away: guest's send failed ({there['error']}) {max(after, 0) * 1000:.0f} ms later")


def concurrent(ctx):
    server, guest = ctx["auth"], ctx["guest"]
    results = {}

    def one(sandbox, i, barrier):
        try:
            conn = server.http(timeout=30)
            barrier.wait(10)
            conn.request("GET", f"/v1/sandboxes/{sandbox}/ports/{guest.http_port}/c/{i}?i={i}", headers=AUTH)
            r = conn.getresponse()
            data = r.read()
            conn.close()
            results[(sandbox, i)] = (r.status, json.loads(data)["target"] if r.status == 200 else data[:200])
        except Exception as e:  # noqa: BLE001 - each thread's failure is reported below
            results[(sandbox, i)] = (None, repr(e))

    seen = []
    for sandboxes in ([ctx["sandbox"]], ctx["three"]):
        results.clear()
        barrier = threading.Barrier(50)
        threads = [threading.Thread(target=one, args=(sandboxes[i % len(sandboxes)], i, barrier), daemon=True)
                   for i in range(50)]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        took = time.monotonic() - started
        wrong = {k: v for k, v in results.items() if v != (200, f"/c/{k[1]}?i={k[1]}")}
        expect(len(results) == 50 and not wrong,
               f"{len(results)} of 50 answered; wrong ones: {dict(list(wrong.items())[:5])}")
        seen.append(f"50 at once to {len(sandboxes)} sandbox{'es' if len(sandboxes) > 1 else ''} in {took:.1f} s")
    return ", ".join(seen) + ", each its own answer"


def slow_reader(ctx):
    server, sandbox, guest = ctx["auth"], ctx["sandbox"], ctx["guest"]
    base = f"/v1/sandboxes/{sandbox}/ports/{guest.http_port}"
    slow = server.raw(timeout=30)
    try:
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        slow.sendall(server.request_head("GET", base + "/big"))
        time.sleep(0.5)  # serve now has the guest's answer flowing at a client that reads nothing
        started = time.monotonic()
        status, _, data = server.call("GET", base + "/beside", timeout=10)
        took = time.monotonic() - started
        expect(status == 200 and json.loads(data)["target"] == "/beside", f"the quick request: {status} {data[:200]!r}")
        expect(took < 1, f"the quick request beside a slow reader took {took:.2f} s")
        time.sleep(max(0, 2 - (time.monotonic() - started) - 0.5))
        head, rest = read_head(slow)
        expect(head is not None and b" 200 " in head.split(b"\r\n")[0] + b" ", f"the slow reader's answer: {head!r}")
        digest = hashlib.sha256()
        count = [0]

        def sink(piece):
            digest.update(piece)
            count[0] += len(piece)
        Reader(slow, rest).body(parse_head(head)[1], sink)
        expect(count[0] == len(BIG) and digest.hexdigest() == BIG_SHA,
               f"the slow reader got {count[0]} bytes hashing {digest.hexdigest()[:16]}, not the 64 MiB sent")
    finally:
        slow.close()
    return (f"beside a reader idle for 2 s on a 64 MiB answer, another request answered in {took * 1000:.0f} ms; "
            f"the 64 MiB then whole")


def nothing_left_behind(ctx):
    server, sandbox, guest = ctx["auth"], ctx["sandbox"], ctx["guest"]
    # Settle: whatever earlier cases left open has gone.
    deadline = time.monotonic() + 10
    fds_before = server.fds()
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = server.fds()
        if now == fds_before:
            break
        fds_before = now
    threads_before = server.threads()
    started = time.monotonic()
    for i in range(1000):
        if i % 2 == 0:
            status, _, data = server.call("GET", f"/v1/sandboxes/{sandbox}/ports/{guest.http_port}/n/{i}")
            expect(status == 200 and json.loads(data)["target"] == f"/n/{i}", f"request {i}: {status} {data[:200]!r}")
        else:
            sock, early = open_tcp(server, sandbox, guest.raw_port, early=b"ECHO\n" + str(i).encode())
            try:
                got = Reader(sock, early).exact(len(str(i)))
                expect(got == str(i).encode(), f"stream {i} echoed {got!r}")
                sock.shutdown(socket.SHUT_WR)
                read_to_eof(sock, timeout=5)
            finally:
                sock.close()
    took = time.monotonic() - started
    deadline = time.monotonic() + 10
    while True:
        fds, threads = server.fds(), server.threads()
        if fds <= fds_before + 4 and threads == threads_before:
            break
        expect(time.monotonic() < deadline,
               f"after 1,000 connections serve holds {fds} descriptors (before: {fds_before}) and "
               f"{threads} threads (before: {threads_before})")
        time.sleep(0.2)
    return (f"500 HTTP requests and 500 /tcp streams in {took:.1f} s; serve's fds {fds_before} -> {fds}, "
            f"threads {threads_before} -> {threads}")


def e2b_headers(ctx):
    server, sandbox, guest = ctx["auth"], ctx["sandbox"], ctx["guest"]
    target = "/echo/e2b%20path?via=e2b&x=%2F"
    status, headers, data = server.call("GET", target, auth=False, headers={
        "E2b-Sandbox-Id": sandbox, "E2b-Sandbox-Port": str(guest.http_port),
        "Host": f"{guest.http_port}-{sandbox}.e2b.app", "X-Client-Custom": "from-e2b"})
    expect(status == 200, f"the E2B-routed request without a token answered {status}: {data[:300]!r}")
    seen = json.loads(data)
    expect(seen["target"] == target, f"the guest was asked for {seen['target']!r}, not {target!r}")
    names = {n.lower() for n, _ in seen["headers"]}
    expect(not names & {"e2b-sandbox-id", "e2b-sandbox-port"},
           f"E2B's routing headers reached the guest: {seen['headers']}")
    expect(header(seen["headers"], "X-Client-Custom") == "from-e2b", f"the client's header lost: {seen['headers']}")
    expect(dict(headers).get("X-Guest-Custom") == "custom-value-42", f"the guest's header did not come back: {headers}")
    # Errors in E2B's shape.
    status, _, data = server.call("GET", "/x", auth=False,
                                  headers={"E2b-Sandbox-Id": "nosuch", "E2b-Sandbox-Port": str(guest.http_port)})
    unknown = e2b_error(status, data, 502)
    for bad in ("0", "abc", "65536"):
        status, _, data = server.call("GET", "/x", auth=False,
                                      headers={"E2b-Sandbox-Id": sandbox, "E2b-Sandbox-Port": bad})
        e2b_error(status, data, 400)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    status, _, data = server.call("GET", "/x", auth=False,
                                  headers={"E2b-Sandbox-Id": sandbox, "E2b-Sandbox-Port": str(dead)})
    dead_message = e2b_error(status, data, 502)
    expect(str(dead) in dead_message, f"E2B's 502 for a dead port does not name it: {dead_message!r}")
    return (f"reached the guest without a token, target as sent, E2b-Sandbox-* not passed on; unknown sandbox "
            f"502 ({unknown!r}); bad ports 400; a dead port 502; all {{code, message}}")


def per_sandbox_cap(ctx):
    server, guest = ctx["auth"], ctx["guest"]
    sandbox = ctx["cap_sandbox"]
    held = []
    try:
        started = time.monotonic()
        # Half HTTP requests, half /tcp streams: both count.
        for batch in range(8):
            for i in range(32):
                s = server.raw(timeout=10)
                if i % 2:
                    s.sendall(server.request_head("GET", f"/v1/sandboxes/{sandbox}/tcp/{SILENT_PORT}",
                                                  [("Connection", "Upgrade"), ("Upgrade", "agentvm-tcp")]))
                else:
                    s.sendall(server.request_head("GET", f"/v1/sandboxes/{sandbox}/ports/{SILENT_PORT}/"))
                held.append(s)
            time.sleep(0.05)
        time.sleep(0.5)  # serve's loop has taken every head
        answered = []
        for s in held:
            s.setblocking(False)
            try:
                piece = s.recv(200)
                answered.append(piece[:120])
            except BlockingIOError:
                pass
            s.setblocking(True)
        expect(not answered, f"{len(answered)} of the 256 waiting connections were answered: {answered[:3]}")
        status, headers, data = server.call("GET", f"/v1/sandboxes/{sandbox}/ports/{guest.http_port}/257th")
        message = native_error(status, data, 429, "at_capacity")
        sock = server.raw()
        try:
            sock.sendall(server.request_head("GET", f"/v1/sandboxes/{sandbox}/tcp/{guest.raw_port}",
                                             [("Connection", "Upgrade"), ("Upgrade", "agentvm-tcp")]))
            head, rest = read_head(sock)
            expect(head is not None, "a /tcp past the cap: closed unanswered")
            status_line, headers = parse_head(head)
            body = []
            Reader(sock, rest).body(headers, body.append)
            native_error(int(status_line.split(" ")[1]), b"".join(body), 429, "at_capacity")
        finally:
            sock.close()
        expect(time.monotonic() - started < 9, "the 257th came too late (serve gives up a dial after 10 s)")
        for s in held:
            s.close()
        held = []
        closed = time.monotonic()
        # Polled past serve's 10 s handshake timeout, to tell a slot freed late from one never freed.
        while True:
            status, _, data = server.call("GET", f"/v1/sandboxes/{sandbox}/ports/{guest.http_port}/after")
            if status == 200:
                break
            native_error(status, data, 429, "at_capacity")
            expect(time.monotonic() - closed < 15,
                   "15 s after the 256 clients went away their sandbox's ports are still at capacity")
            time.sleep(0.1)
        after = time.monotonic() - closed
        expect(json.loads(data)["target"] == "/after", f"after: {data[:200]!r}")
        expect(after < 3, f"the 256 clients went away, but their sandbox stayed at capacity (429) for {after:.1f} s "
                          f"more: a connection whose client left while its guest port was still being dialed is "
                          f"held until the dial ends")
        return (f"256 connections (128 /ports, 128 /tcp) waiting on a silent port, the 257th (and a /tcp) 429 "
                f"at_capacity ({message!r}); "
                f"once they closed, a new one answered 200 after {after * 1000:.0f} ms")
    finally:
        for s in held:
            s.close()


def main():
    os.environ["FAKE_EPISODE_SILENT_PORT"] = str(SILENT_PORT)  # inherited by serve and its episodes
    fake = make_bin("fake", FAKE)
    guest = Guest()
    servers = []
    results = []
    try:
        auth = Server("auth", fake)
        servers.append(auth)
        open_serve = Server("open", fake, token=False)
        servers.append(open_serve)
        ctx = {"guest": guest, "auth": auth, "open": open_serve, "sandbox": auth.create(),
               "open_sandbox": open_serve.create()}
        ctx["three"] = [ctx["sandbox"], auth.create(), auth.create()]
        ctx["cap_sandbox"] = auth.create()
        results = [run_case("target_and_headers", target_and_headers, ctx),
                   run_case("bodies_64mib", bodies_64mib, ctx),
                   run_case("head_and_length", head_and_length, ctx),
                   run_case("websocket_upgrade", websocket_upgrade, ctx),
                   run_case("raw_tcp", raw_tcp, ctx),
                   run_case("refusals", refusals, ctx),
                   run_case("cut_short", cut_short, ctx),
                   run_case("concurrent", concurrent, ctx),
                   run_case("slow_reader", slow_reader, ctx),
                   run_case("nothing_left_behind", nothing_left_behind, ctx),
                   run_case("e2b_headers", e2b_headers, ctx),
                   run_case("per_sandbox_cap", per_sandbox_cap, ctx)]
        for server in servers:
            code = server.stop()
            if code != 0:
                print(f"FAIL stop: serve exited {code}: {server.serve.log()[-1500:]}", flush=True)
                results.append(False)
    except Exception as e:  # noqa: BLE001 - set-up failed: no case ran
        print(f"FAIL setup: {e!r}", flush=True)
        results.append(False)
    finally:
        for server in servers:
            server.stop()
        guest.stop()
        shutil.rmtree(TMP, ignore_errors=True)
    sys.exit(0 if results and all(results) else 1)


if __name__ == "__main__":
    main()
