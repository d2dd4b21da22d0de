#!/usr/bin/env python3
"""agentvm-serve's report to the fleet's balancer (docs/api.md, "/healthz" and "--agent-check"):
the HAProxy agent-check line and /healthz's JSON, as sandboxes are created, at max_sandboxes,
while serve drains, when its VMs cannot start, and under a flood of agent connections; then,
where /usr/sbin/haproxy is installed, a real HAProxy whose server's weight and state follow.

usage: agent_check_check.py AGENTVM_SERVE_BINARY
Prints "ok <case>: <what was seen>" or "FAIL <case>: <why>" per case; exits non-zero if any
failed. Needs no KVM: serve runs from a copy of its binary beside fake_episode.py as its
`agentvm` (or a script that fails), listening for HTTP on a Unix socket.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "vm"))
sys.path.insert(0, HERE)
from checks import expect, run_case  # noqa: E402
from serve_client import UnixConnection, call, free_port  # noqa: E402
import serve_client  # noqa: E402

SERVE = sys.argv[1]
TMP = tempfile.mkdtemp(prefix="agentvm-agent-check-")
HAPROXY = "/usr/sbin/haproxy"
FAKE = f"#!/bin/sh\nexec {sys.executable} {os.path.join(HERE, 'fake_episode.py')} \"$@\"\n"
FAILING = "#!/bin/sh\necho 'agentvm: error: no VM here' >&2\nexit 1\n"
LINE = re.compile(r"ready up (\d+)%\n")
serves = 0


def make_bin(name, script):
    bin_dir = os.path.join(TMP, name)
    os.mkdir(bin_dir)
    try:
        os.link(SERVE, os.path.join(bin_dir, "agentvm-serve"))
    except OSError:
        shutil.copy2(SERVE, os.path.join(bin_dir, "agentvm-serve"))
    set_agentvm(bin_dir, script)
    return bin_dir


def set_agentvm(bin_dir, script):
    path = os.path.join(bin_dir, "agentvm")
    with open(path + ".new", "w") as f:
        f.write(script)
    os.chmod(path + ".new", 0o755)
    os.replace(path + ".new", path)


class Server:
    def __init__(self, bin_dir, *args):
        global serves
        serves += 1
        self.sock_path = os.path.join(TMP, f"serve-{serves}.sock")
        self.agent_port = free_port()
        self.serve = serve_client.Serve(
            os.path.join(bin_dir, "agentvm-serve"), "--listen", f"unix:{self.sock_path}", "--agent-check",
            f"tcp:127.0.0.1:{self.agent_port}", "--mem-reserve", "0", "--node-id", "node-t", *args,
            log_level="info", log_path=os.path.join(TMP, f"serve-{serves}.log"))
        self.serve.wait_listening(lambda: UnixConnection(self.sock_path, timeout=5))

    def agent(self, timeout=5):
        """The agent-check line, read to serve's close."""
        with socket.create_connection(("127.0.0.1", self.agent_port), timeout=timeout) as s:
            data = b""
            while True:
                piece = s.recv(4096)
                if not piece:
                    return data.decode()
                data += piece
                expect(len(data) < 1024, f"an agent line without end: {data[:200]!r}")

    def weight(self):
        line = self.agent()
        m = LINE.fullmatch(line)
        expect(m, f"agent line {line!r} is not 'ready up N%\\n'")
        return int(m.group(1))

    def healthz(self, conn=None):
        status, headers, data = call(conn or UnixConnection(self.sock_path, timeout=5), "GET", "/healthz")
        expect(headers.get("Content-Type") == "application/json", f"/healthz headers {headers}")
        return status, json.loads(data)

    def json_call(self, method, path, body=None, timeout=10):
        data = None if body is None else json.dumps(body).encode()
        status, _, answer = call(UnixConnection(self.sock_path, timeout=timeout), method, path, body=data)
        return status, answer

    def create(self):
        status, answer = self.json_call("POST", "/v1/sandboxes", {})
        expect(status == 201, f"create answered {status}: {answer[:300]!r}")
        return json.loads(answer)["id"]

    def settle(self, warm, within=10):
        """/healthz once the pool holds `warm` VMs (its refill is not instant)."""
        deadline = time.monotonic() + within
        while True:
            status, doc = self.healthz()
            if doc["warm"] == warm:
                return status, doc
            expect(time.monotonic() < deadline, f"the pool never held {warm} warm VMs: {doc}")
            time.sleep(0.05)

    def fds(self):
        return len(os.listdir(f"/proc/{self.serve.proc.pid}/fd"))

    def stop(self):
        return self.serve.stop(timeout=30)


def weight_follows_sandboxes(bin_dir):
    # max 3, one warm VM: idle 100% (2 cold + 4 x 1 warm of 3 + 3 x 1), then 5/6, 4/6, and 0%
    # once the last place is handed out and no refill may start.
    server = Server(bin_dir, "--pool", "default=1", "--max-sandboxes", "3")
    try:
        seen = []
        ids = []
        for expected, warm, running in [(100, 1, 1), (83, 1, 2), (67, 1, 3), (0, 0, 3)]:
            if seen:
                ids.append(server.create())
            status, doc = server.settle(warm)
            weight = server.weight()
            expect(weight == expected, f"after {len(ids)} creates the agent says {weight}%, not {expected}%")
            expect(status == 200 and doc == {"status": "ok", "node": "node-t", "weight": expected, "warm": warm,
                                             "running": running, "max_sandboxes": 3,
                                             "available_mib": doc["available_mib"], "reserve_mib": 0}
                   and isinstance(doc["available_mib"], int) and doc["available_mib"] > 0,
                   f"/healthz after {len(ids)} creates: {status} {doc}")
            seen.append(weight)
        status, answer = server.json_call("POST", "/v1/sandboxes", {})
        expect(status == 429, f"a create at 0% answered {status}, not 429: {answer[:200]!r}")
        for sandbox in ids:
            server.json_call("DELETE", f"/v1/sandboxes/{sandbox}")
        server.settle(1)
        back = server.weight()
        expect(back == 100, f"every sandbox deleted: {back}%")
        code = server.stop()
        expect(code == 0, f"exit {code}")
        return f"agent weights {seen} as 3 sandboxes were created (a 4th refused 429), {back}% once deleted"
    finally:
        server.stop()


def drain_while_call_runs(bin_dir):
    server = Server(bin_dir, "--pool", "default=0", "--drain-grace", "6")
    try:
        sandbox = server.create()
        results = {}

        def hang():
            results["hang"] = server.json_call("POST", f"/v1/sandboxes/{sandbox}/exec", {"argv": ["hang"]},
                                               timeout=30)

        thread = threading.Thread(target=hang, daemon=True)
        thread.start()
        # A keep-alive connection opened before the SIGTERM: the HTTP listeners close then.
        kept = UnixConnection(server.sock_path, timeout=5)
        status, doc = server.healthz(kept)
        expect(status == 200 and doc["status"] == "ok" and doc["running"] == 1, f"before: {status} {doc}")
        time.sleep(0.3)
        server.serve.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        lines = set()
        for _ in range(5):
            lines.add(server.agent())
            time.sleep(0.2)
        expect(lines == {"drain\n"}, f"the agent while draining said {lines}")
        expect(server.serve.proc.poll() is None, "serve did not wait for the call in flight")
        try:
            status, doc = server.healthz(kept)
            kept_seen = f"a keep-alive connection's /healthz {status} {doc['status']}"
            expect(status == 503 and doc["status"] == "draining", f"/healthz while draining: {status} {doc}")
        except OSError as e:
            kept_seen = f"a keep-alive connection's /healthz {e!r}"
        try:
            UnixConnection(server.sock_path, timeout=2).request("GET", "/healthz")
            fresh = "a new connection still accepted"
        except OSError as e:
            fresh = f"a new connection refused ({type(e).__name__})"
        code = server.serve.proc.wait(timeout=20)
        thread.join(timeout=5)
        expect(code == 0, f"exit {code}")
        status, _ = results.get("hang", (None, b""))
        expect(status is not None and status >= 400, f"the call in flight got {status}")
        return f"'drain' x5 during the grace; {kept_seen}; {fresh}; exit 0"
    finally:
        server.stop()


def maint_when_vms_cannot_start(bin_dir):
    server = Server(bin_dir, "--pool", "default=0", "--max-sandboxes", "4")
    try:
        expect(server.weight() == 100, "an idle serve without pools is not at 100%")
        for attempt in range(3):
            expect(server.agent().startswith("ready up "), f"maint after {attempt} failed starts: {server.agent()!r}")
            status, answer = server.json_call("POST", "/v1/sandboxes", {})
            expect(status >= 500, f"a create whose VM cannot start answered {status}")
        line = server.agent()
        expect(line.startswith("maint fail #") and line.endswith("\n") and line.count("\n") == 1
               and "default 3" in line, f"after 3 failed starts the agent says {line!r}")
        status, doc = server.healthz()
        expect(status == 503 and doc["status"] == "maint" and doc["weight"] == 0 and "default 3" in doc["reason"],
               f"/healthz in maint: {status} {doc}")
        # VMs start again: the next create (made directly, as the balancer sends none) ends maint.
        set_agentvm(bin_dir, FAKE)
        server.create()
        weight = server.weight()
        expect(weight == 75, f"after a start that worked: {weight}%")
        status, doc = server.healthz()
        expect(status == 200 and doc["status"] == "ok", f"/healthz after: {status} {doc}")
        return f"{line.strip()!r}, /healthz 503 maint; one good start: ready up {weight}%"
    finally:
        set_agentvm(bin_dir, FAILING)
        server.stop()


def flood_and_garbage(bin_dir):
    server = Server(bin_dir, "--pool", "default=0")
    held = []
    try:
        idle_fds = server.fds()
        # Connections that never read, some that send garbage first, and many at once.
        for i in range(600):
            s = socket.socket()
            s.setblocking(False)
            try:
                s.connect(("127.0.0.1", server.agent_port))
            except BlockingIOError:
                pass
            if i % 3 == 0:
                try:
                    s.send(b"\xff" * 2000 + b"GET / HTTP/1.1\r\n\r\n")
                except OSError:
                    pass
            held.append(s)
        start = time.monotonic()
        weight = server.weight()
        status, _ = server.healthz()
        took = time.monotonic() - start
        expect(weight == 100 and status == 200 and took < 2, f"beside the flood: {weight}% /healthz {status} in {took:.1f} s")
        for s in held:
            s.close()
        held = []
        deadline = time.monotonic() + 10
        while server.fds() > idle_fds + 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        fds = server.fds()
        expect(fds <= idle_fds + 4, f"serve holds {fds} descriptors after the flood (idle {idle_fds})")
        expect(server.serve.proc.poll() is None, "serve died")
        return f"600 agent connections (200 with garbage): answered in {took * 1000:.0f} ms, {fds} fds after"
    finally:
        for s in held:
            s.close()
        server.stop()


class Haproxy:
    def __init__(self, server, name):
        self.stats = os.path.join(TMP, f"{name}.stat")
        cfg = os.path.join(TMP, f"{name}.cfg")
        with open(cfg, "w") as f:
            f.write(f"""global
    stats socket {self.stats} mode 600 level admin
defaults
    mode http
    timeout connect 2s
    timeout client 10s
    timeout server 10s
frontend fe
    bind 127.0.0.1:{free_port()}
    default_backend nodes
backend nodes
    balance random(2)
    server node-t unix@{server.sock_path} weight 100 agent-check agent-addr 127.0.0.1 agent-port {server.agent_port} agent-inter 100ms
""")
        self.log = open(os.path.join(TMP, f"{name}.log"), "wb")
        self.proc = subprocess.Popen([HAPROXY, "-f", cfg, "-db"], stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=self.log)

    def server_stat(self):
        """The server's row of `show stat`, by column name."""
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(5)
        s.connect(self.stats)
        s.sendall(b"show stat\n")
        data = b""
        while True:
            piece = s.recv(65536)
            if not piece:
                break
            data += piece
        s.close()
        lines = data.decode().splitlines()
        header = lines[0].lstrip("# ").split(",")
        for line in lines[1:]:
            row = dict(zip(header, line.split(",")))
            if row.get("svname") == "node-t":
                return row
        expect(False, f"no server node-t in {data[:300]!r}")

    def wait_for(self, what, test, within=10):
        deadline = time.monotonic() + within
        while True:
            expect(self.proc.poll() is None, f"haproxy exited {self.proc.returncode}")
            try:
                row = self.server_stat()
                if test(row):
                    return row
            except OSError:
                row = None
            expect(time.monotonic() < deadline,
                   f"haproxy never saw {what}: {row and {k: row[k] for k in ('status', 'weight', 'last_agt')}}")
            time.sleep(0.1)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def haproxy_follows(bin_dir):
    server = Server(bin_dir, "--pool", "default=1", "--max-sandboxes", "3", "--drain-grace", "5")
    haproxy = Haproxy(server, "follows")
    try:
        seen = []
        sandbox = None
        for expected, warm in [(100, 1), (83, 1), (67, 1), (0, 0)]:
            if seen:
                sandbox = server.create()
            server.settle(warm)
            row = haproxy.wait_for(f"weight {expected}", lambda r, e=expected: r["weight"] == str(e))
            seen.append(f"{row['weight']}")
        threading.Thread(target=lambda: server.json_call("POST", f"/v1/sandboxes/{sandbox}/exec",
                                                         {"argv": ["hang"]}, timeout=30), daemon=True).start()
        time.sleep(0.3)
        server.serve.proc.send_signal(signal.SIGTERM)
        row = haproxy.wait_for("DRAIN", lambda r: r["status"].startswith("DRAIN"))
        code = server.serve.proc.wait(timeout=20)
        expect(code == 0, f"serve exit {code}")
        return f"haproxy's weight {' -> '.join(seen)} as sandboxes were created; {row['status']!r} on SIGTERM"
    finally:
        haproxy.stop()
        server.stop()


def haproxy_maint(bin_dir):
    server = Server(bin_dir, "--pool", "default=0", "--max-sandboxes", "4")
    haproxy = Haproxy(server, "maint")
    try:
        haproxy.wait_for("weight 100", lambda r: r["weight"] == "100")
        for _ in range(3):
            server.json_call("POST", "/v1/sandboxes", {})
        row = haproxy.wait_for("MAINT", lambda r: r["status"] == "MAINT")
        expect("no VM starts" in row["last_agt"], f"haproxy's last agent report: {row['last_agt']!r}")
        set_agentvm(bin_dir, FAKE)
        server.create()
        back = haproxy.wait_for("back from MAINT", lambda r: r["status"] != "MAINT" and r["weight"] == "75")
        return (f"MAINT with {row['last_agt']!r}; after one good start {back['status']!r} at weight "
                f"{back['weight']}")
    finally:
        set_agentvm(bin_dir, FAILING)
        haproxy.stop()
        server.stop()


def main():
    fake = make_bin("fake", FAKE)
    switchable = make_bin("switchable", FAILING)
    results = [run_case("weight_follows_sandboxes", weight_follows_sandboxes, fake),
               run_case("drain_while_call_runs", drain_while_call_runs, fake),
               run_case("maint_when_vms_cannot_start", maint_when_vms_cannot_start, switchable),
               run_case("flood_and_garbage", flood_and_garbage, fake)]
    if os.access(HAPROXY, os.X_OK):
        results += [run_case("haproxy_follows", haproxy_follows, fake),
                    run_case("haproxy_maint", haproxy_maint, switchable)]
    else:
        print(f"# {HAPROXY} is not installed: the HAProxy cases did not run", flush=True)
    shutil.rmtree(TMP, ignore_errors=True)
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
