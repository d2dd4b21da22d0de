"""The test host: run a command where a real (hardware-style) KVM guest can boot.

On a host with hardware KVM the command runs directly. On a PVM host (or one without a
usable /dev/kvm) it runs inside L1: QEMU/TCG emulating an AMD EPYC with SVM, booting
Debian's own kernel with kvm_amd loaded. L1 sees the host's root filesystem read-only over
virtio-9p and chroots into it, so every binary, library and path is the host's; the git
checkout(s), the cwd and the agentvm cache dir are shared read-write at the same paths.
See README.md in this directory.
"""

import hashlib
import os
import select
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EXIT_SETUP = 125     # test host missing a package / cannot be built
EXIT_TIMEOUT = 124
EXIT_L1_FAILED = 126  # L1 died before reporting CMD's status

# Modules L1 loads, in order, with their arguments. Their dependencies are checked
# against `modinfo -F depends` at setup time.
MODULES = [
    ("virtio_ring", ""), ("virtio", ""), ("virtio_mmio", ""), ("virtio_console", ""),
    ("netfs", ""), ("fscache", ""), ("9pnet", ""), ("9pnet_virtio", ""), ("9p", ""),
    ("irqbypass", ""), ("ccp", ""), ("kvm", ""), ("kvm-amd", "nested=1 npt=1"),
]
SCRIPT_FILES = ["testhost.py", "init.sh", "run", "setup"]


def log(msg):
    sys.stderr.write("testhost: " + msg + "\n")
    sys.stderr.flush()


class SetupError(Exception):
    pass


def cache_dir():
    if os.environ.get("AGENTVM_CACHE"):
        return os.environ["AGENTVM_CACHE"]
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "agentvm")


# ---------------------------------------------------------------- host detection

def host_kind():
    """'hardware', 'pvm' or 'none' (no usable /dev/kvm, or no vmx/svm). A machine that is
    itself a PVM guest has the kvm_pvm module but no /dev/kvm: that is 'none'."""
    if not os.path.exists("/dev/kvm") or not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "none"
    if os.path.isdir("/sys/module/kvm_pvm"):
        return "pvm"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = line.split(":", 1)[1].split()
                    return "hardware" if ("vmx" in flags or "svm" in flags) else "none"
    except OSError:
        pass
    return "none"


# ---------------------------------------------------------------- setup (cached artifacts)

def _which_or_fail(prog, package):
    path = shutil.which(prog)
    if not path:
        raise SetupError(f"{prog} not found: install the Debian package '{package}'")
    return path


def l1_kernel():
    """(version, /boot/vmlinuz-..., modules dir) of the newest Debian kernel with kvm-amd."""
    cands = []
    for name in os.listdir("/boot") if os.path.isdir("/boot") else []:
        if name.startswith("vmlinuz-"):
            ver = name[len("vmlinuz-"):]
            mdir = f"/lib/modules/{ver}"
            if os.path.exists(f"{mdir}/kernel/arch/x86/kvm/kvm-amd.ko"):
                cands.append(ver)
    if not cands:
        raise SetupError("no /boot/vmlinuz-* with /lib/modules/*/kernel/arch/x86/kvm/kvm-amd.ko:"
                         " install the Debian package 'linux-image-amd64'")
    def vkey(v):
        return [int(p) if p.isdigit() else 0 for p in v.replace("-", ".").split(".")]
    ver = max(cands, key=vkey)
    return ver, f"/boot/vmlinuz-{ver}", f"/lib/modules/{ver}"


def _busybox():
    for p in ("/bin/busybox", "/usr/bin/busybox"):
        if os.path.exists(p):
            out = subprocess.run(["file", "-L", p], capture_output=True, text=True).stdout \
                if shutil.which("file") else "statically linked"
            if "statically linked" in out or "static-pie" in out:
                return p
    raise SetupError("no static busybox: install the Debian package 'busybox-static'")


def _pkg_version(pkg):
    r = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", pkg],
                       capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else "?"


def artifact_key(kver):
    h = hashlib.sha256()
    h.update(f"kernel={kver}\n".encode())
    h.update(f"kernel-pkg={_pkg_version('linux-image-' + kver)}\n".encode())
    h.update(f"busybox={_pkg_version('busybox-static')}\n".encode())
    for name in SCRIPT_FILES:
        with open(os.path.join(HERE, name), "rb") as f:
            h.update(name.encode() + b"\0" + f.read())
    return h.hexdigest()[:16]


def _newc_entry(name, mode, data=b"", ino=[1000]):
    ino[0] += 1
    name_b = name.encode() + b"\0"
    hdr = "070701" + "".join("%08X" % v for v in (
        ino[0], mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name_b), 0))
    out = hdr.encode() + name_b
    out += b"\0" * ((4 - len(out) % 4) % 4)
    out += data
    out += b"\0" * ((4 - len(out) % 4) % 4)
    return out


def _build_initramfs(path, busybox, mdir):
    """Uncompressed newc cpio: /init, /bin/busybox, the modules and their order."""
    deps = {}
    for name, _ in MODULES:
        r = subprocess.run(["modinfo", "-k", os.path.basename(mdir), "-F", "depends",
                            os.path.join(mdir, _module_relpath(mdir, name))],
                           capture_output=True, text=True)
        deps[name] = [d for d in r.stdout.strip().split(",") if d]
    loaded = set()
    for name, _ in MODULES:
        for d in deps[name]:
            if d.replace("-", "_") not in loaded:
                raise SetupError(f"module {name} needs {d}, not loaded before it")
        loaded.add(name.replace("-", "_"))
    parts = []
    for d in ("bin", "dev", "proc", "sys", "tmp", "newroot", "run-share", "lib", "lib/modules"):
        parts.append(_newc_entry(d, 0o40755))
    parts.append(_newc_entry("dev/console", 0o20600))  # placeholder; devtmpfs replaces it
    with open(os.path.join(HERE, "init.sh"), "rb") as f:
        parts.append(_newc_entry("init", 0o100755, f.read()))
    with open(busybox, "rb") as f:
        parts.append(_newc_entry("bin/busybox", 0o100755, f.read()))
    lines = []
    for name, args in MODULES:
        with open(os.path.join(mdir, _module_relpath(mdir, name)), "rb") as f:
            parts.append(_newc_entry(f"lib/modules/{name}.ko", 0o100644, f.read()))
        lines.append(f"{name} {args}".rstrip())
    parts.append(_newc_entry("modules.list", 0o100644, ("\n".join(lines) + "\n").encode()))
    parts.append(_newc_entry("TRAILER!!!", 0))
    with open(path, "wb") as f:
        for p in parts:
            f.write(p)


_modpaths = {}


def _module_relpath(mdir, name):
    if not _modpaths:
        with open(os.path.join(mdir, "modules.dep")) as f:
            for line in f:
                rel = line.split(":", 1)[0]
                base = os.path.basename(rel)
                for ext in (".ko", ".ko.xz", ".ko.zst", ".ko.gz"):
                    if base.endswith(ext):
                        _modpaths[base[:-len(ext)].replace("-", "_")] = rel
    rel = _modpaths.get(name.replace("-", "_"))
    if not rel:
        raise SetupError(f"module {name} not found in {mdir}: install 'linux-image-amd64'")
    if not rel.endswith(".ko"):
        raise SetupError(f"module {rel} is compressed; the test host expects plain .ko files")
    return rel


def setup(verbose=True):
    """Return the artifact dir (vmlinux, initramfs.cpio), building it if needed."""
    _which_or_fail("qemu-system-x86_64", "qemu-system-x86")
    kver, vmlinuz, mdir = l1_kernel()
    busybox = _busybox()
    key = artifact_key(kver)
    base = os.path.join(cache_dir(), "testhost")
    final = os.path.join(base, key)
    if os.path.exists(os.path.join(final, "initramfs.cpio")):
        return final
    src = "/usr/src/linux-source-6.1.tar.xz"
    srcs = sorted(p for p in os.listdir("/usr/src") if p.startswith("linux-source-")
                  and p.endswith(".tar.xz")) if os.path.isdir("/usr/src") else []
    if not srcs:
        raise SetupError("no /usr/src/linux-source-*.tar.xz (for scripts/extract-vmlinux):"
                         " install the Debian package 'linux-source-6.1'")
    src = os.path.join("/usr/src", srcs[-1])
    os.makedirs(base, exist_ok=True)
    if verbose:
        log(f"building test host artifacts for {kver} in {final} (once, ~15 s)")
    tmp = tempfile.mkdtemp(prefix=f".build-{key}-", dir=base)
    os.chmod(tmp, 0o755)
    try:
        member = srcs[-1][:-len(".tar.xz")] + "/scripts/extract-vmlinux"
        r = subprocess.run(["tar", "-xJf", src, "-C", tmp, member], capture_output=True, text=True)
        if r.returncode != 0:
            raise SetupError(f"extracting {member} from {src} failed: {r.stderr.strip()}")
        with open(os.path.join(tmp, "vmlinux"), "wb") as out:
            r = subprocess.run(["sh", os.path.join(tmp, member), vmlinuz], stdout=out,
                               stderr=subprocess.PIPE, text=True)
        if r.returncode != 0 or os.path.getsize(os.path.join(tmp, "vmlinux")) < 1 << 20:
            raise SetupError(f"extract-vmlinux {vmlinuz} failed: {r.stderr.strip()}")
        shutil.rmtree(os.path.join(tmp, member.split("/")[0]))
        _build_initramfs(os.path.join(tmp, "initramfs.cpio"), busybox, mdir)
        with open(os.path.join(tmp, "KEY"), "w") as f:
            f.write(f"kernel {kver}\nbusybox {_pkg_version('busybox-static')}\nkey {key}\n")
        try:
            os.rename(tmp, final)  # atomic; loses harmlessly against a concurrent setup
        except OSError:
            if not os.path.exists(os.path.join(final, "initramfs.cpio")):
                raise
        # Drop artifacts of other keys (old kernels / old runner versions).
        for old in os.listdir(base):
            p = os.path.join(base, old)
            if old != key and not old.startswith(".") and os.path.isdir(p):
                shutil.rmtree(p, ignore_errors=True)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return final


# ---------------------------------------------------------------- running under L1

def _git_toplevel(path):
    p = os.path.realpath(path)
    while True:
        if os.path.exists(os.path.join(p, ".git")):
            return p
        parent = os.path.dirname(p)
        if parent == p:
            return None
        p = parent


def _rw_shares(extra):
    """Writable directories shared at the same path: outermost only, sorted."""
    cands = [_git_toplevel(HERE), os.getcwd()]
    top = _git_toplevel(os.getcwd())
    if top:
        cands.append(top)
    cdir = cache_dir()
    os.makedirs(cdir, exist_ok=True)
    cands.append(cdir)
    cands += extra
    paths = []
    for c in cands:
        if not c:
            continue
        c = os.path.realpath(c)
        if c == "/" or not os.path.isdir(c):
            continue
        paths.append(c)
    paths = sorted(set(paths))
    out = []
    for p in paths:
        if not any(p.startswith(o + "/") for o in out):
            out.append(p)
    return out


_SKIP_ENV = {"_", "SHLVL", "OLDPWD", "PWD", "TERMCAP", "LS_COLORS"}


def _cmd_script(argv, cwd, shares):
    lines = ["# written by tests/testhost/run"]
    for k, v in sorted(os.environ.items()):
        if k in _SKIP_ENV or not k.replace("_", "a").isalnum() or k[0].isdigit():
            continue
        lines.append(f"export {k}={shlex.quote(v)}")
    # Outside the shares L1's filesystem is read-only, so temporary files (agentvm's disk
    # overlays among them) must go to L1's tmpfs unless TMPDIR already points into a share.
    tmpdir = os.environ.get("TMPDIR")
    if not tmpdir or not any((tmpdir + "/").startswith(s + "/") for s in shares):
        lines.append("export TMPDIR=/tmp")
    lines.append(f"export PWD={shlex.quote(cwd)}")
    # Says to CMD that it runs emulated, where only relations between timings mean anything.
    lines.append("export AGENTVM_IN_TESTHOST=1")
    lines.append("unset AGENTVM_TESTHOST_RUN_DIR 2>/dev/null")
    lines.append(f"cd {shlex.quote(cwd)} || exit 125")
    lines.append("exec " + " ".join(shlex.quote(a) for a in argv))
    return "\n".join(lines) + "\n"


def _cleanup_stale(base):
    """Remove run dirs whose runner died without cleaning up (e.g. SIGKILL)."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    for n in names:
        if not n.startswith("testhost-run."):
            continue
        try:
            pid = int(n.split(".")[1])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(base, n), ignore_errors=True)
        except (ValueError, IndexError, PermissionError):
            pass


def _rdtsc_fn():
    import ctypes
    import mmap
    code = bytes.fromhex("0f3148c1e2204809d0c3")  # rdtsc; shl rdx,32; or rax,rdx; ret
    buf = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    buf.write(code)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    fn = ctypes.CFUNCTYPE(ctypes.c_uint64)(addr)
    fn._keep = buf
    return fn


def host_tsc_khz():
    """The host TSC rate. Under TCG the guest's RDTSC reads the host TSC, and the L1
    kernel's own calibration against the emulated PIT fails on a loaded host (then
    boot stalls), so L1 is told the rate: tsc_early_khz=."""
    try:
        rdtsc = _rdtsc_fn()
        samples = []
        for _ in range(3):
            t0, c0 = time.perf_counter_ns(), rdtsc()
            time.sleep(0.02)
            t1, c1 = time.perf_counter_ns(), rdtsc()
            samples.append((c1 - c0) * 1e6 / (t1 - t0))
        khz = sorted(samples)[1]
        if 100_000 < khz < 10_000_000:
            return int(khz)
    except Exception:
        pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("cpu MHz"):
                    return int(float(line.split(":")[1]) * 1000)
    except (OSError, ValueError):
        pass
    return None


def _set_pdeathsig():
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _end_with_parent():
    """The runner ends as if sent SIGTERM (stopping what it started) when the process that
    started it dies: a killed test or `meson test` would otherwise leave it, re-parented to
    init, and its QEMU running. Call with the SIGTERM handler in place."""
    parent = os.getppid()
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        return
    if os.getppid() != parent:  # it died before the signal was asked for
        os.kill(os.getpid(), signal.SIGTERM)


class _Terminated(Exception):
    def __init__(self, signum):
        self.signum = signum


def _stdin_forwarded():
    """Whether the runner's stdin goes to CMD in L1: not when it is closed, a terminal or
    /dev/null (then CMD's stdin is /dev/null)."""
    try:
        st = os.fstat(0)
    except OSError:
        return False
    if os.isatty(0):
        return False
    if stat.S_ISCHR(st.st_mode):
        try:
            if st.st_rdev == os.stat(os.devnull).st_rdev:
                return False
        except OSError:
            pass
    return True


def _stream_failures(rundir, received):
    """What init.sh reported of CMD's stdout/stderr relays against what arrived here:
    a list of messages, empty when every byte CMD wrote arrived."""
    try:
        with open(os.path.join(rundir, "streams"), errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return ["no report from the stdout/stderr relays in L1"]
    report = {}
    for line in lines:
        parts = line.split(" ", 3)
        if len(parts) >= 3:
            report[parts[0]] = parts[1:]
    bad = []
    for name in ("stdout", "stderr"):
        if name not in report:
            bad.append(f"{name}: no report from its relay in L1")
            continue
        rc, sent = report[name][0], report[name][1]
        msg = report[name][2].strip() if len(report[name]) > 2 else ""
        if rc != "0":
            bad.append(f"{name}: the relay in L1 failed (exit {rc}{': ' + msg if msg else ''});"
                       f" {received[name]} bytes arrived")
        elif sent != "-" and (not sent.isdigit() or int(sent) != received[name]):
            bad.append(f"{name}: L1 sent {sent} bytes to its port, {received[name]} arrived")
    return bad


def run_in_l1(argv, timeout, mem, extra_shares=(), debug=False):
    art = setup()
    tmpbase = tempfile.gettempdir()
    _cleanup_stale(tmpbase)
    rundir = tempfile.mkdtemp(prefix=f"testhost-run.{os.getpid()}.", dir=tmpbase)
    qemu = None
    out_f = err_f = None
    in_r = in_w = None

    def on_signal(signum, frame):
        raise _Terminated(signum)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        _end_with_parent()
        cwd = os.getcwd()
        shares = _rw_shares(list(extra_shares))
        with open(os.path.join(rundir, "cmd.sh"), "w") as f:
            f.write(_cmd_script(argv, cwd, shares))
        with open(os.path.join(rundir, "shares"), "w") as f:
            for i, p in enumerate(shares):
                f.write(f"rw{i} {p}\n")
        for name in ("stdout", "stderr"):
            open(os.path.join(rundir, name), "wb").close()
        forward_stdin = _stdin_forwarded()
        if forward_stdin:
            # QEMU's own stdin is a pipe the runner feeds from its stdin; the "stdio" chardev
            # passes it to port 3, and its EOF closes the port (EOF for the reader in L1).
            in_r, in_w = os.pipe()
            os.set_blocking(in_w, False)
            open(os.path.join(rundir, "stdin"), "wb").close()  # tells init.sh
        p9 = "local,security_model=none"
        khz = host_tsc_khz()
        args = [
            "qemu-system-x86_64", "-M", "microvm", "-accel", "tcg", "-cpu", "EPYC",
            "-smp", "1", "-m", str(mem), "-nodefaults", "-no-user-config", "-nographic",
            "-no-reboot", "-display", "none",
            "-kernel", os.path.join(art, "vmlinux"),
            "-initrd", os.path.join(art, "initramfs.cpio"),
            "-append", "console=ttyS0 panic=-1 mitigations=off rdinit=/init tsc=reliable reboot=t"
            + (f" tsc_early_khz={khz}" if khz else "") + ("" if debug else " quiet"),
            "-serial", "file:" + os.path.join(rundir, "console.log"),
            "-device", "virtio-serial-device,max_ports=4",
            "-chardev", "file,id=out,path=" + os.path.join(rundir, "stdout"),
            "-device", "virtserialport,chardev=out,nr=1,name=stdout",
            "-chardev", "file,id=err,path=" + os.path.join(rundir, "stderr"),
            "-device", "virtserialport,chardev=err,nr=2,name=stderr",
        ]
        if forward_stdin:
            args += ["-chardev", "stdio,id=in,signal=off",
                     "-device", "virtserialport,chardev=in,nr=3,name=stdin"]
        args += [
            "-fsdev", f"{p9},id=run,path={rundir}",
            "-device", "virtio-9p-device,fsdev=run,mount_tag=run",
            "-fsdev", f"{p9},readonly=on,multidevs=remap,id=root,path=/",
            "-device", "virtio-9p-device,fsdev=root,mount_tag=root",
        ]
        for i, p in enumerate(shares):
            args += ["-fsdev", f"{p9},multidevs=remap,id=rw{i},path={p}",
                     "-device", f"virtio-9p-device,fsdev=rw{i},mount_tag=rw{i}"]
        qlog = open(os.path.join(rundir, "qemu.log"), "wb")
        t0 = time.monotonic()
        qemu = subprocess.Popen(args, stdin=in_r if forward_stdin else subprocess.DEVNULL,
                                stdout=qlog, stderr=qlog, preexec_fn=_set_pdeathsig)
        qlog.close()
        if in_r is not None:
            os.close(in_r)
            in_r = None
        out_f = open(os.path.join(rundir, "stdout"), "rb")
        err_f = open(os.path.join(rundir, "stderr"), "rb")
        pidfd = os.pidfd_open(qemu.pid)
        deadline = t0 + timeout
        started = None
        received = {"stdout": 0, "stderr": 0}
        stdin_open = forward_stdin  # runner's stdin not yet at EOF
        pending = b""               # read from stdin, not yet taken by QEMU

        def pump():
            for src, dst, name in ((out_f, 1, "stdout"), (err_f, 2, "stderr")):
                while True:
                    chunk = src.read(1 << 16)
                    if not chunk:
                        break
                    received[name] += len(chunk)
                    _write_all(dst, chunk)

        while True:
            now = time.monotonic()
            if now >= deadline:
                _kill(qemu)
                pump()
                log(f"timeout: command did not finish within {timeout:g} s; killed the test host")
                return EXIT_TIMEOUT
            reading = in_w is not None and stdin_open and not pending
            rlist = [pidfd, 0] if reading else [pidfd]
            wlist = [in_w] if in_w is not None and pending else []
            r, w, _ = select.select(rlist, wlist, [], min(0.05, deadline - now))
            if reading and 0 in r:
                try:
                    chunk = os.read(0, 1 << 16)
                except (BlockingIOError, InterruptedError):
                    chunk = None
                except OSError as e:
                    log(f"reading stdin failed ({e.strerror}); CMD gets EOF")
                    chunk = b""
                if chunk == b"":
                    stdin_open = False
                elif chunk:
                    pending = chunk
            if in_w is not None and pending and in_w in w:
                try:
                    pending = pending[os.write(in_w, pending):]
                except BlockingIOError:
                    pass
                except BrokenPipeError:  # QEMU is gone; the status tells why
                    pending, stdin_open = b"", False
            if in_w is not None and not pending and not stdin_open:
                os.close(in_w)  # EOF for QEMU's stdin: port 3 closes, CMD's stdin ends
                in_w = None
            pump()
            if debug and started is None and os.path.exists(os.path.join(rundir, "started")):
                started = time.monotonic()
                log(f"L1 start -> CMD start: {started - t0:.2f} s")
            if pidfd in r:
                break
        qemu.wait()
        os.close(pidfd)
        pump()
        if debug:
            log(f"L1 start -> exit: {time.monotonic() - t0:.2f} s")
        try:
            with open(os.path.join(rundir, "status")) as f:
                status = int(f.read().strip()) & 0xFF
        except (OSError, ValueError):
            log(f"the test host died before the command finished (qemu exit {qemu.returncode})")
            _log_tails(rundir)
            return EXIT_L1_FAILED
        bad = _stream_failures(rundir, received)
        if bad:
            for b in bad:
                log(f"output lost: {b}")
            log(f"failing with exit {EXIT_L1_FAILED} (the command itself exited {status})")
            return EXIT_L1_FAILED
        return status
    except _Terminated as t:
        _kill(qemu)
        log(f"killed by signal {t.signum}; stopped the test host")
        return 128 + t.signum
    finally:
        for s in old:
            signal.signal(s, signal.SIG_IGN)
        _kill(qemu)
        for fd in (in_r, in_w):
            if fd is not None:
                os.close(fd)
        for f in (out_f, err_f):
            if f:
                f.close()
        if debug:
            log(f"run dir kept: {rundir}")
        else:
            shutil.rmtree(rundir, ignore_errors=True)
        for s, h in old.items():
            signal.signal(s, h)


def _log_tails(rundir):
    for name in ("qemu.log", "console.log"):
        try:
            with open(os.path.join(rundir, name), errors="replace") as f:
                tail = f.read()[-3000:]
        except OSError:
            tail = ""
        if tail.strip():
            sys.stderr.write(f"--- {name} (tail) ---\n{tail}\n")


def run_direct(argv, timeout):
    """Hardware KVM: run CMD as a plain child (own process group), same timeout/signals."""
    try:
        child = subprocess.Popen(argv, start_new_session=True)
    except OSError as e:
        log(f"cannot run {argv[0]}: {e.strerror}")
        return 127 if isinstance(e, FileNotFoundError) else 126

    def forward(signum, frame):
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            pass

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, forward)
    _end_with_parent()
    try:
        rc = child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        log(f"timeout: command did not finish within {timeout:g} s; killed it")
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        child.wait()
        return EXIT_TIMEOUT
    return 128 - rc if rc < 0 else rc


def _write_all(fd, data):
    while data:
        try:
            n = os.write(fd, data)
        except BrokenPipeError:
            return
        except BlockingIOError:
            select.select([], [fd], [])
            continue
        data = data[n:]


def _kill(proc):
    if proc is None or proc.poll() is not None:
        return
    proc.kill()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
