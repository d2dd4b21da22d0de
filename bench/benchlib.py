"""What the benchmarks in bench/ share: where agentvm is, where real guests boot, and how a
series of timings is summarised."""
import json
import math
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AGENTVM = os.path.join(REPO, "build/agentvm")


def hardware_kvm():
    return os.path.exists("/dev/kvm") and not os.path.exists("/sys/module/kvm_pvm")


def in_testhost():
    return bool(os.environ.get("AGENTVM_IN_TESTHOST"))


def where():
    return ("nested KVM inside the emulated test host: absolute times are meaningless, only relations"
            if in_testhost() else "hardware KVM")


def run_where_guests_boot(script, argv, timeout_s, testhost_mem_mib=2048):
    """Returns where a Linux guest boots (hardware KVM); otherwise re-runs `script argv` inside
    the emulated test host (with testhost_mem_mib of memory) and never returns."""
    if hardware_kvm() or in_testhost():
        return
    name = os.path.basename(script)
    print(f"bench/{name}: no hardware KVM here; running inside the emulated test host, "
          "where only relations between the numbers are meaningful", file=sys.stderr)
    # AGENTVM_IN_TESTHOST guards against re-running forever should the runner disagree.
    os.execve(os.path.join(REPO, "tests/testhost/run"),
              ["run", "--timeout", str(int(timeout_s)), "--mem", str(testhost_mem_mib), "--", sys.executable, os.path.abspath(script), *argv],
              dict(os.environ, AGENTVM_IN_TESTHOST="1"))


def p99(samples):
    """Nearest-rank 99th percentile: the smallest sample at or above 99 % of them."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def summary_line(name, seconds, with_p99=True):
    """Prints one series in ms; returns its median in ms."""
    ms = [s * 1000 for s in seconds]
    tail = f"  p99 {p99(ms):9.3f}" if with_p99 else ""
    print(f"  {name:40s} median {statistics.median(ms):9.3f} ms{tail}  min {min(ms):9.3f}  max {max(ms):9.3f}")
    return statistics.median(ms)


def local_install(with_serve=False):
    """agentvm (and agentvm-serve, beside it) without debug info, the default guest and a
    snapshot baked from them, in a temporary directory of this machine's /tmp; returns the
    directory and the agentvm binary."""
    home = tempfile.mkdtemp(prefix="agentvm-bench-")
    os.makedirs(os.path.join(home, "guest"))
    binary = os.path.join(home, "agentvm")
    subprocess.run(["objcopy", "--strip-debug", AGENTVM, binary], check=True)
    if with_serve:
        subprocess.run(["objcopy", "--strip-debug", AGENTVM + "-serve", binary + "-serve"], check=True)
    for name in ("vmlinux", "rootfs.ext4"):
        shutil.copyfile(os.path.join(REPO, "build/guest", name), os.path.join(home, "guest", name))
    r = subprocess.run([binary, "--log-level", "warn", "snapshot", "bake", "--out",
                        os.path.join(home, "guest/snapshot"), "--boot-timeout", "300"],
                       stdin=subprocess.DEVNULL, capture_output=True)
    if r.returncode != 0:
        sys.exit(f"bench: FAILED: baking the local snapshot: {r.stderr.decode(errors='replace')[-1500:]}")
    return home, binary


def process_tree(pid):
    """pid and every process below it."""
    pids = [pid]
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            for child in f.read().split():
                pids += process_tree(int(child))
    return pids


def smaps_rollup(pid):
    """kB figures of /proc/PID/smaps_rollup, by field name, summed over agentvm's processes (the
    supervisor and the jailed VMM it runs)."""
    fields = {}
    for member in process_tree(pid):
        with open(f"/proc/{member}/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3 and parts[2] == "kB":
                    key = parts[0].rstrip(":")
                    fields[key] = fields.get(key, 0) + int(parts[1])
    return fields


def mem_available_kib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    sys.exit("bench: FAILED: no MemAvailable in /proc/meminfo")


# A first call waits for the boot, which is slow under emulation.
CALL_TIMEOUT_S = 120


def fail(msg):
    sys.stdout.flush()
    sys.exit(f"bench/{os.path.basename(sys.argv[0])}: FAILED: {msg}")


class Episode:
    """One `agentvm episode` with one call in flight at a time, read without helper threads
    so that the timing includes no thread hand-off on our side."""

    def __init__(self, argv):
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(argv,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     bufsize=0)
        self.out = self.proc.stdout.fileno()
        self.inp = self.proc.stdin.fileno()
        self.pending = b""
        self.next_id = 0

    def _stderr_tail(self):
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-2000:]

    def _read_line(self, deadline):
        while b"\n" not in self.pending:
            # The episode process answers or ends; a deadline guards against a hung guest.
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.out], [], [], left)[0]:
                self.proc.kill()
                fail(f"no answer from the episode in {CALL_TIMEOUT_S} s; stderr: {self._stderr_tail()}")
            chunk = os.read(self.out, 65536)
            if not chunk:
                fail(f"the episode ended (exit {self.proc.wait()}) with a call unanswered; "
                     f"stderr: {self._stderr_tail()}")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line

    def call(self, request):
        """Sends one request; returns (seconds from write to response line, the agent's duration_ms)."""
        self.next_id += 1
        data = json.dumps({"id": self.next_id, **request}).encode() + b"\n"
        deadline = time.monotonic() + CALL_TIMEOUT_S
        start = time.perf_counter()
        try:
            os.write(self.inp, data)
        except BrokenPipeError:
            fail(f"the episode ended (exit {self.proc.wait()}) before taking a call; "
                 f"stderr: {self._stderr_tail()}")
        line = self._read_line(deadline)
        took = time.perf_counter() - start
        try:
            msg = json.loads(line)
        except ValueError:
            fail(f"not a JSON line from the episode: {line[:200]!r}")
        if msg.get("id") != self.next_id:
            fail(f"answer to {request} has id {msg.get('id')!r}, expected {self.next_id}: {line[:300]!r}")
        if "error" in msg or "event" in msg:
            fail(f"{request} answered {line[:300]!r}")
        got = (msg.get("exit_code"), msg.get("signal"), msg.get("timed_out"), msg.get("stdout"), msg.get("stderr"))
        if got != (0, None, False, "", ""):
            fail(f"{request} should exit 0 silently, answered {line[:300]!r}")
        return took, msg.get("duration_ms")

    def close(self):
        self.proc.stdin.close()
        try:
            code = self.proc.wait(timeout=CALL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            fail(f"the episode did not end within {CALL_TIMEOUT_S} s of its stdin closing")
        if code != 0 or self.pending:
            fail(f"the episode ended with exit {code}, unread output {self.pending[:200]!r}; "
                 f"stderr: {self._stderr_tail()}")
