"""Inbound ports with a real guest (python/README.md, "Ports"), both transports: a server
spawned in the sandbox reached through ``sb.ports.forward`` (embedded: the episode's vsock
socket; service: serve's raw-TCP upgrade), a 4 MiB answer whole, 10 connections at once, a
port with nothing listening refused without ending the forward, and the forward closed with
the sandbox. ``sb.ports.url`` needs a TCP listener: serve here is on a Unix socket."""
from __future__ import annotations

import hashlib
import socket
import threading
import time
from typing import Any, Dict

import pytest

from agentvm import Sandbox

SERVER = ("import http.server, os\n"
          "class H(http.server.BaseHTTPRequestHandler):\n"
          "    protocol_version = 'HTTP/1.1'\n"
          "    def log_message(self, *a): pass\n"
          "    def do_GET(self):\n"
          "        body = b'x' * (4 << 20) if self.path == '/big' else self.path.encode()\n"
          "        self.send_response(200); self.send_header('Content-Length', str(len(body)))\n"
          "        self.end_headers(); self.wfile.write(body)\n"
          "class S(http.server.ThreadingHTTPServer):\n"
          "    request_queue_size = 64\n"
          "S(('0.0.0.0', 8000), H).serve_forever()\n")


def get(port: int, path: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=120) as c:
        c.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while piece := c.recv(1 << 20):
            data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return body


def test_forward_reaches_a_server_in_the_guest(target: Dict[str, Any]) -> None:
    with Sandbox(**target) as sb:
        sb.files.write("/tmp/server.py", SERVER)
        sb.commands.spawn(["python3", "/tmp/server.py"], tag="web")
        deadline = time.monotonic() + 60
        while sb.commands.run("grep -q ':1F40 ' /proc/net/tcp").exit_code != 0:
            assert time.monotonic() < deadline, "the server did not listen within 60 s"
            time.sleep(0.2)
        if target:
            with pytest.raises(ValueError, match="forward"):
                sb.ports.url(8000)
        with sb.ports.forward(8000) as fwd:
            assert get(fwd.port, "/hello?x=1") == b"/hello?x=1"
            assert hashlib.sha256(get(fwd.port, "/big")).hexdigest() == hashlib.sha256(b"x" * (4 << 20)).hexdigest()
            answers: list = []
            threads = [threading.Thread(target=lambda i=i: answers.append(get(fwd.port, f"/n{i}") == f"/n{i}".encode()))
                       for i in range(10)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert answers.count(True) == 10, answers
            with sb.ports.forward(8009) as dead:
                with socket.create_connection(("127.0.0.1", dead.port), timeout=60) as c:
                    c.settimeout(60)
                    assert c.recv(10) == b"", "a refused guest port closes the local connection"
            assert get(fwd.port, "/after") == b"/after", "the forward goes on after another's refusal"
            kept = fwd.port
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", kept), timeout=5)
