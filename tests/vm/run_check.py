#!/usr/bin/env python3
"""`agentvm run` with a real guest: output, exit statuses and what is left behind.

usage: run_check.py AGENTVM_BINARY
Prints "ok <case>: <what was seen>" or "FAIL <case>: <why>" per case; exits non-zero if any
failed.
"""
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from checks import expect, run_case

AGENTVM = sys.argv[1]


def run(*args, stdin=subprocess.DEVNULL, env=None):
    return subprocess.run([AGENTVM, "run", *args], stdin=stdin, capture_output=True, timeout=600,
                          env=env)


def streams_and_status():
    r = run("--", "sh", "-c", "echo out; echo err >&2; exit 3")
    expect((r.returncode, r.stdout, r.stderr) == (3, b"out\n", b"err\n"),
           f"got {r.returncode} {r.stdout!r} {r.stderr!r}")
    r = run("--", "sh", "-c", "kill -USR1 $$")
    expect(r.returncode == 128 + 10, f"signal: exit {r.returncode}")
    return "stdout and stderr kept apart, exit 3 passed on, SIGUSR1 -> 138"


def order_and_binary():
    # Interleaved writes over time arrive in order, and bytes that are not UTF-8 pass intact.
    r = run("--", "sh", "-c", "for i in 1 2 3; do echo $i; sleep 0.2; done; printf '\\000\\377'")
    expect(r.returncode == 0 and r.stdout == b"1\n2\n3\n\x00\xff", f"got {r.stdout!r}")
    return "streamed lines in order, NUL and 0xff bytes intact"


def shell_env_workdir_stdin():
    r = run("--env", "A=1", "--env", "B=two words", "--workdir", "/etc", "--shell",
            'echo "$A $B $PWD"; [[ 1 == 1 ]] && echo bash')
    expect(r.returncode == 0 and r.stdout == b"1 two words /etc\nbash\n", f"got {r.stdout!r} {r.stderr!r}")
    r = run("-i", "--", "sha256sum", stdin=open("/etc/passwd", "rb"))
    want = subprocess.run(["sha256sum"], stdin=open("/etc/passwd", "rb"), capture_output=True).stdout
    expect(r.stdout == want, f"stdin: {r.stdout!r} != {want!r}")
    return "--env, --workdir, --shell (bash), -i stdin delivered byte-exact"


def own_statuses():
    cases = [
        (["--timeout", "1", "--", "sh", "-c", "sleep 1000 & sleep 1000"], 124, b"timed out"),
        (["--", "no-such-command"], 127, b"not found"),
        (["--", "/etc/hostname"], 126, b"/etc/hostname"),
        (["--workdir", "/nope", "--", "true"], 127, b"/nope"),
        (["--bogus-flag", "--", "true"], 125, b"bogus"),
        ([], 125, b"give the command"),
        (["--env", "NOEQUALS", "--", "true"], 125, b"NAME=VALUE"),
        (["--kernel", "/nonexistent", "--", "true"], 125, b"/nonexistent"),
        (["--max-output", "1", "--", "echo", "hello"], 0, b"cut at 1 bytes"),
        (["--cpu-quota", "nan", "--", "true"], 125, b"--cpu-quota"),
        (["--disk-size", "16", "--", "true"], 125, b"smaller than the root filesystem image"),
        (["--disk-size", str(1 << 40), "--", "true"], 125, b"where the disk's overlay lives"),
        (["--disk-size", str((1 << 44) + 700), "--", "true"], 125, b"out of range"),
        (["--guest-pids", "0", "--", "true"], 125, b"--guest-pids"),
    ]
    for args, code, message in cases:
        r = run(*args)
        expect(r.returncode == code and message in r.stderr,
               f"{args}: exit {r.returncode} (want {code}), stderr {r.stderr[-400:]!r}")
    return f"{len(cases)} cases: 124 timeout, 127 not found, 126 not executable, 125 agentvm's own errors"


def disk_size():
    """--disk-size grows the guest's filesystem at boot: what did not fit the image's free space
    fits, and the disk's size is still where ENOSPC comes."""
    image_mib = os.path.getsize(os.path.join(os.path.dirname(AGENTVM), "guest", "rootfs.ext4")) >> 20
    # Allocates N MiB in one file (no data written, so even emulated it is quick).
    script = ("import os, sys; st = os.statvfs('/'); print(st.f_blocks * st.f_frsize >> 20, end=' ');"
              "fd = os.open('/big', os.O_CREAT | os.O_WRONLY)\n"
              "try:\n os.posix_fallocate(fd, 0, int(sys.argv[1]) << 20); print('allocated')\n"
              "except OSError as e:\n print(os.strerror(e.errno))")
    free_mib = int(run("--", "sh", "-c", "df -m --output=avail / | tail -1").stdout)
    want = free_mib + 64
    r = run("--", "python3", "-c", script, str(want))
    expect(r.returncode == 0 and r.stdout.split()[1:] == [b"No", b"space", b"left", b"on", b"device"],
           f"default disk, {want} MiB: {r.stdout!r} {r.stderr[-400:]!r}")
    disk = image_mib + 160
    r = run("--disk-size", str(disk), "--", "python3", "-c", script, str(want))
    words = r.stdout.split()
    expect(r.returncode == 0 and words[1:] == [b"allocated"] and image_mib + 100 < int(words[0]) <= disk,
           f"--disk-size {disk}, {want} MiB: {r.stdout!r} {r.stderr[-400:]!r}")
    r = run("--disk-size", str(disk), "--", "python3", "-c", script, str(disk))
    expect(r.returncode == 0 and b"No space left" in r.stdout, f"--disk-size {disk}, {disk} MiB: {r.stdout!r}")
    return (f"{want} MiB: ENOSPC on the image's {free_mib} MiB free; allocated with --disk-size {disk} "
            f"(filesystem {int(words[0])} MiB); {disk} MiB: ENOSPC")


def guest_pids():
    r = run("--cold", "--guest-pids", "100", "--", "cat", "/sys/fs/cgroup/tool-calls/pids.max")
    expect(r.returncode == 0 and r.stdout == b"100\n", f"cold --guest-pids 100: {r.stdout!r} {r.stderr[-400:]!r}")
    r = subprocess.run([AGENTVM, "--log-level", "debug", "run", "--guest-pids", "64", "--", "cat",
                        "/sys/fs/cgroup/tool-calls/pids.max"], stdin=subprocess.DEVNULL, capture_output=True,
                       timeout=600)
    expect(r.returncode == 0 and r.stdout == b"64\n", f"--guest-pids 64: {r.stdout!r} {r.stderr[-400:]!r}")
    expect(b"restoring from snapshot" in r.stderr, f"--guest-pids 64 did not restore set-up's snapshot: {r.stderr[-600:]!r}")
    return "the tool calls' pids.max is --guest-pids, booted (100) and restored from set-up's snapshot (64)"


def big_output():
    """64 MiB of control bytes pass through whole under the default --vmm-mem: run streams the
    output and asks for a response without it, so it never holds the 384 MiB of escaped text."""
    size = 64 << 20
    with tempfile.TemporaryFile() as out:
        r = subprocess.run([AGENTVM, "run", "--max-output", str(size), "--", "sh", "-c",
                            f"head -c {size} /dev/zero | tr '\\0' '\\1'"],
                           stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.PIPE, timeout=900)
        expect(r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]!r}")
        out.seek(0)
        total = ones = 0
        while chunk := out.read(1 << 20):
            total += len(chunk)
            ones += chunk.count(b"\x01")
    expect(total == size and ones == size, f"{total} bytes, {ones} of them \\x01; want {size}")
    return f"{size >> 20} MiB of \\x01 arrived byte-exact, exit 0"


def closed_stdout():
    """A reader that stops reading ends agentvm run like any program in a pipeline."""
    proc = subprocess.Popen([AGENTVM, "run", "--", "yes"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.read(4)
    proc.stdout.close()
    err = proc.stderr.read()
    code = proc.wait(timeout=600)
    expect(first == b"y\ny\n", f"first bytes {first!r}")
    expect(code == 128 + 13 and b"error" not in err, f"exit {code}, stderr {err[-400:]!r}")
    return "stdout closed after 4 bytes of an endless yes: exit 141 (SIGPIPE's), no error message"


def nothing_left_behind():
    tmp = tempfile.mkdtemp(prefix="agentvm-run-")
    env = dict(os.environ, TMPDIR=tmp)
    before = set(subprocess.run(["pgrep", "-f", "agentvm"], capture_output=True).stdout.split())
    for _ in range(3):
        r = run("--", "true", env=env)
        expect(r.returncode == 0, f"exit {r.returncode}: {r.stderr!r}")
    after = set(subprocess.run(["pgrep", "-f", "agentvm"], capture_output=True).stdout.split())
    expect(os.listdir(tmp) == [], f"left in TMPDIR: {os.listdir(tmp)}")
    os.rmdir(tmp)
    expect(after <= before, f"processes left: {after - before}")
    return "3 runs: TMPDIR empty, no agentvm process left"


def outside_server():
    """A web server of the test's on 127.0.0.2, the outside the guest reaches only by policy;
    returns it and its URL."""
    class Hello(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "18")
            self.end_headers()
            self.wfile.write(b"hello from outside")

    server = http.server.ThreadingHTTPServer(("127.0.0.2", 0), Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.2:{server.server_address[1]}/hello"


def egress():
    server, url = outside_server()
    tmp = tempfile.mkdtemp(prefix="agentvm-egress-")
    env = dict(os.environ, TMPDIR=tmp)
    try:
        r = subprocess.run([AGENTVM, "--log-level", "debug", "run", "--egress-allow", "127.0.0.2", "--", "curl", "-sS",
                            url], stdin=subprocess.DEVNULL, capture_output=True, timeout=600, env=env)
        expect(r.returncode == 0 and r.stdout == b"hello from outside", f"allowed: {r.returncode} {r.stdout!r} {r.stderr!r}")
        expect(b"egress: GET 127.0.0.2:" in r.stderr, f"the connection is not logged: {r.stderr!r}")
        r = run("--egress-allow", "*", "--", "curl", "-sS", url, env=env)
        expect(b"agentvm egress: " in r.stdout and b"loopback" in r.stdout, f"'*' for loopback: {r.stdout!r}")
        r = run("--", "sh", "-c", "printenv HTTP_PROXY || echo unset", env=env)
        expect(r.stdout == b"unset\n", f"proxy env without a policy: {r.stdout!r}")
        r = run("--egress-allow", "a..b", "--", "true", env=env)
        expect(r.returncode != 0 and b"a..b" in r.stderr, f"a bad rule: {r.returncode} {r.stderr!r}")
        lines = b'{"id":1,"op":"exec","argv":["curl","-sS","' + url.encode() + b'"]}\n'
        e = subprocess.run([AGENTVM, "episode", "--egress-allow", "127.0.0.2"], input=lines, capture_output=True,
                           timeout=600, env=env)
        answer = json.loads(e.stdout.splitlines()[-1])
        expect(answer.get("stdout") == "hello from outside", f"episode: {e.stdout!r} {e.stderr[-1000:]!r}")
        expect(os.listdir(tmp) == [], f"left in TMPDIR: {os.listdir(tmp)}")
    finally:
        server.shutdown()
        server.server_close()
    os.rmdir(tmp)
    return "run and episode reached 127.0.0.2 through --egress-allow (logged); '*' refused loopback; no proxy env " \
           "without a policy; a bad rule named; TMPDIR empty after"


def processes_of(uid):
    """pid -> /proc/PID/status fields of every process running as uid."""
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
        except OSError:
            continue
        if fields.get("Uid", "").split()[:1] == [str(uid)]:
            found[int(entry)] = fields
    return found


def jail_uid():
    """--jail-uid: the VMM runs as that uid and gid, with no capabilities, and still reaches
    the outside through --egress-allow's proxy; root is refused, as is --no-jail with it, and a
    --vsock-uds directory the uid cannot write is named."""
    uid = 1879048192 + 60000
    server, url = outside_server()
    tmp = tempfile.mkdtemp(prefix="agentvm-jail-uid-")
    env = dict(os.environ, TMPDIR=tmp)
    try:
        proc = subprocess.Popen([AGENTVM, "run", "--jail-uid", str(uid), "--egress-allow", "127.0.0.2", "--", "sh",
                                 "-c", f"sleep 3; curl -sS {url}"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env)
        seen = {}
        while not seen and proc.poll() is None:
            seen = processes_of(uid)
            time.sleep(0.05)
        out, err = proc.communicate(timeout=600)
        expect(proc.returncode == 0 and out == b"hello from outside", f"{proc.returncode} {out!r} {err[-2000:]!r}")
        expect(len(seen) == 1, f"processes of uid {uid} while it ran: {seen}")
        vmm = next(iter(seen.values()))
        expect(vmm["Uid"].split() == [str(uid)] * 4 and vmm["Gid"].split() == [str(uid)] * 4,
               f"the VMM's ids: Uid {vmm['Uid']} Gid {vmm['Gid']}")
        expect(int(vmm["CapEff"], 16) == 0 and vmm["Groups"].strip() == "", f"the VMM: {vmm}")
        r = run("--jail-uid", "0", "--", "true", env=env)
        expect(r.returncode != 0 and b"--jail-uid" in r.stderr and b"root" in r.stderr, f"uid 0: {r.stderr!r}")
        r = run("--no-jail", "--jail-uid", str(uid), "--", "true", env=env)
        expect(r.returncode != 0 and b"--no-jail" in r.stderr, f"with --no-jail: {r.stderr!r}")
        closed = tempfile.mkdtemp(prefix="agentvm-closed-")
        try:
            r = run("--jail-uid", str(uid), "--vsock-uds", os.path.join(closed, "vsock"), "--", "true", env=env)
        finally:
            shutil.rmtree(closed)
        expect(r.returncode != 0 and b"cannot write" in r.stderr and closed.encode() in r.stderr,
               f"an unwritable --vsock-uds directory: {r.returncode} {r.stderr[-2000:]!r}")
        expect(os.listdir(tmp) == [], f"left in TMPDIR: {os.listdir(tmp)}")
    finally:
        server.shutdown()
        server.server_close()
    os.rmdir(tmp)
    return (f"the VMM ran as uid and gid {uid}, no groups, no capabilities, and reached 127.0.0.2 through the "
            "proxy; uid 0, --no-jail with it and an unwritable --vsock-uds directory refused, named")


CASES = [streams_and_status, order_and_binary, shell_env_workdir_stdin, own_statuses, disk_size, guest_pids,
         big_output, closed_stdout, nothing_left_behind, egress, jail_uid]


def main():
    results = [run_case(case.__name__, case) for case in CASES]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
