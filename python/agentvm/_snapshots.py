"""Snapshot directories the client keeps for embedded sandboxes created without
``snapshot_dir=``, so that their ``fork()`` and ``pause()`` work as in service mode.

A sandbox created that way gets a directory of its own, ``ROOT/lineage-XXXXXXXX``, where ROOT
is ``agentvm-snapshots-UID`` in the temp dir (``tempfile.gettempdir()``: ``$TMPDIR``, else
``/tmp``), both mode 0700, private to the user. Not ``$XDG_RUNTIME_DIR``: it is removed when
the user's last session ends (a paused sandbox must outlive that, as serve's do), and it is a
small tmpfs, whose pages the VMM writing a snapshot is charged for in its memory cgroup and
cannot write back. Its episode writes its live snapshots there, and every sandbox that
descends from it (its forks, their forks, the sandboxes resumed from its pauses) uses the same
directory: a snapshot names the one below it by path (docs/protocol.md, "Live snapshots"), so
the whole lineage lives and goes together. The directory is removed when nothing needs it any
more: no sandbox of the lineage runs, in this process or another, and no paused snapshot in it
waits to be resumed (a paused one waits ``PAUSED_RETENTION``, as ``agentvm serve``'s default
``--paused-retention``).

What needs a directory is written in it, so that other processes (a later one resuming a
paused id) and a process that died count too:
- ``.held/PID-START-RANDOM``: a running sandbox of process PID (whose start time, field 22 of
  ``/proc/PID/stat``, is START: a reused pid does not count);
- ``.paused/NAME``: the paused snapshot ``NAME``, holding the time (epoch seconds) until
  which it is kept.
Every change to them and the decision to remove the directory happen under ``flock`` of
``.lock``, so a resume racing a removal either holds the directory first or finds it gone.
"""
from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import tempfile
import time
import uuid
from contextlib import contextmanager
from typing import Iterator, Optional, Tuple

PAUSED_RETENTION = 7 * 86400.0  # agentvm serve --paused-retention's default
_PREFIX = "lineage-"
# A directory being created (before its first holder is in it) has this prefix; one a crashed
# process left is removed after an hour.
_NEW_PREFIX = ".new-"
_NEW_STALE_S = 3600.0
# How often a process looks for directories nothing needs any more (at a new directory's
# creation): each look locks every directory in ROOT once.
_SWEEP_EVERY_S = 60.0
_last_sweep: Optional[float] = None


def root() -> str:
    """The user's private directory of managed snapshot directories, created if missing.
    Raises PermissionError when the path exists but is not a directory private to the user
    (a name in a shared temp dir that someone else took)."""
    path = os.path.join(tempfile.gettempdir(), f"agentvm-snapshots-{os.geteuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise PermissionError(errno.EACCES, "not a directory private to this user (mode 0700, owned by "
                              f"uid {os.geteuid()}): snapshots of sandboxes without snapshot_dir= go there", path)
    return path


def _start_time(pid: int) -> Optional[str]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _holder_alive(name: str) -> bool:
    pid, start, _ = (name.split("-", 2) + ["", ""])[:3]
    return pid.isdigit() and _start_time(int(pid)) == start


def _paused_until(path: str) -> float:
    try:
        with open(path) as f:
            return float(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0.0


class ManagedDir:
    """One managed snapshot directory (see the module's doc)."""

    def __init__(self, path: str) -> None:
        self.path = path

    @classmethod
    def create(cls) -> "Tuple[ManagedDir, str]":
        """A new directory, held by the caller: (the directory, the hold to release)."""
        global _last_sweep
        base = root()
        if _last_sweep is None or time.monotonic() - _last_sweep >= _SWEEP_EVERY_S:
            _last_sweep = time.monotonic()
            sweep(base)
        tmp = tempfile.mkdtemp(prefix=_NEW_PREFIX, dir=base)
        for sub in (".held", ".paused"):
            os.mkdir(os.path.join(tmp, sub), 0o700)
        open(os.path.join(tmp, ".lock"), "wb").close()
        hold = _new_hold()
        open(os.path.join(tmp, ".held", hold), "wb").close()
        # Renamed into place with its holder in it, so that a sweep never sees it unheld.
        path = os.path.join(base, _PREFIX + uuid.uuid4().hex)
        try:
            os.rename(tmp, path)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return cls(path), hold

    @classmethod
    def of(cls, snapshot: str) -> "Optional[ManagedDir]":
        """The managed directory ``snapshot`` (a snapshot's directory) is in, if it is in one."""
        parent = os.path.dirname(os.path.abspath(snapshot))
        if not os.path.basename(parent).startswith(_PREFIX):
            return None
        try:
            if os.path.realpath(os.path.dirname(parent)) != os.path.realpath(root()):
                return None
        except OSError:
            return None
        return cls(parent)

    @contextmanager
    def _locked(self) -> Iterator[bool]:
        """Holds the directory's lock; yields whether the directory is still there."""
        try:
            fd = os.open(os.path.join(self.path, ".lock"), os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            yield False
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            # Removed while this waited for the lock: the fd is of the removed directory's file.
            yield os.path.exists(os.path.join(self.path, ".lock"))
        finally:
            os.close(fd)

    def hold(self) -> Optional[str]:
        """Counts one more running sandbox on the directory; None when it is gone (or was
        removed now because nothing needed it any more, its paused snapshots expired)."""
        with self._locked() as there:
            if not there or self._remove_if_unneeded():
                return None
            hold = _new_hold()
            open(os.path.join(self.path, ".held", hold), "wb").close()
            return hold

    def release(self, hold: str) -> None:
        """The sandbox that took ``hold`` has ended; the directory goes if nothing else needs it."""
        with self._locked() as there:
            if there:
                try:
                    os.unlink(os.path.join(self.path, ".held", hold))
                except FileNotFoundError:
                    pass
                self._remove_if_unneeded()

    def paused(self, name: str, retention: float = PAUSED_RETENTION) -> None:
        """Snapshot ``name`` is a paused sandbox: kept until resumed, at most ``retention`` s."""
        with self._locked() as there:
            if there:
                _write(os.path.join(self.path, ".paused", name), f"{time.time() + retention:.3f}\n")

    def resumed(self, name: str) -> None:
        """The paused snapshot ``name`` runs again (under a hold of its own)."""
        with self._locked() as there:
            if there:
                try:
                    os.unlink(os.path.join(self.path, ".paused", name))
                except FileNotFoundError:
                    pass

    def _remove_if_unneeded(self) -> bool:
        """Under the lock: removes the directory when no live sandbox holds it and no paused
        snapshot in it is within its retention; True if it did."""
        held = os.path.join(self.path, ".held")
        paused = os.path.join(self.path, ".paused")
        try:
            holders = os.listdir(held)
            waiting = os.listdir(paused)
        except FileNotFoundError:
            holders, waiting = [], []
        needed = False
        for h in holders:
            if _holder_alive(h):
                needed = True
            else:
                _unlink(os.path.join(held, h))  # of a process that died without releasing
        now = time.time()
        if any(_paused_until(os.path.join(paused, p)) > now for p in waiting):
            needed = True
        if needed:
            return False
        # .lock last: a waiter that gets the lock then finds the directory gone.
        for entry in os.listdir(self.path):
            if entry != ".lock":
                p = os.path.join(self.path, entry)
                if os.path.isdir(p) and not os.path.islink(p):
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    _unlink(p)
        _unlink(os.path.join(self.path, ".lock"))
        try:
            os.rmdir(self.path)
        except OSError:
            pass
        return True


def sweep(base: str) -> None:
    """Removes the directories under ``base`` that nothing needs any more (their processes
    died, their paused snapshots expired) and creations a crashed process left."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    for n in names:
        p = os.path.join(base, n)
        if n.startswith(_PREFIX):
            d = ManagedDir(p)
            with d._locked() as there:
                if there:
                    d._remove_if_unneeded()
        elif n.startswith(_NEW_PREFIX):
            try:
                if time.time() - os.lstat(p).st_mtime > _NEW_STALE_S:
                    shutil.rmtree(p, ignore_errors=True)
            except OSError:
                pass


def _new_hold() -> str:
    pid = os.getpid()
    return f"{pid}-{_start_time(pid)}-{uuid.uuid4().hex[:12]}"


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
