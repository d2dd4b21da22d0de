#!/usr/bin/env python3
"""agentvm serve started as deploy/systemd/agentvm-serve.service starts it, without systemd:
this script plays systemd's part (as root) and checks serve's.

From the units it takes the command line (ExecStart, with %S and $VARIABLES from a serve.conf
expanded as systemd expands them), the user, group and supplementary groups, the capabilities
(AmbientCapabilities, CapabilityBoundingSet), NoNewPrivileges, UMask, the state and runtime
directories, and the socket (agentvm-serve.socket: its path moved under a temporary root, its
owner and mode). It passes the socket as systemd does (fd 3, LISTEN_PID, LISTEN_FDS,
LISTEN_FDNAMES), listens on a NOTIFY_SOCKET and, on cgroup v2, delegates a cgroup to the user
as Delegate=yes does. Then it checks that serve
  - reports READY=1 from its main process, and runs with the unit's uid, groups and capabilities;
  - answers /healthz on the socket, creates a sandbox and runs an exec in it (on cgroup v2 the
    VMM's cgroup inside the delegated one, serve itself in its leaf "serve"), its VMM a uid and
    gid of the jail's range with no groups and no capabilities;
  - on SIGHUP (ExecReload) reports STOPPING=1, drains and exits 0; started again on the same
    socket, it answers a request a client sent while no serve ran.

usage: serve_unit_check.py --serve AGENTVM_SERVE --agentvm AGENTVM [--user NAME|UID:GID]
                           [--unit-dir DIR] [--conf FILE] [--stand-in-episode]
--user: who serve runs as (default: the unit's User=); UID:GID for a user not in passwd.
--conf: serve.conf to use (default: one that keeps no warm VM, --pool default=0).
--stand-in-episode: AGENTVM is tests/service/fake_episode.py, which answers exec with empty
  output and makes no cgroup: the exec's output and the cgroups are then not checked.
Prints "ok serve_unit: ..." or "FAIL serve_unit: ..."; exits non-zero on failure (77, meson's
skip, when not run as root).
check() is the function to reuse."""
import argparse
import grp
import http.client
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_UNIT_DIR = os.path.join(HERE, "..", "..", "deploy", "systemd")
DEFAULT_CONF = "AGENTVM_SERVE_ARGS=--pool default=0 --log-level info\n"
CGROUP_ROOT = "/sys/fs/cgroup"
# capability(7) numbers of the names a unit may give.
CAPABILITIES = {"CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_KILL": 5, "CAP_SETGID": 6, "CAP_SETUID": 7,
                "CAP_SETPCAP": 8, "CAP_NET_BIND_SERVICE": 10, "CAP_SYS_ADMIN": 21, "CAP_SYS_RESOURCE": 24}


class Failed(Exception):
    pass


def expect(cond, why):
    if not cond:
        raise Failed(why)


def read_unit(path):
    """{key: [values]} of a unit's lines (continuations joined; sections merged: the keys of
    agentvm-serve's units are unique across them)."""
    keys = {}
    with open(path) as f:
        text = re.sub(r"\\\n\s*", " ", f.read())
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;[":
            continue
        key, _, value = line.partition("=")
        keys.setdefault(key.strip(), []).append(value.strip())
    return keys


def one(unit, key):
    expect(key in unit and len(unit[key]) == 1, f"the unit has no single {key}=")
    return unit[key][0]


def read_conf(path):
    """An EnvironmentFile: KEY=VALUE lines, # comments, optional quotes around the value."""
    values = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, eq, value = line.partition("=")
            expect(eq == "=" and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key), f"{path}: not KEY=VALUE: {line}")
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            values[key] = value
    return values


def expand_command(line, specifiers, env):
    """ExecStart as systemd runs it: %-specifiers, then ${VAR} as one word and $VAR split at spaces."""
    words = []
    for word in shlex.split(line):
        word = re.sub(r"%(.)", lambda m: specifiers[m.group(1)], word)
        whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if whole:
            words += env.get(whole.group(1), "").split()
            continue
        words.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m.group(1), ""), word))
    return words


def resolve_user(text):
    if re.fullmatch(r"\d+:\d+", text):
        uid, gid = (int(part) for part in text.split(":"))
        return uid, gid
    entry = pwd.getpwnam(text)
    return entry.pw_uid, entry.pw_gid


def cap_list(names):
    return ",".join("+" + name.lower().removeprefix("cap_") for name in names)


def cap_mask(names):
    return sum(1 << CAPABILITIES[name] for name in names)


def status_field(pid, name):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return line.split(":", 1)[1].split()
    raise Failed(f"/proc/{pid}/status has no {name}")


class Notifications:
    """systemd's end of NOTIFY_SOCKET: an abstract datagram socket, senders' pids attached."""

    def __init__(self):
        self.address = f"@agentvm-serve-unit-check-{os.getpid()}-{time.monotonic_ns()}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind("\0" + self.address[1:])

    def wait_for(self, field, proc, within):
        """The first datagram holding the line `field`; returns (its text, the sender's pid)."""
        deadline = time.monotonic() + within
        while True:
            left = deadline - time.monotonic()
            expect(left > 0, f"no {field} from serve within {within} s")
            expect(proc.poll() is None, f"serve exited ({proc.returncode}) before {field}")
            self.sock.settimeout(min(left, 1.0))
            try:
                data, ancillary, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(12))
            except socket.timeout:
                continue
            pid = None
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = struct.unpack("iII", payload[:12])[0]
            text = data.decode()
            if field in text.split("\n"):
                return text, pid


class Client(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def request(path, method, target, body=None, timeout=600):
    conn = Client(path, timeout)
    data = json.dumps(body).encode() if body is not None else None
    conn.request(method, target, body=data, headers={"Content-Type": "application/json"} if data else {})
    answer = conn.getresponse()
    return answer.status, answer.read()


def own_cgroup(pid):
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                return line[3:].strip()
    return ""


class Systemd:
    """What systemd would have set up for the units: directories, socket, cgroup, credentials."""

    def __init__(self, unit_dir, serve_bin, agentvm_bin, user, conf_path):
        self.service = read_unit(os.path.join(unit_dir, "agentvm-serve.service"))
        self.socket_unit = read_unit(os.path.join(unit_dir, "agentvm-serve.socket"))
        self.uid, self.gid = resolve_user(user or one(self.service, "User"))
        groups = one(self.service, "SupplementaryGroups").split()
        self.groups = [grp.getgrnam(name).gr_gid for name in groups]
        self.cgroup = None
        self.root = tempfile.mkdtemp(prefix="agentvm-serve-unit-")
        os.chmod(self.root, 0o755)
        self.ambient = one(self.service, "AmbientCapabilities").split()
        self.bounding = one(self.service, "CapabilityBoundingSet").split()
        self.no_new_privs = one(self.service, "NoNewPrivileges") == "yes"
        self.bin_dir = self._programs(serve_bin, agentvm_bin)
        # %S and StateDirectory=, RuntimeDirectory=, PrivateTmp=: directories of the user's own.
        self.state_root = self._dir("state", 0o755, root_owned=True)
        self.state_dir = os.path.join(self.state_root, one(self.service, "StateDirectory"))
        os.makedirs(self.state_dir)
        os.chown(self.state_dir, self.uid, self.gid)
        os.chmod(self.state_dir, int(one(self.service, "StateDirectoryMode"), 8))
        self.run_root = self._dir("run", 0o755, root_owned=True)
        runtime = os.path.join(self.run_root, one(self.service, "RuntimeDirectory"))
        os.makedirs(runtime, exist_ok=True)
        os.chown(runtime, self.uid, self.gid)
        self.tmp = self._dir("tmp", 0o1777, root_owned=True)
        self.conf = read_conf(conf_path)
        expect(one(self.service, "EnvironmentFile") == "/etc/agentvm/serve.conf",
               "the unit's EnvironmentFile is not /etc/agentvm/serve.conf")
        self.command = expand_command(one(self.service, "ExecStart"), {"S": self.state_root, "%": "%"}, self.conf)
        expect(self.command[0] == "/usr/bin/agentvm-serve", f"ExecStart runs {self.command[0]}")
        self.command[0] = os.path.join(self.bin_dir, "agentvm-serve")
        self.listen_path, self.listener = self._socket()
        self.cgroup = self._delegate()

    def _dir(self, name, mode, root_owned):
        path = os.path.join(self.root, name)
        os.mkdir(path)
        os.chmod(path, mode)
        if not root_owned:
            os.chown(path, self.uid, self.gid)
        return path

    def _programs(self, serve_bin, agentvm_bin):
        """serve runs the agentvm beside it, as /usr/bin holds both: a directory with the two."""
        beside = os.path.join(os.path.dirname(os.path.abspath(serve_bin)), "agentvm")
        if os.path.exists(beside) and os.path.samefile(beside, agentvm_bin):
            return os.path.dirname(beside)
        bin_dir = self._dir("bin", 0o755, root_owned=True)
        for source, name in ((serve_bin, "agentvm-serve"), (agentvm_bin, "agentvm")):
            shutil.copy(source, os.path.join(bin_dir, name))
            os.chmod(os.path.join(bin_dir, name), 0o755)
        return bin_dir

    def _socket(self):
        """agentvm-serve.socket: ListenStream under /run, moved into this run's root."""
        listen = one(self.socket_unit, "ListenStream")
        expect(listen.startswith("/run/"), f"ListenStream={listen}: expected a path under /run")
        path = os.path.join(self.run_root, listen[len("/run/"):])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path)
        sock.listen(int(one(self.socket_unit, "Backlog")))
        expect(one(self.socket_unit, "SocketUser") == one(self.service, "User")
               and one(self.socket_unit, "SocketGroup") == one(self.service, "Group"),
               "the socket's owner is not the service's user and group")
        os.chown(path, self.uid, self.gid)
        os.chmod(path, int(one(self.socket_unit, "SocketMode"), 8))
        return path, sock

    def _delegate(self):
        """Delegate=yes on cgroup v2: the unit's group, owned by the user with its
        cgroup.procs, cgroup.subtree_control and cgroup.threads, its controllers enabled above."""
        if not os.path.exists(os.path.join(CGROUP_ROOT, "cgroup.controllers")):
            return None
        for controller in ("cpu", "memory", "pids"):
            with open(os.path.join(CGROUP_ROOT, "cgroup.subtree_control"), "w") as f:
                f.write("+" + controller)
        path = os.path.join(CGROUP_ROOT, f"agentvm-serve-unit-check-{os.getpid()}.service")
        os.mkdir(path)
        for name in ("", "cgroup.procs", "cgroup.subtree_control", "cgroup.threads"):
            os.chown(os.path.join(path, name), self.uid, self.gid)
        return path

    def remove_cgroup(self):
        """What systemd does once a unit's processes are gone: its group and all below it go."""
        for entry in sorted(os.listdir(self.cgroup), reverse=True):
            child = os.path.join(self.cgroup, entry)
            if os.path.isdir(child):
                os.rmdir(child)
        os.rmdir(self.cgroup)

    def restarted(self):
        """Restart=: the stopped unit's group removed, a fresh one for the next start."""
        if self.cgroup:
            self.remove_cgroup()
            self.cgroup = self._delegate()

    def start(self, notify_address):
        """serve as systemd would start it: in the cgroup, as the user, with fd 3 the socket."""
        caps = ["--inh-caps", "-all," + cap_list(self.ambient), "--ambient-caps", "-all," + cap_list(self.ambient),
                "--bounding-set", "-all," + cap_list(self.bounding)]
        setpriv = ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}",
                   "--groups=" + ",".join(str(g) for g in self.groups), *caps,
                   *(["--no-new-privs"] if self.no_new_privs else []), "--"]
        join = f"echo $$ > {shlex.quote(self.cgroup)}/cgroup.procs && " if self.cgroup else ""
        script = join + 'LISTEN_PID=$$ exec "$@"'
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "TMPDIR": self.tmp, "HOME": self.state_dir,
               "LISTEN_FDS": "1", "LISTEN_FDNAMES": "agentvm-serve.socket", "NOTIFY_SOCKET": notify_address,
               "LANG": "C.UTF-8", **self.conf}
        if "TESTHOST_EMULATED" in os.environ:
            env["TESTHOST_EMULATED"] = os.environ["TESTHOST_EMULATED"]
        listener = self.listener.fileno()
        umask = int(one(self.service, "UMask"), 8)

        def socket_at_3():
            os.dup2(listener, 3)
            os.umask(umask)

        self.log_path = os.path.join(self.root, "serve.log")
        log = open(self.log_path, "ab")
        proc = subprocess.Popen(["sh", "-c", script, "sh", *setpriv, *self.command], env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=log, preexec_fn=socket_at_3, pass_fds=(3,), cwd="/")
        log.close()
        return proc

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def cleanup(self):
        self.listener.close()
        if self.cgroup:
            self.remove_cgroup()
        shutil.rmtree(self.root, ignore_errors=True)


def stop(proc, within=120):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(within)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# serve's default --jail-uid-range (service/vm_users/jail_ids.hpp).
JAIL_IDS = range(1879048192, 1879048192 + 65536)


def descendants(pid):
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children = [int(c) for c in f.read().split()]
        except FileNotFoundError:
            continue
        for child in children:
            found += [child] + descendants(child)
    return found


def vmm_identity(serve_pid, serve_uid):
    """Checks that serve's VMM (its episode process's child) runs as a uid and gid of its own
    from the jail's range, with no groups and no capabilities."""
    vmms = [p for p in descendants(serve_pid) if status_field(p, "Uid")[0] != str(serve_uid)]
    expect(len(vmms) == 1, f"serve's processes of another uid than {serve_uid}: {vmms}")
    uids = status_field(vmms[0], "Uid")
    gids = status_field(vmms[0], "Gid")
    expect(len(set(uids)) == 1 and int(uids[0]) in JAIL_IDS, f"the VMM's uids {uids}, not one of the jail's")
    expect(gids == uids, f"the VMM's gids {gids}, not its uid {uids[0]}")
    expect(status_field(vmms[0], "Groups") == [], f"the VMM's groups {status_field(vmms[0], 'Groups')}")
    expect(int(status_field(vmms[0], "CapEff")[0], 16) == 0, "the VMM holds capabilities")
    return f"its VMM runs as uid and gid {uids[0]}, no groups, no capabilities"


def check(serve_bin, agentvm_bin, user=None, unit_dir=DEFAULT_UNIT_DIR, conf_path=None, stand_in=False):
    """Runs every check; returns what was seen, raises Failed on the first failure."""
    expect(os.geteuid() == 0, "plays systemd: run as root")
    expect(shutil.which("setpriv"), "needs setpriv (util-linux)")
    own_conf = None
    if conf_path is None:
        own_conf = tempfile.NamedTemporaryFile("w", suffix=".conf", delete=False)
        own_conf.write(DEFAULT_CONF)
        own_conf.close()
        conf_path = own_conf.name
    systemd = None
    seen = []
    proc = None
    try:
        systemd = Systemd(unit_dir, serve_bin, agentvm_bin, user, conf_path)
        notify = Notifications()
        started = time.monotonic()
        proc = systemd.start(notify.address)
        ready, sender = notify.wait_for("READY=1", proc, 120)
        expect(sender == proc.pid, f"READY=1 came from pid {sender}, not serve's main process {proc.pid}")
        seen.append(f"READY=1 from the main process after {time.monotonic() - started:.1f} s "
                    f"({ready.replace(chr(10), '; ')})")

        uids = status_field(proc.pid, "Uid")
        gids = status_field(proc.pid, "Gid")
        groups = sorted(int(g) for g in status_field(proc.pid, "Groups"))
        expect(uids == [str(systemd.uid)] * 4, f"serve's uids {uids}, expected {systemd.uid}")
        expect(gids == [str(systemd.gid)] * 4, f"serve's gids {gids}, expected {systemd.gid}")
        expect(groups == sorted(systemd.groups), f"serve's groups {groups}, expected {systemd.groups}")
        effective = int(status_field(proc.pid, "CapEff")[0], 16)
        expect(effective == cap_mask(systemd.ambient),
               f"serve's capabilities {effective:#x}, expected {cap_mask(systemd.ambient):#x} ({systemd.ambient})")
        seen.append(f"uid {systemd.uid}, gid {systemd.gid}, groups {groups}, capabilities {systemd.ambient}")

        status, body = request(systemd.listen_path, "GET", "/healthz")
        expect(status == 200 and json.loads(body).get("status") == "ok", f"/healthz: {status} {body[:500]!r}")
        status, body = request(systemd.listen_path, "POST", "/v1/sandboxes", {})
        expect(status == 201, f"create: {status} {body[:2000]!r}")
        sandbox = json.loads(body)["id"]
        status, body = request(systemd.listen_path, "POST", f"/v1/sandboxes/{sandbox}/exec",
                               {"argv": ["echo", "hello from a unit"]})
        expect(status == 200, f"exec: {status} {body[:2000]!r}")
        answer = json.loads(body)
        expect(answer.get("exit_code") == 0, f"exec: {answer}")
        if not stand_in:
            expect(answer.get("stdout") == "hello from a unit\n", f"exec's stdout: {answer}")
        seen.append("/healthz ok, a sandbox's exec " + ("answered" if stand_in else "printed its line"))
        if not stand_in:
            seen.append(vmm_identity(proc.pid, systemd.uid))

        if systemd.cgroup and not stand_in:
            relative = systemd.cgroup[len(CGROUP_ROOT):]
            expect(own_cgroup(proc.pid) == relative + "/serve", f"serve is in {own_cgroup(proc.pid)}")
            vms = [e for e in os.listdir(systemd.cgroup) if e.startswith("vm-")]
            expect(vms, f"no VMM cgroup in {systemd.cgroup}: {os.listdir(systemd.cgroup)}")
            seen.append(f"serve in {relative}/serve, its VMM in {relative}/{vms[0]}")

        # ExecReload: SIGHUP drains; serve exits 0 and systemd starts it again (Restart=always).
        reload = one(systemd.service, "ExecReload")
        expect(reload == "/bin/kill -HUP $MAINPID", f"ExecReload={reload}")
        proc.send_signal(signal.SIGHUP)
        notify.wait_for("STOPPING=1", proc, 30)
        code = proc.wait(int(one(systemd.service, "TimeoutStopSec")))
        expect(code == 0, f"serve exited {code} after SIGHUP")
        waiting = Client(systemd.listen_path, 600)
        waiting.request("GET", "/healthz")
        systemd.restarted()
        proc = systemd.start(notify.address)
        notify.wait_for("READY=1", proc, 120)
        answer = waiting.getresponse()
        expect(answer.status == 200, f"/healthz sent between the two serves: {answer.status}")
        seen.append("SIGHUP: STOPPING=1, exit 0; a request sent before the restart answered by the next serve")
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(int(one(systemd.service, "TimeoutStopSec")))
        expect(code == 0, f"serve exited {code} after SIGTERM")
        return "; ".join(seen)
    except Failed as e:
        log = systemd.log() if systemd and os.path.exists(os.path.join(systemd.root, "serve.log")) else ""
        raise Failed(f"{e}\n--- serve's log (last 4000 bytes):\n{log[-4000:]}") from None
    finally:
        if proc:
            stop(proc)
        if systemd:
            systemd.cleanup()
        if own_conf:
            os.unlink(own_conf.name)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--serve", required=True)
    parser.add_argument("--agentvm", required=True)
    parser.add_argument("--user")
    parser.add_argument("--unit-dir", default=DEFAULT_UNIT_DIR)
    parser.add_argument("--conf")
    parser.add_argument("--stand-in-episode", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0:
        # The jail suite's convention: skipped (77), never passed, where it cannot run.
        print("SKIP serve_unit: it plays systemd (binds the socket, switches users): run it as root")
        return 77
    started = time.monotonic()
    try:
        seen = check(args.serve, args.agentvm, args.user, args.unit_dir, args.conf, args.stand_in_episode)
    except (Failed, OSError, KeyError) as e:
        print(f"FAIL serve_unit: {e} [{time.monotonic() - started:.1f} s]", flush=True)
        return 1
    print(f"ok serve_unit: {seen} [{time.monotonic() - started:.1f} s]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
