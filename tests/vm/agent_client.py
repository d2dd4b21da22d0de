"""The host side of the guest agent (docs/protocol.md), for the vm-tier scripts: boot the
default guest, whose init starts the agent, and exchange JSON lines with it on vsock port 52
through agentvm's hybrid socket."""
import base64
import json
import os
import signal
import subprocess
import time

from hybrid_vsock import open_guest_port

AGENT_PORT = 52


class AgentError(Exception):
    """The guest or its agent did not answer as it should; the message says how."""


def boot(agentvm, tmp, *args):
    """Starts the default guest with its vsock host end and console in tmp, plus ARGS.

    Returns (process, socket path, console path). The init command only keeps the guest up
    until agentvm is stopped: the agent is what the scripts talk to.
    """
    uds = os.path.join(tmp, "v.sock")
    console = os.path.join(tmp, "console")
    proc = subprocess.Popen([agentvm, "--log-level", "warn", "boot", "--vsock-uds", uds,
                             "--console", console, "--init-cmd", "sleep 100000", *args],
                            stdin=subprocess.DEVNULL)
    return proc, uds, console


def stop_with_sigterm(proc):
    """SIGTERM to agentvm, as a user's ^C or a supervisor would send; returns whether it ended
    the way docs/cli.md says (128 + SIGTERM)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=120) == 128 + signal.SIGTERM


def connect(uds, proc):
    """A Client for the agent. It starts a moment after the guest's init, so this retries
    until its port answers (AgentError if agentvm exits first or it never does)."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AgentError(f"agentvm exited ({proc.returncode}) before the agent answered")
        try:
            s, line = open_guest_port(uds, AGENT_PORT)
            if line.startswith(b"OK "):
                return Client(s)
        except OSError:
            pass
        time.sleep(0.2)
    raise AgentError(f"the agent never answered on vsock port {AGENT_PORT}")


def field(msg, name):
    """A byte field in either spelling (plain UTF-8 or _b64)."""
    if name in msg:
        return msg[name].encode()
    return base64.b64decode(msg.get(name + "_b64", ""))


class Client:
    def __init__(self, sock):
        self.sock = sock
        self.buf = b""

    def send(self, obj):
        self.sock.sendall(json.dumps(obj).encode() + b"\n")

    def send_raw(self, line):
        self.sock.sendall(line)

    def message(self):
        """The next line from the agent, parsed: an event or a final response."""
        while b"\n" not in self.buf:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise AgentError("the agent closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def reply(self, rid):
        """The final line for request rid (events are skipped)."""
        while True:
            msg = self.message()
            if msg.get("id") == rid and "event" not in msg:
                return msg

    def call(self, obj):
        self.send(obj)
        return self.reply(obj["id"])
