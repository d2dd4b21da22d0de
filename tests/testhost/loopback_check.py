#!/usr/bin/python3
"""Checks that a TCP listener inside the test host answers a client inside it, over loopback
(`agentvm serve --listen tcp:127.0.0.1:PORT` in tests/testhost/run, and its clients).

  loopback_check.py

One run of tests/testhost/run, in which a python3 program listens on 127.0.0.1 (an ephemeral
port), connects to itself, sends a line and reads it back through the accepted socket; then
the same over ::1. It failed with `Network is unreachable` while L1's init left `lo` down.

The test host is used even on a hardware-KVM host (AGENTVM_TESTHOST=always unless set);
exit 77 (skipped) when it cannot run there (a package missing).
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.path.join(HERE, "run")
UNAVAILABLE = 125

ECHO = """
import socket
for host, family in (("127.0.0.1", socket.AF_INET), ("::1", socket.AF_INET6)):
    with socket.create_server((host, 0), family=family) as srv:
        port = srv.getsockname()[1]
        with socket.create_connection((host, port), timeout=30) as cli:
            conn, _ = srv.accept()
            with conn:
                cli.sendall(b"ping\\n")
                conn.sendall(conn.recv(64))
                got = cli.recv(64)
    assert got == b"ping\\n", got
    print("echoed over %s port %d" % (host, port))
"""


def main():
    env = dict(os.environ, AGENTVM_TESTHOST_QUIET="1")
    env.setdefault("AGENTVM_TESTHOST", "always")
    r = subprocess.run([RUN, "--timeout", "300", "--", sys.executable, "-c", ECHO],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env)
    if r.returncode == UNAVAILABLE:
        print("skip: the test host cannot run here", flush=True)
        return 77
    if r.returncode != 0 or r.stdout.count("echoed over ") != 2:
        print(f"FAIL loopback in the test host (exit {r.returncode}):\n{r.stdout}{r.stderr}", flush=True)
        return 1
    print("ok", r.stdout.strip(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
