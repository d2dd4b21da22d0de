"""What the benchmarks in bench/ share: where agentvm is, where real guests boot, and how a
series of timings is summarised."""
import math
import os
import statistics
import sys

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
