"""`agentvm episode` as a harness embeds it: a subprocess speaking JSON lines on its stdin and
stdout (docs/protocol.md). A reader thread collects every line, so tests can pipeline
requests, read answers in any order, and see what arrives after the process ends."""
import json
import queue
import subprocess
import threading
import time


class EpisodeError(Exception):
    """The episode did not answer as it should; the message says how."""


class Episode:
    def __init__(self, agentvm, *args, console=None):
        cmd = [agentvm, "--log-level", "warn", "episode", *args]
        self.console = console
        if console:
            cmd += ["--console", console]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self.lines = queue.Queue()
        self.stderr = b""
        self.by_id = {}  # id -> list of messages not yet taken
        self.next_id = 0
        threading.Thread(target=self._read_stdout, daemon=True).start()
        self.stderr_reader = threading.Thread(target=self._read_stderr, daemon=True)
        self.stderr_reader.start()

    def _read_stdout(self):
        for raw in self.proc.stdout:
            self.lines.put(raw)
        self.lines.put(None)

    def _read_stderr(self):
        self.stderr = self.proc.stderr.read()

    def send_raw(self, data):
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except BrokenPipeError:
            # The episode has ended: say why, in its own words, rather than only that it did.
            code = self.proc.wait(10)
            self.stderr_reader.join(5)  # its last words, which say why
            raise BrokenPipeError(f"the episode exited {code} before this request: "
                                  f"{self.stderr.decode(errors='replace')[-2000:]}{self.console_tail()}") from None

    def send(self, request):
        """Sends a request (an id is added when missing) and returns its id."""
        if "id" not in request:
            self.next_id += 1
            request = {"id": self.next_id, **request}
        self.send_raw(json.dumps(request).encode() + b"\n")
        return request["id"]

    def console_tail(self, lines=40):
        """The guest console's last lines when the episode was given --console: what a guest
        that stopped answering printed last, for a failure's message."""
        if not self.console:
            return ""
        try:
            with open(self.console, "rb") as f:
                text = f.read()[-16384:].decode(errors="replace")
        except OSError as e:
            return f"\nthe guest console could not be read: {e}"
        kept = text.splitlines()[-lines:]
        return "\nthe guest console's last lines:\n" + "\n".join(kept) if kept else "\nthe guest console is empty"

    def _next_message(self, deadline):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise EpisodeError("no answer in time" + self.console_tail())
        try:
            raw = self.lines.get(timeout=remaining)
        except queue.Empty:
            raise EpisodeError("no answer in time" + self.console_tail()) from None
        if raw is None:
            self.lines.put(None)  # keep reporting the end to later readers
            code = self.proc.wait()
            self.stderr_reader.join(5)  # its last words, which say why
            raise EpisodeError(f"episode output ended (exit {code}): "
                               f"{self.stderr.decode(errors='replace')[-2000:]}{self.console_tail()}")
        try:
            return json.loads(raw)
        except ValueError:
            raise EpisodeError(f"not a JSON line: {raw[:200]!r}") from None

    def result(self, call_id, timeout=300):
        """The events and final message (response or error) of call_id: (events, final)."""
        deadline = time.monotonic() + timeout
        pending = self.by_id.setdefault(call_id, [])
        while True:
            for i, msg in enumerate(pending):
                if "event" not in msg:
                    events = pending[:i]
                    del pending[:i + 1]
                    return events, msg
            msg = self._next_message(deadline)
            self.by_id.setdefault(msg.get("id"), []).append(msg)

    def call(self, request, timeout=300):
        """Sends a request and returns its final message."""
        return self.result(self.send(request), timeout)[1]

    def vmm_pid(self):
        """The jailed VMM: the one child of the agentvm process (its supervisor)."""
        pid = self.proc.pid
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = f.read().split()
        if len(children) != 1:
            raise EpisodeError(f"the supervisor {pid} has children {children}, not one VMM")
        return int(children[0])

    def close_stdin(self):
        self.proc.stdin.close()

    def wait(self, timeout=300):
        """Exit status once the process ends (stdin must be closed, or it must be dying)."""
        return self.proc.wait(timeout=timeout)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
