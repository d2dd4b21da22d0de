"""Inbound ports with a real guest (docs/api.md, "Ports"; docs/protocol.md, "Guest ports"): one
case of serve_check.py, on its serve, so that it shares that check's test-host boot.

Servers started inside the sandbox (its python3) are reached through serve's
/v1/sandboxes/{id}/ports/{p}/ (HTTP, a 64 MiB body each way by hash, a WebSocket echo through
the upgrade), /tcp/{p} (raw bytes) and `agentvm port-forward`; nothing listening answers 502 at
once; 50 connections at once; a guest server killed mid-answer cuts the answer; a client gone
mid-answer frees the guest's connection; after 1,000 connections neither serve nor the guest's
agent holds more descriptors or threads than before.
"""
import base64
import hashlib
import json
import os
import socket
import struct
import subprocess
import threading
import time

from checks import expect, settled
from serve_client import UnixConnection, call, json_error

# The guest's servers: an HTTP one (GET /big streams a file with its length, POST /sum answers
# the sha256 of the body however it is framed, GET /cut sends half its length and dies) and a
# WebSocket echo (RFC 6455: one text frame in, the same text back unmasked).
GUEST_SERVERS = r'''
import base64, hashlib, os, socket, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Server(ThreadingHTTPServer):
    request_queue_size = 64  # 50 connections come at once

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args):
        pass
    def do_GET(self):
        if self.path == "/big":
            size = os.path.getsize("/tmp/big.bin")
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.send_header("X-Guest", "yes")
            self.end_headers()
            with open("/tmp/big.bin", "rb") as f:
                while chunk := f.read(1 << 20):
                    self.wfile.write(chunk)
        elif self.path == "/cut":
            self.send_response(200)
            self.send_header("Content-Length", str(1 << 20))
            self.end_headers()
            self.wfile.write(b"x" * (1 << 19))
            self.wfile.flush()
            os._exit(0)
        else:
            body = f"{self.command} {self.path} auth={self.headers.get('Authorization')}".encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    def do_POST(self):
        digest, got = hashlib.sha256(), 0
        if self.headers.get("Transfer-Encoding") == "chunked":
            while (size := int(self.rfile.readline().strip(), 16)):
                digest.update(self.rfile.read(size)); got += size; self.rfile.readline()
            self.rfile.readline()
        else:
            left = int(self.headers.get("Content-Length", "0"))
            while left:
                chunk = self.rfile.read(min(left, 1 << 20)); digest.update(chunk); got += len(chunk); left -= len(chunk)
        body = f"{got} {digest.hexdigest()}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

def websocket(conn):
    with conn:
        head = b""
        while b"\r\n\r\n" not in head:
            piece = conn.recv(1)
            if not piece:
                return
            head += piece
        key = [l.split(b":", 1)[1].strip() for l in head.split(b"\r\n") if l.lower().startswith(b"sec-websocket-key:")][0]
        accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
        conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")
        f = conn.makefile("rb")
        while True:
            first = f.read(2)
            if len(first) < 2:
                return
            length = first[1] & 0x7f
            if length == 126:
                length = int.from_bytes(f.read(2), "big")
            elif length == 127:
                length = int.from_bytes(f.read(8), "big")
            mask = f.read(4)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(f.read(length)))
            if first[0] & 0x0f == 8:
                return
            out = bytes([0x81]) + (bytes([length]) if length < 126 else bytes([126]) + length.to_bytes(2, "big"))
            conn.sendall(out + data)

def websockets():
    listener = socket.create_server(("0.0.0.0", 8001))
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=websocket, args=(conn,), daemon=True).start()

threading.Thread(target=websockets, daemon=True).start()
Server(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
'''


def unix_socket(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(120)
    s.connect(path)
    return s


def read_head(s):
    head = b""
    while b"\r\n\r\n" not in head:
        piece = s.recv(1)
        expect(piece, f"the connection closed within the head: {head!r}")
        head += piece
    return head.decode()


def upgrade(sock_path, path, protocol, extra=""):
    s = unix_socket(sock_path)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: {protocol}\r\n{extra}\r\n".encode())
    return s, read_head(s)


def ws_frame(payload):
    mask = os.urandom(4)
    size = len(payload)
    length = bytes([0x80 | size]) if size < 126 else bytes([0x80 | 126]) + size.to_bytes(2, "big")
    return bytes([0x81]) + length + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def ws_read(s):
    f = s.makefile("rb")
    first = f.read(2)
    length = first[1] & 0x7f
    if length == 126:
        length = int.from_bytes(f.read(2), "big")
    return f.read(length)


def guest_counts(exec_, sandbox_id):
    """The agent's descriptors and threads in the guest."""
    # The agent init started (its parent is PID 1), not a call's process.
    r = exec_(sandbox_id, ["sh", "-c", "for d in /proc/[0-9]*; do [ \"$(cat $d/comm)\" = agentvm-agent ] && "
                                       "grep -q '^PPid:[[:space:]]*1$' $d/status && p=$d; done; "
                                       "ls $p/fd | wc -l; ls $p/task | wc -l"])
    fds, threads = (int(x) for x in r["stdout"].split())
    return fds, threads


def host_counts(pid):
    return len(os.listdir(f"/proc/{pid}/fd")), len(os.listdir(f"/proc/{pid}/task"))


def wait_listening(exec_, sandbox_id, port):
    for _ in range(200):
        r = exec_(sandbox_id, ["sh", "-c", f"grep -q ':{port:04X} ' /proc/net/tcp /proc/net/tcp6"])
        if r["exit_code"] == 0:
            return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on guest port {port} after 20 s")


def run(sock_path, serve_pid, agentvm, create, delete, exec_):
    s = create()
    sid = s["id"]
    base = f"/v1/sandboxes/{sid}"
    conn = UnixConnection(sock_path, timeout=300)
    big = os.urandom(64 << 20)
    digest = hashlib.sha256(big).hexdigest()
    status, _, body = call(conn, "PUT", f"{base}/files?path=/tmp/big.bin", big)
    expect(status == 200, f"upload: {status} {body!r}")
    status, _, body = call(UnixConnection(sock_path), "PUT", f"{base}/files?path=/tmp/servers.py",
                           GUEST_SERVERS.encode())
    expect(status == 200, f"upload: {status} {body!r}")

    # Nothing listens yet: 502 at once, naming the port.
    t0 = time.monotonic()
    status, _, body = call(UnixConnection(sock_path), "GET", f"{base}/ports/8000/")
    took = time.monotonic() - t0
    expect(status == 502 and json_error(body) == "port_unreachable" and "8000" in json.loads(body)["message"],
           f"nothing listening: {status} {body!r}")
    expect(took < 5, f"nothing listening took {took:.1f} s")

    status, _, body = call(UnixConnection(sock_path), "POST", f"{base}/spawn",
                           json.dumps({"argv": ["python3", "/tmp/servers.py", "8000"], "tag": "web"}).encode(),
                           {"Content-Type": "application/json"})
    expect(status == 200, f"spawn: {status} {body!r}")
    wait_listening(exec_, sid, 8000)
    wait_listening(exec_, sid, 8001)

    status, headers, body = call(UnixConnection(sock_path), "GET", f"{base}/ports/8000/a%20b?q=1&r=%2F",
                                 headers={"Authorization": "Bearer secret"})
    expect(status == 200 and body == b"GET /a%20b?q=1&r=%2F auth=None", f"GET through the port: {status} {body!r}")
    expect(headers.get("Content-Type") == "text/plain", f"headers: {headers}")

    status, headers, body = call(UnixConnection(sock_path, timeout=600), "GET", f"{base}/ports/8000/big")
    expect(status == 200 and headers.get("Content-Length") == str(len(big)) and headers.get("X-Guest") == "yes"
           and hashlib.sha256(body).hexdigest() == digest, f"64 MiB down: {status} {headers} {len(body)} bytes")
    status, _, body = call(UnixConnection(sock_path, timeout=600), "POST", f"{base}/ports/8000/sum", big)
    expect(status == 200 and body.decode() == f"{len(big)} {digest}", f"64 MiB up: {status} {body!r}")
    chunks = (big[i:i + (1 << 20)] for i in range(0, 8 << 20, 1 << 20))
    # An iterable body without a length: http.client sends it chunked.
    status, _, body = call(UnixConnection(sock_path, timeout=600), "POST", f"{base}/ports/8000/sum", chunks)
    expect(status == 200 and body.decode() == f"{8 << 20} {hashlib.sha256(big[:8 << 20]).hexdigest()}",
           f"8 MiB chunked up: {status} {body!r}")

    # A WebSocket echo through the upgrade.
    ws, head = upgrade(sock_path, f"{base}/ports/8001/echo", "websocket",
                       "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n")
    expect(head.startswith("HTTP/1.1 101") and "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" in head, f"WebSocket head: {head!r}")
    for message in (b"hello", os.urandom(40000)):
        ws.sendall(ws_frame(message))
        expect(ws_read(ws) == message, "WebSocket echo")
    ws.close()

    # Raw TCP to the WebSocket server's port (its handshake is just bytes here), then
    # `agentvm port-forward` to the HTTP server.
    raw, head = upgrade(sock_path, f"{base}/tcp/8001", "agentvm-tcp")
    expect(head.startswith("HTTP/1.1 101") and "agentvm-tcp" in head, f"raw head: {head!r}")
    raw.sendall(b"GET / HTTP/1.1\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
    expect("s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" in read_head(raw), "raw stream to 8001")
    raw.close()
    forward = subprocess.Popen([agentvm, "port-forward", "8000", "--serve", f"unix:{sock_path}", "--sandbox", sid],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = forward.stdout.readline()
        expect(line.startswith("listening on 127.0.0.1:"), f"port-forward said {line!r}")
        local_port = int(line.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", local_port), timeout=60) as c:
            c.sendall(b"GET /via-forward HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = b""
            while piece := c.recv(65536):
                answer += piece
        expect(answer.endswith(b"GET /via-forward auth=None"), f"through port-forward: {answer[-200:]!r}")
    finally:
        forward.terminate()
        expect(forward.wait(10) == 0, f"port-forward exited {forward.returncode}: {forward.stderr.read()}")

    # 50 at once.
    results = []

    def one(i):
        try:
            status, _, body = call(UnixConnection(sock_path, timeout=120), "GET", f"{base}/ports/8000/n{i}")
            results.append(True if status == 200 and body == f"GET /n{i} auth=None".encode() else (status, body[:300]))
        except OSError as e:
            results.append(repr(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expect(results.count(True) == 50, f"50 at once: {results.count(True)} right; {[r for r in results if r is not True]}")

    # The client gone mid-answer, then 1,000 connections: nothing held afterwards.
    c = unix_socket(sock_path)
    c.sendall(f"GET {base}/ports/8000/big HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    c.recv(65536)
    c.close()
    time.sleep(1)
    serve_before, agent_before = host_counts(serve_pid), guest_counts(exec_, sid)
    for i in range(1000):
        if i % 2:
            r, _ = upgrade(sock_path, f"{base}/tcp/8000", "agentvm-tcp")
            r.close()
        else:
            status, _, _ = call(UnixConnection(sock_path), "GET", f"{base}/ports/8000/{i}")
            expect(status == 200, f"connection {i}: {status}")
    # The last connections' ends may still be on their way through vsock (slow under
    # emulation): what is held must come back down within 30 s; a leak never does.
    def serve_back(c):
        return c[0] <= serve_before[0] + 2 and c[1] == serve_before[1]

    def agent_back(c):
        return c[0] <= agent_before[0] + 2 and c[1] <= agent_before[1] + 1

    serve_after = settled(lambda: host_counts(serve_pid), serve_back, 30)
    expect(serve_back(serve_after), f"serve's fds/threads {serve_before} -> {serve_after} 30 s after 1,000 connections")
    agent_after = settled(lambda: guest_counts(exec_, sid), agent_back, 30)
    expect(agent_back(agent_after),
           f"the agent's fds/threads {agent_before} -> {agent_after} 30 s after 1,000 connections")

    # The guest's server dies mid-answer: the answer is cut, not hung.
    cut = unix_socket(sock_path)
    cut.sendall(f"GET {base}/ports/8000/cut HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    head = read_head(cut)
    received = 0
    while piece := cut.recv(65536):
        received += len(piece)
    expect(head.startswith("HTTP/1.1 200") and "Content-Length: 1048576" in head and received < 1 << 20,
           f"a cut answer: {head!r}, {received} bytes")
    delete(sid)
    return (f"502 at once ({took * 1000:.0f} ms); 64 MiB down and up by sha256, chunked up; WebSocket echo; raw "
            f"TCP; port-forward; 50 at once; serve {serve_before}->{serve_after}, agent "
            f"{agent_before}->{agent_after} fds/threads after 1,000; a dying server's answer cut")
