#!/usr/bin/env python3
"""The fleet tier: real Slurm, real HAProxy, real serve with real guests, through one URL.

usage: fleet_check.py --tap FILE     (as root, where a guest boots: tests/fleet/run.sh)

Three network namespaces are three hosts, each with a `slurmd -N hN` (slurm_cluster.py).
deploy/slurm/agentvm-fleet.sbatch, submitted with sbatch as a user would, runs one
`agentvm serve` per node (restarting it when it dies) and HAProxy on the first node with the
configuration `agentvm fleet haproxy-config --slurm` writes. Every case talks to the fleet
through HAProxy's URL only, except to kill or stop a node's serve. Each case prints
"ok <case>: <what was seen>" or "FAIL <case>: <why>"; the results also go to FILE as TAP with
closing counts, which tests/run_all.sh adds up.
"""
import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "vm"))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, HERE)
from checks import Failed, expect, run_case  # noqa: E402
from slurm_cluster import SlurmCluster  # noqa: E402
import agentvm  # noqa: E402

SERVE_PORT = 8780
FRONT_PORT = 8700
CREATES_AT_ONCE = 30
MAX_SANDBOXES = 20  # per node: 30 at once plus /run_code's and the warm pools fit on three


def node_of(sandbox_id):
    """The node an id names: all but its last two '-' parts (service/sandbox_ids.hpp)."""
    return sandbox_id.rsplit("-", 2)[0]


class Fleet:
    """The Slurm job that runs the fleet, and the ways the check reaches it."""

    def __init__(self, cluster, root):
        self.cluster = cluster
        self.root = root
        self.token = "e2b_" + secrets.token_hex(20)  # E2B's key shape: the SDK checks it
        self.token_file = os.path.join(root, "token")
        with open(self.token_file, "w") as f:
            f.write(self.token + "\n")
        os.chmod(self.token_file, 0o600)
        self.url = f"http://{cluster.address(cluster.nodes[0])}:{FRONT_PORT}"
        self.job = None

    def submit(self):
        self.fleet_dir = os.path.join(self.root, "fleet")
        env = dict(self.cluster.env,
                   AGENTVM_BIN=os.path.join(REPO, "build", "agentvm"),
                   STATE_ROOT=os.path.join(self.root, "state"),
                   FLEET_DIR=self.fleet_dir,
                   TOKEN_FILE=self.token_file,
                   SERVE_PORT=str(SERVE_PORT),
                   FLEET_PORT=str(FRONT_PORT),
                   SERVE_ARGS=f"--pool default=1 --max-sandboxes {MAX_SANDBOXES} --mem-reserve 256 "
                              "--drain-grace 60 --log-level info")
        out = subprocess.run(["sbatch", "--parsable", f"--nodes={len(self.cluster.nodes)}",
                              f"--output={self.root}/job-%j.out", "--export=ALL",
                              os.path.join(REPO, "deploy", "slurm", "agentvm-fleet.sbatch")],
                             env=env, check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.job = out.stdout.strip().split(";")[0]

    def job_log(self):
        """The job's output and the tail of each serve's and HAProxy's log, for a failure."""
        out = []
        paths = [os.path.join(self.root, f"job-{self.job}.out")]
        if os.path.isdir(self.fleet_dir):
            paths += [os.path.join(self.fleet_dir, name) for name in sorted(os.listdir(self.fleet_dir))
                      if name.endswith(".log")]
        for path in paths:
            try:
                with open(path, errors="replace") as f:
                    out.append(f"--- {os.path.basename(path)}\n" + "".join(f.readlines()[-20:]))
            except OSError as e:
                out.append(f"--- {path}: {e}")
        return "\n".join(out)

    def request(self, method, path, body=None, headers=None, base=None, timeout=120):
        """(status, headers by lower-case name, parsed JSON or raw bytes) of one request (HTTP's
        header names are case-blind, and HAProxy sends them in lower case)."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request((base or self.url) + path, data=data, method=method,
                                     headers={"Authorization": f"Bearer {self.token}",
                                              "Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                status, hdrs, raw = resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
        except urllib.error.HTTPError as e:
            status, hdrs, raw = e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()
        try:
            return status, hdrs, json.loads(raw) if raw else None
        except ValueError:
            return status, hdrs, raw

    def node_url(self, node):
        return f"http://{self.cluster.address(node)}:{SERVE_PORT}"

    def node_healthy(self, node):
        try:
            status, _, body = self.request("GET", "/healthz", base=self.node_url(node), timeout=3)
            return status == 200 and isinstance(body, dict) and body.get("node") == node
        except OSError:
            return False

    def server_states(self):
        """HAProxy's view of each node: {node: "UP"|"DOWN"|...} from its stats socket."""
        import socket
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(os.path.join(self.fleet_dir, "haproxy.sock"))
            s.sendall(b"show stat\n")
            text = b""
            while chunk := s.recv(65536):
                text += chunk
        states = {}
        for line in text.decode(errors="replace").splitlines():
            fields = line.split(",")
            if len(fields) > 17 and fields[1] in self.cluster.nodes:
                states.setdefault(fields[1], fields[17])
        return states

    def wait_ready(self, within):
        deadline = time.monotonic() + within
        while True:
            healthy = [node for node in self.cluster.nodes if self.node_healthy(node)]
            try:
                states = self.server_states() if len(healthy) == len(self.cluster.nodes) else {}
            except OSError:
                states = {}
            if states and all(states.get(node, "").startswith("UP") for node in self.cluster.nodes):
                return
            if time.monotonic() > deadline:
                raise Failed(f"the fleet is not up after {within} s: serves healthy {healthy}, HAProxy {states}; "
                             f"job log:\n{self.job_log()}")
            time.sleep(1)

    def serve_pid(self, node):
        out = subprocess.run(["pgrep", "-f", f"agentvm-serve .*--node-id {node}( |$)"], stdout=subprocess.PIPE,
                             text=True)
        pids = [int(p) for p in out.stdout.split()]
        expect(len(pids) == 1, f"expected one serve of node {node}, found {pids}")
        return pids[0]

    def sandbox(self):
        return agentvm.Sandbox(url=self.url, token=self.token, timeout=900)


# --- the cases --------------------------------------------------------------------------------

def spread_and_state(fleet, kept):
    """30 sandboxes created at once through the front door spread over every node, and each keeps
    its state across calls."""
    with ThreadPoolExecutor(CREATES_AT_ONCE) as pool:
        sandboxes = list(pool.map(lambda _: fleet.sandbox(), range(CREATES_AT_ONCE)))
    kept.extend(sandboxes)
    counts = {node: 0 for node in fleet.cluster.nodes}
    for sb in sandboxes:
        counts[node_of(sb.sandbox_id)] += 1
    expect(all(count >= CREATES_AT_ONCE // 5 for count in counts.values()),
           f"every node gets at least a fifth: {counts}")

    def write_then_read(item):
        index, sb = item
        sb.commands.run(f"echo {index}-{sb.sandbox_id} > /tmp/state")
        return sb.commands.run("cat /tmp/state").stdout.strip() == f"{index}-{sb.sandbox_id}"
    with ThreadPoolExecutor(10) as pool:
        kept_state = list(pool.map(write_then_read, enumerate(sandboxes)))
    expect(all(kept_state), f"{kept_state.count(False)} sandboxes lost their state between calls")
    return f"{CREATES_AT_ONCE} at once: {counts}; each kept a file across calls"


def run_code_spreads(fleet, _kept):
    """SandboxFusion's /run_code through the front door: each answered, spread over the nodes."""
    def one(index):
        status, _, body = fleet.request("POST", "/run_code", {"code": f"print({index} * 2)", "language": "python",
                                                          "run_timeout": 120})
        expect(status == 200 and body.get("status") == "Success"
               and body["run_result"]["stdout"] == f"{index * 2}\n", f"/run_code {index}: {status} {body}")
        return node_of(body["executor_pod_name"])
    with ThreadPoolExecutor(5) as pool:
        nodes = list(pool.map(one, range(15)))
    counts = {node: nodes.count(node) for node in fleet.cluster.nodes}
    expect(all(counts.values()), f"every node ran some: {counts}")
    return f"15 /run_code, 5 at a time: {counts}"


E2B_SCRIPT = r"""
const { Sandbox } = require('e2b');
(async () => {
  const sbx = await Sandbox.create({ timeoutMs: 300000 });
  const run = await sbx.commands.run('echo through-the-front-door $((6 * 7))');
  await sbx.files.write('/tmp/e2b-note', 'kept');
  const note = await sbx.files.read('/tmp/e2b-note');
  const listed = [];
  for (const pages = Sandbox.list({ limit: 10 }); pages.hasNext;) listed.push(...(await pages.nextItems()).map((s) => s.sandboxId));
  const info = await sbx.getInfo();
  await sbx.kill();
  console.log(JSON.stringify({ id: sbx.sandboxId, stdout: run.stdout, note, listed, state: info.state }));
})().catch((e) => { console.error(e); process.exit(1); });
"""


def e2b_sdk_through_the_front_door(fleet, kept):
    """The official E2B SDK, unmodified, pointed at the front door as at one serve."""
    node_bin = subprocess.run(["bash", "-c", "source tests/e2b/node_env.sh && e2b_find_node"], cwd=REPO,
                              stdout=subprocess.PIPE, text=True).stdout.strip()
    expect(node_bin, "no Node.js for the E2B SDK: tests/e2b/install.sh (./setup.sh build) installs it")
    env = dict(os.environ, E2B_API_URL=fleet.url, E2B_SANDBOX_URL=fleet.url, E2B_API_KEY=fleet.token,
               NODE_PATH=os.path.join(REPO, "tests", "e2b", "node_modules"))
    env.pop("E2B_DOMAIN", None)
    env.pop("E2B_DEBUG", None)
    out = subprocess.run([node_bin, "-e", E2B_SCRIPT], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, timeout=300)
    expect(out.returncode == 0, f"the SDK's script failed: {out.stderr[-2000:]}")
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    expect(seen["stdout"] == "through-the-front-door 42\n", f"commands.run: {seen}")
    expect(seen["note"] == "kept" and seen["state"] == "running", f"files and getInfo: {seen}")
    others = {sb.sandbox_id for sb in kept}
    expect(seen["id"] in seen["listed"] and len(others & set(seen["listed"])) == len(others),
           f"Sandbox.list from the front door lists the whole fleet: {len(seen['listed'])} listed, "
           f"{len(others - set(seen['listed']))} of the native ones missing")
    return f"create, commands.run, files, getInfo, list ({len(seen['listed'])} across the fleet), kill on " \
        f"node {node_of(seen['id'])}"


def list_covers_the_fleet(fleet, kept):
    """The native list, answered by whichever node the front door picks, covers every node."""
    status, headers, body = fleet.request("GET", "/v1/sandboxes")
    expect(status == 200 and isinstance(body, dict) and isinstance(body.get("sandboxes"), list),
           f"list: {status} {str(body)[:300]}")
    expect(not body.get("unreached"), f"nodes unreached: {body.get('unreached')}")
    listed = {entry["id"] for entry in body["sandboxes"]}
    missing = {sb.sandbox_id for sb in kept} - listed
    expect(not missing, f"{len(missing)} sandboxes missing from the fleet's list, e.g. {sorted(missing)[:3]}")
    expect("agentvm-unreached-nodes" not in headers, f"a node unreached: {headers}")
    return f"{len(listed)} listed, every node's"


def idempotent_create(fleet, _kept):
    """A create repeated with one Idempotency-Key through the front door yields one sandbox."""
    key = secrets.token_hex(16)
    answers = [fleet.request("POST", "/v1/sandboxes", {}, headers={"Idempotency-Key": key}) for _ in range(3)]
    expect(all(status == 201 for status, _, _ in answers), f"creates: {[a[0] for a in answers]} {answers[0][2]}")
    ids = {body["id"] for _, _, body in answers}
    expect(len(ids) == 1, f"three creates with one key made {ids}")
    replayed = [headers.get("idempotent-replayed") for _, headers, _ in answers[1:]]
    expect(replayed == ["true", "true"], f"the repeats say they are replays: {replayed}")
    (only,) = ids
    fleet.request("DELETE", f"/v1/sandboxes/{only}")
    return f"3 creates, one sandbox {only}"


def drain_takes_no_new_creates(fleet, kept):
    """A node's serve drained with SIGTERM takes no new creates while its sandboxes finish their
    calls; then Slurm's job starts it again."""
    node = fleet.cluster.nodes[1]
    victim = next(sb for sb in kept if node_of(sb.sandbox_id) == node)
    with ThreadPoolExecutor(1) as pool:
        long_call = pool.submit(victim.commands.run, "sleep 8; echo finished")
        time.sleep(2)  # the call is running on the node
        os.kill(fleet.serve_pid(node), signal.SIGTERM)
        time.sleep(1.5)  # the agent-check answers drain at its next poll
        created = [fleet.request("POST", "/v1/sandboxes", {}) for _ in range(6)]
        result = long_call.result(timeout=120)
    expect(result.stdout == "finished\n", f"the draining node's call: {result}")
    expect(all(status == 201 for status, _, _ in created), f"creates while a node drains: {[c[0] for c in created]}")
    landed = [node_of(body["id"]) for _, _, body in created]
    expect(node not in landed, f"a create landed on the draining node: {landed}")
    for _, _, body in created:
        fleet.request("DELETE", f"/v1/sandboxes/{body['id']}")
    kept[:] = [sb for sb in kept if node_of(sb.sandbox_id) != node]  # drained: they ended
    deadline = time.monotonic() + 120
    while not fleet.node_healthy(node):
        expect(time.monotonic() < deadline, f"Slurm's job did not start {node}'s serve again within 120 s: "
                                            f"{fleet.job_log()}")
        time.sleep(1)
    return f"{node}: its call finished while 6 creates went to {sorted(set(landed))}; serve back"


def kill_9_and_back(fleet, kept):
    """A node whose serve is killed with kill -9 is out of HAProxy within 5 s; its sandboxes
    answer sandbox_lost, the others are untouched, creates keep succeeding, and once Slurm's
    job has started its serve again it takes creates again."""
    node = fleet.cluster.nodes[2]
    lost = [sb for sb in kept if node_of(sb.sandbox_id) == node]
    others = [sb for sb in kept if node_of(sb.sandbox_id) != node]
    expect(lost and others, f"sandboxes on {node} and elsewhere: {len(lost)}, {len(others)}")
    killed_at = time.monotonic()
    os.kill(fleet.serve_pid(node), signal.SIGKILL)
    out_after = None
    failures = []
    creates = 0
    while time.monotonic() - killed_at < 8:
        status, _, body = fleet.request("POST", "/v1/sandboxes", {})
        creates += 1
        if status != 201:
            failures.append(status)
        else:
            fleet.request("DELETE", f"/v1/sandboxes/{body['id']}")
        if out_after is None and not fleet.server_states().get(node, "").startswith("UP"):
            out_after = time.monotonic() - killed_at
    expect(out_after is not None and out_after <= 5, f"HAProxy took {node} out after {out_after} s")
    expect(not failures, f"creates failed after the kill: {failures} of {creates}")
    for sb in lost[:3]:
        try:
            sb.commands.run("true")
            raise Failed(f"{sb.sandbox_id} on the killed node answered")
        except agentvm.SandboxLost as e:
            expect(e.node == node, f"SandboxLost names node {e.node}, not {node}")
    for sb in others[:6]:
        expect(sb.sandbox_id in sb.commands.run("cat /tmp/state").stdout, f"{sb.sandbox_id} lost its state")
    deadline = time.monotonic() + 120
    while not fleet.node_healthy(node):
        expect(time.monotonic() < deadline, f"Slurm's job did not start {node}'s serve again within 120 s: "
                                            f"{fleet.job_log()}")
        time.sleep(1)
    while not fleet.server_states().get(node, "").startswith("UP"):
        expect(time.monotonic() < deadline, f"HAProxy did not take {node} back: {fleet.server_states()}")
        time.sleep(0.5)
    back_at = time.monotonic() - killed_at
    # Asked afresh (a client that saw SandboxLost answers it again without asking): the node's
    # new serve knows the id as one of the serve before it.
    status, _, body = fleet.request("GET", f"/v1/sandboxes/{lost[0].sandbox_id}")
    expect(status == 410 and body.get("error") == "sandbox_lost" and body.get("node") == node
           and "restarted" in body.get("message", ""), f"after the restart, the lost sandbox: {status} {body}")
    landed = []
    deadline = time.monotonic() + 60
    while node not in landed:
        expect(time.monotonic() < deadline, f"no create reached {node} after it came back: {landed}")
        status, _, body = fleet.request("POST", "/v1/sandboxes", {})
        expect(status == 201, f"create: {status} {body}")
        landed.append(node_of(body["id"]))
        fleet.request("DELETE", f"/v1/sandboxes/{body['id']}")
    kept[:] = others
    return f"out of HAProxy after {out_after:.1f} s, {creates} creates meanwhile all 201; {len(lost)} sandboxes " \
        f"SandboxLost; serve back after {back_at:.0f} s, create #{len(landed)} landed there"


CASES = [spread_and_state, run_code_spreads, e2b_sdk_through_the_front_door, list_covers_the_fleet,
         idempotent_create, drain_takes_no_new_creates, kill_9_and_back]


def write_tap(path, results):
    with open(path, "w") as f:
        f.write("TAP version 13\n")
        for number, (name, ok) in enumerate(results, start=1):
            f.write(f"{'ok' if ok else 'not ok'} {number} - {name}\n")
        f.write(f"1..{len(results)}\n")
        passed = sum(ok for _, ok in results)
        f.write(f"# pass {passed}\n# fail {len(results) - passed}\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tap", required=True)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="agentvm-fleet-")
    cluster = SlurmCluster(os.path.join(root, "slurm"))
    results = []
    kept = []
    try:
        up = time.monotonic()
        cluster.start()
        fleet = Fleet(cluster, root)
        fleet.submit()
        fleet.wait_ready(within=int(os.environ.get("FLEET_UP_WITHIN", "300")))
        print(f"fleet up in {time.monotonic() - up:.0f} s: Slurm job {fleet.job}, HAProxy at {fleet.url}", flush=True)
        for case in CASES:
            results.append((case.__name__, run_case(case.__name__, case, fleet, kept)))
    except Exception as e:  # the cluster itself failed: every case that did not run fails
        print(f"FAIL fleet set-up: {e}\n{cluster.logs()}", flush=True)
        done = {name for name, _ in results}
        results += [(case.__name__, False) for case in CASES if case.__name__ not in done]
    finally:
        for sb in kept:
            try:
                sb.kill()
            except agentvm.AgentvmError:
                pass
        cluster.stop()
        leftovers = subprocess.run(["pgrep", "-f", "agentvm-serve .*--node-id h[0-9]|^[^ ]*/agentvm |haproxy"],
                                   stdout=subprocess.PIPE, text=True).stdout.split()
        results.append(("nothing_left_behind", not leftovers))
        print(("ok" if not leftovers else "FAIL") + f" nothing_left_behind: serve, agentvm or haproxy processes left: {leftovers}",
              flush=True)
        if all(ok for _, ok in results):
            cluster.remove()
        else:
            print(cluster.logs(), flush=True)
    write_tap(args.tap, results)
    sys.exit(0 if all(ok for _, ok in results) else 1)


if __name__ == "__main__":
    main()
