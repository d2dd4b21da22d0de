#!/usr/bin/env python3
"""serve's Idempotency-Key on creates (docs/api.md, "Idempotent creates"; docs/e2b.md), with a
fake episode and no VMs: one sandbox per key however often, and however concurrently, a create
is sent; repeats answered with it and `Idempotent-Replayed: true`; another body under a key 422
idempotency_conflict; a malformed key 400; a refused create (429) not remembered; a creator that
went away leaving its sandbox to a repeat that waited, or to nobody; the native fork; E2B's
create, whose keys are apart from the native API's.

usage: idempotency_check.py AGENTVM_SERVE_BINARY
Prints "ok <case>: <what was seen>" or "FAIL <case>: <why>" per case; exits non-zero if any
failed. serve runs with --pool default=0 (every create starts a VM: the fake's, ready after
1 s) and --max-sandboxes 4, from a copy of its binary beside the fake as its `agentvm`.
"""
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "vm"))
from checks import expect, run_case  # noqa: E402
from serve_client import Serve, UnixConnection, call  # noqa: E402

SERVE = sys.argv[1]
TMP = tempfile.mkdtemp(prefix="agentvm-idempotency-")
SOCKET = os.path.join(TMP, "serve.sock")
MAX_SANDBOXES = 4

# The episode: ready 1 s after its start (long enough for a repeat to come while a create
# runs); snapshot writes the directory it is asked for into its outbox; any call is answered ok.
FAKE = r'''
import json, os, signal, sys, time

args = sys.argv[1:]
outbox = args[args.index("--snapshot-dir") + 1] if "--snapshot-dir" in args else None
time.sleep(1.0)

def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()

signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
send({"event": "ready", "restored": "--snapshot" in args})
for line in sys.stdin:
    request = json.loads(line)
    if request.get("op") == "snapshot":
        os.makedirs(os.path.join(outbox, request["name"]))
        with open(os.path.join(outbox, request["name"], "manifest.json"), "w") as f:
            f.write("{}")
        send({"id": request["id"], "snapshot": {"path": os.path.join(outbox, request["name"])}})
    else:
        send({"id": request["id"], "ok": True})
'''


def request(method, path, body=None, key=None, timeout=60):
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    data = None if body is None else json.dumps(body).encode()
    status, head, answer = call(UnixConnection(SOCKET, timeout=timeout), method, path, data, headers)
    return status, {name.lower(): value for name, value in head.items()}, answer


def replayed(head):
    return head.get("idempotent-replayed")


def listed():
    _, _, data = call(UnixConnection(SOCKET), "GET", "/v1/sandboxes")
    return {sandbox["id"] for sandbox in json.loads(data)["sandboxes"]}


def delete_all():
    for sandbox in listed():
        call(UnixConnection(SOCKET), "DELETE", f"/v1/sandboxes/{sandbox}")
    deadline = time.monotonic() + 20
    while listed():
        expect(time.monotonic() < deadline, f"sandboxes left: {listed()}")
        time.sleep(0.1)


def at_once(*calls):
    """Runs each call on its own thread, the second 0.2 s after the first (so that the first is
    the one that runs); returns their results in order."""
    results = [None] * len(calls)

    def run(i, fn):
        try:
            results[i] = fn()
        except Exception as e:  # noqa: BLE001 - reported as the case's failure below
            results[i] = e

    threads = []
    for i, fn in enumerate(calls):
        threads.append(threading.Thread(target=run, args=(i, fn)))
        threads[-1].start()
        time.sleep(0.2)
    for thread in threads:
        thread.join(60)
    for result in results:
        expect(not isinstance(result, Exception) and result is not None, f"a request failed: {result!r}")
    return results


def new_key():
    return "test-" + uuid.uuid4().hex


def concurrent_creates():
    key = new_key()
    body = {"metadata": {"case": "concurrent"}}
    first, second = at_once(lambda: request("POST", "/v1/sandboxes", body, key),
                            lambda: request("POST", "/v1/sandboxes", body, key))
    expect(first[0] == 201 and second[0] == 201, f"statuses: {first[0]} {first[2][:300]!r}, {second[0]} {second[2][:300]!r}")
    ids = {json.loads(first[2])["id"], json.loads(second[2])["id"]}
    expect(len(ids) == 1, f"two creates under one key made {ids}")
    expect(replayed(first[1]) is None and replayed(second[1]) == "true",
           f"Idempotent-Replayed: first {replayed(first[1])!r}, repeat {replayed(second[1])!r}")
    expect(listed() == ids, f"listed: {listed()}, answered: {ids}")
    delete_all()
    return f"two creates 0.2 s apart under one key: one sandbox {ids.pop()}, the repeat marked replayed"


def sequential_repeat_and_conflict():
    key = new_key()
    body = {"metadata": {"case": "sequential"}, "timeout": 120}
    status, head, data = request("POST", "/v1/sandboxes", body, key)
    expect(status == 201 and replayed(head) is None, f"first: {status} {replayed(head)!r} {data[:300]!r}")
    sandbox = json.loads(data)
    # The same body in another key order and spacing is the same request.
    status, head, data = call(UnixConnection(SOCKET), "POST", "/v1/sandboxes",
                              b'{ "timeout": 120,  "metadata": {"case": "sequential"} }',
                              {"Idempotency-Key": key})
    again = json.loads(data)
    expect(status == 201 and head.get("Idempotent-Replayed") == "true", f"repeat: {status} {head} {data[:300]!r}")
    expect(again["id"] == sandbox["id"] and set(again) == set(sandbox) and again["state"] == "running",
           f"repeat answered {again}, first {sandbox}")
    status, head, data = request("POST", "/v1/sandboxes", {"metadata": {"case": "other"}}, key)
    expect(status == 422 and json.loads(data)["error"] == "idempotency_conflict",
           f"another body: {status} {data[:300]!r}")
    status, _, data = request("POST", f"/v1/sandboxes/{sandbox['id']}/fork", {"count": 1}, key)
    expect(status == 422 and json.loads(data)["error"] == "idempotency_conflict",
           f"a fork under a create's key: {status} {data[:300]!r}")
    expect(listed() == {sandbox["id"]}, f"listed: {listed()}")
    # Once the sandbox has ended, a repeat is answered as a GET of it would be.
    call(UnixConnection(SOCKET), "DELETE", f"/v1/sandboxes/{sandbox['id']}")
    status, head, data = request("POST", "/v1/sandboxes", body, key)
    expect(status == 404 and json.loads(data)["error"] == "not_found" and sandbox["id"] in json.loads(data)["message"]
           and replayed(head) == "true", f"a repeat after its sandbox ended: {status} {head} {data[:300]!r}")
    delete_all()
    return "a repeat answered 201 with the same id and replayed; another body and a fork 422 " \
           "idempotency_conflict; after a delete 404 naming the id"


def malformed_keys():
    seen = []
    for key, what in (("k" * 256, "256 characters"), ("", "empty")):
        status, _, data = request("POST", "/v1/sandboxes", {}, key)
        answer = json.loads(data)
        expect(status == 400 and answer["error"] == "bad_field" and "Idempotency-Key" in answer["message"],
               f"{what}: {status} {data[:300]!r}")
        seen.append(what)
    status, head, data = request("POST", "/v1/sandboxes", {}, "k" * 255)
    expect(status == 201 and replayed(head) is None, f"255 characters: {status} {data[:300]!r}")
    expect(len(listed()) == 1, f"listed: {listed()}")
    delete_all()
    return f"{' and '.join(seen)} keys 400 bad_field naming the header; 255 characters taken"


def refusal_not_remembered():
    fillers = []
    for _ in range(MAX_SANDBOXES):
        status, _, data = request("POST", "/v1/sandboxes", {})
        expect(status == 201, f"filling: {status} {data[:300]!r}")
        fillers.append(json.loads(data)["id"])
    key = new_key()
    status, head, data = request("POST", "/v1/sandboxes", {}, key)
    expect(status == 429 and json.loads(data)["error"] == "at_capacity", f"when full: {status} {data[:300]!r}")
    call(UnixConnection(SOCKET), "DELETE", f"/v1/sandboxes/{fillers[0]}")
    status, head, data = request("POST", "/v1/sandboxes", {}, key)
    expect(status == 201 and replayed(head) is None, f"the repeat after the 429: {status} {head} {data[:300]!r}")
    made = json.loads(data)["id"]
    expect(made not in fillers and made in listed(), f"made {made}; listed {listed()}")
    status, head, data = request("POST", "/v1/sandboxes", {}, key)
    expect(status == 201 and json.loads(data)["id"] == made and replayed(head) == "true",
           f"the next repeat: {status} {head} {data[:300]!r}")
    delete_all()
    return f"429 at_capacity, then (one freed) the repeat made {made}, replayed after"


def creator_gone():
    key = new_key()
    body = {"metadata": {"case": "gone"}}
    gone = UnixConnection(SOCKET)
    gone.request("POST", "/v1/sandboxes", body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json", "Idempotency-Key": key})
    time.sleep(0.2)

    def repeat():
        return request("POST", "/v1/sandboxes", body, key)

    def close_first():
        gone.close()
        return True

    # The repeat waits for the first, whose client then leaves before the VM is ready.
    (status, head, data), _ = at_once(repeat, close_first)
    expect(status == 201 and replayed(head) == "true", f"the repeat that waited: {status} {head} {data[:300]!r}")
    taken = json.loads(data)["id"]
    time.sleep(1)
    expect(listed() == {taken}, f"the repeat got {taken}; listed {listed()}")
    delete_all()

    # Nobody waits: the sandbox is deleted, and the key forgotten.
    key = new_key()
    gone = UnixConnection(SOCKET)
    gone.request("POST", "/v1/sandboxes", body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json", "Idempotency-Key": key})
    time.sleep(0.2)
    gone.close()
    time.sleep(2.5)
    expect(not listed(), f"a create whose client left, with nobody waiting, left {listed()}")
    status, head, data = request("POST", "/v1/sandboxes", body, key)
    expect(status == 201 and replayed(head) is None, f"a repeat after that: {status} {head} {data[:300]!r}")
    delete_all()
    return f"a repeat waiting when the first's client left got {taken}; with nobody waiting none " \
           "was left and a repeat made a new one"


def fork_once():
    status, _, data = request("POST", "/v1/sandboxes", {})
    expect(status == 201, f"parent: {status} {data[:300]!r}")
    parent = json.loads(data)["id"]
    key = new_key()
    path = f"/v1/sandboxes/{parent}/fork"
    first, second = at_once(lambda: request("POST", path, {"count": 2}, key),
                            lambda: request("POST", path, {"count": 2}, key))
    expect(first[0] == 201 and second[0] == 201, f"forks: {first[0]} {first[2][:300]!r}, {second[0]} {second[2][:300]!r}")
    children = [s["id"] for s in json.loads(first[2])["sandboxes"]]
    expect([s["id"] for s in json.loads(second[2])["sandboxes"]] == children and replayed(second[1]) == "true",
           f"the repeat: {second[2][:300]!r} {second[1]}")
    expect(listed() == {parent, *children}, f"listed {listed()}, parent {parent}, children {children}")
    call(UnixConnection(SOCKET), "DELETE", f"/v1/sandboxes/{children[0]}")
    status, head, data = request("POST", path, {"count": 2}, key)
    states = [(s["id"], s["state"]) for s in json.loads(data)["sandboxes"]]
    expect(status == 201 and replayed(head) == "true" and states == [(children[0], "ended"), (children[1], "running")],
           f"a repeat after a child's delete: {status} {states}")
    expect(len(listed()) == 2, f"listed: {listed()}")
    delete_all()
    return f"two forks of 2 under one key: children {children} once; a repeat lists the deleted one as ended"


def e2b_create():
    key = new_key()
    body = {"templateID": "base", "timeout": 120}
    first, second = at_once(lambda: request("POST", "/v2/sandboxes", body, key),
                            lambda: request("POST", "/v2/sandboxes", body, key))
    expect(first[0] == 201 and second[0] == 201, f"creates: {first[0]} {first[2][:300]!r}, {second[0]} {second[2][:300]!r}")
    made = json.loads(first[2])
    expect(json.loads(second[2])["sandboxID"] == made["sandboxID"] and replayed(second[1]) == "true"
           and replayed(first[1]) is None, f"the repeat: {second[1]} {second[2][:300]!r}")
    status, head, data = request("POST", "/v2/sandboxes", body, key)
    again = json.loads(data)
    expect(status == 201 and replayed(head) == "true" and again["sandboxID"] == made["sandboxID"]
           and set(again) == set(made) and again["envdAccessToken"] == made["envdAccessToken"],
           f"a later repeat: {status} {head} {data[:300]!r}")
    expect(listed() == {made["sandboxID"]}, f"listed: {listed()}")
    status, _, data = request("POST", "/v2/sandboxes", {"templateID": "base", "timeout": 60}, key)
    expect(status == 422 and json.loads(data)["code"] == 422, f"another body: {status} {data[:300]!r}")
    status, _, data = request("POST", "/v2/sandboxes", body, "k" * 256)
    expect(status == 400 and json.loads(data)["code"] == 400, f"a long key: {status} {data[:300]!r}")
    # The native API's keys are its own: the same text makes a sandbox of its own there.
    status, head, data = request("POST", "/v1/sandboxes", {}, key)
    expect(status == 201 and replayed(head) is None and json.loads(data)["id"] != made["sandboxID"],
           f"a native create under E2B's key: {status} {head} {data[:300]!r}")
    expect(len(listed()) == 2, f"listed: {listed()}")
    call(UnixConnection(SOCKET), "DELETE", f"/v1/sandboxes/{made['sandboxID']}")
    status, head, data = request("POST", "/v2/sandboxes", body, key)
    expect(status == 404 and json.loads(data)["code"] == 404 and replayed(head) == "true",
           f"a repeat after its sandbox ended: {status} {head} {data[:300]!r}")
    delete_all()
    return f"two E2B creates under one key made {made['sandboxID']} once; a later repeat the same body; " \
           "another body 422; a long key 400; the native API's key of the same text apart; 404 once ended"


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
                  "--max-sandboxes", str(MAX_SANDBOXES), "--mem-reserve", "0",
                  log_path=os.path.join(TMP, "serve.log"))
    failed = 0
    try:
        serve.wait_listening(lambda: UnixConnection(SOCKET))
        for case in (concurrent_creates, sequential_repeat_and_conflict, malformed_keys, refusal_not_remembered,
                     creator_gone, fork_once, e2b_create):
            failed += not run_case(case.__name__, case)
            try:
                delete_all()  # a failed case's sandboxes do not fail the next
            except Exception:  # noqa: BLE001
                pass
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
