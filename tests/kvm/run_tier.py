#!/usr/bin/env python3
"""tests/kvm/run_tier.py [--timeout S] EXE... : runs the kvm tier's test executables on a KVM.

Where /dev/kvm opens (hardware KVM or PVM), each EXE runs directly, as the tier was made
for. Where it does not (no /dev/kvm at all, as on machines that are themselves PVM guests,
or one this user cannot open), all EXEs run in ONE boot of the emulated test host
(tests/testhost/run), on its nested hardware-style KVM: a boot costs tens of seconds of
emulation, so the tier pays it once. Either way the choice is made here, on every run, and
said on stderr when it is the test host.

Exit status: 0 when every EXE passed; the first failing EXE's status (or the runner's own:
124 timeout, 126 test host died) when one failed; 1 when an EXE skipped (it found no KVM), or
when there is neither a usable /dev/kvm nor a test host (a package missing: the runner
names it), with the reason on stderr. The tier runs on every machine: it never skips.
"""
import os
import subprocess
import sys

SKIP = 77  # an EXE's "no KVM here"
TESTHOST_UNAVAILABLE = 125  # tests/testhost/run: a package it needs is missing
RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testhost", "run")


def say(msg):
    print(f"kvm tier: {msg}", file=sys.stderr, flush=True)


def kvm_unusable():
    """Why /dev/kvm cannot run the tier here, or None when it can."""
    try:
        os.close(os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC))
    except OSError as e:
        return f"cannot open /dev/kvm: {e.strerror}"
    return None


def run_here(exes):
    failed, skipped = None, False
    for exe in exes:
        print(f"=== {os.path.basename(exe)}", flush=True)
        code = subprocess.run([exe], stdin=subprocess.DEVNULL).returncode
        if code == SKIP:
            skipped = True
        elif code != 0 and failed is None:
            failed = code if code > 0 else 128 - code  # killed by a signal: as a shell says it
    if failed is not None:
        return failed
    if skipped:
        say("an EXE skipped (above: why): the tier must run, so that is a failure")
        return 1
    return 0


def run_in_testhost(exes, timeout_s):
    # AGENTVM_IN_TESTHOST: inside, run the EXEs directly whatever is found there, so a test
    # host that lacks /dev/kvm makes the EXEs say so (and the tier fail) instead of nesting again.
    env = dict(os.environ, AGENTVM_IN_TESTHOST="1", AGENTVM_TESTHOST_QUIET="1")
    code = subprocess.run([RUNNER, "--timeout", str(timeout_s), "--",
                           sys.executable, os.path.abspath(__file__), *exes],
                          stdin=subprocess.DEVNULL, env=env).returncode
    if code == TESTHOST_UNAVAILABLE:
        say("failed: no usable /dev/kvm here and the test host cannot start (reason above)")
        return 1
    if code in (124, 126):
        say(f"the test host runner failed with status {code} (124: timeout, 126: the test host died)")
    return code


def main(argv):
    timeout_s = 600
    if argv[:1] == ["--timeout"]:
        timeout_s, argv = int(argv[1]), argv[2:]
    exes = [os.path.abspath(exe) for exe in argv]
    if not exes:
        sys.exit(__doc__.split("\n\n")[0])
    if os.environ.get("AGENTVM_IN_TESTHOST"):
        return run_here(exes)
    why = kvm_unusable()
    if why is None:
        return run_here(exes)
    say(f"{why}; running {', '.join(os.path.basename(e) for e in exes)} inside the emulated "
        "test host (nested KVM under TCG), in one boot")
    return run_in_testhost(exes, timeout_s)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
