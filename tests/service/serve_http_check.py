#!/usr/bin/env python3
"""agentvm-serve's HTTP front: listeners, authentication, errors, limits, stop.

usage: serve_http_check.py AGENTVM_SERVE_BINARY
Prints "ok <case>: <what was seen>" or "FAIL <case>: <why>" per case; exits non-zero if any
failed. Needs no KVM: it checks what serve answers before any sandbox exists, or with sandboxes
whose VMs are FAKE_EPISODE, a script that answers every call.
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


# A stand-in for `agentvm episode`: ready at once, then every call succeeds with nothing to say.
# serve runs the `agentvm` beside its own binary, so a copy of serve goes beside this.
FAKE_EPISODE = """#!/usr/bin/env python3
import json, sys
print(json.dumps({"event": "ready", "restored": False}), flush=True)
for line in sys.stdin:
    answer = {"id": json.loads(line)["id"], "ok": True, "exit_code": 0, "stdout": "", "stderr": ""}
    print(json.dumps(answer), flush=True)
"""


def ServeWithFakeVms(*args):
    bin_dir = os.path.join(TMP, "fake-vms")
    if not os.path.isdir(bin_dir):
        os.mkdir(bin_dir)
        shutil.copy(SERVE, os.path.join(bin_dir, "agentvm-serve"))
        with open(os.path.join(bin_dir, "agentvm"), "w") as f:
            f.write(FAKE_EPISODE)
        os.chmod(os.path.join(bin_dir, "agentvm"), 0o755)
    global serves_started
    serves_started += 1
    return serve_client.Serve(os.path.join(bin_dir, "agentvm-serve"), "--pool", "default=0", *args,
                              log_path=os.path.join(TMP, f"serve-{serves_started}.log"))


def create_sandbox(conn):
    status, _, data = call(conn, "POST", "/v1/sandboxes", body=b"{}")
    expect(status == 201, f"create with a fake VM: {status} {data!r}")
    return json.loads(data)["id"]


def expect_alive(serve, conn):
    expect(serve.proc.poll() is None, f"serve exited {serve.proc.returncode}: {serve.log()[-1500:]}")
    status, _, _ = call(conn, "GET", "/healthz")
    expect(status == 200, f"healthz: {status}")


def one_piece(connect, method, where, headers, body=b""):
    """A request sent in one write, read to its end: a request refused at its headers has its
    connection closed before its body is read, which a body sent apart could meet as EPIPE."""
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    with connect() as s:
        s.settimeout(10)
        s.sendall(f"{method} {where} HTTP/1.1\r\n{head}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                  .encode() + body)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    status_line, _, rest = reply.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def non_utf8_file_paths():
    # A path the agent protocol cannot carry (a JSON string; other bytes would become U+FFFD,
    # another file) is refused before anything is sent; it once made serve throw from the
    # upload's last callback, ending serve and every sandbox.
    path = os.path.join(TMP, "paths.sock")
    serve = ServeWithFakeVms("--listen", f"unix:{path}")
    try:
        serve.wait_listening(lambda: UnixConnection(path))
        conn = UnixConnection(path)
        sandbox = create_sandbox(conn)
        status, _, data = call(conn, "PUT", f"/v1/sandboxes/{sandbox}/files?path=/tmp/ok", body=b"x")
        expect(status == 200 and json.loads(data)["bytes"] == 1, f"upload to /tmp/ok: {status} {data!r}")
        for method, where in [("PUT", sandbox + "/files"), ("GET", sandbox + "/files"),
                              ("GET", sandbox + "/files/stat"), ("GET", sandbox + "/files/list"),
                              ("PUT", "sb-0000000000000000/files")]:
            # In one piece: an upload refused at its headers is closed before its body is read.
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(10)
                s.connect(path)
                s.sendall(f"{method} /v1/sandboxes/{where}?path=/tmp/%FF HTTP/1.1\r\nHost: localhost\r\n"
                          f"Content-Length: 1\r\n\r\nx".encode())
                reply = s.recv(4096)
            head, _, data = reply.partition(b"\r\n\r\n")
            expect(head.startswith(b"HTTP/1.1 400") and json_error(data) == "bad_field",
                   f"{method} {where}?path=/tmp/%FF: {reply[:300]!r}")
            expect_alive(serve, UnixConnection(path))
    finally:
        serve.stop()
    return "?path=/tmp/%FF: 400 bad_field for upload, download, stat and list, before the sandbox is looked up; serve lives"


def unknown_transfer_coding():
    # MHD reads the body of any coding but chunked until the client closes: an upload with one
    # never ended, its client waiting with no answer and its history entry running for good.
    # The fuzz target found it.
    path = os.path.join(TMP, "coding.sock")
    serve = ServeWithFakeVms("--listen", f"unix:{path}")
    try:
        serve.wait_listening(lambda: UnixConnection(path))
        sandbox = create_sandbox(UnixConnection(path))
        for where, coding in [(f"PUT /v1/sandboxes/{sandbox}/files?path=/tmp/c", b"gzip"),
                              ("POST /v1/sandboxes", b"gzip, chunked")]:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(10)
                s.connect(path)
                s.sendall(where.encode() + b" HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: " + coding +
                          b"\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
                try:
                    reply = s.recv(4096)
                except socket.timeout:
                    reply = b"(no answer within 10 s)"
            head, _, data = reply.partition(b"\r\n\r\n")
            expect(head.startswith(b"HTTP/1.1 501") and json_error(data) == "unsupported_transfer_encoding",
                   f"{where} with Transfer-Encoding {coding!r}: {reply[:200]!r}")
        status, _, data = call(UnixConnection(path), "GET", f"/v1/sandboxes/{sandbox}/history")
        expect(status == 200 and json.loads(data)["calls"] == [], f"history: {status} {data[:300]!r}")
    finally:
        serve.stop()
    return "an upload and a create with a Transfer-Encoding but chunked: 501 at once, nothing left running"


def deep_bodies():
    # Nested deeper than the protocol's 64 levels: refused before parsing, since what serve
    # does with a parsed body (a history summary, the line to the agent) recurses, and half a
    # million levels overflowed its stack.
    path = os.path.join(TMP, "deep.sock")
    serve = ServeWithFakeVms("--listen", f"unix:{path}")
    try:
        serve.wait_listening(lambda: UnixConnection(path))
        sandbox = create_sandbox(UnixConnection(path))
        deep = lambda n: b"[" * n + b"]" * n  # noqa: E731
        cases = [(f"/v1/sandboxes/{sandbox}/exec", b'{"argv":' + deep(500000) + b"}"),
                 (f"/v1/sandboxes/{sandbox}/run_code", b'{"code":' + deep(65) + b"}"),
                 ("/v1/sandboxes", b'{"metadata":{"a":' + deep(64) + b"}}"),
                 ("/run_code", b'{"code":"1","language":"python","x":' + deep(64) + b"}")]
        for where, body in cases:
            status, _, data = call(UnixConnection(path), "POST", where, body=body)
            expect(status == 400 and json_error(data) == "bad_json" and b"deeper than 64" in data,
                   f"{len(body)} bytes to {where}: {status} {data[:200]!r}")
            expect_alive(serve, UnixConnection(path))
        # 64 levels are taken: this one reaches the call, which the fake VM answers.
        status, _, data = call(UnixConnection(path), "POST", f"/v1/sandboxes/{sandbox}/exec",
                               body=b'{"argv":["true"],"x":' + deep(63) + b"}")
        expect(status == 200, f"exec with 64 levels: {status} {data[:200]!r}")
    finally:
        serve.stop()
    return f"{len(cases)} bodies nested 65 to 500000 deep: 400 bad_json, serve lives; 64 levels served"


def no_auth_local_clients_only():
    # Without a token, a web page in a browser on this host must not reach serve: its
    # cross-site requests carry the page's Origin, and through DNS rebinding the Host is the
    # attacker's name. A Unix socket is out of a browser's reach: its Host is not checked.
    port = free_port()
    unix_path = os.path.join(TMP, "local.sock")
    serve = ServeWithFakeVms("--listen", f"tcp:127.0.0.1:{port}", "--listen", f"unix:{unix_path}", "--no-auth")
    try:
        tcp = lambda: http.client.HTTPConnection("127.0.0.1", port, timeout=10)  # noqa: E731
        serve.wait_listening(tcp)
        serve.wait_listening(lambda: UnixConnection(unix_path))
        tcp_socket = lambda: socket.create_connection(("127.0.0.1", port))  # noqa: E731

        def unix_socket():
            s = socket.socket(socket.AF_UNIX)
            s.connect(unix_path)
            return s
        cases = [
            (tcp_socket, {"Host": f"localhost:{port}"}, 200),
            (tcp_socket, {"Host": f"127.0.0.1:{port}", "Origin": f"http://localhost:{port}"}, 200),
            (tcp_socket, {"Host": f"[::1]:{port}", "Origin": "https://127.0.0.1"}, 200),
            (tcp_socket, {"Host": "attacker.example"}, 403),
            (tcp_socket, {"Host": f"attacker.example:{port}"}, 403),
            (tcp_socket, {"Host": f"localhost.attacker.example:{port}"}, 403),
            (tcp_socket, {"Host": f"127.0.0.1:{port}", "Origin": "http://attacker.example"}, 403),
            (tcp_socket, {"Host": f"127.0.0.1:{port}", "Origin": "null"}, 403),
            (unix_socket, {"Host": "attacker.example"}, 200),
            (unix_socket, {"Host": "localhost", "Origin": "http://attacker.example"}, 403),
        ]
        for connect, headers, want in cases:
            for method, where, body in [("GET", "/healthz", b""),
                                        ("POST", "/run_code", b'{"code":"1","language":"python"}')]:
                status, data = one_piece(connect, method, where, headers, body)
                if want == 403:
                    expect(status == 403 and json_error(data) == "forbidden", f"{method} {where} {headers}: {status} {data!r}")
                else:
                    expect(status == 200, f"{method} {where} {headers}: {status} {data!r}")
        # HTTP/1.0 may leave Host out: on TCP that is no loopback Host either.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            reply = s.recv(4096)
        expect(reply.startswith(b"HTTP/1.0 403") or reply.startswith(b"HTTP/1.1 403"), f"no Host: {reply[:80]!r}")
    finally:
        serve.stop()
    # With a token the request proves itself: Host and Origin are not checked.
    token_file = os.path.join(TMP, "local-token")
    with open(token_file, "w") as f:
        f.write("t0ken\n")
    os.chmod(token_file, 0o600)
    serve = Serve("--listen", f"tcp:127.0.0.1:{port}", "--token-file", token_file)
    try:
        serve.wait_listening(tcp)
        status, _, _ = call(tcp(), "GET", "/healthz", headers={"Host": "attacker.example", "Origin": "null",
                                                               "Authorization": "Bearer t0ken"})
        expect(status == 200, f"a foreign Host with the token: {status}")
    finally:
        serve.stop()
    return f"{len(cases)} Host/Origin cases on TCP and a Unix socket: foreign ones 403 forbidden; HTTP/1.0 without Host 403; a token lifts the check"


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
        expect(status == 200 and json.loads(data)["status"] == "ok", f"healthz: {status} {data!r}")
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


def jail_uid_range_checked():
    """--jail-uid-range: bad ranges, one holding a host account, one /etc/subuid delegates, and a
    serve lacking the capabilities are refused by name; none starts serve with VMMs of its own uid."""
    cases = [
        (["--jail-uid-range", "x"], b"FIRST:COUNT"),
        (["--jail-uid-range", "0:5"], b"root"),
        (["--jail-uid-range", "2147483000:1000"], b"past 2147483647"),
        (["--jail-uid-range", "1:1"], b"(uid 1)"),
    ]
    for args, said in cases:
        r = subprocess.run([SERVE, "--listen", f"unix:{TMP}/jail.sock", *args], stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=10)
        expect(r.returncode != 0 and said in r.stderr, f"{args}: exit {r.returncode}, stderr {r.stderr!r}")
    # A host whose /etc/subuid delegates the default range to a user's containers, in a mount
    # namespace of its own so that the host's file stays as it is.
    subuid = os.path.join(TMP, "subuid")
    with open(subuid, "w") as f:
        f.write("builder:1879050000:65536\n")
    r = subprocess.run(["unshare", "--mount", "sh", "-c", 'mount --bind "$0" /etc/subuid && exec "$@"', subuid,
                        SERVE, "--listen", f"unix:{TMP}/jail.sock"], stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=10)
    expect(r.returncode != 0 and b"/etc/subuid line 1" in r.stderr and b"builder" in r.stderr,
           f"a range delegated in /etc/subuid: exit {r.returncode}, stderr {r.stderr!r}")
    # As nobody, without capabilities: the default range needs them.
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", SERVE, "--listen",
                        f"unix:{TMP}/jail.sock", "--state-dir", f"{TMP}/nobody-state"], stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=10)
    expect(r.returncode != 0 and b"CAP_CHOWN" in r.stderr and b"--jail-uid-range none" in r.stderr,
           f"without capabilities: exit {r.returncode}, stderr {r.stderr!r}")
    path = os.path.join(TMP, "none.sock")
    serve = Serve("--listen", f"unix:{path}", "--jail-uid-range", "none")
    try:
        serve.wait_listening(lambda: UnixConnection(path))
        status, _, _ = call(UnixConnection(path), "GET", "/healthz")
        expect(status == 200, f"--jail-uid-range none: /healthz {status}")
    finally:
        serve.stop()
    return (f"{len(cases)} bad ranges, one /etc/subuid delegates, and a serve without the capabilities refused by "
            "name; "
            "--jail-uid-range none served")


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


def lost_sandboxes_and_the_front_door():
    """An id of another node or of an earlier serve is sandbox_lost in each API's shape; a full
    node behind the front door answers a create 503 naming the refusal, so HAProxy retries it."""
    path = os.path.join(TMP, "fleet.sock")
    serve = ServeWithFakeVms("--listen", f"unix:{path}", "--node-id", "n1", "--max-sandboxes", "1")
    try:
        serve.wait_listening(lambda: UnixConnection(path))
        conn = UnixConnection(path)
        mine = create_sandbox(conn)
        node, instance, _ = mine.rsplit("-", 2)
        expect(node == "n1" and len(instance) == 6, f"the id names its node and serve: {mine}")
        elsewhere = "n2-abc123-0123456789abcdef"
        earlier = f"n1-{'0' if instance[0] != '0' else '1'}{instance[1:]}-0123456789abcdef"
        never = f"n1-{instance}-0123456789abcdef"
        for lost, lost_node in ((elsewhere, "n2"), (earlier, "n1")):
            status, _, data = call(conn, "GET", f"/v1/sandboxes/{lost}")
            expect(status == 410 and json.loads(data).get("error") == "sandbox_lost"
                   and json.loads(data).get("node") == lost_node, f"native GET {lost}: {status} {data!r}")
            status, _, data = call(conn, "POST", f"/v1/sandboxes/{lost}/exec", body=b'{"cmd":["true"]}')
            expect(status == 410, f"native exec {lost}: {status} {data!r}")
            status, _, data = call(conn, "GET", f"/sandboxes/{lost}")
            expect(status == 404 and json.loads(data)["message"].startswith("sandbox_lost: "),
                   f"E2B getInfo {lost}: {status} {data!r}")
            status, _, data = call(conn, "GET", "/health",
                                   headers={"E2b-Sandbox-Id": lost, "E2b-Sandbox-Port": "49983"})
            expect(status == 502 and b"sandbox_lost: " in data, f"E2B envd traffic to {lost}: {status} {data!r}")
        status, _, data = call(conn, "GET", f"/v1/sandboxes/{never}")
        expect(status == 404 and json_error(data) == "not_found", f"an id this serve never made: {status} {data!r}")
        status, headers, data = call(conn, "POST", "/v1/sandboxes", body=b"{}")
        expect(status == 429 and json_error(data) == "at_capacity", f"a full node, asked directly: {status} {data!r}")
        status, headers, data = call(conn, "POST", "/v1/sandboxes", body=b"{}", headers={"Agentvm-Front-Door": "1"})
        expect(status == 503 and headers.get("Agentvm-Refusal") == "at_capacity"
               and json_error(data) == "at_capacity", f"a full node behind the front door: {status} {headers} {data!r}")
        expect_alive(serve, conn)
    finally:
        serve.stop()
    return "410 sandbox_lost naming the node (native), 404 and 502 'sandbox_lost:' (E2B); 503 + Agentvm-Refusal " \
        "behind the front door, 429 without"


def main():
    results = [run_case(case.__name__, case) for case in
               [unix_listener, tcp_needs_token, jail_uid_range_checked, token_auth, limits_and_garbage, state_dir_in_use, non_utf8_file_paths,
                unknown_transfer_coding, deep_bodies, no_auth_local_clients_only,
                lost_sandboxes_and_the_front_door]]
    shutil.rmtree(TMP, ignore_errors=True)
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
