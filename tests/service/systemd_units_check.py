#!/usr/bin/env python3
"""deploy/systemd's units as systemd reads them: `systemd-analyze verify` passes on
agentvm-serve.service and agentvm-serve.socket installed where the package puts them
(/usr/lib/systemd/system, the programs at /usr/bin), in a root of its own, so that the check
neither needs a booted systemd nor the package installed. A unit with a misspelt option fails
the same check, which counts any warning (so a pass means the units were read), and the settings serve relies on are
there.

usage: systemd_units_check.py UNIT_DIR AGENTVM AGENTVM_SERVE
"""
import os
import shutil
import subprocess
import sys
import tempfile

UNITS = ("agentvm-serve.service", "agentvm-serve.socket")
# What the rest of the project relies on: readiness, delegation, a stop that drains, the user.
REQUIRED = {
    "agentvm-serve.service": ["Type=notify", "Delegate=yes", "KillMode=mixed", "User=agentvm",
                              "SupplementaryGroups=kvm", "EnvironmentFile=/etc/agentvm/serve.conf",
                              "ExecStart=/usr/bin/agentvm-serve ", "ExecReload=/bin/kill -HUP $MAINPID",
                              "StateDirectory=agentvm/serve", "RuntimeDirectory=agentvm"],
    "agentvm-serve.socket": ["ListenStream=/run/agentvm/serve.sock", "SocketUser=agentvm", "SocketMode=0600"],
}


def make_root(unit_dir, agentvm, serve):
    root = tempfile.mkdtemp(prefix="agentvm-units-")
    units = os.path.join(root, "usr/lib/systemd/system")
    shutil.copytree("/usr/lib/systemd/system", units, symlinks=True)
    for name in UNITS:
        shutil.copy(os.path.join(unit_dir, name), units)
    bin_dir = os.path.join(root, "usr/bin")
    os.makedirs(bin_dir, exist_ok=True)
    shutil.copy(agentvm, os.path.join(bin_dir, "agentvm"))
    shutil.copy(serve, os.path.join(bin_dir, "agentvm-serve"))
    shutil.copy(shutil.which("kill"), os.path.join(bin_dir, "kill"))
    os.symlink("usr/bin", os.path.join(root, "bin"))
    return root


def clean(r):
    """verify exits 0 on a value it cannot parse, with a warning: only silence is a pass."""
    return r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip()


def verify(root, unit_names):
    paths = [os.path.join("/usr/lib/systemd/system", name) for name in unit_names]
    return subprocess.run(["systemd-analyze", "verify", f"--root={root}", *paths],
                          capture_output=True, text=True, timeout=120)


def main():
    unit_dir, agentvm, serve = sys.argv[1:4]
    if not shutil.which("systemd-analyze"):
        print("not ok: systemd-analyze is not installed (Debian's systemd package)")
        return 1
    failures = 0
    root = make_root(unit_dir, agentvm, serve)
    try:
        r = verify(root, UNITS)
        if clean(r):
            print("ok verify: systemd-analyze verify passes on " + ", ".join(UNITS))
        else:
            failures += 1
            print(f"not ok verify: exit {r.returncode}\n{r.stdout}{r.stderr}")

        units = os.path.join(root, "usr/lib/systemd/system")
        broken = os.path.join(units, "agentvm-serve-broken.service")
        with open(os.path.join(units, "agentvm-serve.service")) as f:
            text = f.read()
        with open(broken, "w") as f:
            f.write(text.replace("KillMode=mixed", "KillMode=mixd"))
        r = verify(root, ["agentvm-serve-broken.service"])
        if not clean(r) and "mixd" in r.stdout + r.stderr:
            print("ok broken_refused: a misspelt value fails the same check, naming it")
        else:
            failures += 1
            print(f"not ok broken_refused: exit {r.returncode}\n{r.stdout}{r.stderr}")

        for name, needed in REQUIRED.items():
            with open(os.path.join(unit_dir, name)) as f:
                lines = [line.strip() for line in f]
            missing = [want for want in needed if not any(line.startswith(want) for line in lines)]
            if missing:
                failures += 1
                print(f"not ok settings_{name}: missing {missing}")
            else:
                print(f"ok settings_{name}: {len(needed)} settings present")
    finally:
        shutil.rmtree(root)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
