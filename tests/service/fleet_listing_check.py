#!/usr/bin/env python3
"""Fleet-wide listing (docs/api.md, "Listing across a fleet") without VMs: three serves
`--node-id n1..n3` on loopback ports, each given all three as `--peer` (its own entry skipped),
with fake_episode.py standing in for `agentvm episode`.

usage: fleet_listing_check.py AGENTVM_SERVE_BINARY
Prints "ok <case>: <what was seen>" or "FAIL <case>: <why>" per case; exits non-zero if any
failed. Checks that the native list (GET /v1/sandboxes) and E2B's (GET /v2/sandboxes) asked of
any node hold every node's sandboxes, that E2B's filters and paging hold across nodes, that
`Agentvm-List-Scope: node` keeps a list to its node, that a killed node is named in
`Agentvm-Unreached-Nodes` (and the native body's "unreached") while the answer stays 200, and
that peers answering garbage, a huge body, JSON nested too deep, the wrong shape or an error,
or nothing at all, are each named without harming the answer or serve.
"""
import http.client
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "vm"))
sys.path.insert(0, HERE)
from checks import expect, run_case  # noqa: E402
from serve_client import Serve, call, free_port  # noqa: E402

SERVE = sys.argv[1]
TMP = tempfile.mkdtemp(prefix="agentvm-fleet-")
TOKEN = "fleet-check-token"
NATIVE = {"Authorization": f"Bearer {TOKEN}"}
E2B = {"X-API-KEY": TOKEN, "Content-Type": "application/json"}
NODES = ["n1", "n2", "n3"]
UNREACHED = "agentvm-unreached-nodes"


class Node:
    def __init__(self, name, port, peers, bin_dir, token_file):
        self.name = name
        self.port = port
        args = ["--node-id", name, "--listen", f"tcp:127.0.0.1:{port}", "--token-file", token_file,
                "--pool", "default=0"]
        for peer in peers:
            args += ["--peer", peer]
        # TMPDIR: what a node killed with SIGKILL leaves (its VMs' socket directory) goes with TMP.
        self.serve = Serve(os.path.join(bin_dir, "agentvm-serve"), *args, log_level="info",
                           log_path=os.path.join(TMP, f"{name}.log"), env=dict(os.environ, TMPDIR=TMP))
        self.serve.wait_listening(self.http)

    def http(self, timeout=30):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def get(self, path, headers=None):
        status, hdrs, data = call(self.http(), "GET", path, headers=headers or NATIVE)
        return status, {k.lower(): v for k, v in hdrs.items()}, data

    def native_create(self):
        status, _, data = call(self.http(), "POST", "/v1/sandboxes", body=b"{}",
                               headers={**NATIVE, "Content-Type": "application/json"})
        expect(status == 201, f"{self.name}: native create answered {status}: {data[:300]!r}")
        return json.loads(data)["id"]

    def e2b_create(self, metadata=None):
        body = {"templateID": "base", "timeout": 300}
        if metadata:
            body["metadata"] = metadata
        status, _, data = call(self.http(), "POST", "/v2/sandboxes", body=json.dumps(body).encode(), headers=E2B)
        expect(status == 201, f"{self.name}: E2B create answered {status}: {data[:300]!r}")
        return json.loads(data)["sandboxID"]

    def native_list(self, headers=None):
        status, hdrs, data = self.get("/v1/sandboxes", headers)
        expect(status == 200, f"{self.name}: GET /v1/sandboxes answered {status}: {data[:300]!r}")
        doc = json.loads(data)
        return [s["id"] for s in doc["sandboxes"]], doc, hdrs

    def e2b_list(self, query=""):
        status, hdrs, data = self.get("/v2/sandboxes" + query, {"X-API-KEY": TOKEN})
        expect(status == 200, f"{self.name}: GET /v2/sandboxes{query} answered {status}: {data[:300]!r}")
        doc = json.loads(data)
        expect(isinstance(doc, list), f"{self.name}: E2B's list is not an array: {data[:200]!r}")
        return doc, hdrs


FLEET = {}        # name -> Node
CREATED = {}      # name -> [ids]
TAGGED = []       # the E2B sandbox with metadata team=blue


def all_ids():
    return sorted(i for ids in CREATED.values() for i in ids)


def fleet_lists_everything():
    for name, node in FLEET.items():
        CREATED[name] = [node.native_create(), node.native_create(), node.e2b_create()]
    TAGGED.append(FLEET["n2"].e2b_create({"team": "blue"}))
    CREATED["n2"].append(TAGGED[0])
    for ids in CREATED.values():
        expect(len(set(i.split("-")[0] for i in ids)) == 1, f"ids of one node name two: {ids}")
    for name, node in FLEET.items():
        ids, doc, hdrs = node.native_list()
        expect(sorted(ids) == all_ids(), f"{name}'s native list {sorted(ids)} != the fleet's {all_ids()}")
        expect(len(ids) == len(set(ids)), f"{name}'s native list repeats ids: {ids}")
        expect(doc.get("unreached") == [], f"{name}: unreached {doc.get('unreached')!r} with every node up")
        expect(UNREACHED not in hdrs, f"{name}: {UNREACHED} with every node up: {hdrs.get(UNREACHED)}")
        entries, hdrs = node.e2b_list()
        listed = sorted(e["sandboxID"] for e in entries)
        expect(listed == all_ids(), f"{name}'s E2B list {listed} != the fleet's {all_ids()}")
        expect(UNREACHED not in hdrs, f"{name}: E2B list has {UNREACHED}: {hdrs.get(UNREACHED)}")
        starts = [e["startedAt"] for e in entries]
        expect(starts == sorted(starts, reverse=True), f"{name}: E2B's default order is not newest first: {starts}")
    return f"{len(all_ids())} sandboxes on 3 nodes, all in every node's native and E2B list"


def node_scope_stays_local():
    for name, node in FLEET.items():
        ids, doc, _ = node.native_list({**NATIVE, "Agentvm-List-Scope": "node"})
        expect(sorted(ids) == sorted(CREATED[name]), f"{name} scope=node listed {ids}, not {CREATED[name]}")
        expect("unreached" not in doc, f"{name}: a node-scoped list has 'unreached': {doc}")
        status, _, data = node.get("/v2/sandboxes", {"X-API-KEY": TOKEN, "Agentvm-List-Scope": "node"})
        listed = sorted(e["sandboxID"] for e in json.loads(data))
        expect(status == 200 and listed == sorted(CREATED[name]), f"{name} E2B scope=node: {status} {listed}")
    return "Agentvm-List-Scope: node answers each node's own sandboxes alone"


def e2b_paging_across_nodes():
    for order in ("desc", "asc"):
        seen, token, pages = [], None, 0
        while True:
            query = f"?limit=3&order={order}" + (f"&nextToken={urllib.parse.quote(token)}" if token else "")
            entries, hdrs = FLEET["n3"].e2b_list(query)
            expect(len(entries) <= 3, f"a page of limit 3 has {len(entries)}")
            seen += entries
            pages += 1
            token = hdrs.get("x-next-token")
            expect(pages <= 10, "paging does not end")
            if not token:
                break
            expect(len(entries) == 3, f"a page with a next token has {len(entries)} entries, not 3")
        ids = [e["sandboxID"] for e in seen]
        expect(sorted(ids) == all_ids(), f"{order}: pages of 3 gave {sorted(ids)}, not {all_ids()}")
        keys = [(e["startedAt"], e["sandboxID"]) for e in seen]
        expect(keys == sorted(keys, reverse=order == "desc"), f"{order}: the pages are not in order: {keys}")
    # The SDK's metadata filter: form-encoded, then encoded once more.
    entries, _ = FLEET["n1"].e2b_list("?metadata=" + urllib.parse.quote(urllib.parse.urlencode({"team": "blue"})))
    expect([e["sandboxID"] for e in entries] == TAGGED, f"metadata team=blue from n1 gave {entries}, not {TAGGED}")
    entries, _ = FLEET["n1"].e2b_list("?state=paused")
    expect(entries == [], f"state=paused listed {entries}")
    return f"{len(all_ids())} sandboxes paged 3 at a time from n3 in both orders; n2's metadata filter from n1"


def credentials_are_checked():
    status, _, _ = FLEET["n1"].get("/v1/sandboxes", {"Authorization": "Bearer wrong"})
    expect(status == 401, f"a wrong token listed: {status}")
    status, _, _ = FLEET["n1"].get("/v2/sandboxes", {"X-API-KEY": "wrong"})
    expect(status == 401, f"a wrong API key listed: {status}")
    return "a wrong token is refused at the door, not sent on"


def dead_node_is_reported():
    FLEET["n3"].serve.proc.kill()
    FLEET["n3"].serve.proc.wait()
    for name in ("n1", "n2"):
        started = time.monotonic()
        ids, doc, hdrs = FLEET[name].native_list()
        took = time.monotonic() - started
        expect(took < 3, f"{name}'s list took {took:.1f} s with n3 dead")
        alive = sorted(CREATED["n1"] + CREATED["n2"])
        expect(sorted(ids) == alive, f"{name}'s list with n3 dead: {sorted(ids)}, not {alive}")
        expect([u["node"] for u in doc["unreached"]] == ["n3"], f"{name}: unreached {doc['unreached']}")
        expect(hdrs.get(UNREACHED, "").startswith("n3 (could not connect)"),
               f"{name}: {UNREACHED} is {hdrs.get(UNREACHED)!r}")
        entries, hdrs = FLEET[name].e2b_list()
        expect(sorted(e["sandboxID"] for e in entries) == alive, f"{name}'s E2B list with n3 dead: {entries}")
        expect(hdrs.get(UNREACHED, "").startswith("n3 ("), f"{name}: E2B {UNREACHED} is {hdrs.get(UNREACHED)!r}")
    log = FLEET["n1"].serve.log()
    expect("node n3 is missing from the answer" in log, "no warning logged for n3")
    return f"n3 killed: n1 and n2 answer 200 with their {len(alive)} sandboxes, n3 named (could not connect)"


class BadPeer(threading.Thread):
    """A peer that answers every request the same bad way."""

    def __init__(self, how):
        super().__init__(daemon=True)
        self.how = how
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.held = []

    def run(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.answer, args=(conn,), daemon=True).start()

    def answer(self, conn):
        try:
            conn.settimeout(30)
            data = b""
            while b"\r\n\r\n" not in data:
                piece = conn.recv(4096)
                if not piece:
                    return
                data += piece
            if self.how == "hang":
                self.held.append(conn)
                return
            if self.how == "huge":
                body = b"[" + b" " * (17 << 20) + b"]"
            elif self.how == "huge_chunked":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
                chunk = b" " * (1 << 20)
                for _ in range(20):
                    conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                conn.sendall(b"0\r\n\r\n")
                return
            elif self.how == "garbage":
                body = b"this is not JSON"
            elif self.how == "deep":
                body = b"[" * 200 + b"]" * 200
            elif self.how == "shape":
                body = b'{"sandboxes": 5}'
            else:  # "refuse": an error status
                status = b"HTTP/1.1 401 Unauthorized\r\n"
                conn.sendall(status + b"Content-Length: 2\r\nContent-Type: application/json\r\n\r\n{}")
                return
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
                         + body)
        except OSError:
            pass
        finally:
            if self.how != "hang":
                conn.close()


def hostile_peers_are_reported(bin_dir, token_file):
    hows = ["garbage", "huge", "huge_chunked", "hang", "deep", "shape", "refuse"]
    bad = {how: BadPeer(how) for how in hows}
    for peer in bad.values():
        peer.start()
    peers = [f"{how.replace('_', '-')}=http://127.0.0.1:{peer.port}" for how, peer in bad.items()]
    peers.append(f"n1=http://127.0.0.1:{FLEET['n1'].port}")
    peers.append(f"gone=http://127.0.0.1:{free_port()}")
    node = Node("h1", free_port(), peers, bin_dir, token_file)
    try:
        own = node.native_create()
        for what in ("native", "e2b"):
            started = time.monotonic()
            if what == "native":
                ids, doc, hdrs = node.native_list()
                problems = {u["node"]: u["problem"] for u in doc["unreached"]}
            else:
                entries, hdrs = node.e2b_list()
                ids = [e["sandboxID"] for e in entries]
                problems = {}
            took = time.monotonic() - started
            expect(took < 8, f"{what}: the list took {took:.1f} s (a peer's bound is 5 s)")
            expected_ids = sorted([own] + CREATED["n1"])
            expect(sorted(ids) == expected_ids, f"{what}: listed {sorted(ids)}, not {expected_ids}")
            header = hdrs.get(UNREACHED, "")
            named = dict(part.split(" (", 1) for part in header.split("; ")) if header else {}
            expect(sorted(named) == sorted([p.split("=")[0] for p in peers if not p.startswith("n1=")]),
                   f"{what}: {UNREACHED} names {sorted(named)}: {header!r}")
            if what == "native":
                expect(problems == {k: v[:-1] for k, v in named.items()}, f"body {problems} != header {named}")
            for name, needle in [("garbage", "not JSON"), ("huge", "larger than 16 MiB"),
                                 ("huge-chunked", "larger than 16 MiB"), ("hang", "no whole answer within 5 s"),
                                 ("deep", "deeper than"), ("shape", "not a list of sandboxes"),
                                 ("refuse", "HTTP 401"), ("gone", "could not connect")]:
                expect(needle in named.get(name, ""), f"{what}: {name} is reported as {named.get(name)!r}, "
                                                      f"not with {needle!r}")
        status, _, _ = call(node.http(), "GET", "/healthz", headers=NATIVE)
        expect(node.serve.proc.poll() is None and status in (200, 503), f"h1 after the hostile peers: {status}")
    finally:
        node.serve.stop()
        for peer in bad.values():
            peer.sock.close()
            for conn in peer.held:
                conn.close()
    return "garbage, 17 MiB (sized and chunked), a hang, 200 levels deep, the wrong shape, a 401 and a dead " \
           "port each named with its problem; the answer 200 with the good peer's sandboxes, within 8 s"


def main():
    bin_dir = os.path.join(TMP, "bin")
    os.mkdir(bin_dir)
    try:
        os.link(SERVE, os.path.join(bin_dir, "agentvm-serve"))
    except OSError:
        shutil.copy2(SERVE, os.path.join(bin_dir, "agentvm-serve"))
    with open(os.path.join(bin_dir, "agentvm"), "w") as f:
        f.write(f"#!/bin/sh\nexec {sys.executable} {os.path.join(HERE, 'fake_episode.py')} \"$@\"\n")
    os.chmod(os.path.join(bin_dir, "agentvm"), 0o755)
    token_file = os.path.join(TMP, "token")
    with open(token_file, "w") as f:
        f.write(TOKEN + "\n")
    os.chmod(token_file, 0o600)
    ports = {name: free_port() for name in NODES}
    peers = [f"{name}=http://127.0.0.1:{port}" for name, port in ports.items()]
    failed = 0
    try:
        for name in NODES:
            FLEET[name] = Node(name, ports[name], peers, bin_dir, token_file)
        for case in (fleet_lists_everything, node_scope_stays_local, e2b_paging_across_nodes,
                     credentials_are_checked, dead_node_is_reported):
            failed += not run_case(case.__name__, case)
        failed += not run_case("hostile_peers_are_reported", hostile_peers_are_reported, bin_dir, token_file)
    finally:
        for node in FLEET.values():
            node.serve.stop()
        if failed:
            for node in FLEET.values():
                print(f"--- {node.name}'s log:\n{node.serve.log()[-3000:]}", file=sys.stderr)
        shutil.rmtree(TMP, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
