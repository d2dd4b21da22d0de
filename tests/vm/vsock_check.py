#!/usr/bin/env python3
"""End-to-end vsock through agentvm's hybrid Unix socket, run where a real guest boots.

usage: vsock_check.py AGENTVM_BINARY
Boots the guest twice: once with a guest vsock server the host connects to through
"CONNECT <port>", once with a guest client that connects to a host listener at <uds>_<port>
(and to a port nobody listens on). Prints one "... ok" line per scenario; exits non-zero with
the reason otherwise.
"""
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
import time

from hybrid_vsock import open_guest_port

AGENTVM = sys.argv[1]
PAYLOAD = bytes(range(97, 123)) * 40330  # ~1 MiB: many packets, several credit updates

GUEST_SERVER = """import socket
s=socket.socket(socket.AF_VSOCK,socket.SOCK_STREAM);s.bind((socket.VMADDR_CID_ANY,5000));s.listen()
print("server-listening",flush=True)
c,_=s.accept();d=b""
while True:
  b=c.recv(65536)
  if not b:break
  d+=b
c.sendall(d.upper());c.close();print("served",len(d),flush=True)"""

GUEST_CLIENT = """import socket
c=socket.socket(socket.AF_VSOCK,socket.SOCK_STREAM);c.connect((2,6000));c.sendall(b"ping"*262144);c.shutdown(socket.SHUT_WR)
d=b""
while True:
  b=c.recv(65536)
  if not b:break
  d+=b
print("reply",len(d),d[:4].decode(),flush=True)
try:
  x=socket.socket(socket.AF_VSOCK,socket.SOCK_STREAM);x.connect((2,6001));print("connected-6001",flush=True)
except OSError as e:print("refused",e.errno,flush=True)"""


def fail(why, console_path=None):
    if console_path and os.path.exists(console_path):
        why += "\nconsole:\n" + open(console_path, errors="replace").read()[-2000:]
    sys.exit("vsock_check: " + why)


def boot(tmp, name, init_cmd):
    console = os.path.join(tmp, name + ".console")
    uds = os.path.join(tmp, "v.sock")
    proc = subprocess.Popen([AGENTVM, "--log-level", os.environ.get("AGENTVM_LOG_LEVEL", "warn"), "boot", "--vsock-uds", uds,
                             "--console", console, "--init-cmd", "python3 -c " + shlex.quote(init_cmd)],
                            stdin=subprocess.DEVNULL)
    return proc, uds, console


def wait_for(path, text, proc, limit=240):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if os.path.exists(path) and text in open(path, errors="replace").read():
            return
        if proc.poll() is not None:
            fail(f"agentvm exited ({proc.returncode}) before '{text}'", path)
        time.sleep(0.1)
    fail(f"'{text}' never appeared", path)


def recv_all(sock):
    chunks = []
    while True:
        b = sock.recv(1 << 16)
        if not b:
            return b"".join(chunks)
        chunks.append(b)


def host_to_guest(tmp):
    proc, uds, console = boot(tmp, "server", GUEST_SERVER)
    wait_for(console, "server-listening", proc)
    s, line = open_guest_port(uds, 5000)
    if not line.startswith(b"OK "):
        fail(f"handshake answered {line!r}", console)
    s.sendall(PAYLOAD)
    s.shutdown(socket.SHUT_WR)
    reply = recv_all(s)
    if reply != PAYLOAD.upper():
        fail(f"guest echoed {len(reply)} bytes, not the {len(PAYLOAD)} sent, upper-cased", console)
    # An unknown guest port is refused: the stream just closes.
    r = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    r.settimeout(120)
    r.connect(uds)
    r.sendall(b"CONNECT 5999\n")
    if recv_all(r) != b"":
        fail("a connect to a closed guest port was answered", console)
    # Malformed handshakes are closed without an answer, and the VM carries on.
    for bad in (b"HELLO 5000\n", b"CONNECT 5000x\n", b"CONNECT 99999999999\n", b"CONNECT " + b"9" * 100):
        b = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        b.settimeout(120)
        b.connect(uds)
        b.sendall(bad)
        try:
            answer = recv_all(b)
        except ConnectionResetError:  # closed with our unread bytes still queued: a reset
            answer = b""
        if answer != b"":
            fail(f"handshake {bad[:20]!r} was answered", console)
    if proc.wait(timeout=240) != 0:
        fail(f"agentvm exited {proc.returncode}", console)
    print("host-to-guest ok:", len(PAYLOAD), "bytes each way, bad handshakes closed")


def guest_to_host(tmp):
    uds = os.path.join(tmp, "v.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(uds + "_6000")
    listener.listen()
    got = {}

    def serve():
        c, _ = listener.accept()
        data = recv_all(c)
        got["len"] = len(data)
        c.sendall(b"PONG" * (len(data) // 4))
        c.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    proc, _, console = boot(tmp, "client", GUEST_CLIENT)
    if proc.wait(timeout=240) != 0:
        fail(f"agentvm exited {proc.returncode}", console)
    text = open(console, errors="replace").read()
    if got.get("len") != 4 * 262144:
        fail(f"host received {got.get('len')} bytes, not {4 * 262144}", console)
    if f"reply {4 * 262144} PONG" not in text:
        fail("guest did not get the host's reply", console)
    if "refused" not in text:
        fail("the guest reached a host port nobody listens on", console)
    print("guest-to-host ok:", got["len"], "bytes each way, unlistened port refused")


with tempfile.TemporaryDirectory(prefix="agentvm-vsock-") as tmp:
    host_to_guest(tmp)
with tempfile.TemporaryDirectory(prefix="agentvm-vsock-") as tmp:
    guest_to_host(tmp)
