#!/usr/bin/env python3
"""The guest agent inside a real guest, reached over vsock through agentvm's hybrid socket.

usage: agent_check.py AGENTVM_BINARY
Boots the default guest (whose init starts the agent by itself), connects to guest port 52
through "CONNECT 52", and runs tool calls (docs/protocol.md): exec with exit codes and
stderr, a persistent shell (cd/export carry over), a binary file written and read back,
a malformed line. Then SIGTERM ends the VM. Prints "agent ok" or exits non-zero with why.
"""
import base64
import hashlib
import os
import sys
import tempfile

from agent_client import AgentError, boot, connect, field, stop_with_sigterm

AGENTVM = sys.argv[1]


def fail(why, console=None):
    if console and os.path.exists(console):
        why += "\nconsole:\n" + open(console, errors="replace").read()[-2000:]
    sys.exit("agent_check: " + why)


with tempfile.TemporaryDirectory(prefix="agentvm-agent-") as tmp:
    proc, uds, console = boot(AGENTVM, tmp)
    try:
        c = connect(uds, proc)

        r = c.call({"id": 1, "op": "exec", "argv": ["uname", "-sr"]})
        if r.get("exit_code") != 0 or not field(r, "stdout").startswith(b"Linux 6.1"):
            fail(f"exec uname: {r}", console)

        r = c.call({"id": 2, "op": "exec", "argv": ["sh", "-c", "echo out; echo err >&2; exit 3"]})
        if (r.get("exit_code"), field(r, "stdout"), field(r, "stderr")) != (3, b"out\n", b"err\n"):
            fail(f"exec exit code and streams: {r}", console)

        c.call({"id": 3, "op": "shell", "cmd": "cd /tmp && export AGENT_CHECK=42"})
        r = c.call({"id": 4, "op": "shell", "cmd": "echo $PWD $AGENT_CHECK"})
        if field(r, "stdout") != b"/tmp 42\n":
            fail(f"shell state did not persist: {r}", console)

        blob = os.urandom(300000)
        r = c.call({"id": 5, "op": "write_file", "path": "/root/blob", "data_b64": base64.b64encode(blob).decode()})
        if r.get("ok") is not True or r.get("bytes") != len(blob):
            fail(f"write_file: {r}", console)
        c.send({"id": 6, "op": "read_file", "path": "/root/blob"})
        got = b""
        while True:
            msg = c.message()
            if msg.get("event") == "data":
                got += base64.b64decode(msg["data_b64"])
            elif msg.get("id") == 6:
                break
        if hashlib.sha256(got).digest() != hashlib.sha256(blob).digest():
            fail(f"read_file returned {len(got)} bytes that differ from the {len(blob)} written", console)

        c.send_raw(b"this is not json\n")
        msg = c.message()
        if msg.get("error", {}).get("code") != "bad_json":
            fail(f"malformed line answered with {msg}", console)
        r = c.call({"id": 7, "op": "exec", "argv": ["true"]})
        if r.get("exit_code") != 0:
            fail(f"the connection did not survive a malformed line: {r}", console)

        # A tool call that kills the agent itself: init restarts it and the next call works.
        c.send({"id": 8, "op": "exec", "argv": ["sh", "-c", "kill -9 $PPID"]})
        while c.sock.recv(1 << 16):
            pass
        c = connect(uds, proc)
        r = c.call({"id": 9, "op": "exec", "argv": ["echo", "back"]})
        if field(r, "stdout") != b"back\n":
            fail(f"no agent after it was killed: {r}", console)
    except AgentError as e:
        fail(str(e), console)
    finally:
        stopped = stop_with_sigterm(proc)
    if not stopped:
        fail(f"agentvm exited {proc.returncode} on SIGTERM", console)
    print("agent ok: exec, shell state, 300000-byte file round trip, malformed line, "
          "agent restarted after being killed, SIGTERM teardown")
