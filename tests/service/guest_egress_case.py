"""Egress with a real guest (docs/api.md, "Egress"): one case of serve_check.py, on its serve,
so that it shares that check's test-host boot.

The outside is a web server of this test's on 127.0.0.2 (a loopback address that is not the
guest's own 127.0.0.1, so the tools' NO_PROXY does not keep it off the proxy; any special
address needs a rule naming it). From sandboxes created with the native "egress" field:
curl (plain and through CONNECT), Python's urllib and `pip download` from a PEP 503 index reach
it when the policy allows it; a port outside the rule, "*" (public addresses only), a name
that resolves to loopback, and a sandbox without a policy are refused with the proxy's reason
shown by the tool; the 65th connection at once is answered 429; every connection is in the
sandbox's history and in /metrics.
"""
import base64
import hashlib
import io
import json
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from checks import expect

HOST = "127.0.0.2"
WHEEL = "tinypkg-1.0-py3-none-any.whl"


def make_wheel():
    """A minimal valid wheel: one module, METADATA, WHEEL and RECORD."""
    files = {
        "tinypkg/__init__.py": b"VALUE = 42\n",
        "tinypkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
        "tinypkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: agentvm-test\nRoot-Is-Purelib: true\n"
                                       b"Tag: py3-none-any\n",
    }
    record = ""
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += f"{name},sha256={digest},{len(data)}\n"
    record += "tinypkg-1.0.dist-info/RECORD,,\n"
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("tinypkg-1.0.dist-info/RECORD", record)
    return out.getvalue()


class Outside:
    """The web server the sandboxes reach: /hello, a PEP 503 index, the wheel, /hold (kept open)."""

    def __init__(self):
        wheel = make_wheel()
        self.wheel_sha = hashlib.sha256(wheel).hexdigest()
        self.release = threading.Event()
        outside = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def send(self, body, kind="text/plain"):
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/hello":
                    self.send(b"hello from outside")
                elif self.path in ("/simple/tinypkg/", "/simple/tinypkg"):
                    link = f'<a href="/files/{WHEEL}#sha256={outside.wheel_sha}">{WHEEL}</a>'
                    self.send(f"<html><body>{link}</body></html>".encode(), "text/html")
                elif self.path == f"/files/{WHEEL}":
                    self.send(wheel, "application/octet-stream")
                else:
                    self.send_error(404)

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 128

        self.server = Server((HOST, 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


# 70 CONNECTs at once from the guest to the outside: what each got back.
MANY_AT_ONCE = r'''
import socket, sys
port = int(sys.argv[1])
conns, answers = [], []
for i in range(70):
    s = socket.create_connection(("127.0.0.1", 3128))
    s.sendall(f"CONNECT 127.0.0.2:{port} HTTP/1.1\r\n\r\n".encode())
    conns.append(s)
for s in conns:
    s.settimeout(30)
    data = b""
    while b"\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    answers.append(data.split(b"\r\n")[0].decode())
print("\n".join(answers))
'''


def run(create, delete, exec_, metrics):
    outside = Outside()
    seen = []
    url = f"http://{HOST}:{outside.port}"
    before = metrics()

    def sh(sid, cmd):
        answer = exec_(sid, ["sh", "-c", cmd])
        return answer["exit_code"], answer.get("stdout", ""), answer.get("stderr", "")

    def counter(samples, result):
        return samples.get(("agentvm_egress_connections_total", frozenset({("result", f'"{result}"')})), 0)

    try:
        allowed = create(egress={"allow": [HOST, "localhost"]})["id"]
        code, out, _ = sh(allowed, "printenv HTTP_PROXY HTTPS_PROXY NO_PROXY")
        expect(out.split() == ["http://127.0.0.1:3128", "http://127.0.0.1:3128", "localhost,127.0.0.1,::1"],
               f"the proxy's env: {out!r}")

        code, out, err = sh(allowed, f"curl -sS {url}/hello")
        expect(code == 0 and out == "hello from outside", f"curl through the proxy: {code} {out!r} {err!r}")
        code, out, err = sh(allowed, f"curl -sS -p {url}/hello")
        expect(code == 0 and out == "hello from outside", f"curl through CONNECT: {code} {out!r} {err!r}")
        code, out, err = sh(allowed, f"python3 -c 'import urllib.request; "
                                     f"print(urllib.request.urlopen(\"{url}/hello\").read().decode())'")
        expect(code == 0 and out.strip() == "hello from outside", f"urllib: {code} {out!r} {err!r}")
        code, out, err = sh(allowed, f"pip download --no-deps --disable-pip-version-check -q --index-url {url}/simple/ "
                                     f"--trusted-host {HOST} -d /tmp/dl tinypkg && sha256sum /tmp/dl/{WHEEL}")
        expect(code == 0 and out.split()[0] == outside.wheel_sha, f"pip download: {code} {out!r} {err[-2000:]!r}")
        seen.append("curl (plain and CONNECT), urllib and pip download reached the outside")

        # A name allowed by its rule that resolves to loopback: refused by its address.
        code, out, err = sh(allowed, f"curl -sS --noproxy '' -x http://127.0.0.1:3128 "
                                     f"http://localhost:{outside.port}/hello")
        expect(out.startswith("agentvm egress: ") and "loopback" in out,
               f"a name resolving to loopback: {code} {out!r} {err!r}")
        seen.append(f"a name resolving to loopback refused ({out.strip()[:100]})")

        answers = exec_(allowed, ["python3", "-c", MANY_AT_ONCE, str(outside.port)])["stdout"].split("\n")
        established = sum(a == "HTTP/1.1 200 Connection established" for a in answers)
        limited = sum(a == "HTTP/1.1 429 Too Many Requests" for a in answers)
        expect(established == 64 and limited == 6, f"70 at once: {established} established, {limited} 429: {answers}")
        seen.append("70 connections at once: 64 established, 6 answered 429")

        narrow = create(egress={"allow": ["*", f"{HOST}:1-1000"]})["id"]
        code, out, err = sh(narrow, f"curl -sS {url}/hello")
        expect(code == 0 and out.startswith("agentvm egress: ") and str(outside.port) in out,
               f"a port outside the rule: {code} {out!r} {err!r}")
        code, out, err = sh(narrow, f"curl -sS -p {url}/hello")
        expect(code != 0 and "403" in err, f"CONNECT to a port outside the rule: {code} {out!r} {err!r}")
        seen.append("a port outside the rule and '*' for a loopback address refused (403, the reason shown)")

        closed = create()["id"]
        code, out, err = sh(closed, "printenv HTTP_PROXY || echo unset")
        expect(out.strip() == "unset", f"a sandbox without a policy has proxy env: {out!r}")
        code, out, err = sh(closed, f"curl -sS -m 20 -x http://127.0.0.1:3128 {url}/hello")
        expect("no egress policy" in out, f"the agent's answer without a policy: {code} {out!r} {err!r}")
        code, out, err = sh(closed, f"curl -sS -m 20 {url}/hello")
        expect(code != 0, f"a sandbox without a policy reached the outside: {out!r}")
        seen.append("a sandbox without a policy: no proxy env, the agent's 403, no route out")

        history = delete(allowed)["history"]["calls"]
        egress = [c for c in history if c["request"].get("op") == "egress"]
        ok = [c for c in egress if "result" in c and c["result"].get("allowed")]
        refused = [c for c in egress if "error" in c]
        expect(len(ok) >= 4 + 64 and all(c["result"]["bytes_in"] > 0 for c in ok[:4]),
               f"allowed connections in the history: {len(ok)}: {ok[:3]}")
        expect(any(c["error"]["code"] == "egress_refused" and c["error"]["status"] == 403 for c in refused)
               and sum(c["error"]["status"] == 429 for c in refused) == 6,
               f"refused connections in the history: {refused[:8]}")
        expect(egress[1]["request"] == {"op": "egress", "method": "CONNECT", "destination": f"{HOST}:{outside.port}"},
               f"a CONNECT's entry: {egress[1]}")
        seen.append(f"history: {len(ok)} allowed (bytes counted), {len(refused)} refused")
        delete(narrow)
        delete(closed)

        after = metrics()
        grew = {r: counter(after, r) - counter(before, r) for r in ("allowed", "refused", "failed")}
        expect(grew["allowed"] >= 68 and grew["refused"] >= 9, f"egress metrics grew by {grew}")
        bytes_in = after.get(("agentvm_egress_bytes_total", frozenset({("direction", '"in"')})), 0)
        expect(bytes_in > 0, "agentvm_egress_bytes_total{direction=in} did not grow")
        seen.append(f"metrics: {grew}")
    finally:
        outside.close()
    return "; ".join(seen)
