"""Many sandboxes from one event loop (asyncio, no thread per sandbox)."""
from __future__ import annotations

import asyncio
import threading

from agentvm import AsyncSandbox
from conftest import IN_TESTHOST, mem_available_mib, run_async

WANTED = 50
# What one more sandbox running the calls below costs the host, generously: measured in the
# test host (December 2026), 50 of them took ~5 MiB of MemAvailable each.
PER_SANDBOX_MIB = 16
KEEP_FREE_MIB = 512


def how_many() -> int:
    if not IN_TESTHOST:
        return WANTED
    fits = (mem_available_mib() - KEEP_FREE_MIB) // PER_SANDBOX_MIB
    if fits < WANTED:
        print(f"test host: MemAvailable {mem_available_mib()} MiB fits {fits} sandboxes of "
              f"~{PER_SANDBOX_MIB} MiB with {KEEP_FREE_MIB} MiB spare, not {WANTED}: running {fits}")
    return max(2, min(WANTED, fits))


def test_many_sandboxes_one_loop(target: dict) -> None:
    n = how_many()

    async def one(i: int) -> str:
        # A long lifetime: under emulation, 50 guests share one emulated CPU.
        async with await AsyncSandbox.create(envs={"N": str(i)}, timeout=3600, **target) as sb:
            r = await sb.commands.run("cd /tmp && echo $N > n.txt && echo $((N * 2))", timeout=1800)
            assert r.exit_code == 0, r
            assert (await sb.commands.run("cat n.txt", timeout=1800)).stdout == f"{i}\n"
            back = await sb.files.read("/tmp/n.txt")
            assert back == f"{i}\n".encode()
            return r.stdout.strip()

    async def main() -> None:
        threads_before = threading.active_count()
        results = await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        assert not failures, f"{len(failures)} of {n} episodes failed; first: {failures[0]!r}"
        assert results == [str(i * 2) for i in range(n)]
        if not target:
            # Embedded mode uses no thread per sandbox (pipes and pidfds on the loop).
            assert threading.active_count() <= threads_before + 2

    run_async(main())
