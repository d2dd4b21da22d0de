#!/usr/bin/env python3
"""A stand-in for `agentvm episode` (docs/protocol.md, "The host side") for checks of serve that
need a sandbox but no VM: it announces itself ready, then answers each request line at once,
except where the request asks it to misbehave:

- exec or run_code whose argv[0] or code is "hang": never answered (a call in flight);
- write_file whose path contains "exit-after-chunk": answered, then the episode ends (the VM
  dies between an upload's chunks);
- stat or read_file whose path contains "die": the episode ends without answering (mid-fetch).

The env op is kept, and an exec of argv ["env-json"] answers it as its stdout (JSON).

SIGTERM (serve stopping it) answers every call still running with `stopped`, then exits, as
the real episode does. Of its arguments (episode --announce-ready ...) only --vsock-uds PATH
is read: it then plays the VMM's end of vsock and the guest agent's port relay together at PATH
(docs/protocol.md, "Guest ports"), the "guest" being this host's loopback: after "CONNECT 53"
and "PORT p", the stream is a connection to 127.0.0.1:p. A port the test names in the
environment variable FAKE_EPISODE_SILENT_PORT is accepted and then never answered."""
import base64
import json
import os
import signal
import socket
import sys
import threading

running = set()


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def stopped(_signum, _frame):
    for call in sorted(running):
        send({"id": call, "error": {"code": "stopped", "message": "the episode was stopped"}})
    sys.exit(0)


def read_line(conn, limit=64):
    line = b""
    while not line.endswith(b"\n"):
        piece = conn.recv(1)
        if not piece or len(line) >= limit:
            return None
        line += piece
    return line[:-1].decode(errors="replace")


def pump(source, sink):
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def relay(conn):
    with conn:
        if read_line(conn) != "CONNECT 53":
            return
        conn.sendall(b"OK 1\n")
        line = read_line(conn) or ""
        if not line.startswith("PORT "):
            conn.sendall(b"ERR bad request\n")
            return
        port = int(line[5:])
        if str(port) == os.environ.get("FAKE_EPISODE_SILENT_PORT"):
            threading.Event().wait(3600)
        try:
            server = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError as e:
            conn.sendall(f"ERR nothing listens on guest port {port} ({e.strerror})\n".encode())
            return
        server.settimeout(None)
        conn.sendall(b"OK\n")
        with server:
            back = threading.Thread(target=pump, args=(server, conn), daemon=True)
            back.start()
            pump(conn, server)
            back.join()


def serve_vsock(listener):
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=relay, args=(conn,), daemon=True).start()


def main():
    signal.signal(signal.SIGTERM, stopped)
    if "--vsock-uds" in sys.argv:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(sys.argv[sys.argv.index("--vsock-uds") + 1])
        listener.listen(128)
        threading.Thread(target=serve_vsock, args=(listener,), daemon=True).start()
    send({"event": "ready", "restored": False})
    env = {}
    for line in sys.stdin:
        request = json.loads(line)
        call, op = request["id"], request.get("op")
        if op == "env":
            env = request["env"]
            send({"id": call, "ok": True})
        elif op in ("exec", "run_code", "shell"):
            argv = request.get("argv") or [request.get("code") or request.get("cmd") or ""]
            if argv[:1] == ["hang"]:
                running.add(call)
                continue
            # "env-json": the sandbox's env as the episode holds it (serve's env op), as JSON.
            out = json.dumps(env) if argv[:1] == ["env-json"] else ""
            send({"id": call, "exit_code": 0, "signal": None, "timed_out": False, "oom_killed": False,
                  "stdout": out, "stderr": "", "duration_ms": 1})
        elif op == "write_file":
            send({"id": call, "ok": True, "bytes": 0})
            if "exit-after-chunk" in request.get("path", ""):
                sys.exit(1)
        elif op == "stat":
            if "die" in request.get("path", ""):
                sys.exit(1)
            send({"id": call, "ok": True, "type": "file", "size": 7, "mode": "0644", "mtime": 0.0})
        elif op == "read_file":
            if "die" in request.get("path", ""):
                sys.exit(1)
            send({"id": call, "event": "data", "offset": 0, "data_b64": base64.b64encode(b"fetched").decode()})
            send({"id": call, "ok": True, "size": 7, "mode": "0644"})
        else:
            send({"id": call, "error": {"code": "unknown_op", "message": f"the fake episode does not do {op}"}})


if __name__ == "__main__":
    main()
