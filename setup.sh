#!/usr/bin/env bash
# One entry point for a fresh Debian 12 machine (as root): installs what is missing, builds the
# VMM, the guest kernel, the guest init and the rootfs image (each cached, rebuilt only when its
# inputs change), then either boots the default guest (`demo`) or runs every test (`test`).
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

packages=(
  build-essential meson ninja-build pkg-config
  linux-libc-dev liburing-dev libcli11-dev libspdlog-dev libfmt-dev doctest-dev
  nlohmann-json3-dev libseccomp-dev
  linux-source-6.1 bc flex bison libelf-dev libssl-dev dwarves xz-utils
  debootstrap busybox-static e2fsprogs cpio
  qemu-system-x86 linux-image-amd64
)

install_missing_packages() {
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if ((${#missing[@]})); then
    [[ $EUID -eq 0 ]] || { echo "setup: must run as root to install: ${missing[*]}" >&2; exit 1; }
    say "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

build_vmm() {
  say "building the VMM (build/)"
  [[ -f build/build.ninja ]] || meson setup build >/dev/null
  ninja -C build >/dev/null
}

build_guest() {
  mkdir -p build/guest
  kernel-config/build.sh build/guest/vmlinux
  rootfs/build.sh build/guest/agentvm-init build/guest/agent/agentvm-agent build/guest/rootfs.ext4
}

# True when this host's /dev/kvm can boot a Linux guest (hardware KVM). On PVM, or without
# /dev/kvm, real guests run inside the emulated test host instead.
hardware_kvm() {
  [[ -e /dev/kvm && ! -e /sys/module/kvm_pvm ]]
}

install_missing_packages
build_vmm
build_guest
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
