"""File operations beyond transfers (docs/protocol.md, make_dir, move, remove, watch, stat and
list_dir's fields; python/README.md, "Files"), both transports, in one test since each boots a
sandbox: directories made, entries renamed and removed (a tree too deep for one path), listings
of several levels, stat's owner and symlink fields, and watches: a burst of some 270 changes
seen in order, the tree outgrowing the watch (overflow), stop(), and watches kept across a fork
that end when their directory is removed."""
from __future__ import annotations

import time
from typing import Any, Dict, List, Tuple

import pytest

from agentvm import AgentError, FilesystemEvent, NotFound, Sandbox, WatchHandle

# 60 files made and written, 30 of them renamed and 30 removed, one chmod, a subdirectory of 20
# files, a chain of directories whose path outgrows a watch's 4096 bytes, and "done" last.
LONG = "d" * 250
BURST = f"""
import os
os.chdir("/tmp/wd")
for i in range(60):
    with open(f"f{{i}}", "w") as f:
        f.write("x")
for i in range(30):
    os.rename(f"f{{i}}", f"g{{i}}")
for i in range(30, 60):
    os.remove(f"f{{i}}")
os.chmod("g0", 0o600)
os.mkdir("sub")
for i in range(20):
    with open(f"sub/s{{i}}", "w") as f:
        f.write("y")
fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
for level in range(18):
    os.mkdir("{LONG}", dir_fd=fd)
    fd = os.open("{LONG}", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
with open("done", "w") as f:
    f.write("z")
"""


def expected_top() -> List[Tuple[str, str]]:
    out = []
    for i in range(60):
        out += [("create", f"f{i}"), ("write", f"f{i}")]
    for i in range(30):
        out += [("remove", f"f{i}"), ("create", f"g{i}")]
    out += [("remove", f"f{i}") for i in range(30, 60)]
    return out + [("chmod", "g0"), ("create", "sub"), ("create", LONG), ("create", "done"), ("write", "done")]


def collect_until(watch: WatchHandle, last: Tuple[str, str], within: float = 60.0) -> List[FilesystemEvent]:
    events: List[FilesystemEvent] = []
    deadline = time.monotonic() + within
    while not any((e.type, e.name) == last for e in events):
        assert time.monotonic() < deadline, f"no {last} within {within} s; saw {[(e.type, e.name) for e in events]}"
        events += watch.get_new_events()
        time.sleep(0.05)
    return events


def test_dirs_renames_removal_listing_stat_and_watches(target: Dict[str, Any]) -> None:
    with Sandbox(**target) as sb:
        files = sb.files
        for bad in (0, 65):
            with pytest.raises(ValueError):
                files.list("/tmp", depth=bad)
        with pytest.raises(TypeError):
            files.remove("/tmp", recursive="yes")  # type: ignore[arg-type]

        # make_dir: mkdir -p, False when there, its mode exactly, something else in the way.
        assert files.make_dir("/tmp/w/a/b") is True
        assert files.make_dir("/tmp/w/a/b") is False
        assert files.make_dir("/tmp/w/m", mode=0o701) is True
        assert files.info("/tmp/w/m").mode == 0o701
        files.write("/tmp/w/f.txt", "hello")
        with pytest.raises(AgentError) as e:
            files.make_dir("/tmp/w/f.txt")
        assert e.value.code == "exists"

        # stat: a symlink followed, with its target; owner and group by number and name.
        sb.commands.run("ln -s f.txt /tmp/w/link && chown 65534:65534 /tmp/w/m && chown 4242:4242 /tmp/w/a",
                        check=True)
        info = files.info("/tmp/w/link")
        assert (info.name, info.path, info.type, info.size, info.symlink_target) == \
            ("link", "/tmp/w/link", "file", 5, "f.txt"), info
        assert (info.uid, info.gid, info.owner, info.group) == (0, 0, "root", "root")
        names = sb.commands.run(["stat", "-c", "%U %G", "/tmp/w/m"]).stdout.split()
        m = files.info("/tmp/w/m/")
        assert (m.name, m.path, m.uid, m.gid, [m.owner, m.group], m.symlink_target) == \
            ("m", "/tmp/w/m", 65534, 65534, names, None), m
        assert files.exists("/tmp/w/link") and not files.exists("/tmp/w/nothing")

        # list: one level, then two (each directory's entries right after it).
        assert [e.name for e in files.list("/tmp/w")] == ["a", "f.txt", "link", "m"]
        deep = files.list("/tmp/w", 2)
        assert [(e.name, e.path, e.type) for e in deep] == [
            ("a", "/tmp/w/a", "dir"), ("a/b", "/tmp/w/a/b", "dir"), ("f.txt", "/tmp/w/f.txt", "file"),
            ("link", "/tmp/w/link", "symlink"), ("m", "/tmp/w/m", "dir")]
        assert deep[3].symlink_target == "f.txt" and deep[4].owner == names[0] and deep[2].mtime > 1.6e9
        assert (deep[0].uid, deep[0].owner, deep[0].group) == (4242, "4242", "4242")  # ids without names
        assert [e.name for e in files.list("/tmp/w", 3, max_entries=2)] == ["a", "a/b"]

        # rename: a file into a directory, a symlink (itself), onto a directory that is not empty.
        moved = files.rename("/tmp/w/f.txt", "/tmp/w/a/g.txt")
        assert (moved.name, moved.path, moved.type, moved.size) == ("g.txt", "/tmp/w/a/g.txt", "file", 5)
        link = files.rename("/tmp/w/link", "/tmp/w/l2")
        assert (link.type, link.symlink_target) == ("symlink", "f.txt")
        with pytest.raises(AgentError) as e:
            files.rename("/tmp/w/m", "/tmp/w/a")
        assert e.value.code == "not_empty"
        with pytest.raises(NotFound):
            files.rename("/tmp/w/nothing", "/tmp/w/x")

        # remove: a symlink (not what it points to), a tree, only empty ones without recursive.
        files.remove("/tmp/w/l2")
        assert files.read_text("/tmp/w/a/g.txt") == "hello"
        with pytest.raises(AgentError) as e:
            files.remove("/tmp/w/a", recursive=False)
        assert e.value.code == "not_empty"
        files.remove("/tmp/w/m", recursive=False)
        files.remove("/tmp/w/a")
        assert [e.name for e in files.list("/tmp/w")] == []
        with pytest.raises(NotFound):
            files.remove("/tmp/w/a")

        # watch: a burst seen in order (a rename a remove and a create); a subdirectory made
        # meanwhile watched too; one overflow when a directory's path outgrows the watch.
        files.make_dir("/tmp/wd")
        watch = files.watch_dir("/tmp/wd", recursive=True)
        assert not watch.done() and watch.ended is None
        sb.commands.run(["python3", "-c", BURST], check=True)
        events = collect_until(watch, ("write", "done"))
        top = [(e.type, e.name) for e in events if "/" not in e.name and not e.is_overflow]
        assert top == expected_top(), top
        created_in_sub = {e.name for e in events if e.type == "create" and e.name.startswith("sub/")}
        assert created_in_sub == {f"sub/s{i}" for i in range(20)}
        overflows = [i for i, e in enumerate(events) if e.is_overflow]
        assert len(overflows) == 1 and events[overflows[0]] == FilesystemEvent("", "overflow")
        at = [(e.type, e.name) for e in events]
        assert at.index(("create", LONG)) < overflows[0] < at.index(("create", "done"))
        # Levels 2 to 17 reported; 17 (a path of 4266 bytes) is not watched, so 18 is not.
        chain = {e.name.count("/") for e in events if e.type == "create" and e.name.startswith(LONG + "/")}
        assert chain == set(range(1, 17)), chain
        watch.stop()
        assert watch.done() and watch.ended == "cancelled"
        watch.stop()  # again: nothing

        # Two watches, one read by events(), one by callback. A fork waits for every call in
        # flight: they are stopped for it and started again after, with an overflow for the
        # changes they could not see meanwhile. They end when their directory goes.
        seen: List[FilesystemEvent] = []
        iterated = files.watch_dir("/tmp/wd")
        called = files.watch_dir("/tmp/wd", on_event=seen.append)
        [child] = sb.fork()
        try:
            assert child.files.exists("/tmp/wd/done")
        finally:
            child.kill()
        files.write("/tmp/wd/after", "1")
        files.remove("/tmp/wd")  # the chain of directories too, deeper than a path can name
        deadline = time.monotonic() + 30
        while not (iterated.done() and called.done()):
            assert time.monotonic() < deadline, f"the watches did not end: {iterated}, {called}"
            time.sleep(0.05)
        got = [(e.type, e.name) for e in iterated.events()]
        assert iterated.ended == called.ended == "removed"
        assert got[:3] == [("overflow", ""), ("create", "after"), ("write", "after")], got
        assert set(got[3:]) >= {("remove", n) for n in ("after", "done", "sub", LONG, "g0")}, got
        assert [(e.type, e.name) for e in seen] == got
        assert called.get_new_events() == []
        assert not files.exists("/tmp/wd")
        assert sb.commands.run("echo alive").stdout == "alive\n"
