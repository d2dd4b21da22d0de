"""A Slurm cluster of network namespaces on one machine, for the fleet tier (tests/fleet/).

Each "host" is a network namespace with its own address on a bridge (10.77.0.1N/24; the
bridge, 10.77.0.1, is the machine itself), and a `slurmd -N hN` in it, so every job step
Slurm starts on hN runs in hN's namespace: an `agentvm serve` there listens on hN's address,
and HAProxy in front reaches it over the bridge, as it would another machine. slurmctld runs
on the bridge's address. Debian 12's Slurm (22.05) is built with multiple-slurmd support;
auth/none and cred/none stand in for munge, whose key a test should not need.

Everything the cluster writes is under its directory; stop() ends every daemon it started,
removes the namespaces and the bridge, and leaves nothing behind.
"""
import os
import shutil
import socket
import subprocess
import time

BRIDGE = "agvfleet0"
NETNS_PREFIX = "agvf-"
SUBNET = "10.77.0"
CTLD_PORT = 16817
SLURMD_PORT = 16818


def sh(*argv, check=True, **kwargs):
    return subprocess.run(argv, check=check, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def host_address(index):
    return f"{SUBNET}.{10 + index}"


class SlurmCluster:
    def __init__(self, root, nodes=3):
        self.root = root
        self.nodes = [f"h{i}" for i in range(1, nodes + 1)]
        self.conf = os.path.join(root, "slurm.conf")
        self.procs = []
        self.env = dict(os.environ, SLURM_CONF=self.conf)

    def address(self, node):
        return host_address(self.nodes.index(node) + 1)

    def netns(self, node):
        return NETNS_PREFIX + node

    # --- the machine ------------------------------------------------------------------------
    def _prepare_machine(self):
        for module in ("bridge", "veth"):
            sh("modprobe", module, check=False)
        # The test host's kernel boots without a host name; Slurm names its controller's host.
        if socket.gethostname() in ("", "(none)", "localhost"):
            socket.sethostname("fleet-testhost")
        # slurmd's cgroup/v2 plugin puts its step daemons under system.slice and asks systemd
        # over D-Bus for a scope; the test host has neither systemd nor a cgroup mount.
        if not os.path.ismount("/sys/fs/cgroup"):
            sh("mount", "-t", "cgroup2", "none", "/sys/fs/cgroup")
        self.no_systemd = not os.path.exists("/run/dbus/system_bus_socket")
        if self.no_systemd:
            os.makedirs("/sys/fs/cgroup/system.slice", exist_ok=True)

    def _network(self):
        self._remove_network()
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "add", f"{SUBNET}.1/24", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        for index, node in enumerate(self.nodes, start=1):
            ns = self.netns(node)
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", f"{ns}-a", "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "link", "set", f"{ns}-a", "master", BRIDGE, "up")
            sh("ip", "-n", ns, "addr", "add", f"{host_address(index)}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")

    def _remove_network(self):
        for node in self.nodes:
            sh("ip", "netns", "del", self.netns(node), check=False)
        sh("ip", "link", "del", BRIDGE, check=False)

    # --- Slurm ------------------------------------------------------------------------------
    def _write_conf(self):
        host = socket.gethostname().split(".")[0]
        root = self.root
        lines = [
            "ClusterName=agentvm-fleet-test",
            f"SlurmctldHost={host}({SUBNET}.1)",
            f"SlurmctldPort={CTLD_PORT}",
            "AuthType=auth/none", "CredType=cred/none",
            "SlurmUser=root", "SlurmdUser=root",
            f"StateSaveLocation={root}/ctld",
            f"SlurmdSpoolDir={root}/spool-%n",
            f"SlurmdPidFile={root}/slurmd-%n.pid",
            f"SlurmctldPidFile={root}/slurmctld.pid",
            f"SlurmctldLogFile={root}/slurmctld.log",
            f"SlurmdLogFile={root}/slurmd-%n.log",
            "ProctrackType=proctrack/pgid", "TaskPlugin=task/none", "SwitchType=switch/none", "MpiDefault=none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            # Three slurmd on a 2-core machine each claim the CPUs their line gives them.
            "SlurmdParameters=config_overrides",
            "ReturnToService=2", "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none", "SchedulerType=sched/builtin",
            "InactiveLimit=0", "KillWait=5", "MailProg=/bin/true",
        ]
        for index, node in enumerate(self.nodes, start=1):
            lines.append(f"NodeName={node} NodeHostname={host} NodeAddr={host_address(index)} "
                         f"Port={SLURMD_PORT} CPUs=2")
        lines.append(f"PartitionName=fleet Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP "
                     "OverSubscribe=YES")
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(os.path.join(root, "cgroup.conf"), "w") as f:
            f.write("CgroupPlugin=cgroup/v2\n" + ("IgnoreSystemd=yes\n" if self.no_systemd else ""))
        os.makedirs(f"{root}/ctld", exist_ok=True)
        for node in self.nodes:
            os.makedirs(f"{root}/spool-{node}", exist_ok=True)

    def _spawn(self, argv, log_name):
        log = open(os.path.join(self.root, log_name), "w")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        log.close()
        self.procs.append(proc)
        return proc

    def start_slurmd(self, node):
        # nsenter rather than `ip netns exec`, which mounts a sysfs of the namespace's own over
        # /sys and so hides the cgroup tree slurmd needs.
        return self._spawn(["nsenter", f"--net=/run/netns/{self.netns(node)}", "slurmd", "-D", "-N", node,
                            "-f", self.conf], f"slurmd-{node}.out")

    def start(self, within=60):
        os.makedirs(self.root, exist_ok=True)
        self._prepare_machine()
        self._network()
        self._write_conf()
        self._spawn(["slurmctld", "-D", "-i", "-f", self.conf], "slurmctld.out")
        for node in self.nodes:
            self.start_slurmd(node)
        deadline = time.monotonic() + within
        while True:
            states = sh("sinfo", "-h", "-N", "-o", "%N %T", check=False, env=self.env).stdout.split()
            idle = {states[i] for i in range(0, len(states) - 1, 2) if states[i + 1] in ("idle", "mixed")}
            if idle >= set(self.nodes):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"Slurm's nodes not idle after {within} s: {' '.join(states)}; "
                                   f"see {self.root}/*.out")
            time.sleep(0.5)

    def run(self, *argv, check=True, timeout=60):
        return sh(*argv, check=check, env=self.env, timeout=timeout)

    def stop(self):
        # Jobs first (their steps end their tasks), then the daemons.
        sh("scancel", "--full", "--partition=fleet", check=False, env=self.env)
        time.sleep(1)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
        self._remove_network()

    def logs(self):
        """The tail of every daemon's log, for a failure's report."""
        out = []
        for name in sorted(os.listdir(self.root)):
            if name.endswith((".log", ".out")):
                with open(os.path.join(self.root, name), errors="replace") as f:
                    out.append(f"--- {name}\n" + "".join(f.readlines()[-15:]))
        return "\n".join(out)

    def remove(self):
        shutil.rmtree(self.root, ignore_errors=True)
