#!/usr/bin/env python3
"""The fleet's front door without VMs (docs/fleet.md): three agentvm-serve (n1, n2, n3) on
loopback ports with fake_episode.py standing in for `agentvm episode`, the configuration the
real `agentvm fleet haproxy-config` writes for them, and the real HAProxy 2.6 in front. Every
request goes through HAProxy's one port; which node answered is read from HAProxy's own log
(one line per request, "backend/server").

usage: fleet_routing_check.py AGENTVM_SERVE AGENTVM
Prints "ok <case>: ..." or "FAIL <case>: ..." per case; exits non-zero if any failed. Needs
/usr/sbin/haproxy (Debian's haproxy package): without it the check fails, it is not skipped.
"""
import concurrent.futures
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "vm"))
sys.path.insert(0, HERE)
from checks import expect, run_case  # noqa: E402
from serve_client import free_port  # noqa: E402
import serve_client  # noqa: E402

SERVE, AGENTVM = sys.argv[1], sys.argv[2]
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
TMP = tempfile.mkdtemp(prefix="agentvm-fleet-")
TOKEN = "e2b_" + "0123456789abcdef" * 2 + "01234567"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
E2B_AUTH = {"X-API-KEY": TOKEN}
NODES = ["n1", "n2", "n3"]
MAX_SANDBOXES = 24  # per node: the full-node case needs room on two, the full-fleet case fills all three
ID = re.compile(r"^([a-z0-9-]+)-[0-9a-f]{6}-[0-9a-f]{16}$")


def node_of(sandbox_id):
    found = ID.match(sandbox_id)
    expect(found, f"not a sandbox id of the fleet's shape: {sandbox_id!r}")
    return found.group(1)


def port_pair():
    """A free port whose successor is free too (serve's port, and its agent check's)."""
    for _ in range(100):
        port = free_port()
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no two free consecutive ports")


class Node:
    def __init__(self, name, bin_dir, agent_check, peers_file):
        self.name = name
        self.port = port_pair()
        self.bin_dir = bin_dir
        self.agent_check = agent_check
        self.peers_file = peers_file
        self.state_dir = os.path.join(TMP, f"state-{name}")
        os.mkdir(self.state_dir)
        self.starts = 0
        self.serve = None

    def start(self):
        self.starts += 1
        args = ["--pool", "default=0", "--listen", f"tcp:127.0.0.1:{self.port}", "--token-file",
                os.path.join(TMP, "token"), "--node-id", self.name, "--max-sandboxes", str(MAX_SANDBOXES),
                "--mem-reserve", "0", "--drain-grace", "1"]
        if self.agent_check:
            args += ["--agent-check", f"tcp:127.0.0.1:{self.port + 1}"]
        if self.peers_file:
            args += ["--peers-file", self.peers_file]
        self.serve = serve_client.Serve(os.path.join(self.bin_dir, "agentvm-serve"), *args, log_level="info",
                                        state_dir=self.state_dir,
                                        log_path=os.path.join(TMP, f"{self.name}-{self.starts}.log"),
                                        # What a node killed with SIGKILL leaves goes with TMP.
                                        env=dict(os.environ, TMPDIR=TMP))
        self.serve.wait_listening(lambda: http.client.HTTPConnection("127.0.0.1", self.port, timeout=5))

    def kill(self):
        self.serve.proc.send_signal(signal.SIGKILL)
        self.serve.proc.wait()
        self.serve.log_file.close()

    def stop(self):
        if self.serve and self.serve.proc.poll() is None:
            self.serve.stop(timeout=30)


class FrontDoor:
    """HAProxy on the configuration `agentvm fleet haproxy-config` wrote; its log (stdout and
    stderr, -db) goes to a file that `answered_by` reads."""

    def __init__(self, nodes, agent_check):
        self.port = free_port()
        self.socket = os.path.join(TMP, "haproxy.sock")
        self.config = os.path.join(TMP, "haproxy.cfg")
        command = [AGENTVM, "fleet", "haproxy-config", "--bind", f"127.0.0.1:{self.port}",
                   "--stats-socket", self.socket, "-o", self.config]
        for node in nodes:
            command += ["--node", f"{node.name}=127.0.0.1:{node.port}"]
        if agent_check:
            command.append("--agent-check")
        made = subprocess.run(command, capture_output=True, text=True)
        expect(made.returncode == 0, f"{' '.join(command)}: exit {made.returncode}: {made.stderr}")
        checked = subprocess.run([HAPROXY, "-c", "-f", self.config], capture_output=True, text=True)
        expect(checked.returncode == 0, f"haproxy -c refused the configuration: {checked.stdout}{checked.stderr}")
        self.log_path = os.path.join(TMP, "haproxy.log")
        self.log_file = open(self.log_path, "wb")
        self.proc = subprocess.Popen([HAPROXY, "-db", "-f", self.config], stdin=subprocess.DEVNULL,
                                     stdout=self.log_file, stderr=subprocess.STDOUT,
                                     env={**os.environ, "AGENTVM_TOKEN": TOKEN})

    def stat(self):
        """{(backend, server): status} from the runtime API's `show stat`."""
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(self.socket)
            s.sendall(b"show stat\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        result = {}
        for line in data.decode().splitlines():
            if line.startswith("#") or not line:
                continue
            fields = line.split(",")
            result[(fields[0], fields[1])] = fields[17]
        return result

    def admin(self, command):
        """One command of HAProxy's runtime API; its answer must be empty (it is, on success)."""
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(self.socket)
            s.sendall(command.encode() + b"\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        expect(not data.strip(), f"HAProxy's runtime API refused {command!r}: {data.decode(errors='replace')}")

    def wait_status(self, backend, server, wanted, within):
        deadline = time.monotonic() + within
        while True:
            try:
                status = self.stat().get((backend, server), "")
            except OSError:
                status = ""
            if status.startswith(wanted):
                return
            expect(self.proc.poll() is None, f"haproxy exited {self.proc.returncode}: {self.log()[-2000:]}")
            expect(time.monotonic() < deadline, f"{backend}/{server} is {status!r}, not {wanted}, after {within} s")
            time.sleep(0.05)

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def answered_by(self, method, path, at_least=1):
        """The backend/server of each logged request `method path` (HAProxy's httplog line,
        written once the answer is sent: waits up to 2 s for `at_least` of them)."""
        pattern = re.compile(r" (\S+)/(\S+) \S+ \d+ .*\"" + re.escape(f"{method} {path} HTTP/1.1") + '"')
        deadline = time.monotonic() + 2
        while True:
            found = [(m.group(1), m.group(2)) for m in pattern.finditer(self.log())]
            if len(found) >= at_least or time.monotonic() > deadline:
                return found
            time.sleep(0.05)

    def call(self, method, path, body=None, headers=None, timeout=30):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        conn.request(method, path, body=data, headers={**AUTH, **(headers or {})})
        response = conn.getresponse()
        answer = response.read()
        conn.close()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, answer

    def create(self, headers=None):
        status, _, data = self.call("POST", "/v1/sandboxes", {}, headers)
        expect(status == 201, f"a create through the front door: {status} {data[:300]!r}")
        return json.loads(data)["id"]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_file.close()


def make_bin():
    """serve beside a fake `agentvm` (fake_episode.py): serve runs the agentvm beside itself."""
    bin_dir = os.path.join(TMP, "bin")
    os.mkdir(bin_dir)
    try:
        os.link(SERVE, os.path.join(bin_dir, "agentvm-serve"))
    except OSError:
        shutil.copy2(SERVE, os.path.join(bin_dir, "agentvm-serve"))
    with open(os.path.join(bin_dir, "agentvm"), "w") as f:
        f.write(f"#!/bin/sh\nexec {sys.executable} {os.path.join(HERE, 'fake_episode.py')} \"$@\"\n")
    os.chmod(os.path.join(bin_dir, "agentvm"), 0o755)
    return bin_dir


def creates_at_once(front, count, headers=None):
    with concurrent.futures.ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(lambda _: front.create(headers), range(count)))


def spread(ids):
    counts = {name: 0 for name in NODES}
    for sandbox_id in ids:
        counts[node_of(sandbox_id)] = counts.get(node_of(sandbox_id), 0) + 1
    return counts


def delete_all(front, ids):
    for sandbox_id in ids:
        status, _, data = front.call("DELETE", f"/v1/sandboxes/{sandbox_id}")
        expect(status in (200, 204), f"DELETE {sandbox_id}: {status} {data[:200]!r}")


# The cases, in order: each leaves the fleet as it found it, but for `kill_one_node`, which
# `restarted_node` follows.

def creates_spread(front, state):
    ids = creates_at_once(front, 30)
    counts = spread(ids)
    expect(set(counts) == set(NODES), f"creates reached nodes the fleet does not have: {counts}")
    expect(min(counts.values()) >= 6, f"30 creates at once: a node got fewer than a fifth: {counts}")
    expect(len(set(ids)) == 30, "two creates answered the same id")
    logged = front.answered_by("POST", "/v1/sandboxes", at_least=30)
    expect(len(logged) == 30 and all(b == "balanced_native" for b, _ in logged),
           f"creates are balanced_native's: {logged}")
    state["ids"] = ids
    return f"30 creates at once: {counts}"


def sandbox_requests_reach_their_node(front, state):
    for sandbox_id in state["ids"]:
        status, _, data = front.call("GET", f"/v1/sandboxes/{sandbox_id}")
        expect(status == 200 and json.loads(data)["id"] == sandbox_id, f"GET {sandbox_id}: {status} {data[:200]!r}")
        status, _, data = front.call("POST", f"/v1/sandboxes/{sandbox_id}/exec", {"argv": ["true"]})
        expect(status == 200, f"exec in {sandbox_id}: {status} {data[:200]!r}")
    for sandbox_id in state["ids"]:
        for method, path in (("GET", f"/v1/sandboxes/{sandbox_id}"), ("POST", f"/v1/sandboxes/{sandbox_id}/exec")):
            logged = front.answered_by(method, path, at_least=1)
            expect(logged == [("sandbox_native", node_of(sandbox_id))],
                   f"{method} {path} was answered by {logged}, not its node")
    # E2B: a create balanced, then its control plane and its envd traffic (E2b-Sandbox-Id) at its node.
    status, _, data = front.call("POST", "/v2/sandboxes", {"templateID": "base", "timeout": 60}, E2B_AUTH)
    expect(status == 201, f"E2B create: {status} {data[:300]!r}")
    e2b_id = json.loads(data)["sandboxID"]
    status, _, data = front.call("GET", f"/sandboxes/{e2b_id}", headers=E2B_AUTH)
    expect(status == 200 and json.loads(data)["sandboxID"] == e2b_id, f"E2B getInfo: {status} {data[:300]!r}")
    status, _, data = front.call("GET", "/health", headers={"E2b-Sandbox-Id": e2b_id, "E2b-Sandbox-Port": "49983"})
    expect(status in (200, 204), f"E2B envd /health of {e2b_id}: {status} {data[:300]!r}")
    node = node_of(e2b_id)
    for method, path in (("GET", f"/sandboxes/{e2b_id}"), ("GET", "/health")):
        logged = front.answered_by(method, path)
        expect(logged == [("sandbox_e2b", node)], f"E2B {method} {path} answered by {logged}, not {node}")
    expect(front.answered_by("POST", "/v2/sandboxes")[-1][0] == "balanced_e2b", "E2B creates are balanced_e2b's")
    status, _, _ = front.call("DELETE", f"/sandboxes/{e2b_id}", headers=E2B_AUTH)
    expect(status == 204, f"E2B kill: {status}")
    # An id naming no node of the fleet is balanced (HAProxy ignores use-server), and answered
    # by a node that says it is not its own.
    stray = "zz9-abcdef-0123456789abcdef"
    status, _, data = front.call("GET", f"/v1/sandboxes/{stray}")
    expect(status == 410 and json.loads(data).get("error") == "sandbox_lost" and json.loads(data).get("node") == "zz9",
           f"an id of no node of the fleet: {status} {data[:300]!r}")
    expect(front.answered_by("GET", f"/v1/sandboxes/{stray}")[0][1] in NODES, "the stray id was not balanced")
    return f"{len(state['ids'])} sandboxes' GET and exec each at its node; E2B getInfo and envd traffic at {node}"


def run_code_spreads(front, state):
    def one(_):
        status, _, data = front.call("POST", "/run_code", {"code": "print(1)", "language": "python"})
        expect(status == 200, f"/run_code: {status} {data[:300]!r}")
        return json.loads(data)
    answers = list(concurrent.futures.ThreadPoolExecutor(max_workers=6).map(one, range(6)))
    statuses = {a.get("status") for a in answers}
    expect(statuses <= {"Success", "Failed"}, f"/run_code answers: {statuses}")
    logged = front.answered_by("POST", "/run_code", at_least=6)
    nodes = {server for backend, server in logged if backend == "balanced_fusion"}
    expect(len(logged) == 6 and len(nodes) >= 2, f"6 /run_code at once went to {logged}")
    time.sleep(1)  # each run's sandbox ends after its answer
    return f"6 /run_code at once on {sorted(nodes)}"


def idempotent_creates(front, state):
    key = {"Idempotency-Key": "fleet-check-key-1"}
    before = len(front.answered_by("POST", "/v1/sandboxes"))
    first = front.create(key)
    try:
        status, headers, data = front.call("POST", "/v1/sandboxes", {}, key)
        expect(status == 201 and json.loads(data)["id"] == first and headers.get("idempotent-replayed") == "true",
               f"a repeated create with its key: {status} {headers} {data[:300]!r} (first: {first})")
        logged = front.answered_by("POST", "/v1/sandboxes", at_least=before + 2)[before:]
        expect(len(logged) == 2 and all(b == "by_key_native" for b, _ in logged)
               and logged[0][1] == logged[1][1] == node_of(first), f"a key's creates went to {logged}")
    finally:
        delete_all(front, [first])
    return f"a key's two creates at {node_of(first)}, one sandbox"


def direct_call(node, method, path, body=None):
    """A request straight to one node's serve, past the front door."""
    conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=30)
    conn.request(method, path, body=None if body is None else json.dumps(body).encode(), headers=AUTH)
    response = conn.getresponse()
    answer = response.read()
    conn.close()
    return response.status, answer


def capacity_refusals(node):
    _, text = direct_call(node, "GET", "/metrics")
    found = re.search(r'(?m)^agentvm_create_refusals_total\{code="at_capacity"\} (\d+)', text.decode())
    return int(found.group(1)) if found else 0


def full_node_sends_creates_elsewhere(front, state, nodes):
    """A full node refuses a create behind the front door with 503 + Agentvm-Refusal, which
    HAProxy retries on another node: the client sees 201 from a node with room. The agents are
    paused and every node weighs the same, as in the second after a burst filled a node and
    before its agent says 0%: the full node is asked, and refuses."""
    full = nodes[0]
    filled = []
    created = []
    try:
        while True:
            status, data = direct_call(full, "POST", "/v1/sandboxes", {})
            if status == 429:
                break
            expect(status == 201, f"filling {full.name} directly: {status} {data[:300]!r}")
            filled.append(json.loads(data)["id"])
        for node in nodes:
            front.admin(f"disable agent balanced_native/{node.name}")
            front.admin(f"set weight balanced_native/{node.name} 100")
        refused_before = capacity_refusals(full)
        created = [front.create() for _ in range(20)]
        landed = [node_of(i) for i in created]
        refused = capacity_refusals(full) - refused_before
        expect(full.name not in landed, f"a create landed on the full node: {landed}")
        expect(refused >= 1, f"the full node was never asked in {len(created)} creates")
    finally:
        for node in nodes:
            front.admin(f"enable agent balanced_native/{node.name}")
        delete_all(front, filled + created)
    state["ids"] = [i for i in state["ids"] if i not in filled]
    return f"{full.name} full at the weight of the others: asked {refused} times, refused each time; " \
        f"{len(created)} creates answered 201 by {sorted(set(landed))}"


def full_fleet(front, state):
    """Every node full: a create is refused by a node (503 + Agentvm-Refusal: at_capacity,
    retried on the others), and the front door answers 429 at_capacity."""
    have = len(state["ids"])
    more = []
    try:
        # One at a time: a create may meet only full nodes while the agents' weights are a
        # second old (HAProxy tries at most 4), and is answered 429 with Retry-After: 1, which
        # a client honours; so does this one, at most 3 times, while some node has room.
        for _ in range(len(NODES) * MAX_SANDBOXES - have):
            for attempt in range(4):
                status, headers, data = front.call("POST", "/v1/sandboxes", {})
                if status != 429 or attempt == 3:
                    break
                time.sleep(1.2)
            expect(status == 201, f"create {len(more) + 1} of {len(NODES) * MAX_SANDBOXES - have} filling the "
                                  f"fleet: {status} {data[:300]!r}")
            more.append(json.loads(data)["id"])
        counts = spread(state["ids"] + more)
        expect(all(c == MAX_SANDBOXES for c in counts.values()), f"the fleet filled unevenly: {counts}")
        # The agents say 0% once a node is full; HAProxy reads them every second.
        time.sleep(2.5)
        status, headers, data = front.call("POST", "/v1/sandboxes", {})
        expect(status == 429 and json.loads(data).get("error") == "at_capacity",
               f"a create when every node is full: {status} {headers} {data[:300]!r}")
        status, _, data = front.call("POST", "/v2/sandboxes", {"templateID": "base"}, E2B_AUTH)
        expect(status == 429, f"an E2B create when every node is full: {status} {data[:300]!r}")
    finally:
        delete_all(front, more)
    # A freed node takes creates again.
    time.sleep(2.5)
    extra = front.create()
    delete_all(front, [extra])
    return f"{sum(counts.values())} sandboxes fill the fleet; the next create: 429 at_capacity (native and E2B)"


def kill_one_node(front, state, nodes):
    victim = nodes[1]
    victims = [i for i in state["ids"] if node_of(i) == victim.name]
    survivors = [i for i in state["ids"] if node_of(i) != victim.name]
    expect(victims and survivors, f"no sandboxes on {victim.name} to lose, or none elsewhere: {state['ids']}")
    # A call in flight on the victim when it dies (the fake episode never answers "hang").
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        in_flight = pool.submit(front.call, "POST", f"/v1/sandboxes/{victims[0]}/exec", {"argv": ["hang"]})
        time.sleep(0.5)
        killed_at = time.monotonic()
        victim.kill()
        status, _, data = in_flight.result(timeout=20)
    expect(status == 502 and json.loads(data).get("error") == "sandbox_lost"
           and json.loads(data).get("node") == victim.name
           and json.loads(data).get("message", "").startswith("sandbox_lost: "),
           f"a call in flight when its node died: {status} {data[:300]!r}")
    # Creates keep succeeding from the first moment: a refused connection is retried elsewhere.
    # Each deleted at once: the two live nodes have room for few more.
    made = []
    down_after = None
    while time.monotonic() - killed_at < 5:
        made.append(front.create())
        delete_all(front, made[-1:])
        if down_after is None and front.stat().get(("balanced_native", victim.name), "").startswith("DOWN"):
            down_after = time.monotonic() - killed_at
    expect(down_after is not None, f"{victim.name} was not DOWN 5 s after its serve was killed: {front.stat()}")
    after = creates_at_once(front, 6)
    delete_all(front, after)
    made += after
    expect(all(node_of(i) != victim.name for i in made), f"a create landed on the dead node: {spread(made)}")
    for sandbox_id in victims:
        status, _, data = front.call("GET", f"/v1/sandboxes/{sandbox_id}")
        doc = json.loads(data) if data.startswith(b"{") else {}
        expect(status == 410 and doc.get("error") == "sandbox_lost" and doc.get("node") == victim.name,
               f"GET {sandbox_id} of the dead node: {status} {data[:300]!r} (sandbox_lost is serve's answer for "
               f"another node's id)")
    for sandbox_id in survivors:
        status, _, data = front.call("POST", f"/v1/sandboxes/{sandbox_id}/exec", {"argv": ["true"]})
        expect(status == 200, f"exec in {sandbox_id} of a live node: {status} {data[:200]!r}")
    state["ids"] = survivors
    state["lost"] = victims
    return (f"{victim.name} killed: DOWN after {down_after:.2f} s; {len(made)} creates meanwhile, none failed; "
            f"its {len(victims)} sandboxes sandbox_lost, a call in flight 502 sandbox_lost; "
            f"{len(survivors)} others untouched")


def restarted_node(front, state, nodes):
    victim = nodes[1]
    victim.start()
    front.wait_status("balanced_native", victim.name, "UP", within=10)
    front.wait_status("sandbox_native", victim.name, "UP", within=10)
    ids = creates_at_once(front, 12)
    counts = spread(ids)
    expect(counts[victim.name] >= 1, f"the restarted node got no creates: {counts}")
    expect(state.get("lost"), "kill_one_node left no lost sandbox to ask about")
    status, _, data = front.call("GET", f"/v1/sandboxes/{state['lost'][0]}")
    expect(status == 410 and json.loads(data).get("error") == "sandbox_lost",
           f"a sandbox of the serve before the restart, asked of the new one: {status} {data[:300]!r}")
    delete_all(front, ids + state["ids"])
    return f"{victim.name} back UP; 12 creates: {counts}; its old sandboxes still sandbox_lost"


def main():
    expect_haproxy = os.path.exists(HAPROXY)
    if not expect_haproxy:
        print(f"FAIL setup: no HAProxy at {HAPROXY} (apt-get install haproxy)", flush=True)
        sys.exit(1)
    with open(os.path.join(TMP, "token"), "w") as f:
        f.write(TOKEN + "\n")
    os.chmod(os.path.join(TMP, "token"), 0o600)
    bin_dir = make_bin()
    nodes = [Node(name, bin_dir, True, None) for name in NODES]
    peers_file = os.path.join(TMP, "peers")
    command = [AGENTVM, "fleet", "peers", "-o", peers_file] + [f"--node={n.name}=127.0.0.1:{n.port}" for n in nodes]
    made = subprocess.run(command, capture_output=True, text=True)
    if made.returncode != 0:
        print(f"FAIL setup: {' '.join(command)}: {made.stderr}", flush=True)
        sys.exit(1)
    for node in nodes:
        node.peers_file = peers_file
    front = None
    results = []
    state = {}
    try:
        for node in nodes:
            node.start()
        front = FrontDoor(nodes, True)
        for node in nodes:
            front.wait_status("balanced_native", node.name, "UP", within=10)
        results.append(run_case("creates_spread", creates_spread, front, state))
        if "ids" in state:
            results.append(run_case("sandbox_requests_reach_their_node", sandbox_requests_reach_their_node, front,
                                    state))
            results.append(run_case("run_code_spreads", run_code_spreads, front, state))
            results.append(run_case("idempotent_creates", idempotent_creates, front, state))
            results.append(run_case("full_node_sends_creates_elsewhere", full_node_sends_creates_elsewhere, front,
                                    state, nodes))
            results.append(run_case("full_fleet", full_fleet, front, state))
            results.append(run_case("kill_one_node", kill_one_node, front, state, nodes))
            results.append(run_case("restarted_node", restarted_node, front, state, nodes))
        else:
            results.append(False)
    except Exception as e:  # set-up failed: say so, as a failure
        print(f"FAIL setup: {e!r}", flush=True)
        results.append(False)
    finally:
        if front:
            front.stop()
        for node in nodes:
            node.stop()
    if all(results):
        shutil.rmtree(TMP, ignore_errors=True)
    else:
        print(f"# logs kept in {TMP}", flush=True)
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
