"""Embedded transport: one ``agentvm episode`` subprocess per sandbox, JSON lines on its
stdin/stdout (docs/protocol.md, "The host side: agentvm episode").

Everything runs on the caller's event loop without threads: the pipes are asyncio pipe
transports, the process's exit is watched through a pidfd (or polled where there is none).
Response lines may be hundreds of MiB long, so stdout is split into lines here, with no
line-length limit, instead of through ``StreamReader.readline``.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections import deque
from typing import Any, Awaitable, Callable, Deque, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ._common import (DEFAULT_GRACE, FILE_CHUNK, MAX_LINE_BYTES, FileData, OnEvent, OnRef, StreamValue,
                      cancel_quietly, put_bytes, wait_answer)
from ._forward import Dialer, HybridVsockDialer
from ._snapshots import ManagedDir
from .errors import (SANDBOX_DEATH_CODES, CallTimeout, SandboxDied, StartFailed,
                     error_from_protocol)
from .models import byte_field

STDERR_TAIL = 64 * 1024
# Episode exit statuses (docs/protocol.md, "When the episode fails"; docs/cli.md, exit statuses).
_EXIT_CODES = {3: "vm_died", 4: "vm_died", 5: "episode_timeout"}
_CANCELLABLE = ("exec", "shell", "run_code", "attach", "watch")
_ANSWERED_WITH = re.compile(r"answered with error '([a-z_]+)'")
_SUN_PATH_MAX = 107  # a Unix socket's path, in bytes (sockaddr_un's sun_path, less its NUL)


def _fmt_seconds(s: float) -> str:
    return repr(float(s)) if s != int(s) else str(int(s))


def _given_vsock_uds(args: Sequence[str]) -> Optional[str]:
    """The ``--vsock-uds`` path among the caller's agentvm arguments, if they name one."""
    for i, arg in enumerate(args):
        if arg == "--vsock-uds" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--vsock-uds="):
            return arg[len("--vsock-uds="):]
    return None


def _private_socket_dir() -> Tuple[str, str]:
    """A new directory of this user's alone (0700) for an episode's ``--vsock-uds`` socket, and
    the socket's path in it. Under /tmp when ``$TMPDIR`` is too long a path for a socket."""
    made = tempfile.mkdtemp(prefix="agentvm-vsock-")
    path = os.path.join(made, "vsock")
    if len(os.fsencode(path)) > _SUN_PATH_MAX and os.path.isdir("/tmp"):
        os.rmdir(made)
        made = tempfile.mkdtemp(prefix="agentvm-vsock-", dir="/tmp")
        path = os.path.join(made, "vsock")
    return made, path


class _Call:
    __slots__ = ("future", "on_event")

    def __init__(self, future: "asyncio.Future[Dict[str, Any]]", on_event: Optional[OnEvent]) -> None:
        self.future = future
        self.on_event = on_event


class _Stdout(asyncio.Protocol):
    def __init__(self, owner: "EpisodeTransport") -> None:
        self.owner = owner
        self.parts: List[bytes] = []

    def data_received(self, data: bytes) -> None:
        owner = self.owner
        owner.last_rx = owner.loop.time()
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                if start < len(data):
                    self.parts.append(data[start:])
                return
            if self.parts:
                self.parts.append(data[start:nl])
                line = b"".join(self.parts)
                self.parts = []
            else:
                line = data[start:nl]
            start = nl + 1
            if line.strip():
                owner._on_line(line)

    def eof_received(self) -> Optional[bool]:
        return None

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if self.parts:
            line = b"".join(self.parts)
            self.parts = []
            if line.strip():
                self.owner._on_line(line)
        self.owner._stdout_closed()


class _Stderr(asyncio.Protocol):
    def __init__(self, owner: "EpisodeTransport") -> None:
        self.owner = owner

    def data_received(self, data: bytes) -> None:
        tail = self.owner.stderr_tail
        tail += data
        if len(tail) > STDERR_TAIL:
            del tail[: len(tail) - STDERR_TAIL]

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.owner.stderr_done.set()


class _Stdin(asyncio.Protocol):
    def __init__(self, owner: "EpisodeTransport") -> None:
        self.owner = owner
        self.paused = False
        self.waiters: List["asyncio.Future[None]"] = []
        self.lost = False

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._wake()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.lost = True
        self._wake()

    def _wake(self) -> None:
        waiters, self.waiters = self.waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)


class EpisodeTransport:
    """One sandbox as an ``agentvm episode`` child process. What serve does for its sandboxes
    is done here on the client's side: the sandbox's envs given to the episode (its ``env``
    op, which adds them to argv calls and exports them in the shell), a lifetime shortened by a
    timer, fork and pause through live snapshots."""

    kind = "embedded"

    def __init__(self, binary: str, *, snapshot: Optional[str], timeout: float,
                 extra_args: Iterable[str] = (), fork_args: Iterable[str] = (), grace: float = DEFAULT_GRACE,
                 envs: Optional[Dict[str, str]] = None,
                 snapshot_dir: Optional[str] = None, managed: Optional[ManagedDir] = None,
                 hold: Optional[str] = None, no_snapshot_dir_why: str = "") -> None:
        self.binary = binary
        self.snapshot = snapshot
        self.snapshot_dir = snapshot_dir
        # The client's own snapshot directory this episode's snapshots (or the one it is
        # restored from) are in: held from start() until the episode has ended (_snapshots.py).
        self.managed = managed
        self._hold = hold
        # Why there is no snapshot_dir although the caller gave none (the managed one failed).
        self.no_snapshot_dir_why = no_snapshot_dir_why
        self.timeout = timeout
        self.extra_args = list(extra_args)
        # agentvm's arguments the caller gave (without --template): its forks start with them.
        self.fork_args = list(fork_args)
        # The episode's --vsock-uds socket, through which ports.forward reaches the guest: the
        # caller's, or one in a private directory made at start and removed once it has ended.
        self.vsock_uds = _given_vsock_uds(self.extra_args)
        self._vsock_dir: Optional[str] = None
        self.grace = grace
        self.envs: Dict[str, str] = {} if envs is None else envs
        self.loop = asyncio.get_running_loop()
        self.proc: "Optional[subprocess.Popen[bytes]]" = None
        self.pid: Optional[int] = None
        self.sandbox_id = ""
        self.restored: Optional[bool] = None
        self.last_rx = 0.0
        self.stderr_tail = bytearray()
        self.stderr_done = asyncio.Event()
        self._ids = itertools.count(1)
        self._calls: Dict[int, _Call] = {}
        self._ready: "asyncio.Future[Dict[str, Any]]" = self.loop.create_future()
        self._stdout_eof = asyncio.Event()
        self._exited = asyncio.Event()
        self._dead: Optional[SandboxDied] = None
        self._death_codes: List[str] = []
        self._reaper: Optional["asyncio.Task[None]"] = None
        self._killing = False
        self._stdin_t: Optional[asyncio.WriteTransport] = None
        self._stdin_p: Optional[_Stdin] = None
        self._stdout_t: Optional[asyncio.ReadTransport] = None
        self._pause_count = 0
        self._pidfd: Optional[int] = None
        self._poll_handle: Optional[asyncio.TimerHandle] = None
        self._lifetime: Optional[asyncio.TimerHandle] = None
        self._started_at = 0.0

    # -- life cycle -----------------------------------------------------------------------

    @classmethod
    async def open(cls, binary: str, *, snapshot: Optional[str], snapshot_dir: Optional[str], timeout: float,
                   extra_args: List[str], fork_args: List[str], envs: Dict[str, str], grace: float,
                   start_timeout: float) -> "EpisodeTransport":
        """A new sandbox's episode, started. Restored from a snapshot in a directory the client
        keeps, it holds that one (and writes its own snapshots there without
        ``snapshot_dir``); else, without ``snapshot_dir``, a new one is made for it."""
        managed = ManagedDir.of(snapshot) if snapshot is not None else None
        hold: Optional[str] = None
        why = ""
        if snapshot_dir is None and managed is not None:
            snapshot_dir = managed.path
        elif snapshot_dir is None:
            try:
                managed, hold = ManagedDir.create()
                snapshot_dir = managed.path
            except OSError as e:
                why = f"the client's own snapshot directory could not be made: {e}"
        episode = cls(binary, snapshot=snapshot, timeout=timeout, extra_args=extra_args, fork_args=fork_args,
                      grace=grace, envs=envs, snapshot_dir=snapshot_dir, managed=managed, hold=hold,
                      no_snapshot_dir_why=why)
        await episode.start(start_timeout)
        return episode

    @classmethod
    async def resume(cls, binary: str, paused: str, *, snapshot_dir: str, timeout: float, extra_args: List[str],
                     envs: Dict[str, str], grace: float, start_timeout: float) -> "EpisodeTransport":
        """The episode of a paused sandbox (``paused``: its snapshot's directory), started. Its
        shell kept its exports (the episode exports ``envs`` only if they differ)."""
        managed = ManagedDir.of(paused)
        episode = cls(binary, snapshot=paused, timeout=timeout, extra_args=extra_args, fork_args=extra_args,
                      grace=grace, envs=envs, snapshot_dir=snapshot_dir, managed=managed)
        await episode.start(start_timeout)
        if managed is not None:
            # Running again (and holding the directory): no longer a paused sandbox to keep.
            managed.resumed(os.path.basename(os.path.normpath(paused)))
        return episode

    async def fork(self, count: int, start_timeout: float) -> List["EpisodeTransport"]:
        """A live snapshot, and one episode restored from it per child; all start or none (the
        others are killed)."""
        taken = await self.live_snapshot(f"fork-{os.getpid()}-{uuid.uuid4().hex}")
        episodes = [EpisodeTransport(self.binary, snapshot=taken["path"], timeout=self.timeout,
                                     extra_args=self.fork_args, fork_args=self.fork_args, grace=self.grace,
                                     envs=dict(self.envs), snapshot_dir=self.snapshot_dir, managed=self.managed)
                    for _ in range(count)]
        results = await asyncio.gather(*(e.start(start_timeout) for e in episodes), return_exceptions=True)
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is not None:
            await asyncio.gather(*(e.kill() for e in episodes), return_exceptions=True)
            raise failure
        return episodes

    async def pause(self) -> str:
        """A live snapshot, then the episode ended; the snapshot's directory resumes it."""
        resume_id = str((await self.live_snapshot(f"pause-{os.getpid()}-{uuid.uuid4().hex}"))["path"])
        if self.managed is not None:
            # Before the episode ends and lets go of the directory.
            self.managed.paused(os.path.basename(resume_id))
        await self.close()
        return resume_id

    def argv(self) -> List[str]:
        args = [self.binary, "episode", "--announce-ready", "--episode-timeout", _fmt_seconds(self.timeout)]
        if self.snapshot is not None:
            args += ["--snapshot", self.snapshot]
        if self.snapshot_dir is not None:
            args += ["--snapshot-dir", self.snapshot_dir]
        if self._vsock_dir is not None and self.vsock_uds is not None:
            args += ["--vsock-uds", self.vsock_uds]
        return args + self.extra_args

    async def live_snapshot(self, name: str) -> Dict[str, Any]:
        """The episode's host op ``snapshot`` (docs/protocol.md, "Live snapshots"): the VM as
        it is now, in ``snapshot_dir/name``; returns the answer's ``snapshot`` object."""
        if self.snapshot_dir is None:
            raise ValueError("this embedded sandbox cannot fork or pause: it has no snapshot directory ("
                             + (self.no_snapshot_dir_why or "none was given")
                             + "); give snapshot_dir= (an existing directory, which the caller cleans up)")
        msg = await self.call("snapshot", {"name": name}, soft_timeout=120.0)
        return dict(msg["snapshot"])

    async def start(self, start_timeout: float) -> None:
        if self.managed is not None and self._hold is None:
            self._hold = self.managed.hold()
            if self._hold is None:
                raise StartFailed("start_failed", f"the snapshot directory {self.managed.path} is gone "
                                  "(nothing needed it any more, or its paused snapshots expired)")
        if self.vsock_uds is None:
            try:
                self._vsock_dir, self.vsock_uds = _private_socket_dir()
            except OSError as e:
                self.release_hold()
                raise StartFailed("start_failed", f"cannot make a directory for the episode's vsock socket: {e}") \
                    from e
        try:
            self.proc = subprocess.Popen(self.argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, bufsize=0, close_fds=True)
        except OSError as e:
            self.release_hold()
            self._remove_vsock_dir()
            raise StartFailed("start_failed", f"cannot run {self.binary}: {e}") from e
        self._started_at = self.loop.time()
        self.pid = self.proc.pid
        self.sandbox_id = f"ep-{self.proc.pid}"
        assert self.proc.stdout and self.proc.stderr and self.proc.stdin
        self._stdout_t, _ = await self.loop.connect_read_pipe(lambda: _Stdout(self), self.proc.stdout)
        await self.loop.connect_read_pipe(lambda: _Stderr(self), self.proc.stderr)
        self._stdin_t, proto = await self.loop.connect_write_pipe(lambda: _Stdin(self), self.proc.stdin)
        self._stdin_p = proto
        self._watch_exit()
        try:
            ready = await asyncio.wait_for(asyncio.shield(self._ready), start_timeout)
        except asyncio.TimeoutError:
            await self.kill()
            raise StartFailed("start_failed", f"agentvm episode was not ready within {start_timeout:g} s"
                              + self._stderr_suffix()) from None
        except asyncio.CancelledError:
            await asyncio.shield(self.kill())
            raise
        self.restored = bool(ready.get("restored"))
        if self.envs:
            # The episode keeps them (docs/protocol.md, "The sandbox's environment"); one restored
            # from a snapshot knows none of its parent's.
            try:
                await self.call("env", {"env": self.envs}, soft_timeout=0.0)
            except BaseException:
                await asyncio.shield(self.kill())
                raise

    def _watch_exit(self) -> None:
        assert self.proc is not None
        try:
            fd = os.pidfd_open(self.proc.pid)
        except (AttributeError, OSError):
            self._poll_exit()
            return
        self._pidfd = fd
        self.loop.add_reader(fd, self._pidfd_ready)

    def _pidfd_ready(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            return
        if self._pidfd is not None:
            self.loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        self._process_exited()

    def _poll_exit(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            self._process_exited()
        else:
            self._poll_handle = self.loop.call_later(0.5, self._poll_exit)

    def _process_exited(self) -> None:
        self._exited.set()
        self._start_reaper()

    def _stdout_closed(self) -> None:
        self._stdout_eof.set()
        self._start_reaper()

    def _start_reaper(self) -> None:
        if self._reaper is None:
            self._reaper = self.loop.create_task(self._reap())

    async def _reap(self) -> None:
        """The episode is ending: wait (bounded) for its exit, the rest of its stdout (the
        error lines of pending calls) and its stderr, then fail whatever is still pending."""
        assert self.proc is not None
        try:
            await asyncio.wait_for(self._exited.wait(), 15)
        except asyncio.TimeoutError:
            self._signal(signal.SIGKILL)
            try:
                await asyncio.wait_for(self._exited.wait(), 15)
            except asyncio.TimeoutError:
                pass
        for event, within in ((self._stdout_eof, 5.0), (self.stderr_done, 2.0)):
            try:
                await asyncio.wait_for(event.wait(), within)
            except asyncio.TimeoutError:
                pass
        self._close_pipes()
        status = self.proc.returncode
        self._dead = self._death(status)
        for call in list(self._calls.values()):
            if not call.future.done():
                call.future.set_exception(self._dead_copy())
        self._calls.clear()
        if not self._ready.done():
            self._ready.set_exception(StartFailed(
                "start_failed", f"agentvm episode exited {status} before it was ready" + self._stderr_suffix()))
            self._ready.exception()  # retrieved here: start() may be gone already
        if self._lifetime is not None:
            self._lifetime.cancel()
        if self._poll_handle is not None:
            self._poll_handle.cancel()
        if self._stdin_p is not None:
            self._stdin_p._wake()
        self.release_hold()
        self._remove_vsock_dir()

    def _remove_vsock_dir(self) -> None:
        """The episode has ended (or never started): its vsock socket's directory goes."""
        made, self._vsock_dir = self._vsock_dir, None
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)

    def release_hold(self) -> None:
        """The episode has ended (or never started): it no longer needs its managed directory."""
        hold, self._hold = self._hold, None
        if hold is not None and self.managed is not None:
            try:
                self.managed.release(hold)
            except OSError:
                pass  # what is left is removed by the next sweep (_snapshots.sweep)

    def _close_pipes(self) -> None:
        if self._pidfd is not None:
            self.loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        for t in (self._stdin_t, self._stdout_t):
            if t is not None and not t.is_closing():
                t.close()

    def _stderr_text(self) -> str:
        return bytes(self.stderr_tail).decode("utf-8", errors="replace")

    def _stderr_suffix(self) -> str:
        lines = [ln for ln in self._stderr_text().splitlines() if ln.strip()]
        errors = [ln for ln in lines if ": error: " in ln or ": critical: " in ln]
        pick = errors[-3:] or lines[-3:]
        return (" (" + " | ".join(pick) + ")") if pick else ""

    def _death(self, status: Optional[int]) -> SandboxDied:
        stderr = self._stderr_text()
        if self._killing:
            code, why = "killed", "the sandbox was killed"
        elif self._death_codes:
            code, why = self._death_codes[-1], "the sandbox's episode ended"
        else:
            found = _ANSWERED_WITH.findall(stderr)
            if found:
                code = found[-1]
            elif status is not None and status in _EXIT_CODES:
                code = _EXIT_CODES[status]
            elif status is not None and status > 128:
                # 128+N: agentvm got signal N (stopped), or its VMM was killed by signal N (the
                # relay lives in the VMM, so no call was answered; the supervisor says which).
                code = "vm_died" if "VMM was killed" in stderr else "stopped"
            else:
                code = "exited"
            why = f"agentvm episode exited {status}"
        return SandboxDied(code, why + self._stderr_suffix(), exit_status=status, stderr_tail=stderr)

    def _dead_copy(self) -> SandboxDied:
        d = self._dead
        assert d is not None
        return SandboxDied(d.code, d.message, exit_status=d.exit_status, stderr_tail=d.stderr_tail)

    def _signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.returncode is None:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass

    async def kill(self) -> None:
        """Stops the episode (SIGTERM: agentvm stops the VM; SIGKILL if it has not ended
        30 s later) and waits for it to end."""
        if self.proc is None:
            return
        if self._dead is None:
            self._killing = True
        self._signal(signal.SIGTERM)
        self._start_reaper()
        assert self._reaper is not None
        try:
            await asyncio.wait_for(asyncio.shield(self._exited.wait()), 30)
        except asyncio.TimeoutError:
            self._signal(signal.SIGKILL)
        await asyncio.shield(self._reaper)

    def kill_at_exit(self) -> None:
        """kill() without the event loop, for interpreter exit: SIGTERM, then SIGKILL if the
        episode has not ended 30 s later."""
        if self.proc is not None and self.proc.returncode is None:
            self._killing = True
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                try:
                    self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    return  # still running: it still needs its snapshot directory
        self.release_hold()
        self._remove_vsock_dir()

    async def close(self) -> None:
        """Ends the episode gracefully: end of stdin; running calls are answered first."""
        if self._stdin_t is not None and not self._stdin_t.is_closing():
            self._stdin_t.close()
        self._start_reaper()
        assert self._reaper is not None
        await asyncio.shield(self._reaper)

    async def is_running(self) -> bool:
        return self._dead is None and self._reaper is None and self.proc is not None \
            and self.proc.returncode is None

    async def set_timeout(self, seconds: float) -> None:
        if self._dead is not None:
            raise self._dead_copy()
        now = self.loop.time()
        hard_end = self._started_at + self.timeout
        if now + seconds > hard_end + 1e-3:
            raise ValueError(
                f"an embedded sandbox cannot outlive the timeout it was created with "
                f"({self.timeout:g} s, {hard_end - now:.1f} s from now: agentvm episode's --episode-timeout); "
                f"create it with a larger timeout")
        if self._lifetime is not None:
            self._lifetime.cancel()
        self._lifetime = self.loop.call_later(seconds, lambda: self.loop.create_task(self.kill()))

    def info(self) -> Mapping[str, Any]:
        return {"id": self.sandbox_id, "pid": self.pid, "restored": self.restored,
                "running": self._dead is None and self._reaper is None}

    def port_dialer(self) -> Dialer:
        """The episode's ``--vsock-uds`` socket, then the guest's port forwarder (vsock port 53)."""
        if self._dead is not None:
            raise self._dead_copy()
        if self.vsock_uds is None:
            raise ValueError("this episode was started without a vsock socket (--vsock-uds)")
        return HybridVsockDialer(self.vsock_uds)

    def port_url(self, port: int) -> str:
        raise ValueError(f"ports.url is for service mode (serve's HTTP proxy to a guest port); an embedded "
                         f"sandbox's port is reached through ports.forward({port}), a local TCP port")

    def port_headers(self) -> Dict[str, str]:
        return {}

    # -- lines ------------------------------------------------------------------------------

    def _on_line(self, line: bytes) -> None:
        try:
            msg = json.loads(line)
        except ValueError:
            msg = None
        if not isinstance(msg, dict):
            # The episode never sends this (it checks every line): stop trusting it.
            self.stderr_tail += b"\nagentvm client: error: a stdout line is not a JSON object\n"
            self._signal(signal.SIGKILL)
            return
        mid = msg.get("id")
        if mid is None:
            if msg.get("event") == "ready" and not self._ready.done():
                self._ready.set_result(msg)
            return
        call = self._calls.get(mid)
        if call is None:
            return  # a call given up on (client deadline) answering late
        if "event" in msg:
            if call.on_event is not None:
                call.on_event(msg)
            return
        del self._calls[mid]
        err = msg.get("error")
        if isinstance(err, dict) and err.get("code") in SANDBOX_DEATH_CODES:
            self._death_codes.append(str(err.get("code")))
        if not call.future.done():
            call.future.set_result(msg)

    async def _send(self, obj: Dict[str, Any]) -> None:
        if self._dead is not None:
            raise self._dead_copy()
        try:
            line = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
        except UnicodeEncodeError as e:
            raise ValueError(f"a string in the request is not valid Unicode (lone surrogate?): {e}") from None
        if len(line) > MAX_LINE_BYTES:
            raise ValueError(f"the request would be a {len(line)}-byte line; the protocol allows "
                             f"{MAX_LINE_BYTES} (64 MiB)")
        proto = self._stdin_p
        t = self._stdin_t
        if t is None or proto is None or proto.lost or t.is_closing():
            await self._await_death()
        assert t is not None and proto is not None
        t.write(line)
        while proto.paused and not proto.lost:
            w = self.loop.create_future()
            proto.waiters.append(w)
            await w

    async def _await_death(self) -> None:
        self._start_reaper()
        assert self._reaper is not None
        await asyncio.shield(self._reaper)
        raise self._dead_copy()

    def _new_call(self, on_event: Optional[OnEvent]) -> "tuple[int, asyncio.Future[Dict[str, Any]]]":
        if self._dead is not None:
            raise self._dead_copy()
        cid = next(self._ids)
        fut: "asyncio.Future[Dict[str, Any]]" = self.loop.create_future()
        self._calls[cid] = _Call(fut, on_event)
        return cid, fut

    def _last_activity(self) -> float:
        return self.last_rx

    @staticmethod
    def _raise_error(msg: Dict[str, Any]) -> None:
        err = msg.get("error")
        if isinstance(err, dict):
            raise error_from_protocol(str(err.get("code", "internal")), str(err.get("message", "")))

    def stream_value(self, wanted: bool) -> StreamValue:
        return "only" if wanted else None

    async def call(self, op: str, body: Dict[str, Any], *, on_event: Optional[OnEvent] = None,
                   soft_timeout: float, hard_timeout: Optional[float] = None,
                   on_ref: Optional[OnRef] = None) -> Dict[str, Any]:
        cid, fut = self._new_call(on_event)
        try:
            await self._send({"id": cid, "op": op, **body})
        except BaseException:
            self._calls.pop(cid, None)
            raise
        if on_ref is not None:
            on_ref(cid)
        try:
            msg: Dict[str, Any] = await wait_answer(fut, soft=soft_timeout + self.grace, hard=hard_timeout,
                                                    last_activity=self._last_activity, what=f"{op} call {cid}")
        except (CallTimeout, asyncio.CancelledError):
            self._calls.pop(cid, None)
            if op in _CANCELLABLE and self._dead is None:
                self.loop.create_task(cancel_quietly(self, cid))
            raise
        self._raise_error(msg)
        return msg

    async def cancel(self, ref: Any) -> bool:
        msg = await self.call("cancel", {"call": ref}, soft_timeout=0.0)
        return bool(msg.get("running"))

    async def stat(self, path: str) -> Dict[str, Any]:
        return await self.call("stat", {"path": path}, soft_timeout=0.0)

    async def list_dir(self, path: str, max_entries: Optional[int], depth: int = 1) -> Dict[str, Any]:
        body: Dict[str, Any] = {"path": path}
        if max_entries is not None:
            body["max_entries"] = max_entries
        if depth != 1:
            body["depth"] = depth
        return await self.call("list_dir", body, soft_timeout=0.0)

    async def write_file(self, path: str, data: FileData, *, size: Optional[int], mode: Optional[str],
                         hard_timeout: Optional[float]) -> int:
        """Several ``write_file`` calls of at most 4 MiB, the first truncating, the rest
        appending, at most two in flight (they are written in order by the agent)."""
        chunks: Iterable[bytes]
        if isinstance(data, bytes):
            chunks = [data[i:i + FILE_CHUNK] for i in range(0, len(data), FILE_CHUNK)]
        else:
            chunks = data
        total = 0
        in_flight: Deque["asyncio.Task[Dict[str, Any]]"] = deque()
        first = True
        try:
            for chunk in _with_first_empty(chunks):
                body: Dict[str, Any] = {"path": path}
                put_bytes(body, "data", chunk)
                if mode is not None and first:
                    body["mode"] = mode
                if not first:
                    body["append"] = True
                first = False
                in_flight.append(self.loop.create_task(
                    self.call("write_file", body, soft_timeout=0.0, hard_timeout=hard_timeout)))
                # Let the task send its line before the next chunk is read, so lines keep order.
                await asyncio.sleep(0)
                while len(in_flight) >= 2:
                    total += int((await in_flight.popleft()).get("bytes", 0))
            while in_flight:
                total += int((await in_flight.popleft()).get("bytes", 0))
        finally:
            for t in in_flight:
                t.cancel()
        return total

    async def read_file(self, path: str, sink: Callable[[bytes], Awaitable[None]],
                        hard_timeout: Optional[float]) -> None:
        """``read_file``: ``data`` events go to ``sink`` in order. While more than 8 MiB waits
        for the sink, this sandbox's stdout is not read (the agent then waits too)."""
        queue: Deque[bytes] = deque()
        state = {"bytes": 0, "paused": False, "gone": False}
        wake = asyncio.Event()

        def on_event(msg: Dict[str, Any]) -> None:
            if state["gone"] or msg.get("event") != "data":
                return
            data = byte_field(msg, "data") or b""
            queue.append(data)
            state["bytes"] += len(data)
            if state["bytes"] > (8 << 20) and not state["paused"]:
                state["paused"] = True
                self._pause()
            wake.set()

        cid, fut = self._new_call(on_event)
        fut.add_done_callback(lambda _f: wake.set())
        try:
            await self._send({"id": cid, "op": "read_file", "path": path})
            while True:
                while queue:
                    chunk = queue.popleft()
                    state["bytes"] -= len(chunk)
                    if state["paused"] and state["bytes"] < (1 << 20):
                        state["paused"] = False
                        self._resume()
                    await sink(chunk)
                if fut.done():
                    if queue:
                        continue
                    break
                wake.clear()
                waiter = self.loop.create_task(wake.wait())
                try:
                    await wait_answer(waiter, soft=self.grace, hard=hard_timeout,
                                      last_activity=self._last_activity, what=f"read_file {path!r}")
                except CallTimeout:
                    self._calls.pop(cid, None)
                    raise
                finally:
                    waiter.cancel()
            self._raise_error(fut.result())
        finally:
            state["gone"] = True
            queue.clear()
            if state["paused"]:
                self._resume()

    def _pause(self) -> None:
        self._pause_count += 1
        if self._pause_count == 1 and self._stdout_t is not None and not self._stdout_t.is_closing():
            self._stdout_t.pause_reading()

    def _resume(self) -> None:
        self._pause_count -= 1
        if self._pause_count == 0 and self._stdout_t is not None and not self._stdout_t.is_closing():
            self._stdout_t.resume_reading()


def _with_first_empty(chunks: Iterable[bytes]) -> Iterable[bytes]:
    """The chunks, or one empty chunk when there are none (an empty file is still written)."""
    any_chunk = False
    for c in chunks:
        any_chunk = True
        yield c
    if not any_chunk:
        yield b""
