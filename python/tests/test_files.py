"""files: write/read (bytes, str, file objects, a big file both ways), streaming, info, exists, list."""
from __future__ import annotations

import hashlib
import io
import os
import tempfile

import pytest

from agentvm import AgentError, AsyncSandbox, NotFound, Sandbox
from conftest import run_async, tmp_root

# 64 MiB on hardware KVM; 16 MiB (still four of the client's 4 MiB chunks) inside the emulated
# test host, where 64 MiB took over 4 minutes of the tier: serve's own check moves 64 MiB both
# ways there (tests/service/serve_check.py, big_file_both_ways).
BIG = (16 if os.environ.get("AGENTVM_IN_TESTHOST") else 64) << 20


def test_write_read_small(sandbox: Sandbox) -> None:
    assert sandbox.files.write("/tmp/a.txt", "héllo\n") == len("héllo\n".encode())
    assert sandbox.files.read("/tmp/a.txt") == "héllo\n".encode()
    assert sandbox.files.read_text("/tmp/a.txt") == "héllo\n"
    blob = bytes(range(256)) * 3
    assert sandbox.files.write("/tmp/b.bin", blob) == len(blob)
    assert sandbox.files.read("/tmp/b.bin") == blob
    assert sandbox.commands.run(["sha256sum", "/tmp/b.bin"]).stdout.split()[0] == hashlib.sha256(blob).hexdigest()
    # Truncates an existing file; an empty file is a file.
    sandbox.files.write("/tmp/b.bin", b"")
    assert sandbox.files.read("/tmp/b.bin") == b""
    assert sandbox.files.info("/tmp/b.bin").size == 0


def test_write_mode_and_info(sandbox: Sandbox) -> None:
    script = "#!/bin/sh\necho ran\n"
    sandbox.files.write("/tmp/run.sh", script, mode=0o755)
    info = sandbox.files.info("/tmp/run.sh")
    assert (info.type, info.size, info.mode) == ("file", len(script), 0o755)
    assert info.mtime > 0
    assert sandbox.commands.run(["/tmp/run.sh"]).stdout == "ran\n"
    sandbox.files.write("/tmp/ro.txt", "x", mode="0600")
    assert sandbox.files.info("/tmp/ro.txt").mode == 0o600
    d = sandbox.files.info("/etc")
    assert d.type == "dir" and d.is_dir


def test_exists_and_list(sandbox: Sandbox) -> None:
    assert sandbox.files.exists("/etc/hostname")
    assert not sandbox.files.exists("/no/such/file")
    sandbox.commands.run("mkdir -p /tmp/l/sub && printf 12345 > /tmp/l/f && ln -s f /tmp/l/link")
    entries = sandbox.files.list("/tmp/l")
    assert [(e.name, e.type) for e in entries] == [("f", "file"), ("link", "symlink"), ("sub", "dir")]
    assert entries[0].size == 5 and entries[0].path == "/tmp/l/f"
    assert not entries.truncated
    cut = sandbox.files.list("/tmp/l", max_entries=2)
    assert [e.name for e in cut] == ["f", "link"] and cut.truncated
    with pytest.raises(NotFound):
        sandbox.files.list("/no/such/dir")
    with pytest.raises(NotFound):
        sandbox.files.info("/no/such/file")


def test_missing_paths_are_errors(sandbox: Sandbox) -> None:
    with pytest.raises(NotFound):
        sandbox.files.read("/no/such/file")
    with pytest.raises(NotFound):
        sandbox.files.write("/no/such/dir/f", b"x")
    with pytest.raises(AgentError) as e:
        sandbox.files.read("/etc")
    assert e.value.code == "io"


def test_big_file_both_ways(sandbox: Sandbox) -> None:
    """Up from a file object (4 MiB chunks), down whole; the guest's sha256 agrees."""
    with tempfile.TemporaryDirectory(dir=tmp_root()) as d:
        src = os.path.join(d, "src.bin")
        h = hashlib.sha256()
        with open(src, "wb") as f:
            for _ in range(BIG // (1 << 20)):
                chunk = os.urandom(1 << 20)
                h.update(chunk)
                f.write(chunk)
        with open(src, "rb") as f:
            assert sandbox.files.write("/tmp/big.bin", f, request_timeout=900) == BIG
    r = sandbox.commands.run(["sha256sum", "/tmp/big.bin"], timeout=300)
    assert r.stdout.split()[0] == h.hexdigest()
    back = sandbox.files.read("/tmp/big.bin")
    assert len(back) == BIG and hashlib.sha256(back).hexdigest() == h.hexdigest()


def test_bytes_up_and_streamed_down(sandbox: Sandbox) -> None:
    data = os.urandom(9 << 20)
    assert sandbox.files.write("/tmp/mid.bin", data) == len(data)
    got = hashlib.sha256()
    n = 0
    largest = 0
    for chunk in sandbox.files.read_stream("/tmp/mid.bin"):
        got.update(chunk)
        n += len(chunk)
        largest = max(largest, len(chunk))
    assert n == len(data) and got.hexdigest() == hashlib.sha256(data).hexdigest()
    assert largest <= 1 << 20, "read_stream should hand out the file in pieces"


def test_unseekable_file_object(sandbox: Sandbox) -> None:
    class Unseekable(io.RawIOBase):
        def __init__(self) -> None:
            self.left = 5 << 20

        def readable(self) -> bool:
            return True

        def readinto(self, b: bytearray) -> int:  # type: ignore[override]
            n = min(len(b), self.left)
            b[:n] = b"z" * n
            self.left -= n
            return n

    assert sandbox.files.write("/tmp/pipe.bin", io.BufferedReader(Unseekable())) == 5 << 20
    assert sandbox.files.info("/tmp/pipe.bin").size == 5 << 20
    r = sandbox.commands.run("tr -d z < /tmp/pipe.bin | wc -c")
    assert r.stdout.strip() == "0"


def test_read_stream_abandoned_early(sandbox: Sandbox) -> None:
    sandbox.commands.run("head -c 20000000 /dev/urandom > /tmp/r.bin")
    stream = sandbox.files.read_stream("/tmp/r.bin")
    first = next(stream)
    assert first
    stream.close()
    # The sandbox still answers (nothing left paused or pending).
    assert sandbox.commands.run("echo alive").stdout == "alive\n"
    assert len(sandbox.files.read("/tmp/r.bin")) == 20000000


def test_files_async(target: dict) -> None:
    async def main() -> None:
        async with await AsyncSandbox.create(**target) as sb:
            await asyncio.gather(*(sb.files.write(f"/tmp/f{i}", f"{i}" * 1000) for i in range(10)))
            contents = await asyncio.gather(*(sb.files.read(f"/tmp/f{i}") for i in range(10)))
            assert contents == [f"{i}".encode() * 1000 for i in range(10)]
            parts = [c async for c in sb.files.read_stream("/tmp/f3")]
            assert b"".join(parts) == b"3" * 1000
            assert await sb.files.exists("/tmp/f9")
            names = [e.name for e in await sb.files.list("/tmp") if e.name.startswith("f")]
            assert set(names) >= {f"f{i}" for i in range(10)}

    import asyncio
    run_async(main())
