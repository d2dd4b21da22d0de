#!/usr/bin/env python3
"""A SWE-style task: a git repository on the host, its working tree uploaded into a sandbox,
a patch (the "agent's" fix) applied there, the tests run, and a grader's verdict.

    python3 examples/swe_task.py                       # embedded
    python3 examples/swe_task.py --url unix:/run/agentvm/serve.sock

1. On the host, in a temporary directory under the checkout's build/tmp/: a small git
   repository (a package with a bug and its unittest tests), committed; the fix is made in
   the working tree, taken as `git diff`, and the tree reset to the commit.
2. The guest rootfs is Debian minbase + python3 + procps: the example asks the sandbox which
   of git, tar and patch it has. It has no git, so the repository is cloned on the host side
   and its working tree (without .git) is uploaded as a tar archive (`files.write`), then
   unpacked with the guest's tar (or Python's tarfile module where there is no tar).
3. The patch is applied with `git apply` if the guest has git, else `patch -p1` if it has
   patch, else a small unified-diff applier in Python (this file's APPLY_PATCH, uploaded).
4. The tests run before (they must fail) and after the patch (they must pass); the grader's
   verdict is PASS when both hold.

The last line printed is JSON: tools found, how the patch was applied, the test exit codes
and the verdict. Exits 0 on PASS, 1 otherwise.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

from agentvm import Sandbox  # noqa: E402

FILES = {
    "calc/__init__.py": "",
    "calc/ops.py": "def clamp(x, low, high):\n    \"\"\"x limited to [low, high].\"\"\"\n"
                   "    return max(low, min(x, low))\n",
    "tests/__init__.py": "",
    "tests/test_ops.py": "import unittest\n\nfrom calc.ops import clamp\n\n\n"
                         "class ClampTest(unittest.TestCase):\n"
                         "    def test_inside(self):\n        self.assertEqual(clamp(5, 0, 10), 5)\n\n"
                         "    def test_edges(self):\n        self.assertEqual(clamp(-1, 0, 10), 0)\n"
                         "        self.assertEqual(clamp(11, 0, 10), 10)\n",
}
FIX = ("calc/ops.py", "min(x, low)", "min(x, high)")

# Applies a unified diff (as `git diff` writes it) to the tree in the current directory:
# every hunk's context and removed lines must match exactly.
APPLY_PATCH = r'''
import re, sys
patch = open(sys.argv[1]).read().splitlines(keepends=True)
i, files = 0, 0
while i < len(patch):
    if not patch[i].startswith("--- "):
        i += 1
        continue
    target = patch[i + 1][4:].strip().split("\t")[0]
    target = target[2:] if target.startswith("b/") else target
    with open(target) as f:
        lines = f.read().splitlines(keepends=True)
    out, pos, i = [], 0, i + 2
    while i < len(patch) and patch[i].startswith("@@"):
        start = int(re.match(r"@@ -(\d+)", patch[i]).group(1)) - 1
        start = max(start, 0)
        out += lines[pos:start]
        pos = start
        i += 1
        while i < len(patch) and patch[i][:1] in (" ", "-", "+", "\\"):
            kind, text = patch[i][:1], patch[i][1:]
            if kind in (" ", "-"):
                if lines[pos] != text:
                    sys.exit(f"{target}:{pos + 1}: the patch does not apply: {lines[pos]!r} != {text!r}")
                if kind == " ":
                    out.append(text)
                pos += 1
            elif kind == "+":
                out.append(text)
            i += 1
    out += lines[pos:]
    with open(target, "w") as f:
        f.write("".join(out))
    files += 1
print(f"patched {files} file(s)")
'''


def git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, text=True).stdout


def make_repo(root: str) -> Dict[str, str]:
    """The repository, its clone (the working tree to upload) and the fix as a patch."""
    root = os.path.abspath(root)
    repo = os.path.join(root, "origin")
    for rel, text in FILES.items():
        os.makedirs(os.path.dirname(os.path.join(repo, rel)), exist_ok=True)
        with open(os.path.join(repo, rel), "w") as f:
            f.write(text)
    git(root, "init", "-q", repo)
    # Never let a git command below fall through to an enclosing repository (the checkout).
    if not os.path.isdir(os.path.join(repo, ".git")):
        raise RuntimeError(f"git init did not make {repo}/.git")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=agentvm", "-c", "user.email=agentvm@example.invalid", "commit", "-qm", "calc")
    path, old, new = FIX
    with open(os.path.join(repo, path)) as f:
        text = f.read()
    with open(os.path.join(repo, path), "w") as f:
        f.write(text.replace(old, new))
    patch = git(repo, "diff")
    git(repo, "checkout", "-q", "--", path)
    clone = os.path.join(root, "clone")
    subprocess.run(["git", "clone", "-q", repo, clone], check=True)
    return {"clone": clone, "patch": patch, "head": git(clone, "rev-parse", "HEAD").strip()}


def tar_tree(tree: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(tree, arcname="repo", filter=lambda ti: None if "/.git" in ti.name or ti.name.endswith(".git") else ti)
    return buf.getvalue()


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="an agentvm serve (unix:/path or http://host:port); default: embedded")
    p.add_argument("--token", help="serve's token (default: $AGENTVM_TOKEN)")
    args = p.parse_args(argv)
    if shutil.which("git") is None:
        print("this example needs git on the host", file=sys.stderr)
        return 2
    tmp_parent = os.path.join(HERE, "..", "build", "tmp")
    os.makedirs(tmp_parent, exist_ok=True)
    report: Dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="swe-task-", dir=tmp_parent) as root:
        made = make_repo(root)
        print(f"host: repository at {made['head'][:12]}, patch of {len(made['patch'].splitlines())} lines")
        options: Dict[str, Any] = {"timeout": 600}
        if args.url:
            options["url"] = args.url
        if args.token:
            options["token"] = args.token
        with Sandbox(**options) as sb:
            found = sb.commands.run("for t in git tar patch python3; do command -v $t >/dev/null && echo $t; done")
            tools = found.stdout.split()
            report["guest_tools"] = tools
            missing = [t for t in ("git", "tar", "patch") if t not in tools]
            print(f"guest has: {', '.join(tools)} (missing: {', '.join(missing) or 'none'})")

            sb.files.write("/tmp/repo.tar", tar_tree(made["clone"]))
            unpack = "tar -C /work -xf /tmp/repo.tar" if "tar" in tools else \
                "python3 -m tarfile -e /tmp/repo.tar /work"
            sb.commands.run(f"mkdir -p /work && {unpack}", check=True)
            report["unpacked_with"] = "tar" if "tar" in tools else "python3 -m tarfile"
            listing = sorted(e.name for e in sb.files.list("/work/repo"))
            print(f"uploaded the working tree (no .git): /work/repo has {listing}")

            before = sb.commands.run("cd /work/repo && python3 -m unittest -q 2>&1", timeout=120)
            print(f"tests before the patch: exit {before.exit_code}")
            report["tests_before"] = before.exit_code

            sb.files.write("/tmp/fix.patch", made["patch"])
            if "git" in tools:
                how, cmd = "git apply", "git apply /tmp/fix.patch"
            elif "patch" in tools:
                how, cmd = "patch -p1", "patch -p1 < /tmp/fix.patch"
            else:
                sb.files.write("/tmp/apply_patch.py", APPLY_PATCH)
                how, cmd = "python3 apply_patch.py", "python3 /tmp/apply_patch.py /tmp/fix.patch"
            applied = sb.commands.run(f"cd /work/repo && {cmd}")
            print(f"applied the patch with {how}: exit {applied.exit_code} "
                  f"{applied.stdout.strip()}{applied.stderr.strip()}")
            report["patch_applied_with"] = how
            report["patch_exit"] = applied.exit_code

            after = sb.commands.run("cd /work/repo && python3 -m unittest -v 2>&1", timeout=120)
            print(after.stdout.rstrip())
            report["tests_after"] = after.exit_code
    verdict = "PASS" if report["tests_before"] != 0 and report["patch_exit"] == 0 and report["tests_after"] == 0 \
        else "FAIL"
    report["verdict"] = verdict
    print(f"grader: {verdict} (tests failed before the patch: {report['tests_before'] != 0}; "
          f"pass after: {report['tests_after'] == 0})")
    print(json.dumps(report))
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
