#!/usr/bin/env python3
"""agentvm-serve's HTTP front: listeners, authentication, errors, limits, stop.

usage: serve_http_check.py AGENTVM_SERVE_BINARY
Prints "ok <case>: <what was seen>" or "FAIL <case>: <why>" per case; exits non-zero if any
failed. Needs no KVM: it checks what serve answers before any sandbox exists.
"""
import base64
import http.client
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "vm"))
from checks import expect, run_case  # noqa: E402
from serve_client import UnixConnection, call, free_port, json_error  # noqa: E402
import serve_client  # noqa: E402


SERVE = sys.argv[1]
TMP = tempfile.mkdtemp(prefix="agentvm-serve-test-")
serves_started = 0


def Serve(*args):
    # No pool: these cases need no VM, and none is started. Its log goes under TMP, which the
    # check removes at the end.
    global serves_started
    serves_started += 1
    return serve_client.Serve(SERVE, "--pool", "default=0", *args,
                              log_path=os.path.join(TMP, f"serve-{serves_started}.log"))


def unix_listener():
    path = os.path.join(TMP, "serve.sock")
    serve = Serve("--listen", f"unix:{path}")
    try:
        serve.wait_listening(lambda: UnixConnection(path))
        mode = stat.S_IMODE(os.stat(path).st_mode)
        expect(mode == 0o600, f"socket mode {mode:o}")
        expect(not os.path.exists(path + ".new"), "the temporary name it was bound under is left")
        conn = UnixConnection(path)
        status, headers, data = call(conn, "GET", "/healthz")
        expect(status == 200 and json.loads(data) == {"status": "ok"}, f"healthz: {status} {data!r}")
        expect(headers.get("Content-Type") == "application/json", f"headers {headers}")
        status, _, data = call(conn, "GET", "/nowhere")
        expect(status == 404 and json_error(data) == "not_found", f"unknown path: {status} {data!r}")
        status, _, data = call(conn, "POST", "/healthz", body=b"{}")
        expect(status == 405 and json_error(data) == "method_not_allowed", f"POST /healthz: {status} {data!r}")
        # Three requests on one keep-alive connection: it stayed open.
        code = serve.stop()
        expect(code == 0, f"exit {code} after SIGTERM: {serve.log() if code else ''}")
        expect(not os.path.exists(path), "the socket file is left behind")
    finally:
        serve.stop()
    return "socket mode 0600; 200, 404 and 405 as JSON on one connection; SIGTERM: exit 0, socket removed"


def tcp_needs_token():
    port = free_port()
    cases = [
        ([f"--listen", f"tcp:127.0.0.1:{port}"], b"needs a token"),
        ([f"--listen", f"tcp:0.0.0.0:{port}", "--no-auth"], b"loopback addresses only"),
        ([f"--listen", f"tcp:127.0.0.1:{port}", "--token-file", os.path.join(TMP, "missing")], b"cannot be read"),
        ([f"--listen", "tcp:127.0.0.1:99999"], b"port must be a number"),
        ([f"--listen", "udp:x"], b"expected unix:PATH or tcp:HOST:PORT"),
    ]
    for args, said in cases:
        r = subprocess.run([SERVE, *args], stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
        expect(r.returncode == 1 and said in r.stderr, f"{args}: exit {r.returncode}, stderr {r.stderr!r}")
    serve = Serve("--listen", f"tcp:127.0.0.1:{port}", "--no-auth")
    try:
        serve.wait_listening(lambda: http.client.HTTPConnection("127.0.0.1", port, timeout=10))
        status, _, _ = call(http.client.HTTPConnection("127.0.0.1", port, timeout=10), "GET", "/healthz")
        expect(status == 200, f"--no-auth on loopback: {status}")
    finally:
        serve.stop()
    return f"{len(cases)} bad set-ups refused by name (exit 1); --no-auth served on 127.0.0.1 only"


def token_auth():
    port = free_port()
    token_file = os.path.join(TMP, "token")
    with open(token_file, "w") as f:
        f.write("s3cret-token\n")
    os.chmod(token_file, 0o600)
    serve = Serve("--listen", f"tcp:127.0.0.1:{port}", "--token-file", token_file)
    try:
        connect = lambda: http.client.HTTPConnection("127.0.0.1", port, timeout=10)  # noqa: E731
        serve.wait_listening(connect)
        basic = lambda user, password: "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()  # noqa
        cases = [
            ({}, 401),
            ({"Authorization": "Bearer s3cret-token"}, 200),
            ({"Authorization": "Bearer s3cret-tokeN"}, 401),
            ({"Authorization": "Bearer s3cret-token2"}, 401),
            ({"Authorization": "Bearer "}, 401),
            ({"Authorization": basic("agentvm", "s3cret-token")}, 200),
            ({"Authorization": basic("anyone", "s3cret-token")}, 200),
            ({"Authorization": basic("s3cret-token", "")}, 401),
            ({"Authorization": "Basic !!!"}, 401),
        ]
        for headers, want in cases:
            status, got_headers, data = call(connect(), "GET", "/healthz", headers=headers)
            expect(status == want, f"{headers}: {status}, want {want}")
            if want == 401:
                expect(json_error(data) == "unauthorized", f"{headers}: {data!r}")
                expect(got_headers.get("WWW-Authenticate", "").startswith("Basic"), f"{got_headers}")
        # The unknown path answers 401 too: nothing about the API shows without the token.
        status, _, _ = call(connect(), "GET", "/nowhere")
        expect(status == 401, f"unknown path without a token: {status}")
    finally:
        serve.stop()
    return f"{len(cases)} Authorization headers: Bearer and Basic (any user) with the token pass, the rest 401"


def limits_and_garbage():
    path = os.path.join(TMP, "limits.sock")
    serve = Serve("--listen", f"unix:{path}")
    try:
        serve.wait_listening(lambda: UnixConnection(path))
        # A body over the limit: by its Content-Length, answered before it is sent...
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(path)
            s.sendall(b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 2097152\r\n\r\n")
            reply = s.recv(4096)
        head, _, data = reply.partition(b"\r\n\r\n")
        expect(head.startswith(b"HTTP/1.1 413") and json_error(data) == "body_too_large", f"by length: {reply!r}")
        # ...and chunked, without a length: read and dropped, then refused.
        conn = UnixConnection(path)
        conn.request("POST", "/healthz", body=(b"x" * 65536 for _ in range(32)), encode_chunked=True,
                     headers={"Transfer-Encoding": "chunked"})
        r = conn.getresponse()
        status, data = r.status, r.read()
        expect(status == 413 and json_error(data) == "body_too_large", f"2 MiB chunked: {status} {data!r}")
        # Garbage instead of a request: the HTTP library refuses it or closes the connection
        # (one with a NUL in its request line waits for the idle timeout), and serve goes on.
        parked = []
        for garbage, want in [(b"GARBAGE\r\n\r\n", (b"", b"HTTP/1.1 400")),
                              (b"GET / HTTP/9.9\r\n\r\n", (b"HTTP/1.1 505",)),
                              (b"\x00\x01garbage\r\n\r\n", None)]:
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(5)
            s.connect(path)
            s.sendall(garbage)
            if want is None:
                parked.append(s)
                continue
            reply = s.recv(4096)
            s.close()
            expect(any(reply.startswith(w) if w else reply == w for w in want), f"{garbage!r} got {reply[:80]!r}")
        status, _, _ = call(UnixConnection(path), "GET", "/healthz")
        expect(status == 200, f"healthz after garbage: {status}")
        for s in parked:
            s.close()
        # 300 idle connections held open; a new one is still answered at once.
        idle = []
        for _ in range(300):
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            idle.append(s)
        start = time.monotonic()
        status, _, _ = call(UnixConnection(path), "GET", "/healthz")
        took = time.monotonic() - start
        expect(status == 200, f"healthz beside 300 idle connections: {status}")
        threads = len(os.listdir(f"/proc/{serve.proc.pid}/task"))
        expect(threads == 1, f"serve has {threads} threads")
        for s in idle:
            s.close()
    finally:
        serve.stop()
    return f"413 for 2 MiB by Content-Length (unsent) and chunked, garbage refused or closed, healthz beside 300 idle connections, one thread ({took * 1000:.0f} ms)"


def state_dir_in_use():
    # A serve that cannot start (another holds its --state-dir) says why, exits non-zero and
    # leaves no socket file: one left behind looks to a waiting client like a serve that is up.
    state = os.path.join(TMP, "shared-state")
    first_path, second_path = os.path.join(TMP, "first.sock"), os.path.join(TMP, "second.sock")
    first = Serve("--listen", f"unix:{first_path}", "--state-dir", state)
    try:
        first.wait_listening(lambda: UnixConnection(first_path))
        second = subprocess.run([SERVE, "--pool", "default=0", "--listen", f"unix:{second_path}", "--state-dir", state],
                                capture_output=True, text=True, timeout=30)
        expect(second.returncode != 0, f"a second serve on the same --state-dir exited 0: {second.stderr}")
        expect("in use by another agentvm serve" in second.stderr, f"the error: {second.stderr!r}")
        expect(not os.path.exists(second_path), "the failed serve left its socket file")
        status, _, _ = call(UnixConnection(first_path), "GET", "/healthz")
        expect(status == 200, f"the first serve answers {status} after the second failed")
    finally:
        first.stop()
    return f"refused: {second.stderr.strip().splitlines()[-1][:120]}; no socket file left; the first serve answers"


def main():
    results = [run_case(case.__name__, case) for case in
               [unix_listener, tcp_needs_token, token_auth, limits_and_garbage, state_dir_in_use]]
    shutil.rmtree(TMP, ignore_errors=True)
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
