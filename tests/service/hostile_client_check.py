#!/usr/bin/env python3
"""agentvm-serve against hostile clients: malformed, deep, huge, slow, non-UTF-8 and out-of-order
input on every endpoint, floods of connections, sandboxes that end under a request, and stop
signals with requests in flight.

usage: hostile_client_check.py AGENTVM_SERVE_BINARY
Prints "ok <case>: <what was seen>" or "FAIL <case>: <why>" per case; exits non-zero if any
failed. Needs no KVM: serve runs with --pool default=0 from a copy of its binary beside
fake_episode.py as its `agentvm`, so a create gets a fake sandbox that answers at once (or
misbehaves on request). serve starts with a soft descriptor limit of 1024 (the usual default)
and a hard one of at most 4096, listening on TCP loopback (with a token) and on a Unix socket.
After each group of cases, serve must still answer a healthy client on both, and its
descriptor count and resident memory must be back within bounds.
"""
import http.client
import json
import os
import re
import resource
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "vm"))
sys.path.insert(0, HERE)
from checks import Failed, expect, run_case  # noqa: E402
from serve_client import UnixConnection, call, free_port  # noqa: E402
import serve_client  # noqa: E402

SERVE = sys.argv[1]
TMP = tempfile.mkdtemp(prefix="agentvm-hostile-")
TOKEN = "hostile-check-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
AUTH_LINE = f"Authorization: Bearer {TOKEN}\r\n".encode()
HEALTHY_SOURCE = "127.0.0.254"  # the healthy client's own address: no flood shares its limit
SERVE_HARD_NOFILE = 4096
FD_SLACK = 16                    # descriptors serve may hold above its idle count after a group
RSS_SLACK_KIB = 96 * 1024        # resident memory it may keep above its idle size after a group
# Under AddressSanitizer (build-asan/) freed memory waits in a 256 MiB quarantine and every
# allocation has redzones: the bound then only catches growth without end.
RSS_SLACK_ASAN_KIB = 512 * 1024


def read_answer(sock, timeout):
    """(status, body) of the first answer on sock, or (None, b"") when serve closed it
    without one; fails when neither happens within timeout."""
    sock.settimeout(timeout)
    data = b""
    deadline = time.monotonic() + timeout
    while True:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if sep:
            status = int(head.split(b" ", 2)[1])
            length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            chunked = re.search(rb"(?im)^transfer-encoding:\s*chunked", head)
            if length and len(rest) >= int(length.group(1)):
                return status, rest[:int(length.group(1))]
            if chunked and rest.endswith(b"0\r\n\r\n"):
                return status, rest
        expect(time.monotonic() < deadline, f"no answer within {timeout} s (have {data[:120]!r})")
        try:
            piece = sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            piece = b""
        except socket.timeout:
            expect(False, f"no answer within {timeout} s (have {data[:120]!r})")
        if not piece:
            if sep:
                return status, rest
            return None, b""
        data += piece


class Server:
    """One serve on TCP loopback and a Unix socket, with the fake episode as its agentvm."""

    def __init__(self, name, *args, bin_dir=None):
        self.port = free_port()
        self.sock_path = os.path.join(TMP, f"{name}.sock")
        token_file = os.path.join(TMP, "token")
        with open(token_file, "w") as f:
            f.write(TOKEN + "\n")
        os.chmod(token_file, 0o600)
        wrapper = os.path.join(bin_dir or BIN, "serve-limited")
        pool = [] if "--pool" in args else ["--pool", "default=0"]
        self.serve = serve_client.Serve(
            wrapper, *pool, "--listen", f"tcp:127.0.0.1:{self.port}", "--listen",
            f"unix:{self.sock_path}", "--token-file", token_file, *args, log_level="info",
            log_path=os.path.join(TMP, f"{name}.log"))
        self.serve.wait_listening(lambda: self.http(timeout=5))
        self.pid = self.serve.proc.pid
        found = re.search(r"connections: at most (\d+) per listener, (\d+) per client address", self.serve.log())
        # An older serve does not say: its behaviour is then checked against what this one does.
        self.per_listener = int(found.group(1)) if found else 1760
        self.per_address = int(found.group(2)) if found else 440
        self.idle_fds = self.fds()
        self.idle_rss = self.rss_kib()
        with open(f"/proc/{self.pid}/maps") as f:
            self.rss_slack = RSS_SLACK_ASAN_KIB if "libasan" in f.read() else RSS_SLACK_KIB
        self.held_elsewhere = 0  # connections a check keeps open across groups (Slowloris)

    def http(self, timeout=10, source=HEALTHY_SOURCE):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout, source_address=(source, 0))

    def unix(self, timeout=10):
        return UnixConnection(self.sock_path, timeout=timeout)

    def tcp(self, source="127.0.0.1", timeout=10):
        s = socket.socket()
        s.settimeout(timeout)
        s.bind((source, 0))
        s.connect(("127.0.0.1", self.port))
        return s

    def raw_unix(self, timeout=10):
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(timeout)
        s.connect(self.sock_path)
        return s

    def fds(self):
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def rss_kib(self):
        with open(f"/proc/{self.pid}/status") as f:
            return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))

    def alive(self):
        expect(self.serve.proc.poll() is None,
               f"serve exited {self.serve.proc.returncode}: {self.serve.log()[-1500:]}")

    def healthy(self, after, states=("ok",)):
        """serve answers on both listeners, and its descriptors and memory are back in bounds.
        `states`: what /healthz may say of the node (503 "maint" when its VMs fail to start)."""
        self.alive()
        for name, connect in [("tcp", self.http), ("unix", self.unix)]:
            try:
                status, _, data = call(connect(timeout=5), "GET", "/healthz", headers=AUTH)
            except OSError as e:
                expect(False, f"after {after}: a healthy client on {name} got {e!r}")
            state = json.loads(data).get("status") if status in (200, 503) else None
            expect(state in states and status == (200 if state == "ok" else 503),
                   f"after {after}: healthz on {name} answered {status} {data[:200]!r}")
        status, listing = self.json_call("GET", "/v1/sandboxes")
        left = [sb["id"] for sb in json.loads(listing)["sandboxes"]] if status == 200 else listing
        expect(left == [], f"after {after}: sandboxes no answer named, or not deleted, are left: {left}")
        # Closing is serve's next turn after the client's close, or the header deadline's
        # sweep; on a loaded machine (CI runs tests two at a time) that can take seconds.
        deadline = time.monotonic() + 30
        bound = self.idle_fds + FD_SLACK + self.held_elsewhere
        while self.fds() > bound and time.monotonic() < deadline:
            time.sleep(0.1)
        fds, rss = self.fds(), self.rss_kib()
        expect(fds <= bound, f"after {after}: serve holds {fds} descriptors (idle: {self.idle_fds}, "
                             f"{self.held_elsewhere} held open on purpose)")
        expect(rss <= self.idle_rss + self.rss_slack,
               f"after {after}: serve's RSS is {rss} KiB (idle: {self.idle_rss} KiB)")
        return f"{fds} fds, {rss // 1024} MiB"

    def request(self, raw, timeout=5, unix=False):
        """One raw request's answer. A create it makes is deleted at once: the groups count the
        descriptors each sandbox holds against serve, and `healthy` wants none left."""
        s = self.raw_unix() if unix else self.tcp(source="127.0.0.2")
        try:
            s.sendall(raw)
            status, answer = read_answer(s, timeout)
            created = re.search(rb'"id":"([a-z0-9-]+-[0-9a-f]{6}-[0-9a-f]{16})"', answer) if status == 201 else None
            if created:
                self.json_call("DELETE", f"/v1/sandboxes/{created.group(1).decode()}")
            return status, answer
        except (ConnectionResetError, BrokenPipeError):
            return None, b""
        except Failed as e:
            raise Failed(f"{raw[:80]!r}: {e}") from None
        finally:
            s.close()

    def json_call(self, method, path, body=None, timeout=10):
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        status, _, answer = call(self.http(timeout=timeout), method, path, body=data, headers=AUTH)
        return status, answer

    def create_sandbox(self):
        status, answer = self.json_call("POST", "/v1/sandboxes", {})
        expect(status == 201, f"a create with the fake episode answered {status}: {answer[:300]!r}")
        return json.loads(answer)["id"]

    def stop(self):
        return self.serve.stop(timeout=30)


def head(method, target, length=None):
    """A request's head with the token: Host, and Content-Length when given."""
    text = f"{method} {target} HTTP/1.1\r\nHost: x\r\n" + (f"Content-Length: {length}\r\n" if length is not None else "")
    return text.encode() + AUTH_LINE + b"\r\n"


def endpoints(sandbox):
    base = f"/v1/sandboxes/{sandbox}"
    return [("GET", "/healthz"), ("GET", "/metrics"), ("POST", "/run_code"), ("POST", "/run_jupyter"),
            ("GET", "/v1/sandboxes"), ("POST", "/v1/sandboxes"), ("GET", base), ("DELETE", "/v1/sandboxes/sb-nope"),
            ("POST", f"{base}/exec"), ("POST", f"{base}/shell"), ("POST", f"{base}/run_code"),
            ("DELETE", f"{base}/calls/99"), ("GET", f"{base}/files/stat?path=/x"),
            ("GET", f"{base}/files/list?path=/x"), ("PUT", "/v1/sandboxes/sb-nope/files?path=/x"),
            ("GET", f"{base}/files?path=/x"), ("POST", f"{base}/timeout"), ("GET", f"{base}/history"),
            ("POST", f"{base}/fork"), ("POST", f"{base}/pause"), ("POST", "/v1/sandboxes/sb-nope/resume")]


def answered_4xx_or_closed(server, raw, what, unix=False, timeout=5):
    status, body = server.request(raw, timeout=timeout, unix=unix)
    expect(status is None or 400 <= status < 500 or status == 505, f"{what}: answered {status} {body[:200]!r}")
    return status


# ---- the groups -------------------------------------------------------------------------------

def malformed_and_non_utf8(server):
    sandbox = server.create_sandbox()
    bodies = [b"", b"{", b"}{", b"null", b"[]", b"\"x\"", b"\xff\xfe\x00\x01", b'{"argv":["\xc3\x28"]}',
              b'{"code":"\xed\xa0\x80","language":"python"}', b'{"timeout":1e999}', b'{"argv":[' + b"1," * 1000 + b"]}",
              b'{"count":-1}', b'{"\x00":1}']
    seen = 0
    for method, path in endpoints(sandbox):
        for body in bodies:
            raw = (f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n".encode() + AUTH_LINE
                   + b"\r\n" + body)
            status, answer = server.request(raw)
            # Bodies are ignored where none is wanted (GET): anything but a failure of serve's own.
            # (A fork or pause that gets as far as a live snapshot fails in the fake episode.)
            fake_snapshot = status == 500 and b'"snapshot_failed"' in answer
            expect(status is None or status < 500 or status == 502 or fake_snapshot,
                   f"{method} {path} {body[:40]!r}: {status} {answer[:200]!r}")
            seen += 1
    # (A NUL in the request line leaves MHD waiting for more: Slowloris parks those.)
    lines = [b"GARBAGE\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"GET /healthz\r\n\r\n",
             b"GET /v1/sandboxes/\xff\xfe/exec HTTP/1.1\r\nHost: x\r\n" + AUTH_LINE + b"\r\n",
             b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Bad: \xff\xfe\r\n" + AUTH_LINE + b"\r\n",
             b"GET /healthz HTTP/1.1\r\nHost: x\r\nno colon here\r\n" + AUTH_LINE + b"\r\n",
             b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + AUTH_LINE + b"Content-Length: -5\r\n\r\n",
             b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\n" + AUTH_LINE
             + b"Content-Length: 2\r\nContent-Length: 9\r\n\r\n{}",
             b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\n" + AUTH_LINE
             + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
             head("GET", f"/v1/sandboxes/{sandbox}/files?path=%ff%00%2e%2e"),
             b"GET /healthz HTTP/1.1\r\nHost: x\r\nAuthorization: Basic \xff\xff==\r\n\r\n",
             b"GET /healthz HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + b"A" * 8000 + b"\r\n\r\n"]
    for raw in lines:
        for unix in (False, True):
            # Refused, closed, or (a header that is only odd bytes) served: never a failure.
            status, answer = server.request(raw, unix=unix)
            expect(status is None or status < 500 or status == 505, f"{raw[:50]!r}: {status} {answer[:200]!r}")
            seen += 1
    server.json_call("DELETE", f"/v1/sandboxes/{sandbox}")
    return f"{seen} malformed or non-UTF-8 requests answered 4xx or closed; {server.healthy('malformed input')}"


def deep_and_huge(server):
    sandbox = server.create_sandbox()
    deep = b"[" * 200000
    deep_object = b'{"a":' * 100000
    count = 0
    for method, path in endpoints(sandbox):
        if method not in ("POST",):
            continue
        for body in (deep, deep_object):
            raw = (f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n".encode() + AUTH_LINE
                   + b"\r\n" + body)
            status, answer = server.request(raw, timeout=10)
            expect(status is None or 400 <= status < 500, f"{path}, {len(body)} bytes deep: {status} {answer[:200]!r}")
            count += 1
    # A header block over MHD's per-connection memory: 431, or closed.
    answered_4xx_or_closed(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + AUTH_LINE
                           + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 100) for i in range(400)) + b"\r\n",
                           "32 KiB of headers")
    # Bodies over the limits: by Content-Length before any is sent, and sent whole.
    status, _ = server.request(b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\n" + AUTH_LINE
                               + b"Content-Length: 99999999999\r\n\r\n")
    expect(status == 413, f"a 93 GiB Content-Length: {status}")
    big = b'{"argv":["' + b"x" * (3 << 20) + b'"]}'
    status, _ = server.request(head("POST", f"/v1/sandboxes/{sandbox}/exec", len(big)) + big, timeout=20)
    expect(status == 413 or status is None, f"3 MiB exec body: {status}")
    # /run_code takes larger bodies (files in JSON): 12 MiB of JSON that is no request.
    huge = b'{"files":{"a":"' + b"QUFB" * (3 << 20) + b'"},"language":"nope","code":""}'
    status, answer = server.request(head("POST", "/run_code", len(huge)) + huge, timeout=30)
    # SandboxFusion answers a request it cannot run 200 with a SandboxError status.
    refused = status == 200 and json.loads(answer).get("status") == "SandboxError"
    expect(status is not None and (400 <= status < 500 or refused), f"12 MiB /run_code: {status} {answer[:200]!r}")
    server.json_call("DELETE", f"/v1/sandboxes/{sandbox}")
    return (f"{count} bodies nested 100000+ deep, 32 KiB of headers, 3 and 12 MiB bodies refused; "
            f"{server.healthy('deep and huge input')}")


class Slowloris:
    """Connections that trickle their request a byte or a header line at a time, every 0.5 s."""

    def __init__(self, server, count):
        self.server = server
        server.held_elsewhere = count
        self.sockets = []
        for i in range(count):
            s = server.tcp(source="127.0.0.3") if i % 2 == 0 else server.raw_unix()
            s.setblocking(False)
            self.sockets.append(s)
        self.payload = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(1000))
        self.sent = 0
        self.started = time.monotonic()
        self.closed_at = {}
        self.stop = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop and self.sent < len(self.payload):
            # A byte at a time (a request line crawling in), 8 bytes at a time (header lines),
            # or a request line with a NUL in it, once, and then nothing.
            for i, s in enumerate(self.sockets):
                if i in self.closed_at:
                    continue
                if i % 5 == 4:
                    piece = b"\x00\x01garbage\r\n\r\n" if self.sent == 0 else b""
                elif i % 5 < 2:
                    piece = self.payload[self.sent:self.sent + 1]
                else:
                    piece = self.payload[self.sent:self.sent + 8]
                try:
                    if piece:
                        s.send(piece)
                    if s.recv(4096, socket.MSG_PEEK) == b"":
                        self.closed_at[i] = time.monotonic() - self.started
                except BlockingIOError:
                    pass
                except OSError:
                    self.closed_at[i] = time.monotonic() - self.started
            self.sent += 1
            time.sleep(0.5)

    def finish(self):
        self.stop = True
        self.thread.join()
        for s in self.sockets:
            s.close()
        self.server.held_elsewhere = 0


def slow_clients(server, slowloris):
    # Meanwhile serve answers others at once.
    start = time.monotonic()
    server.healthy("slow clients started")
    took = time.monotonic() - start
    expect(took < 2, f"healthz beside {len(slowloris.sockets)} slow clients took {took:.1f} s")
    deadline = slowloris.started + 18
    while len(slowloris.closed_at) < len(slowloris.sockets) and time.monotonic() < deadline:
        time.sleep(0.25)
    open_ones = len(slowloris.sockets) - len(slowloris.closed_at)
    expect(open_ones == 0, f"{open_ones} of {len(slowloris.sockets)} connections trickling their headers are still "
                           f"open after {time.monotonic() - slowloris.started:.0f} s")
    latest = max(slowloris.closed_at.values())
    slowloris.finish()
    return (f"{len(slowloris.sockets)} trickling connections (TCP and Unix) closed by {latest:.1f} s; "
            f"{server.healthy('slow clients')}")


def out_of_order(server):
    sandbox = server.create_sandbox()
    # Three requests in one write: three answers, in order.
    s = server.tcp(source="127.0.0.2")
    one = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + AUTH_LINE + b"\r\n"
    s.sendall(one * 3)
    got = b""
    deadline = time.monotonic() + 5
    while got.count(b"HTTP/1.1 200") < 3 and time.monotonic() < deadline:
        piece = s.recv(65536)
        if not piece:
            break
        got += piece
    s.close()
    expect(got.count(b"HTTP/1.1 200") == 3, f"three pipelined requests: {got[:300]!r}")
    # A body longer than its Content-Length: the rest is a second, malformed request.
    answered_4xx_or_closed(server, b"POST /v1/sandboxes/sb-nope/exec HTTP/1.1\r\nHost: x\r\n" + AUTH_LINE
                           + b"Content-Length: 2\r\n\r\n{}{}{}garbage\r\n\r\n", "body past its length")
    # Expect: 100-continue over the limit is refused before the body.
    status, _ = server.request(b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n" + AUTH_LINE
                               + b"Content-Length: 50000000\r\n\r\n")
    expect(status == 413, f"Expect: 100-continue, 50 MB: {status}")
    # The body before its headers are whole; chunked and a length at once; a stray chunk.
    for raw in [b"{\"argv\":[\"true\"]}POST /v1/sandboxes HTTP/1.1\r\n\r\n",
                b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\n" + AUTH_LINE
                + b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
                b"0\r\n\r\nGET /healthz HTTP/1.1\r\n\r\n",
                b"GET http://elsewhere/healthz HTTP/1.1\r\nHost: x\r\n" + AUTH_LINE + b"\r\n",
                b"CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: x\r\n" + AUTH_LINE + b"\r\n",
                b"OPTIONS * HTTP/1.1\r\nHost: x\r\n" + AUTH_LINE + b"\r\n"]:
        status, answer = server.request(raw)
        expect(status is None or status < 500, f"{raw[:50]!r}: {status} {answer[:200]!r}")
    # Uploads cut off midway, and a client gone before its answer: nothing is left behind.
    for cut in (0, 1000, 5 << 20):
        s = server.tcp(source="127.0.0.2")
        s.sendall(head("PUT", f"/v1/sandboxes/{sandbox}/files?path=/cut", 10 << 20) + b"z" * cut)
        time.sleep(0.2)
        s.close()
    s = server.tcp(source="127.0.0.2")
    s.sendall(head("POST", f"/v1/sandboxes/{sandbox}/exec", 17) + b'{"argv":["hang"]}')
    time.sleep(0.3)
    s.close()
    # The same path uploaded twice at once: the second is refused, the first goes on.
    first = server.tcp(source="127.0.0.2")
    first.sendall(head("PUT", f"/v1/sandboxes/{sandbox}/files?path=/twice", 4) + b"ab")
    time.sleep(0.3)
    status, _ = server.request(head("PUT", f"/v1/sandboxes/{sandbox}/files?path=/twice", 2) + b"ab")
    expect(status == 409, f"a second upload to the same path: {status}")
    first.sendall(b"cd")
    status, _ = read_answer(first, 10)
    expect(status == 200, f"the first upload, finished after the second was refused: {status}")
    first.close()
    server.json_call("DELETE", f"/v1/sandboxes/{sandbox}")
    return (f"pipelining, bodies past or before their headers, cut uploads and a second upload; "
            f"{server.healthy('out-of-order input')}")


def upload_cut_short(server, path, end_sandbox):
    """PUTs 12 MiB to `path` of a new sandbox, 5 MiB at first; end_sandbox(sandbox) ends the
    sandbox meanwhile; then the rest. The upload must be answered with an error, not left
    waiting (issue 31, item 6). Returns its status and the start of its body."""
    sandbox = server.create_sandbox()
    s = server.tcp(source="127.0.0.2")
    total = 12 << 20
    s.sendall(head("PUT", f"/v1/sandboxes/{sandbox}/files?path={path}", total) + b"a" * (5 << 20))
    end_sandbox(sandbox)
    try:
        s.sendall(b"b" * (total - (5 << 20)))
    except OSError:
        pass
    status, body = read_answer(s, 10)
    s.close()
    expect(status is not None and status >= 400, f"the upload to {path} after its sandbox ended: {status} "
                                                 f"{body[:200]!r}")
    return f"answered {status} {body[:80]!r}"


def upload_when_sandbox_deleted(server):
    def delete(sandbox):
        time.sleep(0.5)
        status, _ = server.json_call("DELETE", f"/v1/sandboxes/{sandbox}")
        expect(status == 200, f"DELETE during the upload: {status}")
        time.sleep(0.3)

    return upload_cut_short(server, "/big", delete)


def upload_when_sandbox_dies(server):
    # The fake episode answers the first 4 MiB chunk, then ends; serve is given time to see it.
    said = upload_cut_short(server, "/exit-after-chunk", lambda sandbox: time.sleep(1.0))
    return f"{said}; {server.healthy('uploads whose sandbox ended')}"


def fetch_when_sandbox_dies(server):
    # Issue 31, item 6: /run_code fetching several files from a sandbox that ends on the
    # second: answered (SandboxError), not left waiting.
    body = {"code": "print(1)", "language": "python", "fetch_files": ["a.txt", "die.txt", "c.txt"]}
    status, answer = server.json_call("POST", "/run_code", body, timeout=15)
    expect(status == 200, f"/run_code: {status} {answer[:300]!r}")
    doc = json.loads(answer)
    expect(doc.get("status") == "SandboxError", f"/run_code whose sandbox died mid-fetch: {doc}")
    status, answer = server.json_call("POST", "/run_code", dict(body, fetch_files=["a.txt", "c.txt"]), timeout=15)
    doc = json.loads(answer)
    expect(status == 200 and set(doc.get("files", {})) == {"a.txt", "c.txt"}, f"/run_code fetching two files: {doc}")
    return f"mid-fetch death answered SandboxError ({doc['status']} when it lives); {server.healthy('fetch')}"


def many_connections(server):
    held = []
    try:
        # More than 1024 at once (serve started under a soft limit of 1024), from several
        # addresses and the Unix socket, each address under its limit: all held, serve answers.
        want = 1100
        address, per_address = 5, 0
        for _ in range(min(300, server.per_listener - 10)):
            held.append(server.raw_unix())
        while len(held) < want:
            if per_address >= server.per_address - 5:
                address, per_address = address + 1, 0
            held.append(server.tcp(source=f"127.0.0.{address}"))
            per_address += 1
        time.sleep(0.5)
        fds = server.fds()
        start = time.monotonic()
        for name, connect in [("tcp", server.http), ("unix", server.unix)]:
            try:
                status, _, _ = call(connect(timeout=5), "GET", "/healthz", headers=AUTH)
            except OSError as e:
                expect(False, f"beside {len(held)} connections, a healthy client on {name} got {e!r}")
            expect(status == 200, f"beside {len(held)} connections: healthz on {name} answered {status}")
        took = time.monotonic() - start
        budget = server.per_listener * 2 + 64 + 64 * 8
        expect(fds <= budget, f"serve holds {fds} descriptors beside {len(held)} connections (at most {budget})")
        # The held ones are served too.
        for s in held[:5] + held[-5:]:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + AUTH_LINE + b"\r\n")
            status, _ = read_answer(s, 5)
            expect(status == 200, f"a held connection's request: {status}")
        # One address past its limit: the surplus is closed at once, others are served.
        over = server.per_address + 40
        crowd = [server.tcp(source="127.0.0.4") for _ in range(over)]
        held += crowd
        time.sleep(0.5)
        refused = 0
        for s in crowd:
            s.setblocking(False)
            try:
                if s.recv(1, socket.MSG_PEEK) == b"":
                    refused += 1
            except BlockingIOError:
                pass
            except OSError:
                refused += 1
        expect(refused >= 40, f"{over} connections from one address (limit {server.per_address}): {refused} refused")
        server.held_elsewhere = len(held) - refused
        server.healthy(f"{len(held)} connections, {over} from one address")
        server.held_elsewhere = 0
        total = len(held)
    finally:
        for s in held:
            s.close()
    return (f"{total} held at once ({fds} fds before the crowd, healthz in {took * 1000:.0f} ms); {refused} of "
            f"{over} from one address refused; {server.healthy('many connections')}")


def stop_with_requests_open(name, signals):
    """A serve with a call in flight, a slow and an idle client, and `signals` SIGTERMs."""
    # One SIGTERM: the call has the drain's grace (2 s) to finish; two: the second cuts it short.
    server = Server(name, "--drain-grace", "2" if signals == 1 else "30")
    try:
        sandbox = server.create_sandbox()
        results = {}

        def hang():
            try:
                results["hang"] = server.json_call("POST", f"/v1/sandboxes/{sandbox}/exec", {"argv": ["hang"]},
                                                   timeout=40)
            except Exception as e:  # noqa: BLE001
                results["hang"] = (None, repr(e).encode())

        thread = threading.Thread(target=hang, daemon=True)
        thread.start()
        idle = [server.tcp(source="127.0.0.2") for _ in range(20)] + [server.raw_unix() for _ in range(20)]
        slow = server.tcp(source="127.0.0.2")
        slow.sendall(b"GET /healthz HTTP/1.1\r\n")
        time.sleep(0.5)
        start = time.monotonic()
        for _ in range(signals):
            server.serve.proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)
        try:
            code = server.serve.proc.wait(timeout=25)
        except Exception:  # noqa: BLE001
            code = "still running"
        took = time.monotonic() - start
        thread.join(timeout=5)
        for s in idle + [slow]:
            s.close()
        expect(code == 0, f"exit {code} after {signals} SIGTERM(s) with requests open: {server.serve.log()[-1500:]}")
        status, body = results.get("hang", (None, b"no answer"))
        expect(status is not None and status >= 400, f"the call in flight got {status} {body[:200]!r}")
        return f"exit 0 in {took:.1f} s; the call in flight answered {status} {json.loads(body).get('error')!r}"
    finally:
        server.stop()


def refill_under_flood():
    # Issue 31, item 5: a pool whose VMs fail to start retries its refill from a timer; under
    # a flood of connections that once left serve without a descriptor to read /proc/meminfo
    # with, the refill threw and serve exited.
    server = Server("refill", "--pool", "default=1", bin_dir=FAILING_BIN)
    held = []
    try:
        over = server.per_listener + 100
        for _ in range(over):
            try:
                held.append(server.raw_unix())
            except OSError:
                break
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            server.alive()
            time.sleep(0.25)
        fds = server.fds()
        for s in held:
            s.close()
        held = []
        # Its VMs never start: the node may be in maint (service/fleet/capacity_report.hpp).
        server.healthy("a connection flood during failing refills", states=("ok", "maint"))
        code = server.stop()
        expect(code == 0, f"exit {code}: {server.serve.log()[-1500:]}")
        return f"{over} Unix connections (share {server.per_listener}) held 4 s, {fds} fds, refills failing: serve lives"
    finally:
        for s in held:
            s.close()
        server.stop()


def make_bin(name, agentvm_script, hard):
    """A directory holding serve (linked, or copied), the `agentvm` it runs (the one beside
    its own binary) and serve-limited, which starts it under the usual soft limit of 1024."""
    bin_dir = os.path.join(TMP, name)
    os.mkdir(bin_dir)
    try:
        os.link(SERVE, os.path.join(bin_dir, "agentvm-serve"))
    except OSError:
        shutil.copy2(SERVE, os.path.join(bin_dir, "agentvm-serve"))
    with open(os.path.join(bin_dir, "agentvm"), "w") as f:
        f.write(agentvm_script)
    os.chmod(os.path.join(bin_dir, "agentvm"), 0o755)
    with open(os.path.join(bin_dir, "serve-limited"), "w") as f:
        f.write(f"#!/bin/sh\nulimit -S -n 1024 && ulimit -H -n {min(SERVE_HARD_NOFILE, hard)} || exit 99\n"
                f"exec {os.path.join(bin_dir, 'agentvm-serve')} \"$@\"\n")
    os.chmod(os.path.join(bin_dir, "serve-limited"), 0o755)
    return bin_dir


def main():
    global BIN, FAILING_BIN
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    BIN = make_bin("bin", f"#!/bin/sh\nexec {sys.executable} {os.path.join(HERE, 'fake_episode.py')} \"$@\"\n", hard)
    FAILING_BIN = make_bin("failing-bin", "#!/bin/sh\necho 'agentvm: error: no VM here' >&2\nexit 1\n", hard)

    results = []
    server = None
    try:
        server = Server("main")
        slowloris = Slowloris(server, 40)
        results += [run_case(case.__name__, case, server) for case in
                    [malformed_and_non_utf8, deep_and_huge, out_of_order, upload_when_sandbox_deleted,
                     upload_when_sandbox_dies, fetch_when_sandbox_dies]]
        results.append(run_case("slow_clients", slow_clients, server, slowloris))
        results.append(run_case("many_connections", many_connections, server))
        code = server.stop()
        results.append(run_case("sigterm_exit", lambda: (expect(code == 0, f"exit {code}: {server.serve.log()[-1500:]}"),
                                                         "exit 0 after SIGTERM")[1]))
    finally:
        if server:
            server.stop()
    results.append(run_case("refill_under_flood", refill_under_flood))
    results.append(run_case("sigterm_with_call_in_flight", stop_with_requests_open, "drain", 1))
    results.append(run_case("second_sigterm_with_call_in_flight", stop_with_requests_open, "again", 2))
    shutil.rmtree(TMP, ignore_errors=True)
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
