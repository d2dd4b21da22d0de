#!/usr/bin/env python3
"""N concurrent episodes of a scripted "agent" fixing a small bug, on asyncio.

Each episode is a fresh sandbox (agentvm.gym.AsyncAgentvmEnv) holding a module with a bug and
its unit tests. The agent runs the tests, sees them fail, reads the module, writes the fix,
runs the tests again and submits; the grader (the tests, run in the sandbox) gives the reward.
Every fourth episode is played by a "lazy" agent that submits without fixing anything, so
the reward table has two rows.

    python3 examples/rollouts.py --episodes 16 --concurrency 8            # embedded
    python3 examples/rollouts.py --episodes 16 --url unix:/run/agentvm/serve.sock

Prints episodes/s, a reward table, and a last line of JSON with the same figures. Exits 0
when every episode ran to its end (whatever its reward), 1 otherwise.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

from agentvm.gym import AsyncAgentvmEnv  # noqa: E402

BUGGY = '''def add(a, b):
    return a - b


def mean(xs):
    return add(sum(xs), 0) / len(xs)
'''

TESTS = '''import unittest

from mathx import add, mean


class MathxTest(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)

    def test_mean(self):
        self.assertEqual(mean([1, 2, 3]), 2)


if __name__ == "__main__":
    unittest.main()
'''

GRADER = "cd /work && python3 -m unittest -q test_mathx >/dev/null 2>&1 && echo 1.0 || echo 0.0"


async def episode(i: int, sandbox_options: Dict[str, Any], sem: asyncio.Semaphore) -> Dict[str, Any]:
    policy = "lazy" if i % 4 == 3 else "fixer"
    async with sem:
        # Generous step timeouts: many guests may share few (or emulated) CPUs.
        env = AsyncAgentvmEnv(task="make the tests in /work pass", grader=GRADER, max_steps=8,
                              step_timeout=600, grader_timeout=600,
                              setup_files={"/work/mathx.py": BUGGY, "/work/test_mathx.py": TESTS},
                              sandbox_options=sandbox_options)
        start = time.monotonic()
        steps: List[str] = []
        try:
            await env.reset()

            async def act(action: Dict[str, Any]) -> str:
                obs, _, terminated, _, info = await env.step(action)
                if terminated:  # the sandbox ended under the step
                    raise RuntimeError(f"episode ended at step {info['step']}: {obs}")
                return obs

            if policy == "fixer":
                obs = await act({"tool": "shell", "cmd": "cd /work && python3 -m unittest -q test_mathx"})
                steps.append("tests fail" if "FAILED" in obs else f"unexpected: {obs[-300:]!r}")
                source = await act({"tool": "read_file", "path": "/work/mathx.py"})
                fixed = source.replace("return a - b", "return a + b")
                await act({"tool": "write_file", "path": "/work/mathx.py", "content": fixed})
                obs = await act({"tool": "shell", "cmd": "cd /work && python3 -m unittest -q test_mathx"})
                steps.append("tests pass" if "OK" in obs else f"tests still fail: {obs[-300:]!r}")
            obs, reward, terminated, truncated, info = await env.step({"tool": "submit"})
            return {"episode": i, "policy": policy, "reward": reward, "ok": terminated and "error" not in info,
                    "seconds": time.monotonic() - start, "steps": steps}
        except Exception as e:  # reported in the table, not fatal to the other episodes
            return {"episode": i, "policy": policy, "reward": 0.0, "ok": False, "error": str(e),
                    "seconds": time.monotonic() - start, "steps": steps}
        finally:
            await env.close()


async def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--url", help="an agentvm serve (unix:/path or http://host:port); default: embedded")
    p.add_argument("--token", help="serve's token (default: $AGENTVM_TOKEN)")
    args = p.parse_args(argv)
    if args.episodes < 1 or args.concurrency < 1:
        p.error("--episodes and --concurrency must be positive")
    options: Dict[str, Any] = {"timeout": 600}
    if args.url:
        options["url"] = args.url
    if args.token:
        options["token"] = args.token
    sem = asyncio.Semaphore(args.concurrency)
    start = time.monotonic()
    results = await asyncio.gather(*(episode(i, options, sem) for i in range(args.episodes)))
    wall = time.monotonic() - start

    mode = "service " + args.url if args.url else "embedded"
    print(f"{args.episodes} episodes, concurrency {args.concurrency}, {mode}: {wall:.1f} s, "
          f"{args.episodes / wall:.2f} episodes/s")
    print(f"{'policy':<8} {'episodes':>8} {'mean reward':>12} {'solved':>7} {'errors':>7}")
    table = {}
    for policy in ("fixer", "lazy"):
        rows = [r for r in results if r["policy"] == policy]
        if not rows:
            continue
        mean = sum(r["reward"] for r in rows) / len(rows)
        solved = sum(1 for r in rows if r["reward"] >= 1.0)
        errors = sum(1 for r in rows if not r["ok"])
        table[policy] = {"episodes": len(rows), "mean_reward": mean, "solved": solved, "errors": errors}
        print(f"{policy:<8} {len(rows):>8} {mean:>12.2f} {solved:>7} {errors:>7}")
    for r in results:
        if "error" in r:
            print(f"episode {r['episode']}: {r['error']}", file=sys.stderr)
    print(json.dumps({"episodes": args.episodes, "seconds": round(wall, 3),
                      "episodes_per_s": round(args.episodes / wall, 3), "table": table,
                      "rewards": [r["reward"] for r in results],
                      "steps": [r["steps"] for r in results]}))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
