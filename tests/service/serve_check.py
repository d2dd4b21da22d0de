#!/usr/bin/env python3
"""agentvm serve with real sandboxes: the pool, calls, files, timeouts, failures, metrics and
drain (docs/api.md).

usage: serve_check.py AGENTVM_SERVE_BINARY [CASE...]
Prints "ok <case>: <what was seen>" or "FAIL <case>: <why>" per case; exits non-zero if any
failed. Runs where a real guest boots (tests/testhost/run). The cases share one serve with a
pool of 3, in order; the drain and kill -9 cases start serves of their own.
"""
import base64
import hashlib
import http.client
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "vm"))
from checks import expect, rises, run_case  # noqa: E402
from serve_client import Serve, UnixConnection, call, json_error  # noqa: E402
import guest_egress_case  # noqa: E402
import guest_ports_case  # noqa: E402
import vm_users_case  # noqa: E402

SERVE = sys.argv[1]
TMP = tempfile.mkdtemp(prefix="agentvm-serve-vm-")
SOCKET = os.path.join(TMP, "serve.sock")
POOL = 3
MAX_SANDBOXES = 8
STATE = {"creates": {"warm": 0, "cold": 0}, "calls": 0}


def connect(path=SOCKET, timeout=600):
    return UnixConnection(path, timeout=timeout)


def request(method, path, body=None, headers=None, sock=SOCKET):
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", **(headers or {})}
    return call(connect(sock), method, path, body, headers)


def ok_json(method, path, body=None, expected=200, sock=SOCKET):
    status, _, data = request(method, path, body, sock=sock)
    expect(status == expected, f"{method} {path}: {status} {data[:2000]!r}")
    return json.loads(data)


def create(sock=SOCKET, **body):
    sandbox = ok_json("POST", "/v1/sandboxes", body, expected=201, sock=sock)
    if sock == SOCKET:
        STATE["creates"][sandbox["start"]] += 1
    return sandbox


def delete(sandbox_id, sock=SOCKET):
    return ok_json("DELETE", f"/v1/sandboxes/{sandbox_id}", sock=sock)


def exec_(sandbox_id, argv, sock=SOCKET, **extra):
    return ok_json("POST", f"/v1/sandboxes/{sandbox_id}/exec", {"argv": argv, **extra}, sock=sock)


def shell(sandbox_id, cmd, **extra):
    return ok_json("POST", f"/v1/sandboxes/{sandbox_id}/shell", {"cmd": cmd, **extra})


def text(answer, stream):
    if stream in answer:
        return answer[stream]
    return base64.b64decode(answer[stream + "_b64"]).decode(errors="replace")


def metrics(sock=SOCKET):
    """Parses the Prometheus text format: {(name, frozenset(labels)): value}."""
    status, headers, data = request("GET", "/metrics", sock=sock)
    expect(status == 200 and headers.get("Content-Type", "").startswith("text/plain"), f"metrics: {status} {headers}")
    samples = {}
    families = set()
    for line in data.decode().splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            expect(kind in ("counter", "gauge", "histogram"), f"type line {line!r}")
            families.add(name)
            continue
        if not line or line.startswith("#"):
            continue
        series, value = line.rsplit(" ", 1)
        labels = frozenset()
        name = series
        if "{" in series:
            name, rest = series.split("{", 1)
            expect(rest.endswith("}"), f"metrics line {line!r}")
            pairs = [p for p in rest[:-1].split(",") if p]
            labels = frozenset(tuple(p.split("=", 1)) for p in pairs)
        base = name
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix) and name[: -len(suffix)] in families:
                base = name[: -len(suffix)]
        expect(base in families, f"{name} has no # TYPE line")
        samples[(name, labels)] = float(value)
    return samples


def metric(samples, name, **labels):
    key = (name, frozenset((k, f'"{v}"') for k, v in labels.items()))
    expect(key in samples, f"no sample {name} {labels}")
    return samples[key]


def wait_pool_ready(count, sock=SOCKET, within=600):
    deadline = time.monotonic() + within
    while True:
        ready = metric(metrics(sock), "agentvm_pool_ready", pool="default")
        if ready >= count:
            return
        expect(time.monotonic() < deadline, f"the pool has {ready} of {count} ready after {within} s")
        time.sleep(0.5)


def episode_pids():
    """pid -> cmdline of every agentvm process running here (episodes and their VMMs)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == b"agentvm":
            found[int(entry)] = b" ".join(argv)
    return found


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def cpu_weights(episode):
    """cpu.weight of the cgroup of each VMM of an episode (cgroup v2), or None without v2."""
    if not os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        return None
    weights = []
    for vmm in children(episode):
        with open(f"/proc/{vmm}/cgroup") as f:
            group = next(line[3:].strip() for line in f if line.startswith("0::"))
        with open(f"/sys/fs/cgroup{group}/cpu.weight") as f:
            weights.append(int(f.read()))
    return weights


def wait_no_agentvm(within=30):
    deadline = time.monotonic() + within
    while episode_pids():
        expect(time.monotonic() < deadline, f"agentvm processes left: {episode_pids()}")
        time.sleep(0.2)


def pool_warm_and_cold():
    wait_pool_ready(POOL)
    results = [None] * 5
    errors = []

    def one(i):
        try:
            results[i] = create(metadata={"n": str(i)})
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expect(not errors, f"creates failed: {errors}")
    starts = sorted(r["start"] for r in results)
    expect(starts == ["cold", "cold", "warm", "warm", "warm"], f"starts: {starts}")
    expect(all(r["restored"] for r in results), "a sandbox booted instead of restoring")
    expect(len({r["id"] for r in results}) == 5, "ids repeat")
    expect(sorted(r["metadata"]["n"] for r in results) == [str(i) for i in range(5)], "metadata lost")
    listed = ok_json("GET", "/v1/sandboxes")["sandboxes"]
    expect({s["id"] for s in listed} >= {r["id"] for r in results}, "a created sandbox is not listed")
    # Refill yields to demand: the pool's VMs run at a low CPU weight, handed-out ones at the default.
    weights = [cpu_weights(r["pid"]) for r in results]
    expect(all(w is None or w == [100] for w in weights), f"handed-out VMs' cpu.weight: {weights}")
    assigned = {r["pid"] for r in results}
    wait_pool_ready(POOL)
    pool_weights = [cpu_weights(pid) for pid in children(STATE["serve_pid"]) if pid not in assigned]
    expect(len(pool_weights) >= POOL and all(w is None or w == [10] for w in pool_weights),
           f"the pool's VMs' cpu.weight: {pool_weights}")
    warm_ms = sorted(r["create_ms"] for r in results if r["start"] == "warm")
    cold_ms = sorted(r["create_ms"] for r in results if r["start"] == "cold")
    for r in results:
        delete(r["id"])
    return (f"3 warm ({warm_ms} ms) and 2 cold ({cold_ms} ms), all restored, listed, deleted; cpu.weight "
            f"{weights[0]} handed out, {pool_weights[0]} in the pool")


def state_within_not_across():
    a = create(env={"GREETING": "hello a"})
    b = create()
    shell(a["id"], "cd /tmp && export X=42 && echo kept > /tmp/mark")
    r = shell(a["id"], "echo $PWD $X $GREETING; cat /tmp/mark")
    expect(text(r, "stdout") == "/tmp 42 hello a\nkept\n", f"shell state in a: {r}")
    r = exec_(a["id"], ["sh", "-c", "echo $GREETING"])
    expect(text(r, "stdout") == "hello a\n", f"sandbox env in exec: {r}")
    r = exec_(a["id"], ["sh", "-c", "echo $GREETING"], env={"GREETING": "call's own"})
    expect(text(r, "stdout") == "call's own\n", f"call env over sandbox env: {r}")
    r = shell(b["id"], "echo \"$X|$GREETING\"; cat /tmp/mark 2>&1 || true")
    expect(text(r, "stdout").startswith("|\n") and "No such file" in text(r, "stdout"), f"b sees a's state: {r}")
    r = exec_(b["id"], ["sh", "-c", "exit 3"])
    expect(r["exit_code"] == 3 and r["signal"] is None and r["timed_out"] is False, f"exit code: {r}")
    STATE["calls"] += 6
    history = delete(a["id"])["history"]
    calls = history["calls"]
    expect([c["request"]["op"] for c in calls] == ["shell", "shell", "exec", "exec"], f"history ops: {calls}")
    expect(calls[1]["result"]["stdout"] == "/tmp 42 hello a\nkept\n", f"history output: {calls[1]}")
    expect(calls[2]["request"]["argv"] == ["sh", "-c", "echo $GREETING"], f"history request: {calls[2]}")
    delete(b["id"])
    status, _, data = request("GET", f"/v1/sandboxes/{a['id']}")
    expect(status == 404 and b"has ended (deleted)" in data, f"deleted sandbox: {status} {data!r}")
    return "cwd, variables, env and files kept in one sandbox, none seen in another; history returned on delete"


def big_file_both_ways():
    s = create()
    data = os.urandom(64 << 20)
    digest = hashlib.sha256(data).hexdigest()
    conn = connect()
    status, _, body = call(conn, "PUT", f"/v1/sandboxes/{s['id']}/files?path=/tmp/big.bin&mode=0600", data)
    expect(status == 200 and json.loads(body)["bytes"] == len(data), f"upload: {status} {body!r}")
    r = exec_(s["id"], ["sh", "-c", "sha256sum /tmp/big.bin; stat -c %a /tmp/big.bin"])
    expect(text(r, "stdout").split() == [digest, "/tmp/big.bin", "600"], f"in the guest: {r}")
    status, headers, body = call(connect(), "GET", f"/v1/sandboxes/{s['id']}/files?path=/tmp/big.bin")
    expect(status == 200 and hashlib.sha256(body).hexdigest() == digest, f"download: {status}, {len(body)} bytes")
    status, _, body = call(connect(), "GET", f"/v1/sandboxes/{s['id']}/files?path=/nope")
    expect(status == 422 and json_error(body) == "not_found", f"missing file: {status} {body!r}")
    status, _, body = call(connect(), "PUT", f"/v1/sandboxes/{s['id']}/files?path=/nodir/x", b"x")
    expect(status == 422 and json_error(body) == "not_found", f"upload to a missing dir: {status} {body!r}")
    status, _, body = call(connect(), "PUT", f"/v1/sandboxes/{s['id']}/files?path=/tmp/empty", b"")
    r = exec_(s["id"], ["stat", "-c", "%s", "/tmp/empty"])
    expect(status == 200 and text(r, "stdout") == "0\n", f"empty upload: {status} {body!r} {r}")
    STATE["calls"] += 2
    delete(s["id"])
    return f"64 MiB up and down, sha256 {digest[:16]}…, mode 0600; missing file and dir 422; empty file"


def streaming():
    s = create()
    conn = connect()
    body = json.dumps({"argv": ["sh", "-c", "for i in 1 2 3; do echo line $i; sleep 0.2; done; echo err >&2"],
                       "stream": True}).encode()
    conn.request("POST", f"/v1/sandboxes/{s['id']}/exec", body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    expect(r.status == 200 and r.getheader("Content-Type") == "application/x-ndjson", f"stream: {r.status}")
    lines = [json.loads(line) for line in r.read().decode().splitlines()]
    events = [line for line in lines if "event" in line]
    final = lines[-1]
    out = "".join(text(e, "data") for e in events if e["event"] == "stdout")
    err = "".join(text(e, "data") for e in events if e["event"] == "stderr")
    expect(out == "line 1\nline 2\nline 3\n" and err == "err\n", f"events: {events}")
    expect("event" not in final and final["exit_code"] == 0 and "stdout" not in final, f"final line: {final}")
    expect(len([e for e in events if e["event"] == "stdout"]) >= 2, f"output came in one piece: {events}")
    STATE["calls"] += 1
    delete(s["id"])
    return f"{len(events)} events as NDJSON, then the result without output"


def timeouts():
    a = create(timeout=3)
    b = create(idle_timeout=2, timeout=600)
    exec_(b["id"], ["true"])
    STATE["calls"] += 1
    c = create(timeout=2)
    extended = ok_json("POST", f"/v1/sandboxes/{c['id']}/timeout", {"timeout": 30})
    expect(extended["expires_at"] > c["expires_at"] + 20, f"timeout not extended: {extended}")
    time.sleep(5)
    for sandbox, why in ((a, "timeout"), (b, "idle_timeout")):
        status, _, data = request("GET", f"/v1/sandboxes/{sandbox['id']}")
        expect(status == 404 and f"has ended ({why})".encode() in data, f"{why}: {status} {data!r}")
    expect(ok_json("GET", f"/v1/sandboxes/{c['id']}")["state"] == "running", "the extended sandbox ended")
    delete(c["id"])
    return "lifetime 3 s and idle 2 s ended their sandboxes (404 names why); an extended one lives on"


def vm_killed():
    s = create()
    wait_pool_ready(POOL)
    info = ok_json("GET", f"/v1/sandboxes/{s['id']}")
    vmms = children(info["pid"])
    expect(vmms, f"episode {info['pid']} has no VMM child")
    result = {}

    def long_call():
        result["r"] = request("POST", f"/v1/sandboxes/{s['id']}/exec", {"argv": ["sleep", "60"]})

    t = threading.Thread(target=long_call)
    t.start()
    time.sleep(2)
    for pid in vmms:
        os.kill(pid, signal.SIGKILL)
    t.join(120)
    status, _, data = result["r"]
    expect(status == 502 and json_error(data) == "vm_died", f"pending call: {status} {data!r}")
    status, _, data = request("GET", f"/v1/sandboxes/{s['id']}")
    expect(status == 404 and b"vm_died" in data, f"dead sandbox: {status} {data!r}")
    listed = [x["id"] for x in ok_json("GET", "/v1/sandboxes")["sandboxes"]]
    expect(s["id"] not in listed, "the dead sandbox is still listed")
    wait_pool_ready(POOL)
    STATE["vm_died"] = 1
    return "the pending call failed with vm_died (502), the sandbox is gone, the pool refilled"


def put_refused_at_headers(path, body):
    """A PUT whose body is sent only if serve has not answered its headers within 2 s (serve
    refuses an upload before its body and then closes the connection, so a client that sent the
    body regardless could see a broken pipe instead of the answer). Returns (status, body)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(60)
        sock.connect(SOCKET)
        sock.sendall(f"PUT {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode())
        if not select.select([sock], [], [], 2)[0]:
            sock.sendall(body)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, response.read()


def errors():
    cases = []

    def check(method, path, body, status, code, headers=None):
        got, hdrs, data = request(method, path, body, headers)
        expect(got == status and json_error(data) == code, f"{method} {path}: {got} {data!r}")
        cases.append(f"{status} {code}")
        return hdrs

    check("POST", "/v1/sandboxes", b"{not json", 400, "bad_json", {"Content-Type": "application/json"})
    check("POST", "/v1/sandboxes", {"timeout": -1}, 400, "bad_field")
    check("POST", "/v1/sandboxes", {"pool": "nope"}, 404, "unknown_pool")
    check("GET", "/v1/sandboxes/sb-0000000000000000", None, 404, "not_found")
    check("PUT", "/v1/sandboxes", None, 405, "method_not_allowed")
    s = create()
    check("POST", f"/v1/sandboxes/{s['id']}/exec", {"argv": []}, 400, "bad_field")
    check("POST", f"/v1/sandboxes/{s['id']}/exec", {"argv": ["x"], "id": 1}, 400, "bad_field")
    check("POST", f"/v1/sandboxes/{s['id']}/exec", {"argv": ["/no/such"]}, 422, "not_found")
    conn = connect()
    conn.putrequest("POST", f"/v1/sandboxes/{s['id']}/exec")
    conn.putheader("Content-Length", str(2 << 20))
    conn.endheaders()
    r = conn.getresponse()
    expect(r.status == 413 and json_error(r.read()) == "body_too_large", f"2 MiB body: {r.status}")
    cases.append("413 body_too_large")
    check("GET", f"/v1/sandboxes/{s['id']}/files", None, 400, "missing_field")
    # An upload whose body has not all arrived holds its path: a second one is refused.
    slow = connect()
    slow.putrequest("PUT", f"/v1/sandboxes/{s['id']}/files?path=/tmp/slow")
    slow.putheader("Content-Length", "10")
    slow.endheaders()
    slow.send(b"12345")
    deadline = time.monotonic() + 60
    while True:
        got, data = put_refused_at_headers(f"/v1/sandboxes/{s['id']}/files?path=/tmp/slow", b"other")
        if got == 409 or time.monotonic() > deadline:
            break
        time.sleep(0.1)  # the first upload's headers may not have been served yet
    expect(got == 409 and json_error(data) == "upload_in_progress", f"second upload: {got} {data!r}")
    cases.append("409 upload_in_progress")
    slow.send(b"67890")
    r = slow.getresponse()
    expect(r.status == 200 and json.loads(r.read())["bytes"] == 10, f"the first upload: {r.status}")
    r = exec_(s["id"], ["cat", "/tmp/slow"])
    expect(text(r, "stdout") == "1234567890", f"uploaded: {r}")
    STATE["calls"] += 1
    r = exec_(s["id"], ["sh", "-c", "sleep 10"], timeout=1)
    expect(r["timed_out"] is True, f"timeout: {r}")
    STATE["calls"] += 2  # the call answered not_found counts as a call too
    STATE["timeouts"] = 1
    # At capacity: fill serve up to --max-sandboxes, then one more.
    held = [s]
    while True:
        status, headers, data = request("POST", "/v1/sandboxes", {})
        if status != 201:
            break
        held.append(json.loads(data))
        STATE["creates"][held[-1]["start"]] += 1
        expect(len(held) <= MAX_SANDBOXES, f"{len(held)} sandboxes created past --max-sandboxes")
    expect(status == 429 and json_error(data) == "at_capacity" and headers.get("Retry-After") == "1",
           f"at capacity: {status} {headers} {data!r}")
    cases.append("429 at_capacity")
    STATE["refused"] = 1
    for x in held:
        delete(x["id"])
    return ", ".join(cases)


def run_code():
    def run(**body):
        # Not SandboxFusion's 10 s default: under emulation on a loaded host a fresh sandbox's
        # python3 took more than 10 s to start.
        body.setdefault("run_timeout", 60)
        r = ok_json("POST", "/run_code", body)
        expect(set(r) == {"status", "message", "compile_result", "run_result", "executor_pod_name", "files"},
               f"fields: {sorted(r)}")
        if r["executor_pod_name"]:
            STATE["run_code"] = STATE.get("run_code", 0) + 1
        return r

    r = run(code="import sys\nprint('hi', sys.stdin.read())", language="python", stdin="there")
    expect(r["status"] == "Success" and r["run_result"]["status"] == "Finished"
           and r["run_result"]["return_code"] == 0 and r["run_result"]["stdout"] == "hi there\n"
           and r["compile_result"] is None and r["run_result"]["execution_time"] >= 0, f"success: {r}")
    r = run(code="import sys\nprint('bad', file=sys.stderr)\nsys.exit(3)", language="python")
    expect(r["status"] == "Failed" and r["run_result"]["return_code"] == 3
           and r["run_result"]["stderr"] == "bad\n", f"failure: {r}")
    # 15 s: under emulation on a loaded host, python3's start in a fresh sandbox took more than 5.
    r = run(code="import time\nprint('started', flush=True)\ntime.sleep(60)", language="python", run_timeout=15)
    expect(r["status"] == "Failed" and r["run_result"]["status"] == "TimeLimitExceeded"
           and r["run_result"]["stdout"] == "started\n", f"timeout: {r}")
    files = {"data/in.txt": base64.b64encode(b"41").decode()}
    r = run(code="n = int(open('data/in.txt').read())\nopen('out.bin', 'wb').write(bytes([n, 0, 255]))",
            language="python", files=files, fetch_files=["out.bin", "missing.txt"])
    expect(r["status"] == "Success" and r["files"] == {"out.bin": base64.b64encode(bytes([41, 0, 255])).decode()},
           f"files: {r}")
    r = run(code="echo $((6*7)); exit 1", language="bash")
    expect(r["status"] == "Failed" and r["run_result"]["stdout"] == "42\n", f"bash: {r}")
    r = run(code="fn main() {}", language="rust")
    expect(r["status"] == "SandboxError" and '"rust"' in r["message"] and r["run_result"] is None,
           f"unknown language: {r}")
    status, _, data = request("POST", "/run_code", {"language": "python"})
    expect(status == 400 and json_error(data) == "bad_field", f"no code: {status} {data!r}")
    listed = ok_json("GET", "/v1/sandboxes")["sandboxes"]
    expect(not listed, f"run_code left sandboxes: {listed}")
    STATE["timeouts"] = STATE.get("timeouts", 0) + 1
    return "python success with stdin, failure, TimeLimitExceeded, files in and fetched out, bash, " \
           "rust a SandboxError naming it, every sandbox deleted"


def code_cancel_file_info():
    s = create()
    sid = s["id"]
    first = ok_json("POST", f"/v1/sandboxes/{sid}/run_code", {"code": "x = 21\nx * 2"})
    expect(first["result"] == "42" and first["exception"] is None and first["state_lost"] is False
           and first["timed_out"] is False, f"run_code: {first}")
    status, headers, data = request("POST", f"/v1/sandboxes/{sid}/run_code", {"code": "x / 0"})
    raised = json.loads(data)
    expect(status == 200 and raised["exception"]["type"] == "ZeroDivisionError", f"exception: {status} {data!r}")
    seq = headers.get("X-Agentvm-Call")
    history = ok_json("GET", f"/v1/sandboxes/{sid}/history")["calls"]
    expect(seq is not None and history[int(seq) - 1]["request"] == {"op": "run_code", "code": "x / 0"},
           f"X-Agentvm-Call {seq} vs history {history}")
    expect(ok_json("POST", f"/v1/sandboxes/{sid}/run_code", {"code": "x"})["result"] == "21", "state lost")
    STATE["calls"] += 3

    result = {}

    def long_call():
        result["r"] = request("POST", f"/v1/sandboxes/{sid}/exec", {"argv": ["sleep", "60"], "timeout": 600})

    caller = threading.Thread(target=long_call)
    caller.start()
    running = None
    for _ in range(600):
        calls = ok_json("GET", f"/v1/sandboxes/{sid}/history")["calls"]
        running = next((c for c in calls if c.get("running")), None)
        if running:
            break
        time.sleep(0.05)
    expect(running is not None, "the long call never showed as running")
    time.sleep(0.5)  # let the guest start it
    cancelled = ok_json("DELETE", f"/v1/sandboxes/{sid}/calls/{running['seq']}")
    caller.join(60)
    expect(not caller.is_alive(), "the cancelled call did not answer")
    status, headers, data = result["r"]
    answer = json.loads(data)
    expect(cancelled == {"running": True} and status == 200 and answer.get("cancelled") is True
           and answer["signal"] == 9 and headers.get("X-Agentvm-Call") == str(running["seq"]),
           f"cancel: {cancelled} -> {status} {answer}")
    again = ok_json("DELETE", f"/v1/sandboxes/{sid}/calls/{running['seq']}")
    expect(again == {"running": False}, f"second cancel: {again}")
    for bad in ("999", "0", "x"):
        status, _, data = request("DELETE", f"/v1/sandboxes/{sid}/calls/{bad}")
        expect(status == 404 and json_error(data) == "not_found", f"cancel {bad}: {status} {data!r}")
    STATE["calls"] += 1

    status, _, data = request("PUT", f"/v1/sandboxes/{sid}/files?path=/tmp/info/a.txt", b"12345")
    expect(status == 422, f"upload into a missing directory: {status} {data!r}")
    exec_(sid, ["mkdir", "-p", "/tmp/info/sub"])
    STATE["calls"] += 1
    status, _, data = request("PUT", f"/v1/sandboxes/{sid}/files?path=/tmp/info/a.txt", b"12345")
    expect(status == 200, f"upload: {status} {data!r}")
    info = ok_json("GET", f"/v1/sandboxes/{sid}/files/stat?path=/tmp/info/a.txt")
    expect(info["ok"] is True and info["type"] == "file" and info["size"] == 5 and info["mtime"] > 0,
           f"stat: {info}")
    listed = ok_json("GET", f"/v1/sandboxes/{sid}/files/list?path=/tmp/info")
    expect([(e["name"], e["type"]) for e in listed["entries"]] == [("a.txt", "file"), ("sub", "dir")]
           and listed["truncated"] is False, f"list: {listed}")
    one = ok_json("GET", f"/v1/sandboxes/{sid}/files/list?path=/tmp/info&max_entries=1")
    expect(len(one["entries"]) == 1 and one["truncated"] is True, f"list max_entries=1: {one}")
    deep = ok_json("GET", f"/v1/sandboxes/{sid}/files/list?path=/tmp&depth=2")
    expect({"info/a.txt", "info/sub"} <= {e["name"] for e in deep["entries"]}, f"list depth=2: {deep}")
    for path, code, error in (("files/stat?path=/nope", 422, "not_found"), ("files/list?path=/nope", 422, "not_found"),
                              ("files/list?path=/tmp&max_entries=0", 400, "bad_field"),
                              ("files/list?path=/tmp&depth=0", 400, "bad_field"),
                              ("files/list?path=/tmp&depth=65", 400, "bad_field"),
                              ("files/stat", 400, "missing_field")):
        status, _, data = request("GET", f"/v1/sandboxes/{sid}/{path}")
        expect(status == code and json_error(data) == error, f"{path}: {status} {data!r}")
    delete(sid)
    return "run_code keeps state and answers exceptions 200, X-Agentvm-Call matches the history, " \
           "a running exec cancelled (then not running; unknown calls 404), stat and list with their errors"


def run_jupyter():
    def run(**body):
        r = ok_json("POST", "/run_jupyter", body)
        expect(set(r) == {"status", "message", "driver", "cells", "executor_pod_name", "files"}, f"fields: {sorted(r)}")
        STATE["run_code"] = STATE.get("run_code", 0) + 1
        return r

    files = {"in.txt": base64.b64encode(b"7").decode()}
    r = run(cells=["a = int(open('in.txt').read())", "a * 6", "print(a)", "import sys; sys.stderr.write('e')",
                   "open('out.txt', 'w').write(str(a))", "raise RuntimeError('boom')", "print('never')"],
            files=files, fetch_files=["out.txt"])
    cells = r["cells"]
    expect(r["status"] == "Failed" and r["driver"]["status"] == "Finished" and len(cells) == 6, f"cells: {r}")
    expect(cells[1]["display"] == [{"text/plain": "42"}] and cells[2]["stdout"] == "7\n"
           and cells[3]["stderr"] == "e" and cells[0]["display"] == [] and cells[0]["error"] == [], f"cells: {cells}")
    error = cells[5]["error"][0]
    expect(error["ename"] == "RuntimeError" and error["evalue"] == "boom" and isinstance(error["traceback"], list)
           and error["traceback"][-1] == "RuntimeError: boom\n", f"error: {error}")
    expect(r["files"] == {"out.txt": base64.b64encode(b"7").decode()}, f"files: {r['files']}")
    r = run(cells=["import time", "time.sleep(30)"], cell_timeout=2)
    expect(r["status"] == "Failed" and r["driver"]["status"] == "TimeLimitExceeded"
           and r["cells"][1]["error"][0]["ename"] == "KeyboardInterrupt", f"timeout: {r}")
    STATE["timeouts"] = STATE.get("timeouts", 0) + 1
    r = run(cells=["1 + 1"])
    expect(r["status"] == "Success" and r["cells"][0]["display"] == [{"text/plain": "2"}], f"success: {r}")
    for body, what in (({"cells": []}, "no cells"), ({"cells": ["1"], "kernel": "ruby"}, "kernel"),
                       ({"cells": [1]}, "cell type")):
        status, _, data = request("POST", "/run_jupyter", body)
        expect(status == 400 and json_error(data) == "bad_field", f"{what}: {status} {data!r}")
    listed = ok_json("GET", "/v1/sandboxes")["sandboxes"]
    expect(not listed, f"run_jupyter left sandboxes: {listed}")
    return "cells share state, display/stdout/stderr/error per cell, stop at the first error, " \
           "cell_timeout interrupts, files in and out, bad requests 400, every sandbox deleted"


def fusion_limits():
    """What /run_code and /run_jupyter bring back is bounded whatever the code under test leaves
    (serve builds each answer whole): a link to /dev/zero, a FIFO and a sparse file of 16 GiB
    among fetch_files are refused (SandboxError) before a byte is read, files together past
    --fusion-fetch-max (64 MiB) are a SandboxError, and the cells of /run_jupyter keep at most
    --fusion-output-max (16 MiB) of each stream together."""
    def run(path, **body):
        r = ok_json("POST", path, body)
        STATE["run_code"] = STATE.get("run_code", 0) + 1
        return r

    seen = []
    for setup, what in (("os.symlink('/dev/zero', 'out.bin')", "a link to /dev/zero"),
                        ("os.mkfifo('out.bin')", "a FIFO"),
                        ("open('out.bin', 'wb').truncate(16 << 30)", "a sparse file of 16 GiB")):
        started = time.monotonic()
        r = run("/run_code", code=f"import os\n{setup}", language="python", run_timeout=60,
                fetch_files=["out.bin"])
        took = time.monotonic() - started
        expect(r["status"] == "SandboxError" and "out.bin" in r["message"] and r["files"] == {}
               and r["run_result"]["return_code"] == 0, f"{what}: {r}")
        seen.append(f"{what} refused in {took:.1f} s")
    r = run("/run_code", code="head -c 41943040 /dev/urandom > a; cp a b", language="bash", run_timeout=60,
            fetch_files=["a", "b"])
    expect(r["status"] == "SandboxError" and "--fusion-fetch-max" in r["message"]
           and r["message"].startswith("fetching b:"),
           f"two files of 40 MiB: {r['status']} {r['message']!r}")
    seen.append("two files of 40 MiB past the 64 MiB cap a SandboxError")
    r = run("/run_jupyter", cells=["print('x' * (10 << 20), end='')"] * 3, total_timeout=300)
    kept = [len(cell["stdout"]) for cell in r["cells"]]
    expect(r["status"] == "Success" and kept == [10 << 20, 6 << 20, 0], f"cells' output: {r['status']} {kept}")
    seen.append("3 cells of 10 MiB kept 10, 6 and 0 MiB")
    health = ok_json("GET", "/healthz")
    listed = ok_json("GET", "/v1/sandboxes")["sandboxes"]
    expect(health["status"] == "ok" and not listed, f"after: {health} {listed}")
    return ", ".join(seen) + "; serve well, every sandbox deleted"


def metrics_match():
    wait_pool_ready(POOL)
    m = metrics()
    warm = metric(m, "agentvm_creates_total", pool="default", path="warm")
    cold = metric(m, "agentvm_creates_total", pool="default", path="cold")
    expect(warm + cold == STATE["creates"]["warm"] + STATE["creates"]["cold"] + STATE.get("run_code", 0),
           f"creates: {warm} warm + {cold} cold, the test made {STATE['creates']}")
    expect(cold >= 2, f"cold creates {cold}")
    expect(metric(m, "agentvm_pool_target", pool="default") == POOL, "pool target")
    expect(metric(m, "agentvm_sandboxes", state="warm") == POOL, "warm gauge")
    expect(metric(m, "agentvm_failures_total", kind="vm_died") == STATE.get("vm_died", 0), "vm_died count")
    expect(metric(m, "agentvm_failures_total", kind="timeout") == STATE.get("timeouts", 0), "timeout count")
    expect(metric(m, "agentvm_failures_total", kind="lifetime") == 1, "lifetime expiries")
    expect(metric(m, "agentvm_failures_total", kind="idle") == 1, "idle expiries")
    expect(metric(m, "agentvm_create_refusals_total", code="at_capacity") == STATE.get("refused", 0), "refusals")
    creates = metric(m, "agentvm_create_seconds_count")
    expect(creates == warm + cold, f"create histogram count {creates}")
    expect(metric(m, "agentvm_create_seconds_bucket", le="+Inf") == creates, "histogram +Inf bucket")
    calls = metric(m, "agentvm_call_seconds_count")
    expect(calls >= STATE["calls"], f"call histogram count {calls} < {STATE['calls']}")
    return f"{int(warm)} warm + {int(cold)} cold creates, {int(calls)} calls, failures and refusals as done"


def drain_with_call_in_flight():
    sock = os.path.join(TMP, "drain.sock")
    serve = Serve(SERVE, "--listen", f"unix:{sock}", "--pool", "default=1", "--mem-reserve", "64",
                  "--drain-grace", "60")
    try:
        serve.wait_listening(lambda: connect(sock))
        s = create(sock=sock)
        result = {}

        def long_call():
            result["r"] = exec_(s["id"], ["sh", "-c", "sleep 3; echo finished"], sock=sock)

        t = threading.Thread(target=long_call)
        t.start()
        time.sleep(1)
        serve.proc.send_signal(signal.SIGTERM)
        t.join(120)
        code = serve.proc.wait(120)
        expect(code == 0, f"serve exit {code}: {serve.log()[-2000:]}")
        expect(text(result.get("r", {}), "stdout") == "finished\n", f"the call in flight: {result}")
        wait_no_agentvm()
    finally:
        serve.stop()
    return "the running call finished, serve exited 0, no VM left"


def kill9_leaves_nothing():
    sock = os.path.join(TMP, "kill.sock")
    before = set(os.listdir(os.environ.get("TMPDIR", "/tmp")))
    serve = Serve(SERVE, "--listen", f"unix:{sock}", "--pool", "default=2", "--mem-reserve", "64")
    try:
        serve.wait_listening(lambda: connect(sock))
        wait_pool_ready(2, sock=sock)
        s = create(sock=sock)
        exec_(s["id"], ["true"], sock=sock)
        expect(len(episode_pids()) >= 6, f"agentvm processes: {episode_pids()}")
        serve.proc.kill()
        serve.proc.wait()
        wait_no_agentvm()
    finally:
        serve.stop()
    left = set(os.listdir(os.environ.get("TMPDIR", "/tmp"))) - before
    expect(not [f for f in left if "agentvm" in f and not f.startswith("agentvm-serve")], f"temp files left: {left}")
    serve = Serve(SERVE, "--listen", f"unix:{sock}", "--pool", "default=1", "--mem-reserve", "64")
    try:
        serve.wait_listening(lambda: connect(sock))
        s = create(sock=sock)
        r = exec_(s["id"], ["echo", "again"], sock=sock)
        expect(text(r, "stdout") == "again\n", f"restarted serve: {r}")
    finally:
        expect(serve.stop() == 0, "restarted serve did not stop cleanly")
    wait_no_agentvm()
    return "kill -9: every episode and VMM died with serve, no temp file left; a restarted serve serves"


def serve_footprint(pid, state_dir=None):
    """What a leak would grow: serve's RSS (KiB) and open fds, agentvm processes, VM cgroups,
    agentvm temp files, and the VMs' snapshot outboxes in its state directory."""
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    parent = "/sys/fs/cgroup/agentvm"
    cgroups = os.listdir(parent) if os.path.isdir(parent) else []
    tmp = os.environ.get("TMPDIR", "/tmp")
    return {"rss_kib": rss, "fds": len(os.listdir(f"/proc/{pid}/fd")), "processes": len(episode_pids()),
            "cgroups": len([d for d in cgroups if d.startswith("vm-")]),
            "temp_files": len([f for f in os.listdir(tmp) if f.startswith("agentvm") and "serve" not in f]),
            "outboxes": len(os.listdir(os.path.join(state_dir, "outbox"))) if state_dir else 0}


def settled_footprint(serve, pool):
    """The footprint once only the pool's VMs run (stopped VMs have ended)."""
    deadline = time.monotonic() + 60
    while True:
        wait_pool_ready(pool, sock=serve.sock)
        m = metrics(serve.sock)
        busy = metric(m, "agentvm_sandboxes", state="stopping") + metric(m, "agentvm_sandboxes", state="running")
        if busy == 0:
            footprint = serve_footprint(serve.proc.pid, serve.state_dir)
            if footprint["processes"] == 2 * pool:  # an episode and its VMM each
                return footprint
        expect(time.monotonic() < deadline, f"VMs did not settle: {serve_footprint(serve.proc.pid)}")
        time.sleep(0.2)


def soak_no_leaks():
    # 1000 on hardware KVM; emulated, each VM start takes ~1 s, so fewer (any per-create leak
    # still shows as at least that many).
    cycles = 120 if os.environ.get("AGENTVM_IN_TESTHOST") else 1000
    warmup = 20
    sock = os.path.join(TMP, "soak.sock")
    serve = Serve(SERVE, "--listen", f"unix:{sock}", "--pool", "default=2", "--mem-reserve", "64")
    serve.sock = sock
    try:
        serve.wait_listening(lambda: connect(sock))
        start = time.monotonic()
        for i in range(warmup + cycles):
            if i == warmup:
                before = settled_footprint(serve, 2)
            s = create(sock=sock)
            if i % 10 == 0:
                r = exec_(s["id"], ["echo", str(i)], sock=sock)
                expect(text(r, "stdout") == f"{i}\n", f"cycle {i}: {r}")
            delete(s["id"], sock=sock)
        after = settled_footprint(serve, 2)
        elapsed = time.monotonic() - start
        for key in ("fds", "processes", "temp_files", "outboxes"):
            expect(after[key] == before[key], f"{key} changed over {cycles} creates: {before} -> {after}")
        # Fewer is no leak: groups that supervisors killed earlier left are removed as VMs start.
        expect(after["cgroups"] <= before["cgroups"], f"cgroups grew over {cycles} creates: {before} -> {after}")
        growth = after["rss_kib"] - before["rss_kib"]
        expect(growth <= 2048, f"serve's RSS grew {growth} KiB over {cycles} creates: {before} -> {after}")
    finally:
        code = serve.stop()
    expect(code == 0, f"serve exit {code}")
    return (f"{cycles} creates/deletes in {elapsed:.0f} s: fds {after['fds']}, processes {after['processes']}, "
            f"cgroups {after['cgroups']}, temp files {after['temp_files']}, outboxes {after['outboxes']} as before; RSS "
            f"{before['rss_kib']} -> {after['rss_kib']} KiB")


def memory_reserve_refuses():
    sock = os.path.join(TMP, "reserve.sock")
    serve = Serve(SERVE, "--listen", f"unix:{sock}", "--pool", "default=1", "--mem-reserve", "100000000")
    try:
        serve.wait_listening(lambda: connect(sock))
        status, headers, data = request("POST", "/v1/sandboxes", {}, sock=sock)
        expect(status == 503 and json_error(data) == "memory_reserve" and headers.get("Retry-After") == "5",
               f"create under the reserve: {status} {headers} {data!r}")
        m = metrics(sock)
        expect(metric(m, "agentvm_sandboxes", state="starting") + metric(m, "agentvm_sandboxes", state="warm") == 0,
               "the pool refilled into the reserve")
        expect(metric(m, "agentvm_create_refusals_total", code="memory_reserve") == 1, "refusal not counted")
    finally:
        code = serve.stop()
    expect(code == 0, f"serve exit {code}")
    return "503 memory_reserve with Retry-After 5, no VM started, the refusal counted"


def first_exec_number(*flags):
    """N of the cgroup (/tool-calls/exec-N) the first exec of a sandbox runs in: the guest agent
    numbers its execs, so one more means one call ran before."""
    sock = os.path.join(TMP, "warmup.sock")
    serve = Serve(SERVE, "--listen", f"unix:{sock}", "--pool", "default=1", "--mem-reserve", "64", *flags)
    try:
        serve.wait_listening(lambda: connect(sock))
        wait_pool_ready(1, sock=sock)
        s = create(sock=sock)
        expect(s["start"] == "warm", f"created: {s}")
        r = exec_(s["id"], ["cat", "/proc/self/cgroup"], sock=sock)
        history = ok_json("GET", f"/v1/sandboxes/{s['id']}/history", sock=sock)["calls"]
        expect(len(history) == 1 and history[0]["request"]["argv"][0] == "cat", f"history: {history}")
    finally:
        code = serve.stop()
    expect(code == 0, f"serve exit {code}")
    group = text(r, "stdout").strip().rsplit("/", 1)[-1]
    expect(group.startswith("exec-"), f"cgroup {text(r, 'stdout')!r}")
    return int(group[len("exec-"):])


def pool_warmup():
    plain = first_exec_number()
    primed = first_exec_number("--pool-warmup")
    expect(primed == plain + 1, f"first exec is exec-{primed} with --pool-warmup, exec-{plain} without")
    return f"exec-{plain} first without, exec-{primed} with: one warm-up call ran, kept out of the history"


def plan_calibrates():
    agentvm = os.path.join(os.path.dirname(SERVE), "agentvm")
    r = subprocess.run([agentvm, "--log-level", "warn", "plan", "--gpus", "8", "--rollouts-per-gpu", "4",
                        "--tool-steps", "5", "--step-time", "2", "--episode-length", "100",
                        "--calibration-runs", "1", "--calls", "3", "--json"],
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=600)
    expect(r.returncode == 0, f"plan: exit {r.returncode}, {r.stderr.decode(errors='replace')[-2000:]}")
    out = json.loads(r.stdout)
    measured, plan = out["measured"], out["plan"]
    expect(measured["restored"] is True and 0 < measured["restore_s"] < 120, f"measured: {measured}")
    expect(0.5 < measured["idle_private_mib"] < 64 and 0 < measured["call_cpu_s"] < 10, f"measured: {measured}")
    expect(plan["concurrent_sandboxes"] == 32 and plan["warm_pool_burst"] == 32, f"plan: {plan}")
    expect(abs(plan["creates_per_s"] - 0.32) < 1e-9 and abs(plan["calls_per_s"] - 1.6) < 1e-9, f"plan: {plan}")
    expected_gib = 64 * measured["idle_private_mib"] / 1024
    expect(abs(plan["idle_memory_gib"] - expected_gib) < 1e-9, f"memory: {plan} vs {expected_gib}")
    cores = 1.6 * (2 + measured["call_cpu_s"]) + 0.32 * measured["restore_cpu_s"]
    expect(abs(plan["cores"] - cores) < 1e-9, f"cores: {plan} vs {cores}")
    r = subprocess.run([agentvm, "plan"], stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    expect(r.returncode == 2 and b"--gpus is required" in r.stderr, f"no --gpus: {r.returncode} {r.stderr!r}")
    return (f"calibrated: start {measured['restore_s'] * 1000:.0f} ms, {measured['idle_private_mib']:.2f} MiB idle, "
            f"{measured['call_cpu_s'] * 1000:.1f} ms CPU per call; plan arithmetic checked")


def fork_pause_resume():
    """Fork a sandbox into 3, then pause it and resume it across 5 restarts of serve."""
    sock = os.path.join(TMP, "fork.sock")
    state = os.path.join(TMP, "fork-state")

    def start():
        serve = Serve(SERVE, "--listen", f"unix:{sock}", "--pool", "default=1", "--mem-reserve", "64",
                      state_dir=state)
        serve.wait_listening(lambda: connect(sock))
        return serve

    def sh(sid, cmd):
        answer = ok_json("POST", f"/v1/sandboxes/{sid}/shell", {"cmd": cmd}, sock=sock)
        expect(answer.get("exit_code") == 0, f"{cmd}: {answer}")
        return text(answer, "stdout")

    def code(sid, source):
        return ok_json("POST", f"/v1/sandboxes/{sid}/run_code", {"code": source}, sock=sock)

    def counting(sid):
        rises(lambda: int(sh(sid, "tail -n 1 /work/counter") or 0), 30, f"{sid}: the background job stopped counting")

    def kept(sid, cycles=0):
        seen = sh(sid, "cat /work/file; pwd; echo $FORKVAR; jobs | wc -l").split()
        expect(seen == ["parent-file", "/work", "parent-var", "1"], f"{sid}: shell state {seen}")
        counting(sid)
        expect(code(sid, "x + 1").get("result") == "42", f"{sid}: the interpreter lost x")
        if cycles:
            marks = sh(sid, "cat /work/cycles").split()
            expect(marks == [str(i) for i in range(1, cycles + 1)], f"{sid}: cycle marks {marks}")

    serve = start()
    seen = []
    try:
        parent = create(sock=sock, metadata={"task": "fork"})
        pid = parent["id"]
        sh(pid, "mkdir -p /work && echo parent-file > /work/file && cd /work && export FORKVAR=parent-var")
        sh(pid, "sh -c 'i=0; while :; do i=$((i+1)); echo $i >> /work/counter; sleep 0.1; done' >/dev/null 2>&1 &")
        code(pid, "x = 41")
        status, _, data = request("POST", f"/v1/sandboxes/{pid}/fork", {"count": 0}, sock=sock)
        expect(status == 400 and json_error(data) == "bad_field", f"count 0: {status} {data!r}")
        forked = ok_json("POST", f"/v1/sandboxes/{pid}/fork", {"count": 3}, expected=201, sock=sock)["sandboxes"]
        ids = [child["id"] for child in forked]
        expect(len(set(ids)) == 3 and pid not in ids, f"children ids {ids}")
        expect(all(child["metadata"] == {"task": "fork"} for child in forked), f"children metadata: {forked}")
        for i, cid in enumerate(ids):
            kept(cid)
            sh(cid, f"echo {i} > /work/mine")
        for i, cid in enumerate(ids):
            expect(sh(cid, "cat /work/mine").strip() == str(i), f"child {cid}'s write is not its own")
            delete(cid, sock=sock)
        kept(pid)
        expect(sh(pid, "cat /work/mine 2>/dev/null || echo none").strip() == "none", "a child's write reached the parent")
        seen.append("3 children kept file, cwd, variable, counting job and interpreter and diverged")

        for cycle in range(1, 6):
            sh(pid, f"echo {cycle} >> /work/cycles")
            paused = ok_json("POST", f"/v1/sandboxes/{pid}/pause", sock=sock)
            expect(paused["state"] == "paused" and paused["disk_bytes"] > 0 and paused["id"] == pid, f"pause: {paused}")
            listed = ok_json("GET", "/v1/sandboxes", sock=sock)["sandboxes"]
            expect(any(s["id"] == pid and s["state"] == "paused" for s in listed), f"not listed as paused: {listed}")
            status, _, data = request("POST", f"/v1/sandboxes/{pid}/exec", {"argv": ["true"]}, sock=sock)
            expect(status == 409 and json_error(data) == "paused", f"a call to a paused sandbox: {status} {data!r}")
            expect(serve.stop() == 0, f"serve exit: {serve.log()[-2000:]}")
            serve = start()
            resumed = ok_json("POST", f"/v1/sandboxes/{pid}/resume", sock=sock)
            expect(resumed["id"] == pid and resumed["state"] == "running", f"resume: {resumed}")
            expect(resumed["metadata"] == {"task": "fork"}, f"resumed metadata: {resumed}")
            kept(pid, cycle)
        seen.append(f"5 pause / serve restart / resume cycles lost nothing (last pause stored {paused['disk_bytes'] >> 10} KiB)")

        status, _, data = request("POST", f"/v1/sandboxes/{pid}/resume", sock=sock)
        expect(status == 409 and json_error(data) == "not_paused", f"resume of a running sandbox: {status} {data!r}")
        slow = threading.Thread(target=lambda: sh(pid, "sleep 3"))
        slow.start()
        time.sleep(1)
        status, _, data = request("POST", f"/v1/sandboxes/{pid}/pause", sock=sock)
        slow.join(60)
        expect(status == 409 and json_error(data) == "busy", f"pause with a call running: {status} {data!r}")
        seen.append("resume of a running sandbox and pause during a call refused")
        # A sandbox whose VM died can be neither forked nor paused; the error is clean.
        doomed = create(sock=sock)
        info = ok_json("GET", f"/v1/sandboxes/{doomed['id']}", sock=sock)
        for vmm in children(info["pid"]):
            os.kill(vmm, signal.SIGKILL)
        for action, body in (("fork", {"count": 1}), ("pause", {})):
            status, _, data = request("POST", f"/v1/sandboxes/{doomed['id']}/{action}", body, sock=sock)
            expect(status in (404, 500, 502) and json_error(data) in ("not_found", "snapshot_failed", "vm_died"),
                   f"{action} of a sandbox whose VM died: {status} {data!r}")
        seen.append("fork and pause of a sandbox whose VM died refused")
        # A fork whose client went away: nobody would learn its children's ids, so they go.
        other = create(sock=sock)["id"]
        gone = connect(sock)
        gone.request("POST", f"/v1/sandboxes/{other}/fork", body=json.dumps({"count": 2}),
                     headers={"Content-Type": "application/json"})
        # Gone once the fork has started (its snapshot call is in the history), before the
        # children are ready.
        deadline = time.monotonic() + 60
        while not any(c["request"].get("op") == "snapshot"
                      for c in ok_json("GET", f"/v1/sandboxes/{other}/history", sock=sock)["calls"]):
            expect(time.monotonic() < deadline, "the fork did not start")
            time.sleep(0.02)
        answered_first = bool(select.select([gone.sock], [], [], 0)[0])
        gone.close()
        if answered_first:
            seen.append("a fork answered before its client could go away (nothing to check)")
        else:
            # The children are deleted once the fork would have been answered (all of them
            # ready); one ready before its siblings is listed meanwhile. A serve that kept them
            # would list them from then on.
            def leftover():
                return {x["id"] for x in ok_json("GET", "/v1/sandboxes", sock=sock)["sandboxes"]} - {pid, other}
            deadline = time.monotonic() + 60
            while leftover() and time.monotonic() < deadline:
                time.sleep(0.5)
            settled = time.monotonic() + 5
            while time.monotonic() < settled:
                left = leftover()
                expect(not left, f"a fork whose client went away left {left}")
                time.sleep(0.5)
            seen.append("a fork whose client went away left no children")
        # A DELETE while the sandbox resumes: answered "deleted", so it must not run on.
        ok_json("POST", f"/v1/sandboxes/{other}/pause", sock=sock)
        resumed = {}
        resumer = threading.Thread(target=lambda: resumed.update(
            r=request("POST", f"/v1/sandboxes/{other}/resume", sock=sock)))
        resumer.start()
        time.sleep(0.05)
        deleted = ok_json("DELETE", f"/v1/sandboxes/{other}", sock=sock)
        resumer.join(120)
        expect(deleted["state"] == "deleted", f"delete during resume: {deleted}")
        status, _, data = request("GET", f"/v1/sandboxes/{other}", sock=sock)
        listed = {x["id"] for x in ok_json("GET", "/v1/sandboxes", sock=sock)["sandboxes"]}
        expect(status == 404 and other not in listed,
               f"deleted while resuming, yet {status} {data!r} (the resume answered {resumed.get('r', '')!r:.300})")
        seen.append(f"a DELETE during resume held (the resume answered {resumed['r'][0]})")
        delete(pid, sock=sock)
        # Its VM ends after the answer; then its snapshot and the chain below go.
        deadline = time.monotonic() + 30
        while os.listdir(os.path.join(state, "snapshots")) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = os.listdir(os.path.join(state, "snapshots"))
        expect(not left, f"snapshots left after the last sandbox using them was deleted: {left}")
        seen.append("no snapshot left once nothing used them")
    finally:
        serve.stop()
        shutil.rmtree(state, ignore_errors=True)
    return "; ".join(seen)


# Run as root in a sandbox's guest: takes the agent's own connection to the host (pidfd_getfd)
# and speaks in its place: answers for every call id serve is likely to use, naming a path
# outside the sandbox as their snapshot, stray lines about calls nobody made, and huge lines.
FORGER = r"""
import ctypes, json, os, sys, time
target, seconds = sys.argv[1], float(sys.argv[2])
libc = ctypes.CDLL(None, use_errno=True)
SYS_pidfd_getfd = 438
agent = next(p for p in os.listdir("/proc")
             if p.isdigit() and open(f"/proc/{p}/comm").read().strip() == "agentvm-agent")
pidfd = os.pidfd_open(int(agent))
socks = []
for fd in os.listdir(f"/proc/{agent}/fd"):
    try:
        if os.readlink(f"/proc/{agent}/fd/{fd}").startswith("socket:"):
            got = libc.syscall(SYS_pidfd_getfd, pidfd, int(fd), 0)
            if got >= 0:
                socks.append(got)
    except OSError:
        pass
print(len(socks), flush=True)
while not os.path.exists("/root/go"):
    time.sleep(0.05)
time.sleep(1)
forged = "".join(json.dumps({"id": i, "snapshot": {"path": target}, "ok": True, "exit_code": 0}) + "\n"
                 for i in range(1, 200))
stray = "".join(json.dumps({"id": 10**9 + i, "event": "stdout", "data": "stray"}) + "\n" for i in range(50))
huge = json.dumps({"id": 10**12, "exit_code": 0, "stdout": "A" * (4 << 20)}) + "\n"
end = time.monotonic() + seconds
rounds = 0
while time.monotonic() < end:
    for s in socks:
        try:
            os.write(s, (forged + stray + (huge if rounds % 20 == 0 else "")).encode())
        except OSError:
            pass
    rounds += 1
    time.sleep(0.01)
"""


def state_files(state):
    """Every file under serve's state directory but the VMs' outboxes, with its digest."""
    found = {}
    for root, dirs, files in os.walk(state):
        if os.path.relpath(root, state) == ".":
            dirs[:] = [d for d in dirs if d != "outbox"]
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, state)] = hashlib.sha256(f.read()).hexdigest()
    return found


def hostile_guest():
    """A guest that answers in its agent's place, serve's snapshot calls included, while serve
    forks and pauses it: nothing outside that sandbox changes and serve serves the others."""
    sock = os.path.join(TMP, "hostile.sock")
    serve = Serve(SERVE, "--listen", f"unix:{sock}", "--pool", "default=1", "--mem-reserve", "64", log_level="info")
    state = serve.state_dir

    def sh(sid, cmd):
        answer = ok_json("POST", f"/v1/sandboxes/{sid}/shell", {"cmd": cmd}, sock=sock)
        expect(answer.get("exit_code") == 0, f"{cmd}: {answer}")
        return text(answer, "stdout")

    seen = []
    try:
        serve.wait_listening(lambda: connect(sock))
        paused = create(sock=sock)["id"]
        sh(paused, "echo paused-tenant > /root/mine")
        ok_json("POST", f"/v1/sandboxes/{paused}/pause", sock=sock)
        neighbour = create(sock=sock)["id"]
        sh(neighbour, "echo neighbour > /root/mine")
        attacker = create(sock=sock)["id"]
        before = state_files(state)
        expect(any(path.startswith("snapshots/") for path in before), f"no paused snapshot to guard: {before}")

        status, _, data = call(connect(sock), "PUT", f"/v1/sandboxes/{attacker}/files?path=/root/forge.py",
                               FORGER.encode())
        expect(status == 200, f"upload: {status} {data!r}")
        target = os.path.join(state, "snapshots", "..")
        sh(attacker, f"setsid python3 /root/forge.py {target} 60 >/root/forge.log 2>&1 </dev/null &")
        deadline = time.monotonic() + 60
        while not sh(attacker, "cat /root/forge.log").strip():
            expect(time.monotonic() < deadline, "the forger never started")
            time.sleep(0.5)
        grabbed = sh(attacker, "cat /root/forge.log").split()[0]
        expect(grabbed.isdigit() and int(grabbed) >= 1, f"the forger took no socket of the agent: {grabbed}")
        # Its answer may already be a forged one.
        request("POST", f"/v1/sandboxes/{attacker}/shell", {"cmd": "touch /root/go"}, sock=sock)
        time.sleep(3)  # its flood runs

        outcomes = []
        children = []
        for action, body in (("fork", {"count": 1}), ("fork", {"count": 1}), ("pause", {})):
            status, _, data = request("POST", f"/v1/sandboxes/{attacker}/{action}", body, sock=sock)
            outcomes.append(f"{action} {status} {json_error(data) if status >= 400 else ''}".strip())
            if status == 500:
                message = json.loads(data).get("message", "")
                expect("forged" in message, f"{action} refused, but not for the forged answer: {message}")
            if status == 201:
                children += [child["id"] for child in json.loads(data)["sandboxes"]]
            if status >= 400:
                break
        expect(any(o.startswith(("fork 500", "pause 500")) for o in outcomes),
               f"no snapshot call of serve's met a forged answer: {outcomes}")
        seen.append("forged answers to serve's snapshot calls: " + ", ".join(outcomes))
        for sid in children + [attacker]:
            request("DELETE", f"/v1/sandboxes/{sid}", sock=sock)

        # Once the attacker's VMs are gone, the state directory is as it was.
        deadline = time.monotonic() + 60
        while (after := state_files(state)) != before and time.monotonic() < deadline:
            time.sleep(0.5)
        changed = sorted(set(before.items()) ^ set(after.items()))
        expect(not changed, f"serve's state directory changed: {changed[:10]}")
        seen.append(f"state directory unchanged ({len(before)} files hashed)")
        expect(sh(neighbour, "cat /root/mine").strip() == "neighbour", "the neighbour lost its file")
        ok_json("POST", f"/v1/sandboxes/{paused}/resume", sock=sock)
        expect(sh(paused, "cat /root/mine").strip() == "paused-tenant", "the paused tenant lost its file")
        seen.append("the neighbour and the paused tenant (resumed) kept their files")
        expect(serve.stop() == 0, f"serve exit: {serve.log()[-2000:]}")
    finally:
        serve.stop()
    return "; ".join(seen)


def guest_ports():
    # After metrics_match: its calls are not counted there.
    return guest_ports_case.run(SOCKET, STATE["serve_pid"], os.path.join(os.path.dirname(SERVE), "agentvm"), create,
                                delete, exec_)


def guest_egress():
    # After metrics_match, as guest_ports.
    return guest_egress_case.run(create, delete, exec_, metrics)


def vm_users():
    return vm_users_case.run(STATE["serve_pid"], create, delete, lambda: wait_pool_ready(POOL))


# The test host's guest files are set-up's, linked from build/guest/ into root's cache, and
# /root is 0700; a package installs them where any user reads them. In a mount namespace of the
# case's own, /root is an empty tmpfs of mode 0755 with only .cache (root's own, bound back)
# inside; /dev/kvm gets udev's usual group and mode.
UNIT_USER_SETUP = """set -e
chgrp kvm /dev/kvm && chmod 0660 /dev/kvm
if [ "$(stat -c %a /root)" = 700 ] && [ -d /root/.cache ]; then
    mkdir -p /tmp/serve-unit-root && mount --rbind /root /tmp/serve-unit-root
    mount -t tmpfs -o mode=0755 tmpfs /root
    mkdir /root/.cache && mount --rbind /tmp/serve-unit-root/.cache /root/.cache
fi
exec "$@"
"""


def serve_unit():
    """serve started as deploy/systemd/agentvm-serve.service starts it, as a user of its own
    (uid and gid 61234, not in passwd) with the unit's groups and capabilities, its socket
    passed, its cgroup delegated (tests/package/serve_unit_check.py plays systemd)."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "package", "serve_unit_check.py")
    agentvm = os.path.join(os.path.dirname(SERVE), "agentvm")
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", UNIT_USER_SETUP, "sh",
                        "python3", script, "--serve", SERVE, "--agentvm", agentvm, "--user", "61234:61234"],
                       capture_output=True, text=True, timeout=900)
    expect(r.returncode == 0 and r.stdout.startswith("ok serve_unit: "), f"{r.stdout}{r.stderr[-4000:]}")
    return r.stdout[len("ok serve_unit: "):].strip()


SHARED = [pool_warm_and_cold, state_within_not_across, big_file_both_ways, streaming, timeouts, vm_killed,
          errors, run_code, code_cancel_file_info, run_jupyter, fusion_limits, metrics_match, guest_ports,
          guest_egress, vm_users]
# After the shared serve has stopped: these count every agentvm process of the machine.
ALONE = [drain_with_call_in_flight, soak_no_leaks, kill9_leaves_nothing, memory_reserve_refuses, pool_warmup,
         plan_calibrates, fork_pause_resume, hostile_guest, serve_unit]


def main():
    wanted = sys.argv[2:]
    serve = Serve(SERVE, "--listen", f"unix:{SOCKET}", "--pool", f"default={POOL}", "--max-sandboxes",
                  str(MAX_SANDBOXES), "--mem-reserve", "64", log_level="info")
    failed = 0
    STATE["serve_pid"] = serve.proc.pid
    try:
        serve.wait_listening(connect)
        for case in SHARED:
            if not wanted or case.__name__ in wanted:
                failed += not run_case(case.__name__, case)
        code = serve.stop()
        if code != 0:
            print(f"FAIL serve_exit: {code}")
            failed += 1
    finally:
        serve.stop()
        if failed:
            print(serve.log()[-6000:], file=sys.stderr)
    for case in ALONE:
        if not wanted or case.__name__ in wanted:
            failed += not run_case(case.__name__, case)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
