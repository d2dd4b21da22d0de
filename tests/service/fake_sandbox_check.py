#!/usr/bin/env python3
"""serve against a fake episode that lies, where no VM is needed to show it: what SandboxFusion's
/run_code and /run_jupyter bring back from a sandbox is bounded whatever the sandbox answers
(docs/api.md, "SandboxFusion"), and a create or fork whose client went away leaves no sandbox.

usage: fake_sandbox_check.py AGENTVM_SERVE_BINARY
Prints "ok <case>: <what was seen>" or "FAIL <case>: <why>" per case; exits non-zero if any
failed. Needs no KVM: serve runs with --pool default=0 from a copy of its binary beside the
fake below as its `agentvm`, with --fusion-fetch-max 4 MiB and --fusion-output-max 8000.
"""
import base64
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "vm"))
from checks import expect, run_case  # noqa: E402
from serve_client import Serve, UnixConnection, call  # noqa: E402

SERVE = sys.argv[1]
TMP = tempfile.mkdtemp(prefix="agentvm-fake-sandbox-")
SOCKET = os.path.join(TMP, "serve.sock")
FETCH_MAX = 4 << 20
OUTPUT_MAX = 8000

# The episode: stat says what a path's name asks for (a char device for "zero", a FIFO for
# "fifo", a TiB for "sparse", else a 7-byte file); read_file of "liar" (stat said 7 bytes)
# sends 1 MiB events without end; run_code ignores max_output (5000 bytes of stdout, whatever
# it was asked) and answers with the max_output it was asked for as its result. snapshot
# writes the directory it is asked for into its outbox (--snapshot-dir) and names it. A VM is
# ready after 0.5 s, one restored from a snapshot (--snapshot) after 1.5 s. attach and watch
# send one event and run until cancelled (then answer "detached"); any other op of the
# process, file and context ops answers {"ok":true,"op":OP,"fields":[its fields]}.
FAKE = r'''
import base64, json, os, signal, sys, time

args = sys.argv[1:]
outbox = args[args.index("--snapshot-dir") + 1] if "--snapshot-dir" in args else None
time.sleep(1.5 if "--snapshot" in args else 0.5)

def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()

signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
send({"event": "ready", "restored": False})
following = set()
FORWARDED = {"spawn", "list_processes", "send_stdin", "close_stdin", "signal", "resize", "make_dir", "move",
             "remove", "create_context", "list_contexts", "restart_context", "remove_context"}
for line in sys.stdin:
    request = json.loads(line)
    call, op, path = request["id"], request.get("op"), request.get("path", "")
    if op in ("attach", "watch"):
        following.add(call)
        send({"id": call, "event": "attached" if op == "attach" else "watching"})
    elif op == "cancel":
        running = request["call"] in following
        if running:
            following.discard(request["call"])
            send({"id": request["call"], "detached": True, "cancelled": True})
        send({"id": call, "ok": True, "running": running})
    elif op in FORWARDED:
        send({"id": call, "ok": True, "op": op, "fields": sorted(request)})
    elif op == "exec":
        send({"id": call, "exit_code": 0, "signal": None, "timed_out": False, "oom_killed": False,
              "stdout": "", "stderr": "", "duration_ms": 1})
    elif op == "write_file":
        send({"id": call, "ok": True, "bytes": 0})
    elif op == "run_code":
        send({"id": call, "result": repr(request.get("max_output")), "result_truncated": False,
              "exception": None, "timed_out": False, "state_lost": False, "stdout": "o" * 5000,
              "stderr": "", "duration_ms": 1})
    elif op == "stat":
        kind = "char" if "zero" in path else "fifo" if "fifo" in path else "file"
        send({"id": call, "ok": True, "type": kind, "size": 1 << 40 if "sparse" in path else 7,
              "mode": "0644", "mtime": 0.0})
    elif op == "snapshot":
        os.makedirs(os.path.join(outbox, request["name"]))
        with open(os.path.join(outbox, request["name"], "manifest.json"), "w") as f:
            f.write("{}")
        send({"id": call, "snapshot": {"path": os.path.join(outbox, request["name"])}})
    elif op == "read_file":
        if "liar" in path:
            chunk = base64.b64encode(bytes(1 << 20)).decode()
            offset = 0
            while True:
                send({"id": call, "event": "data", "offset": offset, "data_b64": chunk})
                offset += 1 << 20
        send({"id": call, "event": "data", "offset": 0, "data_b64": base64.b64encode(b"fetched").decode()})
        send({"id": call, "ok": True, "size": 7, "mode": "0644"})
    else:
        send({"id": call, "error": {"code": "unknown_op", "message": op}})
'''


def post(path, body):
    status, _, data = call(UnixConnection(SOCKET, timeout=60), "POST", path, json.dumps(body).encode(),
                           {"Content-Type": "application/json"})
    expect(status == 200, f"{path}: {status} {data[:500]!r}")
    return json.loads(data)


def sandboxes_gone():
    deadline = time.monotonic() + 20
    while True:
        _, _, data = call(UnixConnection(SOCKET), "GET", "/v1/sandboxes")
        listed = json.loads(data)["sandboxes"]
        if not listed:
            return
        expect(time.monotonic() < deadline, f"sandboxes left: {listed}")
        time.sleep(0.1)


def fetch_refusals():
    def run_code(fetch):
        return post("/run_code", {"code": "pass", "language": "python", "fetch_files": fetch})

    r = run_code(["ok.txt"])
    expect(r["status"] == "Success" and r["files"] == {"ok.txt": base64.b64encode(b"fetched").decode()},
           f"a regular file: {r}")
    seen = []
    for name, words in (("zero", "not a regular file (char)"), ("fifo", "not a regular file (fifo)"),
                        ("sparse", "--fusion-fetch-max")):
        r = run_code(["ok.txt", name])
        expect(r["status"] == "SandboxError" and words in r["message"] and name in r["message"]
               and r["run_result"]["return_code"] == 0, f"{name}: {r}")
        seen.append(f"{name}: {r['message']!r}")
    sandboxes_gone()
    return "a regular file fetched; refused before a byte was read: " + "; ".join(seen)


def fetch_past_the_cap():
    started = time.monotonic()
    r = post("/run_code", {"code": "pass", "language": "python", "fetch_files": ["liar"]})
    took = time.monotonic() - started
    expect(r["status"] == "SandboxError" and "--fusion-fetch-max" in r["message"] and r["files"] == {},
           f"a file that never ends: {str(r)[:500]}")
    sandboxes_gone()
    return f"a file stat called 7 bytes that never ended: SandboxError in {took:.1f} s, its sandbox deleted"


def cells_share_the_output_cap():
    r = post("/run_jupyter", {"cells": ["a", "b", "c"]})
    kept = [len(cell["stdout"]) for cell in r["cells"]]
    asked = [cell["display"][0]["text/plain"] for cell in r["cells"]]
    expect(r["status"] == "Success" and kept == [5000, OUTPUT_MAX - 5000 - 4, 0], f"stdout kept: {kept}")
    expect(asked == [str(OUTPUT_MAX), str(OUTPUT_MAX - 5000 - 4), ""], f"max_output asked: {asked}")
    r = post("/run_code", {"code": "pass", "language": "python"})
    expect(r["status"] == "Success", f"run_code: {r}")
    sandboxes_gone()
    return f"3 cells of 5000 bytes (the fake ignores max_output) kept {kept} under {OUTPUT_MAX}, asking for {asked}"


def listed():
    _, _, data = call(UnixConnection(SOCKET), "GET", "/v1/sandboxes")
    return {sandbox["id"] for sandbox in json.loads(data)["sandboxes"]}


def create_client_gone():
    gone = UnixConnection(SOCKET)
    gone.request("POST", "/v1/sandboxes", body=b"{}", headers={"Content-Type": "application/json"})
    time.sleep(0.2)  # the create has started its VM, ready 0.5 s after
    gone.close()
    time.sleep(3)
    left = listed()
    expect(not left, f"a create whose client went away left {left}")
    return "a create whose client went away before its VM was ready left no sandbox"


def fork_client_gone():
    status, _, data = call(UnixConnection(SOCKET), "POST", "/v1/sandboxes", b"{}", {"Content-Type": "application/json"})
    expect(status == 201, f"create: {status} {data!r}")
    parent = json.loads(data)["id"]
    # The client goes away once the fork has started (the parent's snapshot is in its
    # history), before the children are ready (1.5 s after their start).
    gone = UnixConnection(SOCKET)
    gone.request("POST", f"/v1/sandboxes/{parent}/fork", body=json.dumps({"count": 2}).encode(),
                 headers={"Content-Type": "application/json"})
    deadline = time.monotonic() + 10
    while True:
        _, _, data = call(UnixConnection(SOCKET), "GET", f"/v1/sandboxes/{parent}/history")
        if any(c["request"].get("op") == "snapshot" for c in json.loads(data)["calls"]):
            break
        expect(time.monotonic() < deadline, "the fork did not start")
        time.sleep(0.05)
    gone.close()
    time.sleep(4)
    left = listed()
    expect(left == {parent}, f"a fork whose client went away left {left - {parent}}")
    status, _, data = call(UnixConnection(SOCKET), "POST", f"/v1/sandboxes/{parent}/fork", b'{"count": 2}',
                           {"Content-Type": "application/json"})
    expect(status == 201 and len(json.loads(data)["sandboxes"]) == 2, f"a fork: {status} {data[:300]!r}")
    expect(len(listed()) == 3, f"after a fork answered: {listed()}")
    for sandbox in listed():
        call(UnixConnection(SOCKET), "DELETE", f"/v1/sandboxes/{sandbox}")
    sandboxes_gone()
    return "a fork whose client went away before its 2 children were ready left none; one answered kept both"


def forwarded_ops():
    status, _, data = call(UnixConnection(SOCKET, timeout=60), "POST", "/v1/sandboxes", b"{}", {})
    expect(status == 201, f"create: {status} {data!r}")
    base = f"/v1/sandboxes/{json.loads(data)['id']}"
    # Each op reaches the agent with its fields and nothing of serve's but id (and op).
    answer = post(f"{base}/spawn", {"argv": ["server"], "tag": "web"})
    expect(answer == {"ok": True, "op": "spawn", "fields": ["argv", "id", "op", "tag"]}, f"spawn: {answer}")
    for op in ("list_processes", "make_dir", "create_context", "signal"):
        expect(post(f"{base}/{op}", {})["op"] == op, op)
    # The host's own ops are no endpoints.
    for op in ("env", "snapshot", "close", "cancel"):
        status, _, data = call(UnixConnection(SOCKET), "POST", f"{base}/{op}", b"{}", {})
        expect(status == 404 and json.loads(data)["error"] == "not_found", f"{op}: {status} {data!r}")
    # attach is a stream or nothing.
    status, _, data = call(UnixConnection(SOCKET), "POST", f"{base}/attach", b'{"pid":1,"stream":false}', {})
    expect(status == 400 and json.loads(data)["error"] == "bad_field", f"attach stream false: {status} {data!r}")
    # An attach whose client leaves is cancelled in the guest: its history entry gets the answer.
    conn = UnixConnection(SOCKET, timeout=30)
    conn.request("POST", f"{base}/attach", body=b'{"tag":"web"}')
    resp = conn.getresponse()
    expect(resp.status == 200 and resp.getheader("Content-Type") == "application/x-ndjson",
           f"attach: {resp.status} {resp.getheader('Content-Type')}")
    first = json.loads(resp.readline())
    expect(first.get("event") == "attached", f"attach's first line: {first}")
    conn.close()
    deadline = time.monotonic() + 20
    while True:
        _, _, data = call(UnixConnection(SOCKET), "GET", f"{base}/history")
        entries = [e for e in json.loads(data)["calls"] if e["request"].get("op") == "attach"]
        if entries and entries[-1].get("result", {}).get("detached"):
            break
        expect(time.monotonic() < deadline, f"the attach was never cancelled: {entries}")
        time.sleep(0.1)
    call(UnixConnection(SOCKET), "DELETE", base)
    sandboxes_gone()
    return "spawn, list_processes, make_dir, create_context and signal forwarded with their fields; env, " \
           "snapshot, close and cancel 404; attach streams, refuses stream:false, and is cancelled when its client left"


def main():
    bin_dir = os.path.join(TMP, "bin")
    os.mkdir(bin_dir)
    try:
        os.link(SERVE, os.path.join(bin_dir, "agentvm-serve"))
    except OSError:
        shutil.copy2(SERVE, os.path.join(bin_dir, "agentvm-serve"))
    with open(os.path.join(bin_dir, "fake_episode.py"), "w") as f:
        f.write(FAKE)
    with open(os.path.join(bin_dir, "agentvm"), "w") as f:
        f.write(f"#!/bin/sh\nexec {sys.executable} {os.path.join(bin_dir, 'fake_episode.py')} \"$@\"\n")
    os.chmod(os.path.join(bin_dir, "agentvm"), 0o755)
    serve = Serve(os.path.join(bin_dir, "agentvm-serve"), "--listen", f"unix:{SOCKET}", "--pool", "default=0",
                  "--fusion-fetch-max", str(FETCH_MAX), "--fusion-output-max", str(OUTPUT_MAX),
                  log_path=os.path.join(TMP, "serve.log"))
    failed = 0
    try:
        serve.wait_listening(lambda: UnixConnection(SOCKET))
        for case in (fetch_refusals, fetch_past_the_cap, cells_share_the_output_cap, create_client_gone,
                     fork_client_gone, forwarded_ops):
            failed += not run_case(case.__name__, case)
        code = serve.stop()
        if code != 0:
            print(f"FAIL serve_exit: {code}")
            failed += 1
    finally:
        serve.stop()
        if failed:
            print(serve.log()[-4000:], file=sys.stderr)
        shutil.rmtree(TMP, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
