#!/usr/bin/python3
"""Checks that tests/testhost/run passes CMD's streams whole and byte-exact.

  streams_check.py [output|stdin]...   (default: both)

output: one run (one test-host boot) in which three programs each write 64 MiB in single
  large writes to stdout, then again to stderr: print() of a 64 MiB str under
  PYTHONUNBUFFERED=1, one os.write() of 64 MiB, and `dd bs=16M count=4`. What arrives on
  the runner's stdout and stderr must have exactly the expected length and sha256; CMD's
  stdin must be /dev/null (the runner's stdin is /dev/null here).
stdin: the runner's stdin reaches CMD: 4 MiB through `cat` byte-exact, ending at EOF; a
  tiny input that is all sent before CMD reads; an endless input of which CMD reads a
  little (the run must still end). The same through AGENTVM_TESTHOST=never (inherited).

The test host is used even on a hardware-KVM host (AGENTVM_TESTHOST=always unless set);
exit 77 (skipped) when it cannot run there (a package missing).
"""
import hashlib
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.path.join(HERE, "run")
MIB = 1 << 20
SIZE = 64 * MIB
PY = sys.executable  # an absolute path: L1 sees the host's root

# The same generator runs here (expected bytes) and inside L1 (the data written). Blocks of
# a prime length, so a lost, repeated or reordered chunk of any power-of-two size shows.
GEN = """
def block(tag):
    return bytes(33 + (i * 7 + tag * 13) % 94 for i in range(4092)) + b"\\n"
def data(tag, size):
    b = block(tag)
    return (b * (size // len(b) + 1))[:size]
"""
exec(GEN)


def expected_output(tags):
    """The parts one stream must carry, in order: print(str), os.write(bytes), dd of a file
    (as functions, so that only one part is in memory at a time)."""
    t_print, t_write, t_dd = tags
    return [lambda: data(t_print, SIZE) + b"\n",  # noqa: F821
            lambda: data(t_write, SIZE),  # noqa: F821
            lambda: data(t_dd, SIZE)]  # noqa: F821


def output_script():
    """sh script for L1: stdout gets tags 1,2,3 and stderr 4,5,6, in expected_output's order."""
    def py(code):
        return PY + " -c '" + GEN + code + "'"
    return "\n".join([
        "set -e",
        '[ "$(readlink /proc/self/fd/0)" = /dev/null ] || { echo "stdin is not /dev/null" >&2; exit 3; }',
        # print() then hands the whole str to one write(2) and never retries a short one.
        "export PYTHONUNBUFFERED=1",
        py('open("/tmp/dd1", "wb").write(data(3, %d))' % SIZE),
        py('open("/tmp/dd2", "wb").write(data(6, %d))' % SIZE),
        py('print(data(1, %d).decode())' % SIZE),
        py('import os; os.write(1, data(2, %d))' % SIZE),
        "dd if=/tmp/dd1 bs=16M count=4 status=none",
        py('import sys; print(data(4, %d).decode(), file=sys.stderr)' % SIZE),
        py('import os; os.write(2, data(5, %d))' % SIZE),
        "dd if=/tmp/dd2 bs=16M count=4 status=none >&2",
    ]) + "\n"


class Compare:
    """Compares received bytes, as they come, with the expected parts: length, sha256 of the
    whole, offset of the first difference."""

    def __init__(self, parts):
        self.parts = list(parts)
        self.want = hashlib.sha256()
        self.want_len = 0
        self.cur = b""   # the expected part being compared
        self.pos = 0     # offset in self.cur
        self.sha = hashlib.sha256()
        self.n = 0
        self.first_diff = None

    def _expect(self, k):
        """The next k expected bytes (fewer at the end)."""
        out = b""
        while len(out) < k:
            if self.pos == len(self.cur):
                if not self.parts:
                    break
                self.cur, self.pos = self.parts.pop(0)(), 0
                self.want.update(self.cur)
                self.want_len += len(self.cur)
            take = self.cur[self.pos:self.pos + k - len(out)]
            self.pos += len(take)
            out += take
        return out

    def feed(self, chunk):
        if self.first_diff is None:
            e = self._expect(len(chunk))
            if chunk != e:
                i = next((k for k in range(min(len(e), len(chunk))) if chunk[k] != e[k]),
                         min(len(e), len(chunk)))
                self.first_diff = self.n + i
        self.sha.update(chunk)
        self.n += len(chunk)

    def problems(self, name):
        while self._expect(1 << 20):  # hash the rest of what was expected
            pass
        got, want = self.sha.hexdigest(), self.want.hexdigest()
        if self.n == self.want_len and got == want and self.first_diff is None:
            return []
        where = self.first_diff if self.first_diff is not None else self.n
        return [f"{name}: {self.n} bytes arrived, {self.want_len} expected; sha256 {got[:16]}"
                f" vs {want[:16]}; first difference at byte {where}"]


def start(argv, timeout, stdin_pipe=False, env_extra=None):
    """Starts `run --timeout T -- argv` with its stdout and stderr piped to us, and its
    stdin /dev/null or a pipe."""
    env = dict(os.environ, AGENTVM_TESTHOST_QUIET="1")
    env.setdefault("AGENTVM_TESTHOST", "always")
    env.update(env_extra or {})
    return subprocess.Popen([RUN, "--timeout", str(timeout), "--", *argv], env=env,
                            stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def drain(p, out_cmp, err_cmp, stdin_feed=None):
    """Feeds the run's stdout and stderr to out_cmp/err_cmp (and its stdin from stdin_feed)
    until it ends; returns its exit code."""
    def reader(f, cmp):
        while True:
            chunk = f.read1(1 << 20) if hasattr(f, "read1") else f.read(1 << 20)
            if not chunk:
                return
            cmp.feed(chunk)

    threads = [threading.Thread(target=reader, args=(p.stdout, out_cmp)),
               threading.Thread(target=reader, args=(p.stderr, err_cmp))]
    if stdin_feed:
        threads.append(threading.Thread(target=stdin_feed, args=(p.stdin,)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return p.wait()


class Collect:
    def __init__(self):
        self.data = bytearray()

    def feed(self, chunk):
        self.data += chunk


def check_output():
    out = Compare(expected_output((1, 2, 3)))
    err = Compare(expected_output((4, 5, 6)))
    t0 = time.monotonic()
    rc = drain(start(["sh", "-c", output_script()], 600), out, err)
    bad = out.problems("stdout") + err.problems("stderr")
    if rc != 0:
        bad.append(f"exit {rc}, expected 0")
    print(f"output: {out.n} bytes on stdout, {err.n} on stderr, exit {rc},"
          f" {time.monotonic() - t0:.1f} s", flush=True)
    return bad


def feeder(payload, endless=False):
    def feed(pipe):
        try:
            if endless:
                while True:
                    pipe.write(payload)
            pipe.write(payload)
            pipe.close()
        except (BrokenPipeError, ValueError, OSError):
            pass
    return feed


def check_stdin(mode):
    bad = []
    env = {"AGENTVM_TESTHOST": mode}
    tag = f"stdin ({'direct' if mode == 'never' else 'test host'})"
    cases = [
        # (name, argv, stdin bytes, endless, expected stdout)
        ("4 MiB through cat", ["sh", "-c", '[ -p /dev/stdin ] || exit 3; exec cat'],
         data(7, 4 * MIB), False, data(7, 4 * MIB)),  # noqa: F821
        ("tiny, sent before CMD reads", ["sh", "-c", "sleep 1; cat /dev/stdin; echo end >/dev/stdout"],
         b"a\nb\n", False, b"a\nb\nend\n"),
        ("endless, CMD reads 10 bytes", ["head", "-c", "10"],
         b"0123456789" * 6554, True, b"0123456789"),
    ]
    for name, argv, payload, endless, want in cases:
        t0 = time.monotonic()
        out, err = Collect(), Collect()
        p = start(argv, 120, stdin_pipe=True, env_extra=env)
        rc = drain(p, out, err, feeder(payload, endless))
        ok = rc == 0 and bytes(out.data) == want and not err.data
        print(f"{tag}: {name}: {'ok' if ok else 'FAILED'} (exit {rc}, {len(out.data)} bytes"
              f" out, {time.monotonic() - t0:.1f} s)", flush=True)
        if not ok:
            bad.append(f"{tag}: {name}: exit {rc}, stdout {len(out.data)} bytes"
                       f" (expected {len(want)}), equal={bytes(out.data) == want},"
                       f" stderr {bytes(err.data[:500])!r}")
    return bad


def main(argv):
    what = argv or ["output", "stdin"]
    if any(w not in ("output", "stdin") for w in what):
        sys.stderr.write(__doc__)
        return 2
    mode = os.environ.get("AGENTVM_TESTHOST", "always")
    if mode != "never":
        # Build the artifacts first, so no build notice lands in a checked stderr.
        r = subprocess.run([os.path.join(HERE, "setup")], stdout=subprocess.DEVNULL)
        if r.returncode == 125:
            print("the test host cannot run here (see above): skipped")
            return 77
        if r.returncode != 0:
            return 1
    bad = []
    if "output" in what:
        bad += check_output()
    if "stdin" in what:
        bad += check_stdin(mode)
        if mode != "never":
            bad += check_stdin("never")
    for b in bad:
        print("FAIL: " + b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
