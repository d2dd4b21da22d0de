#!/usr/bin/env python3
"""A stand-in for `agentvm episode` (docs/protocol.md, "The host side") for checks of serve that
need a sandbox but no VM: it announces itself ready, then answers each request line at once,
except where the request asks it to misbehave:

- exec or run_code whose argv[0] or code is "hang": never answered (a call in flight);
- write_file whose path contains "exit-after-chunk": answered, then the episode ends (the VM
  dies between an upload's chunks);
- stat or read_file whose path contains "die": the episode ends without answering (mid-fetch).

SIGTERM (serve stopping it) answers every call still running with `stopped`, then exits, as
the real episode does. Its arguments (episode --announce-ready ...) are ignored."""
import base64
import json
import signal
import sys

running = set()


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def stopped(_signum, _frame):
    for call in sorted(running):
        send({"id": call, "error": {"code": "stopped", "message": "the episode was stopped"}})
    sys.exit(0)


def main():
    signal.signal(signal.SIGTERM, stopped)
    send({"event": "ready", "restored": False})
    for line in sys.stdin:
        request = json.loads(line)
        call, op = request["id"], request.get("op")
        if op in ("exec", "run_code", "shell"):
            argv = request.get("argv") or [request.get("code") or request.get("cmd") or ""]
            if argv[:1] == ["hang"]:
                running.add(call)
                continue
            send({"id": call, "exit_code": 0, "signal": None, "timed_out": False, "oom_killed": False,
                  "stdout": "", "stderr": "", "duration_ms": 1})
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
