#!/usr/bin/env python3
"""`agentvm template` end to end, in two phases, each printing "ok <case>: ..." or
"FAIL <case>: ..." (tests/vm/checks.py):

  template_check.py host AGENTVM STORE WORK    on the host: makes OCI images (busybox only, a
      whiteout layer, hostile layers, another architecture, a corrupt archive), a Containerfile
      and a SWE-style repository, and builds templates from them with --no-bake (building
      needs root and a loop mount, not KVM); also every bad input.
  template_check.py guest AGENTVM STORE WORK   where a guest boots: bakes the templates and runs
      episodes in them (agentvm episode --template, agentvm run --template, the Python client
      embedded and through agentvm serve --pool).
Case names after WORK run only those cases.
"""
import json
import os
import shutil
import subprocess
import sys
import time

from checks import Failed, expect, run_case
from episode_client import Episode
import oci_fixtures as fx

AGENTVM = STORE = WORK = None
# Where the hostile layers try to write on the host (under WORK, so a failure leaves no litter
# outside the test's own directory).
ESCAPE_DIR = None


def agentvm(*args, timeout=900):
    return subprocess.run([AGENTVM, *args], capture_output=True, text=True, timeout=timeout)


def build(name, *args):
    return agentvm("template", "build", name, "--store", STORE, "--no-bake", *args)


def built(name, *args):
    r = build(name, *args)
    expect(r.returncode == 0, f"build {name} exited {r.returncode}: {r.stderr[-3000:]}")
    return r


def manifest(name):
    r = agentvm("template", "inspect", name, "--store", STORE)
    expect(r.returncode == 0, f"inspect {name}: {r.stderr}")
    return json.loads(r.stdout)


def refused(r, *words):
    expect(r.returncode != 0, f"exit 0, stderr: {r.stderr[-2000:]}")
    for word in words:
        expect(word in r.stderr, f"'{word}' not in the error: {r.stderr[-2000:]}")
    return r.stderr.strip().splitlines()[-1][:200]


# --- host phase -------------------------------------------------------------------------


def busybox_from_archives():
    layout = os.path.join(WORK, "bb")
    fx.busybox_image(layout, env=["BB_ENV=from-image", "PATH=/bin"], workdir="/home/app",
                     extra_files={"/etc/doomed": b"to be whited out\n", "/etc/kept": b"kept\n"})
    fx.copy_image(f"oci:{layout}:latest", f"oci-archive:{WORK}/bb.tar")
    fx.copy_image(f"oci:{layout}:latest", f"docker-archive:{WORK}/bb-docker.tar:agentvm/bb:latest")
    built("bb", "--from", f"oci-archive:{WORK}/bb.tar", "--env", "ADDED=by-flag")
    m = manifest("bb")
    expect("BB_ENV=from-image" in m["env"] and "ADDED=by-flag" in m["env"], f"env {m['env']}")
    expect(m["workdir"] == "/home/app", f"workdir {m['workdir']}")
    built("bbdocker", "--from", f"docker-archive:{WORK}/bb-docker.tar")
    built("bboci", "--from", f"oci:{layout}:latest")
    a, d, o = manifest("bb"), manifest("bbdocker"), manifest("bboci")
    expect(a["image_config"] == d["image_config"] == o["image_config"], "the formats disagree on the config")
    return f"oci-archive, docker-archive and oci: give workdir {a['workdir']}, env {a['env']}"


def unchanged_rebuild_is_cached():
    before = os.stat(os.path.join(STORE, "bb", "rootfs.layer")).st_ino
    r = built("bb", "--from", f"oci-archive:{WORK}/bb.tar", "--env", "ADDED=by-flag")
    expect("image is current" in r.stderr, f"rebuilt: {r.stderr[-1000:]}")
    expect(os.stat(os.path.join(STORE, "bb", "rootfs.layer")).st_ino == before, "the image was replaced")
    r = built("bb", "--from", f"oci-archive:{WORK}/bb.tar", "--env", "ADDED=changed")
    expect("reusing the unpacked" in r.stderr, f"the base was unpacked again: {r.stderr[-1000:]}")
    r = built("bb", "--from", f"oci-archive:{WORK}/bb.tar", "--env", "ADDED=by-flag")
    return "unchanged: not rebuilt; a changed --env: rebuilt from the cached base"


def whiteout_layer():
    layout = os.path.join(WORK, "wh")
    shutil.copytree(os.path.join(WORK, "bb"), layout)
    fx.add_layer_removing(layout, "latest", "/etc/doomed")
    built("wh", "--from", f"oci:{layout}:latest")
    return "built from a layer whose whiteout deletes /etc/doomed"


def containerfile():
    ctx = os.path.join(WORK, "ctx")
    os.makedirs(ctx)
    with open(os.path.join(ctx, "hello.txt"), "w") as f:
        f.write("copied by COPY\n")
    with open(os.path.join(ctx, "Containerfile"), "w") as f:
        f.write(f"FROM oci-archive:{WORK}/bb.tar\n"
                "RUN mkdir -p /data && echo made-by-run > /data/run.txt\n"
                "COPY hello.txt /data/hello.txt\n"
                "ENV GREETING=from-containerfile\n"
                "WORKDIR /data\n"
                "RUN mkdir -p /home/agent && echo 'agent:x:1234:1234::/home/agent:/bin/sh' >> /etc/passwd"
                " && printf 'agent:x:1234:\\ntools:x:77:other,agent\\n' >> /etc/group && chown 1234:1234 /home/agent\n"
                "USER agent\n")
    built("cf", "--containerfile", os.path.join(ctx, "Containerfile"))
    m = manifest("cf")
    expect("GREETING=from-containerfile" in m["env"] and m["workdir"] == "/data", f"{m['env']} {m['workdir']}")
    expect(m["user"] == "agent" and m["run_as"] == {"uid": 1234, "gid": 1234, "groups": [77], "home": "/home/agent"}
           and "HOME=/home/agent" in m["env"], f"user: {m['user']} {m['run_as']} {m['env']}")
    r = build("cfbad", "--containerfile", os.path.join(ctx, "Bad"))
    refused(r, "Bad")
    with open(os.path.join(ctx, "Failing"), "w") as f:
        f.write(f"FROM oci-archive:{WORK}/bb.tar\nRUN echo step-output-shown && exit 7\n")
    r = build("cfbad", "--containerfile", os.path.join(ctx, "Failing"))
    refused(r, "step-output-shown", "buildah")
    expect(not os.path.exists(os.path.join(STORE, "cfbad")), "a failed build left a template")
    r = build("cfbad", "--containerfile", os.path.join(ctx, "Containerfile"), "--user", "nobody-here")
    refused(r, "no user 'nobody-here'", "/etc/passwd")
    expect(not os.path.exists(os.path.join(STORE, "cfbad")), "a failed build left a template")
    return ("RUN, COPY, ENV, WORKDIR, USER from a local archive (the user resolved in the image's passwd and "
            "group); a failing RUN shows its output; an unknown --user is refused")


def swe_repository():
    repo = os.path.join(WORK, "repo")
    os.makedirs(repo)
    with open(os.path.join(repo, "calc.py"), "w") as f:
        f.write("def add(a, b):\n    return a - b\n")
    with open(os.path.join(repo, "test_calc.py"), "w") as f:
        f.write("import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n"
                "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", repo]
    fx.run("git", "init", "-q", repo)
    fx.run(*git, "add", ".")
    fx.run(*git, "commit", "-qm", "a bug")
    with open(os.path.join(repo, "calc.py"), "w") as f:
        f.write("def add(a, b):\n    return a + b\n")
    patch = subprocess.run(git + ["diff"], check=True, capture_output=True, text=True).stdout
    fx.run(*git, "checkout", "-q", "calc.py")
    with open(os.path.join(WORK, "fix.patch"), "w") as f:
        f.write(patch)
    built("swe", "--packages", "git", "--copy", f"{repo}:/testbed", "--workdir", "/testbed",
          "--env", "PYTHONDONTWRITEBYTECODE=1", "--mem", "512")
    m = manifest("swe")
    expect(m["source"] == "packages:git" and m["workdir"] == "/testbed", f"{m['source']} {m['workdir']}")
    return f"Debian with git, the repository at /testbed ({m['image_bytes'] >> 20} MiB on disk)"


def allocated(path):
    return os.stat(path).st_blocks * 512


def templates_share_their_base():
    """A second template of swe's packages stores only its own blocks: its layer, not a copy of the base."""
    built("swe2", "--packages", "git", "--env", "SECOND=1")
    one, two = manifest("swe"), manifest("swe2")
    expect(one["base_key"] == two["base_key"], "the same packages unpacked to two bases")
    base = os.path.join(STORE, ".bases", one["base_key"] + ".ext4")
    for name in ("swe", "swe2"):
        files = sorted(os.listdir(os.path.join(STORE, name)))
        expect(files == ["rootfs.layer", "rootfs.layer.ranges", "template.json"], f"{name} holds {files}")
    layers = [allocated(os.path.join(STORE, name, "rootfs.layer")) for name in ("swe", "swe2")]
    expect(max(layers) * 8 < allocated(base), f"layers of {layers} bytes against a base of {allocated(base)}")
    expect(two["layer"]["bytes"] <= layers[1], f"{two['layer']} against {layers[1]} bytes allocated")
    r = agentvm("template", "rm", "swe2", "--store", STORE)
    expect(r.returncode == 0 and os.path.exists(base), f"rm swe2 took the base swe still uses: {r.stderr}")
    return (f"the base {allocated(base) >> 20} MiB, once; swe's own blocks {layers[0] >> 20} MiB, "
            f"a second template's {layers[1] >> 20} MiB in {two['layer']['ranges']} ranges")


def hostile_layers_contained():
    target = ESCAPE_DIR
    os.makedirs(target)
    layout = os.path.join(WORK, "evil")
    climb = "../" * 16
    fx.hand_made_image(layout, [
        fx.busybox_layer(),
        fx.tar_layer([
            {"name": climb + target.lstrip("/") + "/by-dotdot", "data": b"dotdot\n"},
            {"name": target + "/by-absolute-path", "data": b"absolute\n"},
            {"name": "esc", "type": "symlink", "link": target},
            {"name": "setuid-file", "data": b"#!/bin/sh\n", "mode": 0o4755},
            {"name": "kmsg-node", "type": "char", "major": 1, "minor": 11, "mode": 0o600},
        ]),
        fx.tar_layer([{"name": "esc/through-symlink", "data": b"symlink\n"}]),
    ], config={"Env": ["PATH=/bin"]})
    payload = os.path.join(WORK, "escape-payload")
    with open(payload, "w") as f:
        f.write("copied\n")
    r = build("evil", "--from", f"oci:{layout}:latest", "--copy", f"{payload}:/esc/copied-through-symlink")
    expect(r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}")
    escaped = os.listdir(target)
    expect(not escaped, f"written on the host: {escaped}")
    return "a '..' path, an absolute path, a symlink to a host path and a --copy through it all stayed inside"


def sparse_file_refused():
    layout = os.path.join(WORK, "sparse")
    fx.hand_made_image(layout, [fx.sparse_file_layer(WORK, 10)])
    seen = refused(build("sparse", "--from", f"oci:{layout}:latest", "--disk-size", "1024"), "umoci", "huge")
    expect(not os.path.exists(os.path.join(STORE, "sparse")), "a failed build left a template")
    expect(not os.listdir(os.path.join(STORE, ".work")), "a failed build left work files")
    return seen


def too_big_for_its_disk():
    layout = os.path.join(WORK, "dense")
    fx.hand_made_image(layout, [fx.dense_file_layer(WORK, 1536)])
    seen = refused(build("dense", "--from", f"oci:{layout}:latest", "--disk-size", "1024"), "do not fit",
                   "--disk-size")
    expect(not os.path.exists(os.path.join(STORE, "dense")), "a failed build left a template")
    expect(not os.listdir(os.path.join(STORE, ".work")), "a failed build left work files")
    return seen[:120]


def other_architecture():
    layout = os.path.join(WORK, "arm")
    fx.hand_made_image(layout, [fx.tar_layer([{"name": "x", "data": b"x"}])], architecture="arm64")
    return refused(build("arm", "--from", f"oci:{layout}:latest"), "arm64", "amd64")


def corrupt_archive():
    with open(f"{WORK}/bb.tar", "rb") as f:
        data = f.read()
    with open(f"{WORK}/corrupt.tar", "wb") as f:
        f.write(data[: len(data) // 2])
    seen = refused(build("corrupt", "--from", f"oci-archive:{WORK}/corrupt.tar"), "skopeo")
    expect(not os.path.exists(os.path.join(STORE, "corrupt")), "a failed build left a template")
    return seen


def bad_input():
    cases = [
        (("../escape", "--from", f"oci-archive:{WORK}/bb.tar"), "template name"),
        (("a/b", "--from", f"oci-archive:{WORK}/bb.tar"), "template name"),
        (("default", "--from", f"oci-archive:{WORK}/bb.tar"), "set-up's own guest"),
        (("x", "--from", f"oci-archive:{WORK}/missing.tar"), "missing.tar"),
        (("x", "--from", f"tarball:{WORK}/bb.tar"), "unknown source"),
        (("x",), "one of --from, --containerfile or --packages"),
        (("x", "--from", f"oci-archive:{WORK}/bb.tar", "--copy", "/nonexistent-agentvm:/x"), "does not exist"),
        (("x", "--from", f"oci-archive:{WORK}/bb.tar", "--copy", f"{WORK}/bb.tar:relative"), "absolute"),
        (("x", "--from", f"oci-archive:{WORK}/bb.tar", "--env", "NOEQUALS"), "KEY=VALUE"),
        (("x", "--from", f"oci-archive:{WORK}/bb.tar", "--workdir", "rel"), "absolute"),
        (("x", "--packages", "git,Bad!"), "not a Debian package name"),
    ]
    for args, words in cases:
        r = build(*args)
        expect(r.returncode != 0, f"{args}: exit 0")
        expect(words in r.stderr, f"{args}: '{words}' not in {r.stderr[-500:]}")
    r = agentvm("template", "rm", "nosuch", "--store", STORE)
    refused(r, "no template 'nosuch'")
    r = agentvm("episode", "--template", "nosuch", "--template-store", STORE)
    refused(r, "no template 'nosuch'")
    return f"{len(cases) + 2} bad inputs refused, each naming the problem"


def failing_run_step_template():
    built("bbfail", "--from", f"oci-archive:{WORK}/bb.tar", "--run", "echo about-to-fail; exit 3")
    return "built (its bake must fail)"


def list_and_rm():
    r = agentvm("template", "list", "--json", "--store", STORE)
    names = [t["name"] for t in json.loads(r.stdout)]
    for name in ("default", "bb", "cf", "wh", "swe", "evil"):
        expect(name in names, f"{name} not listed: {names}")
    base = manifest("bbdocker")["base_key"]
    kept = {manifest(name)["base_key"] for name in ("bb", "cf", "wh", "swe", "evil")}
    r = agentvm("template", "rm", "bbdocker", "--store", STORE)
    expect(r.returncode == 0, r.stderr)
    expect(not os.path.exists(os.path.join(STORE, "bbdocker")), "still there")
    left = {name.split(".")[0] for name in os.listdir(os.path.join(STORE, ".bases"))}
    expect(base not in left, "its base stayed")
    expect(kept <= left, f"bases of other templates went: {kept - left}")
    return f"{len(names)} listed; rm took the template and its unshared base"


def run_cases(cases, only):
    """Runs the cases (those named in `only`, when given); 0 when all passed."""
    chosen = [case for case in cases if not only or case.__name__ in only]
    ok = [run_case(case.__name__, case, expected=(subprocess.SubprocessError, OSError)) for case in chosen]
    return 0 if all(ok) else 1


def host_phase(only):
    cases = [busybox_from_archives, unchanged_rebuild_is_cached, whiteout_layer, containerfile, swe_repository,
             templates_share_their_base, hostile_layers_contained, sparse_file_refused, too_big_for_its_disk, other_architecture, corrupt_archive, bad_input,
             failing_run_step_template, list_and_rm]
    return run_cases(cases, only)


# --- guest phase ------------------------------------------------------------------------


def bake(name):
    r = agentvm("template", "bake", name, "--store", STORE)
    expect(r.returncode == 0, f"bake {name} exited {r.returncode}: {r.stderr[-3000:]}")


def episode(name, calls):
    ep = Episode(AGENTVM, "--template", name, "--template-store", STORE)
    try:
        return [ep.call(call, timeout=300) for call in calls]
    finally:
        ep.close_stdin()
        ep.wait(timeout=120)


def sh(cmd):
    return {"op": "exec", "argv": ["/bin/sh", "-c", cmd]}


def busybox_runs_exec_and_shell():
    bake("bb")
    out = episode("bb", [sh("echo $BB_ENV $ADDED; pwd; stat -c %a /tmp; ls -d /dev/null"),
                         {"op": "shell", "cmd": "cd /etc && export X=kept"},
                         {"op": "shell", "cmd": "pwd; echo $X"},
                         {"op": "run_code", "code": "1"}])
    expect(out[0].get("stdout") == "from-image by-flag\n/home/app\n1777\n/dev/null\n", f"exec: {out[0]}")
    expect(out[1].get("shell") == "sh" and out[1].get("exit_code") == 0, f"shell: {out[1]}")
    expect(out[2].get("stdout") == "/etc\nkept\n", f"shell state: {out[2]}")
    expect(out[3].get("error", {}).get("code") == "spawn_failed" and "python3" in out[3]["error"]["message"],
           f"run_code: {out[3]}")
    r = agentvm("run", "--template", "bb", "--template-store", STORE, "--", "cat", "/etc/kept")
    expect(r.returncode == 0 and r.stdout == "kept\n", f"run: {r.returncode} {r.stdout!r} {r.stderr[-500:]}")
    return "env, workdir, /tmp made, shell falls back to sh (and says so), run_code names python3; run works"


def containerfile_template_runs():
    bake("cf")
    out = episode("cf", [sh("cat run.txt hello.txt; echo $GREETING; pwd"),
                         sh("id -u; id -G; echo $HOME; touch /data/mine 2>/dev/null || echo denied"),
                         {"op": "write_file", "path": "/home/agent/note", "data": "hi"},
                         sh("stat -c %u:%g /home/agent/note"),
                         {"op": "shell", "cmd": "id -u; echo more >> /home/agent/note; cat /home/agent/note"}])
    expect(out[0].get("stdout") == "made-by-run\ncopied by COPY\nfrom-containerfile\n/data\n", f"{out[0]}")
    expect(out[1].get("stdout") == "1234\n1234 77\n/home/agent\ndenied\n", f"user: {out[1]}")
    expect(out[2].get("ok") is True and out[3].get("stdout") == "1234:1234\n", f"write_file: {out[2]} {out[3]}")
    expect(out[4].get("stdout") == "1234\nhimore\n", f"shell: {out[4]}")
    return "RUN's file, COPY's file, ENV, WORKDIR and USER (exec, shell, write_file's owner) all in the episode"


def whiteout_applied():
    bake("wh")
    out = episode("wh", [sh("cat /etc/kept; test -e /etc/doomed && echo doomed-still-there; true")])
    expect(out[0].get("stdout") == "kept\n", f"{out[0]}")
    return "/etc/doomed gone, /etc/kept there"


def swe_task_passes_only_on_its_template():
    bake("swe")
    with open(os.path.join(WORK, "fix.patch")) as f:
        patch = f.read()
    grade = {"op": "shell", "cmd": "python3 -m unittest -q 2>&1 | tail -1"}
    out = episode("swe", [{"op": "shell", "cmd": "pwd; git status --short | wc -l"},
                          dict(grade),
                          {"op": "write_file", "path": "/tmp/fix.patch", "data": patch},
                          {"op": "shell", "cmd": "git apply /tmp/fix.patch && git diff --stat | tail -1"},
                          {"op": "shell", "cmd": "python3 -m unittest -q"}])
    expect(out[0].get("stdout") == "/testbed\n0\n", f"repo: {out[0]}")
    expect("FAILED" in out[1].get("stdout", ""), f"before the fix: {out[1]}")
    expect(out[3].get("exit_code") == 0, f"git apply: {out[3]}")
    expect(out[4].get("exit_code") == 0, f"after the fix: {out[4]}")
    default = episode("default", [{"op": "shell", "cmd": "cd /testbed && python3 -m unittest -q"}])
    expect(default[0].get("exit_code") != 0, f"the default template passed: {default[0]}")
    return "fails, git apply fixes, the grader passes; on the default template the grader fails"


def hostile_image_contained_in_guest():
    bake("evil")
    target = ESCAPE_DIR
    # The root filesystem bound elsewhere, without init's mounts over it: the target may lie
    # under /tmp (a clone in /tmp), where the guest's tmpfs would hide it.
    out = episode("evil", [sh(f"mkdir -p /mnt/image && mount -o bind / /mnt/image && ls /mnt/image{target}; "
                              "stat -c %A /setuid-file; stat -c %F /kmsg-node")])
    lines = out[0].get("stdout", "").splitlines()
    expect(lines == ["by-absolute-path", "by-dotdot", "copied-through-symlink", "through-symlink", "-rwsr-xr-x",
                     "character special file"], f"{out[0]}")
    return "what climbed out landed inside the image; setuid and device nodes kept for the guest only"


def failing_run_step_fails_bake():
    r = agentvm("template", "bake", "bbfail", "--store", STORE)
    seen = refused(r, "exit code 3", "about-to-fail")
    expect(manifest("bbfail")["snapshot"] is None, "a snapshot was recorded")
    expect(not os.path.exists(os.path.join(STORE, "bbfail", "snapshot")), "a snapshot was left")
    return seen


def python_client_and_serve_pool():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    from agentvm import Sandbox
    os.environ["AGENTVM_TEMPLATES"] = STORE
    with Sandbox(template="cf", binary=AGENTVM) as sb:
        embedded = sb.commands.run("cat run.txt").stdout
    expect(embedded == "made-by-run\n", f"embedded: {embedded!r}")
    tmp = os.environ.get("TMPDIR", "/tmp")
    sock = os.path.join(tmp, f"template-serve-{os.getpid()}.sock")
    # Its own state directory: the default one, under /var/lib, is read-only in the test host.
    state = os.path.join(WORK, "serve-state")
    serve = subprocess.Popen([AGENTVM, "serve", "--listen", "unix:" + sock, "--pool", "cf=1", "--template-store", STORE,
                              "--state-dir", state, "--log-level", "warn"], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not os.path.exists(sock):
            if serve.poll() is not None:
                raise Failed(f"serve exited {serve.returncode}: {serve.stderr.read()[-2000:]}")
            expect(time.monotonic() < deadline, "serve did not listen")
            time.sleep(0.2)
        with Sandbox(url="unix:" + sock, template="cf") as sb:
            served = sb.commands.run("cat hello.txt; echo $GREETING").stdout
        expect(served == "copied by COPY\nfrom-containerfile\n", f"served: {served!r}")
    except Exception as e:
        if serve.poll() is not None:
            raise Failed(f"{e}; serve exited {serve.returncode}: {serve.stderr.read()[-2000:]}") from e
        raise
    finally:
        serve.terminate()
        serve.wait(timeout=120)
    return "Sandbox(template=...) embedded and through serve --pool cf=1"


def guest_phase(only):
    cases = [busybox_runs_exec_and_shell, containerfile_template_runs, whiteout_applied,
             swe_task_passes_only_on_its_template, hostile_image_contained_in_guest, failing_run_step_fails_bake,
             python_client_and_serve_pool]
    return run_cases(cases, only)


def main(argv):
    global AGENTVM, STORE, WORK, ESCAPE_DIR
    if len(argv) < 5 or argv[1] not in ("host", "guest"):
        sys.exit(__doc__)
    AGENTVM, STORE, WORK = argv[2], argv[3], argv[4]
    ESCAPE_DIR = os.path.join(WORK, "escape-target")
    return host_phase(argv[5:]) if argv[1] == "host" else guest_phase(argv[5:])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
