#!/usr/bin/env bash
# One entry point for a fresh Debian 12 machine (as root): installs what is missing, builds the
# VMM, the guest kernel, the guest init and the rootfs image, bakes the default snapshot and
# fetches the E2B tier's Node.js SDKs (each cached, rebuilt only when its inputs change), then either boots the default guest (`demo`) or runs every test (`test`).
#
#   ./setup.sh demo     set up, then run a command in a fresh VM and a short tool-call episode
#   ./setup.sh test     set up, then run the unit, kvm and vm test suites
#   ./setup.sh build    set up only
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$repo"
mode=${1:-build}
start=$SECONDS

say() { printf 'setup: [%4ds] %s\n' "$((SECONDS - start))" "$*" >&2; }

# Everything the set-up prints goes to stderr, ninja's progress included: stdout is the demo's.
# ninja's status line: edges finished/total and seconds since that ninja started (full command
# lines only for a step that fails).
export NINJA_STATUS=${NINJA_STATUS:-'[%f/%t %es] '}

# A step that can be quiet for minutes (apt, the kernel build, debootstrap, the bake) says every
# this many seconds that it still runs.
readonly HEARTBEAT_S=60
ticker=

# Says every HEARTBEAT_S seconds, until stop_ticker, that step LABEL (begun at second T0) runs.
# The ticker is one subshell without children that linger: its sleep is the read builtin timing
# out on a pipe it holds both ends of, so stop_ticker's kill leaves nothing behind holding stderr.
# It also stops by itself once the set-up ($$) is gone. Its lines go to fd 3, the set-up's
# stderr; its own stderr is /dev/null from the fork on, since bash 5.2 may warn there about an
# earlier ticker.
start_ticker() {
  local label=$1 t0=$2
  {
    (
      while read -r -t "$HEARTBEAT_S" <> <(:) || true; kill -0 "$$" 2>/dev/null; do
        say "$label: still running, $((SECONDS - t0))s so far" 2>&3
      done
    ) &
  } 3>&2 2>/dev/null
  ticker=$!
}

stop_ticker() {
  [[ -n $ticker ]] || return 0
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
  ticker=
}
# A set-up that fails also stops the rest of build/ it started (start_rest_of_build; ninja
# stops the compilers it runs).
on_exit() {
  stop_ticker
  if [[ -n ${rest_pid:-} ]]; then
    kill "$rest_pid" 2>/dev/null || true
    wait "$rest_pid" 2>/dev/null || true
  fi
}
trap on_exit EXIT

# step [--no-heartbeat] LABEL CMD...: runs CMD as one step of the set-up. Says LABEL before it,
# its time after it and, unless CMD shows progress of its own, every HEARTBEAT_S seconds that it
# still runs. Returns CMD's status. CMD runs where `set -e` does not apply: a function given as
# CMD must return its failures itself.
step() {
  local heartbeat=1
  if [[ $1 == --no-heartbeat ]]; then
    heartbeat=0
    shift
  fi
  local label=$1 t0=$SECONDS status=0
  shift
  say "$label"
  if ((heartbeat)); then
    start_ticker "$label" "$t0"
  fi
  "$@" || status=$?
  stop_ticker
  if ((status)); then
    say "$label: failed after $((SECONDS - t0))s"
    return "$status"
  fi
  say "$label: done in $((SECONDS - t0))s"
}

packages=(
  build-essential meson ninja-build pkg-config clang libclang-rt-14-dev
  linux-libc-dev liburing-dev libcli11-dev libspdlog-dev libfmt-dev doctest-dev
  nlohmann-json3-dev libseccomp-dev nettle-dev libmicrohttpd-dev libcurl4-openssl-dev libhttp-parser-dev
  linux-source-6.1 bc flex bison libelf-dev libssl-dev dwarves xz-utils
  debootstrap busybox-static e2fsprogs cpio
  skopeo umoci buildah
  qemu-system-x86 linux-image-amd64
  python3-pytest python3-mypy
  systemd
  debhelper dh-python help2man lintian
  slurm-wlm haproxy
)

install_missing_packages() {
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if ((${#missing[@]})); then
    [[ $EUID -eq 0 ]] || { echo "setup: must run as root to install: ${missing[*]}" >&2; exit 1; }
    say "missing packages: ${missing[*]}"
    step "installing ${#missing[@]} packages (apt-get)" install_packages "${missing[@]}"
  fi
}

install_packages() {
  apt-get update -qq >&2 &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# Runs meson setup ARGS...; its long report is shown only if it fails.
meson_setup() {
  local log
  log=$(meson setup "$@" 2>&1) || { printf '%s\n' "$log" >&2; return 1; }
}

# What the demo runs: the VMM and what goes into the guest's rootfs: 38% of the CPU time of all
# of build/ (tests/README.md: the tests, their guests, agentvm-serve and the bench probe are the
# rest), so `demo` reaches its first result that much sooner.
readonly demo_targets=(agentvm guest/agentvm-init guest/agent/agentvm-agent)
# The product's other program: `agentvm serve` runs it (`build`).
readonly serve_targets=(agentvm-serve)

build_vmm() {
  if [[ ! -f build/build.ninja ]]; then
    step --no-heartbeat "configuring build/ (meson setup)" meson_setup build
  fi
  local targets=("${demo_targets[@]}")
  if [[ $mode == build ]]; then
    targets+=("${serve_targets[@]}")
  fi
  # ninja prints its own progress: one line per edge, or one updated line on a terminal.
  step --no-heartbeat "building the VMM, the guest init and agent (ninja -C build ${targets[*]})" \
    ninja -C build "${targets[@]}" >&2
}

# `test`: the rest of build/ (agentvm-serve, the tests, the bench probe) compiles while the guest
# kernel, the rootfs and the bake run, under SCHED_IDLE (chrt --idle): it takes only the cycles
# they leave idle (the rootfs waits on downloads, the bake runs one emulated CPU, the kernel's
# link is serial), so they take no longer than alone. Its progress goes to a log;
# finish_rest_of_build waits for it before the tests.
rest_pid=
rest_log=build/meson-logs/setup-rest-of-build.log
start_rest_of_build() {
  say "building the rest of build/ (tests, agentvm-serve, bench) beside the guest, on idle CPU: $rest_log"
  chrt --idle 0 ninja -C build -j 2 >"$rest_log" 2>&1 &
  rest_pid=$!
}

finish_rest_of_build() {
  [[ -n $rest_pid ]] || return 0
  local t0=$SECONDS status=0
  say "waiting for the rest of build/ ($rest_log)"
  wait "$rest_pid" || status=$?
  rest_pid=
  if ((status)); then
    tail -n 40 "$rest_log" >&2
    say "building the rest of build/ failed (above; all of it in $rest_log)"
    return "$status"
  fi
  say "the rest of build/ is built (waited $((SECONDS - t0))s): $(tail -n 1 "$rest_log")"
}

# Both print their own progress on stderr (lines prefixed kernel: and rootfs:), and nothing
# when cached. The rootfs is built while the kernel compiles: on a fresh machine it is mostly
# debootstrap waiting on downloads, which the kernel's compile does not.
build_guest() {
  mkdir -p build/guest
  local rootfs_pid status=0
  step "guest root filesystem (rootfs/build.sh, beside the kernel)" \
    rootfs/build.sh build/guest/agentvm-init build/guest/agent/agentvm-agent build/guest/rootfs.ext4 >&2 &
  rootfs_pid=$!
  step "guest kernel (kernel-config/build.sh)" kernel-config/build.sh build/guest/vmlinux >&2 || status=$?
  wait "$rootfs_pid" || status=$?
  return "$status"
}

# True when this host's /dev/kvm can boot a Linux guest (hardware KVM). On PVM, or without
# /dev/kvm, real guests run inside the emulated test host instead.
hardware_kvm() {
  [[ -e /dev/kvm && ! -e /sys/module/kvm_pvm ]]
}

# Runs an agentvm command where a Linux guest can boot: here on hardware KVM, else in the
# emulated test host.
agentvm_where_guests_boot() {
  if hardware_kvm; then
    build/agentvm "$@"
  else
    AGENTVM_TESTHOST_QUIET=1 tests/testhost/run -- build/agentvm "$@"
  fi
}

# The snapshot `agentvm run` and `agentvm episode` restore from by default. Baked again when the
# VMM, the kernel or the rootfs changed: the snapshot records their identity, and a stale one
# would be refused (those commands then warn and boot cold).
bake_default_snapshot() {
  local snapshot=build/guest/snapshot key
  key=$({ sha256sum build/agentvm; stat -L -c '%d %i %s %Y %Z' build/guest/vmlinux build/guest/rootfs.ext4; } |
        sha256sum | cut -d' ' -f1)
  if [[ -f $snapshot/manifest.json && $(cat "$snapshot.key" 2>/dev/null) == "$key" ]]; then
    say "default snapshot $snapshot is current"
    return
  fi
  local where="on this host's KVM" console=build/meson-logs/bake-console.log attempt
  hardware_kvm || where="in the emulated test host, slow"
  rm -rf "$snapshot.key"
  # Twice at most: a bake that failed once for want of a guest (seen once in CI: the agent never
  # answered within the boot timeout, a second bake of the same image took 40 s) would leave
  # every later test to boot cold. The guest's console says why it failed.
  for attempt in 1 2; do
    rm -rf "$snapshot" "$snapshot".partial-*
    # Quiet until it is done (the guest boots and settles), hence the heartbeat. An agent
    # answers in about 10 s under emulation; 120 s leaves room for a loaded host.
    if step "baking the default snapshot ($snapshot, $where, try $attempt)" \
        agentvm_where_guests_boot --log-level warn snapshot bake --out "$snapshot" --boot-timeout 120 \
        --console "$console" >&2; then
      echo "$key" >"$snapshot.key"
      return
    fi
    say "the bake's guest console ($console) ended with:"
    tail -n 20 "$console" >&2
  done
  rm -rf "$snapshot"
  say "WARNING: baking the default snapshot failed twice (above); agentvm run and episode will boot cold"
}

# The E2B tier's Node.js and official SDKs (tests/e2b/install.sh: each cached by the hash of its
# inputs, nothing done when current; it shows its own progress). npm fetches them: Debian's
# where the machine has none.
install_e2b_sdks() {
  if ! command -v npm >/dev/null; then
    [[ $EUID -eq 0 ]] || { echo "setup: must run as root to install npm (the E2B tier's SDKs)" >&2; return 1; }
    say "npm not found: installing Debian's (it fetches the E2B SDKs, and Node.js if this one is too old)"
    install_packages npm || return 1
  fi
  tests/e2b/install.sh
}

install_missing_packages
build_vmm
if [[ $mode == test ]]; then
  start_rest_of_build
fi
build_guest
bake_default_snapshot
if [[ $mode != demo ]]; then
  step "E2B SDKs for the E2B tier (tests/e2b/install.sh)" install_e2b_sdks
fi
finish_rest_of_build
say "set-up done"

case "$mode" in
  build) ;;
  demo)
    # One command in a fresh VM, then a three-call episode whose JSON lines show a file
    # written, run from a cd, and the cd still in force in the next call.
    demo='build/agentvm run -- python3 -c "import os, platform; print(f\"hello from agentvm: {platform.system()} {platform.release()}, {os.cpu_count()} vCPU, python {platform.python_version()}\")"
printf "%s\n" \
  "{\"id\":1,\"op\":\"write_file\",\"path\":\"/root/hi.py\",\"data\":\"import os; print(\\\"tool call ran in\\\", os.getcwd())\\n\"}" \
  "{\"id\":2,\"op\":\"shell\",\"cmd\":\"cd /tmp && python3 /root/hi.py\"}" \
  "{\"id\":3,\"op\":\"shell\",\"cmd\":\"pwd\"}" | build/agentvm episode'
    if hardware_kvm; then
      exec bash -c "$demo"
    fi
    echo "setup: no hardware KVM on this host; running through the emulated test host (slow)" >&2
    AGENTVM_TESTHOST_QUIET=1 exec tests/testhost/run -- bash -c "$demo"
    ;;
  test)
    exec tests/run_all.sh
    ;;
  *)
    echo "usage: $0 [build|demo|test]" >&2
    exit 2
    ;;
esac
