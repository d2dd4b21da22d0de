"""A test's view of agentvm-serve: start it, talk HTTP to it over its Unix socket or TCP, stop
it. Shared by serve_http_check.py (no VMs) and serve_check.py (real sandboxes)."""
import atexit
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "vm"))
from checks import expect  # noqa: E402


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=60):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Serve:
    """agentvm-serve as a child; its stderr goes to a file (read by log()) so that a chatty
    serve never blocks on a full pipe."""

    def __init__(self, binary, *args, log_path=None, log_level="warn", state_dir=None, env=None):
        self.log_path = log_path or f"/tmp/agentvm-serve-{os.getpid()}-{time.monotonic_ns()}.log"
        self.log_file = open(self.log_path, "wb")
        if log_path is None:  # read after stop() by a failing check; gone when the check ends
            atexit.register(lambda path=self.log_path: os.path.exists(path) and os.unlink(path))
        # Each serve its own state directory (one serve per directory), unless a test shares
        # one between a serve and its successor.
        self.own_state = state_dir is None and "--state-dir" not in args
        self.state_dir = tempfile.mkdtemp(prefix="agentvm-serve-state-") if self.own_state else state_dir
        extra = ["--state-dir", self.state_dir] if self.state_dir else []
        self.proc = subprocess.Popen([binary, "--log-level", log_level, *extra, *args], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=self.log_file, env=env)

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def wait_listening(self, connect, within=10):
        deadline = time.monotonic() + within
        while True:
            try:
                conn = connect()
                conn.request("GET", "/healthz")
                conn.getresponse().read()
                return
            except OSError:
                if self.proc.poll() is not None:
                    expect(False, f"serve exited {self.proc.returncode}: {self.log()[-2000:]}")
                expect(time.monotonic() < deadline, f"serve did not answer within {within} s")
                time.sleep(0.05)

    def stop(self, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.log_file.close()
            if self.own_state:
                shutil.rmtree(self.state_dir, ignore_errors=True)


def call(conn, method, path, body=None, headers=None):
    """One request; returns (status, headers, body bytes)."""
    conn.request(method, path, body=body, headers=headers or {})
    r = conn.getresponse()
    data = r.read()
    return r.status, dict(r.getheaders()), data


def json_error(data):
    doc = json.loads(data)
    expect(set(doc) == {"error", "message"} and isinstance(doc["message"], str) and doc["message"],
           f"not a JSON error: {data!r}")
    return doc["error"]
