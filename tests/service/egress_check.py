#!/usr/bin/env python3
"""agentvm-serve's egress proxies (docs/api.md, "Egress"; issue 29) without VMs: the test plays
the VMM, connecting to a sandbox's `<vsock-uds>_3128` as the guest agent's egress relay does,
and a web server of the test's on 127.0.0.2 plays the outside. Which rules a sandbox gets (its
create's, its pool's --pool-egress-allow, serve's --egress-allow), the proxy env in its env op,
no proxy at all without rules, CONNECT and plain HTTP through it, refusals, the history and
metrics entries, and flags and create fields that are wrong, named.

usage: egress_check.py AGENTVM_SERVE_BINARY
Prints "ok <case>: <what was seen>" or "FAIL <case>: <why>" per case; exits non-zero if any
failed. serve runs from a copy of its binary beside fake_episode.py as its `agentvm`.
"""
import http.client
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "vm"))
sys.path.insert(0, HERE)
from checks import expect, run_case  # noqa: E402
from serve_client import free_port  # noqa: E402
import serve_client  # noqa: E402

SERVE = sys.argv[1]
TMP = tempfile.mkdtemp(prefix="agentvm-egress-")
FAKE = f"#!/bin/sh\nexec {sys.executable} {os.path.join(HERE, 'fake_episode.py')} \"$@\"\n"


class Hello(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        body = f"outside: {self.command} {self.path} host={self.headers.get('Host')}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


OUTSIDE = http.server.ThreadingHTTPServer(("127.0.0.2", 0), Hello)
OUTSIDE.daemon_threads = True
threading.Thread(target=OUTSIDE.serve_forever, daemon=True).start()
OUT_PORT = OUTSIDE.server_address[1]


def bin_dir():
    path = os.path.join(TMP, "bin")
    if not os.path.isdir(path):
        os.mkdir(path)
        shutil.copy2(SERVE, os.path.join(path, "agentvm-serve"))
        with open(os.path.join(path, "agentvm"), "w") as f:
            f.write(FAKE)
        os.chmod(os.path.join(path, "agentvm"), 0o755)
    return path


class Node:
    def __init__(self, *args):
        self.port = free_port()
        self.serve = serve_client.Serve(os.path.join(bin_dir(), "agentvm-serve"), "--listen",
                                        f"tcp:127.0.0.1:{self.port}", "--no-auth", "--mem-reserve", "0",
                                        "--node-id", "node-e", *args, log_level="info")
        self.serve.wait_listening(lambda: http.client.HTTPConnection("127.0.0.1", self.port, timeout=5))

    def call(self, method, path, body=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
        try:
            data = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def create(self, **body):
        status, data = self.call("POST", "/v1/sandboxes", body)
        expect(status == 201, f"create {body}: {status} {data[:500]!r}")
        sandbox = json.loads(data)
        with open(f"/proc/{sandbox['pid']}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        sandbox["uds"] = argv[argv.index(b"--vsock-uds") + 1].decode()
        return sandbox

    def env_of(self, sandbox):
        status, data = self.call("POST", f"/v1/sandboxes/{sandbox['id']}/exec", {"argv": ["env-json"]})
        expect(status == 200, f"exec: {status} {data!r}")
        return json.loads(json.loads(data)["stdout"])

    def metrics(self):
        status, data = self.call("GET", "/metrics")
        expect(status == 200, f"metrics: {status}")
        return data.decode()

    def stop(self):
        code = self.serve.stop()
        expect(code == 0, f"serve exit {code}: {self.serve.log()[-2000:]}")


def through_proxy(sandbox, request):
    """Connects as the VMM does for guest port 3128 and sends `request`; all that comes back."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(20)
        s.connect(sandbox["uds"] + "_3128")
        s.sendall(request)
        data = b""
        while True:
            piece = s.recv(65536)
            if not piece:
                return data
            data += piece
            if request.startswith(b"CONNECT") and data.count(b"\r\n\r\n") == 1 and b"200 Connection" in data:
                s.sendall(b"GET /in-tunnel HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                request = b""


def which_rules_apply():
    # A second pool: a snapshot directory (the fake episode restores nothing from it).
    other_pool = os.path.join(TMP, "snap")
    os.makedirs(other_pool, exist_ok=True)
    with open(os.path.join(other_pool, "manifest.json"), "w") as f:
        f.write("{}")
    node = Node("--pool", "default=0", "--pool", f"{other_pool}=0", "--egress-allow", "10.9.9.9",
                "--pool-egress-allow", "default=127.0.0.2")
    try:
        pooled = node.create()
        env = node.env_of(pooled)
        expect(env.get("HTTP_PROXY") == "http://127.0.0.1:3128" and env.get("NO_PROXY") == "localhost,127.0.0.1,::1",
               f"the proxy env: {env}")
        answer = through_proxy(pooled, f"CONNECT 127.0.0.2:{OUT_PORT} HTTP/1.1\r\n\r\n".encode())
        expect(answer.startswith(b"HTTP/1.1 200 Connection established\r\n\r\n")
               and answer.endswith(b"outside: GET /in-tunnel host=x"), f"CONNECT: {answer!r}")
        answer = through_proxy(pooled, f"GET http://127.0.0.2:{OUT_PORT}/p?q=1 HTTP/1.1\r\nHost: evil\r\n\r\n".encode())
        expect(answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(f"outside: GET /p?q=1 host=127.0.0.2:{OUT_PORT}".encode()),
               f"plain GET: {answer!r}")

        own = node.create(egress={"allow": ["pypi.org"], "deny": []}, env={"HTTP_PROXY": "http://mine:1"})
        expect(node.env_of(own).get("HTTP_PROXY") == "http://mine:1", "the create's own HTTP_PROXY did not win")
        answer = through_proxy(own, f"CONNECT 127.0.0.2:{OUT_PORT} HTTP/1.1\r\n\r\n".encode())
        expect(answer.startswith(b"HTTP/1.1 403 Forbidden") and b"agentvm egress: " in answer, f"refused: {answer!r}")

        other = node.create(pool=other_pool)
        answer = through_proxy(other, f"CONNECT 127.0.0.2:{OUT_PORT} HTTP/1.1\r\n\r\n".encode())
        expect(answer.startswith(b"HTTP/1.1 403"), f"serve's default for another pool: {answer!r}")

        closed = node.create(egress={"allow": []})
        expect("HTTP_PROXY" not in node.env_of(closed), "proxy env without rules")
        expect(not os.path.exists(closed["uds"] + "_3128"), "a proxy socket for a sandbox without rules")

        status, data = node.call("DELETE", f"/v1/sandboxes/{own['id']}")
        calls = json.loads(data)["history"]["calls"]
        egress = [c for c in calls if c["request"].get("op") == "egress"]
        expect(len(egress) == 1 and egress[0]["request"]["destination"] == f"127.0.0.2:{OUT_PORT}"
               and egress[0]["error"]["code"] == "egress_refused" and egress[0]["error"]["status"] == 403,
               f"history: {egress}")
        status, data = node.call("DELETE", f"/v1/sandboxes/{pooled['id']}")
        calls = json.loads(data)["history"]["calls"]
        allowed = [c["result"] for c in calls if c["request"].get("op") == "egress" and "result" in c]
        expect(len(allowed) == 2 and all(r["allowed"] and r["bytes_in"] > 0 for r in allowed), f"history: {allowed}")
        text = node.metrics()
        for line in ('agentvm_egress_connections_total{result="allowed"} 2',
                     'agentvm_egress_connections_total{result="refused"} 2'):
            expect(line in text, f"metrics lack {line!r}")
        expect(not os.path.exists(pooled["uds"] + "_3128"), "the proxy socket outlived its sandbox")
        node.stop()
    finally:
        node.serve.stop()
    return ("pool rule over serve's, the create's over both (its own HTTP_PROXY kept), no proxy without rules; "
            "CONNECT and plain GET through it; history and metrics")


def wrong_input_named():
    seen = []
    for args, needle in [(["--pool", "default=0", "--pool-egress-allow", "nosuch=1.2.3.4"], "nosuch=1.2.3.4"),
                         (["--egress-allow", "a..b"], "a..b"),
                         (["--pool", "default=0", "--pool-egress-deny", "default=:x"], "default")]:
        r = subprocess.run([os.path.join(bin_dir(), "agentvm-serve"), "--listen", f"unix:{TMP}/x.sock", *args],
                           capture_output=True, timeout=30)
        expect(r.returncode != 0 and needle.encode() in r.stderr, f"{args}: exit {r.returncode} {r.stderr!r}")
        seen.append(r.stderr.decode().strip().splitlines()[-1][:80])
    node = Node("--pool", "default=0")
    try:
        for body, needle in [({"egress": {"allow": ["a..b"]}}, "a..b"), ({"egress": {"permit": []}}, "permit"),
                             ({"egress": {"allow": "x"}}, "array")]:
            status, data = node.call("POST", "/v1/sandboxes", body)
            expect(status == 400 and json.loads(data)["error"] == "bad_field" and needle in json.loads(data)["message"],
                   f"{body}: {status} {data!r}")
        node.stop()
    finally:
        node.serve.stop()
    return "; ".join(seen) + "; bad create fields 400 bad_field naming them"


def main():
    ok = all([run_case("which_rules_apply", which_rules_apply), run_case("wrong_input_named", wrong_input_named)])
    OUTSIDE.shutdown()
    shutil.rmtree(TMP, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
