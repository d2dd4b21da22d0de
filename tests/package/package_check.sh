#!/usr/bin/env bash
# The Debian package, end to end: builds it from this checkout (dpkg-buildpackage, the guest
# taken prebuilt from build/guest/ so that no kernel is built), checks it with lintian, installs
# it on this machine with apt, uses it from outside the checkout (cwd a scratch directory,
# PATH=/usr/bin:/bin, no AGENTVM_* variables), then purges it and checks that nothing is left
# but the system user, which Debian policy keeps.
#
#   tests/package/package_check.sh [TAP_FILE]     default build/package-tests.tap
#
# Results in TAP, closing with "# pass N" and "# fail N" (tests/run_all.sh counts them). Needs
# root and ./setup.sh build (build/guest/, or AGENTVM_PREBUILT_GUEST naming another guest).
# Refuses to run where agentvm is already installed: it would replace and then purge the
# machine's own. `agentvm run` goes through tests/testhost/run, which runs it directly on
# hardware KVM.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tap=${1:-$repo/build/package-tests.tap}
readonly clean_path=/usr/bin:/bin
readonly packages=(agentvm python3-agentvm)

passed=0 failed=0 count=0
: >"$tap"
# record STATUS DESCRIPTION [DETAIL...]: one TAP result; each line of each DETAIL follows as a comment.
record() {
  local status=$1 what=$2
  shift 2
  count=$((count + 1))
  if ((status == 0)); then
    passed=$((passed + 1)); echo "ok $count - $what" | tee -a "$tap"
  else
    failed=$((failed + 1)); echo "not ok $count - $what" | tee -a "$tap"
  fi
  (($#)) && printf '%s\n' "$@" | sed -n 's/^\(.\)/# \1/p' | tee -a "$tap"
  return 0
}
finish() {
  { echo "1..$count"; echo "# pass $passed"; echo "# fail $failed"; } | tee -a "$tap"
  ((failed == 0))
  exit
}
say() { printf 'package: %s\n' "$*" >&2; }

# As a user would run it: from a scratch directory, with the system's PATH and nothing of ours
# in the environment.
outside() { (cd "$scratch" && env -i PATH=$clean_path HOME="$HOME" LANG=C.UTF-8 "$@"); }

# serve as the installed unit starts it (tests/package/serve_unit_check.py plays systemd with the
# installed units, /usr/bin/agentvm-serve and the package's `agentvm` user), in the same boot as
# the run below: its verdict line goes to that boot's stderr.
serve_unit_in_boot="chgrp kvm /dev/kvm && chmod 0660 /dev/kvm && /usr/bin/python3 $repo/tests/package/serve_unit_check.py \
  --serve /usr/bin/agentvm-serve --agentvm /usr/bin/agentvm --unit-dir /lib/systemd/system >&2"

if [[ $EUID -ne 0 ]]; then record 1 "run as root (it installs a package)"; finish; fi
for p in "${packages[@]}"; do
  if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'installed'; then
    record 1 "$p is already installed on this machine: this check installs and purges its own; remove it first"
    finish
  fi
done
# The guest the package ships, prebuilt: set-up's, or AGENTVM_PREBUILT_GUEST's (as debian/rules).
guest=${AGENTVM_PREBUILT_GUEST:-$repo/build/guest}
for f in vmlinux rootfs.ext4; do
  [[ -f $guest/$f ]] || { record 1 "$guest/$f missing: ./setup.sh build makes it"; finish; }
done

work=$(mktemp -d /var/tmp/agentvm-package.XXXXXX)
scratch=$work/elsewhere
mkdir -p "$work/src" "$scratch"
installed=0
cleanup() {
  if ((installed)); then apt-get purge -y -qq "${packages[@]}" >/dev/null 2>&1; fi
  rm -rf "$work"
}
trap cleanup EXIT

# --- build: the working tree as it is (tracked and new files, not ignored ones) -------------
t0=$SECONDS
say "building the package in $work (dpkg-buildpackage; log: $work/build.log)"
(cd "$repo" && git ls-files -co --exclude-standard -z | tar --null --ignore-failed-read -T - -cf - 2>/dev/null) |
  tar -xf - -C "$work/src"
(cd "$work/src" && DEB_BUILD_OPTIONS="nocheck noddebs parallel=$(nproc)" AGENTVM_PREBUILT_GUEST="$guest" \
  nice dpkg-buildpackage -b -us -uc >"$work/build.log" 2>&1)
status=$?
debs=("$work"/agentvm_*.deb "$work"/python3-agentvm_*.deb)
record "$status" "dpkg-buildpackage -b -us -uc builds agentvm and python3-agentvm ($((SECONDS - t0)) s)" \
  "$( ((status)) && tail -n 15 "$work/build.log")"
((status)) && finish

lintian_out=$(lintian --fail-on error --tag-display-limit 0 "$work"/*.changes 2>&1)
status=$?
record "$status" "lintian finds no errors (warnings and notes below)" "$lintian_out"

# --- install ---------------------------------------------------------------------------------
t0=$SECONDS
log=$(DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${debs[@]}" 2>&1)
status=$?
installed=1
record "$status" "apt-get installs both packages ($((SECONDS - t0)) s)" "$( ((status)) && tail -n 10 <<<"$log")"
files_before_purge=$(dpkg -L "${packages[@]}" 2>/dev/null)

missing=()
for path in /usr/bin/agentvm /usr/bin/agentvm-serve /usr/lib/agentvm/vmlinux /usr/lib/agentvm/rootfs.ext4 \
  /usr/lib/agentvm/agentvm-init /usr/lib/agentvm/agent/agentvm-agent /usr/lib/agentvm/apt_mirror.sh \
  /usr/share/man/man1/agentvm.1.gz /usr/share/man/man1/agentvm-doctor.1.gz /usr/share/man/man1/agentvm-run.1.gz \
  /usr/lib/python3/dist-packages/agentvm/__init__.py; do
  [[ -e $path ]] || missing+=("$path")
done
record "${#missing[@]}" "the programs, the guest, man pages and the Python client are where they belong" \
  "${missing[@]/#/missing: }"
id_out=$(id agentvm 2>&1)
state=$(stat -c '%U:%G %a' /var/lib/agentvm 2>&1)
[[ $id_out == *"(kvm)"* && $state == "root:agentvm 775" ]]
record $? "system user agentvm, in group kvm; /var/lib/agentvm root's, writable by group agentvm" "$id_out" "$state"
man_out=$(MANPAGER=cat man -l /usr/share/man/man1/agentvm-doctor.1.gz 2>&1)
[[ $man_out == *"--help"* || $man_out == *"doctor"* ]]
record $? "man agentvm-doctor renders the command's own help" "${man_out:0:200}"

# --- use, from outside the checkout -----------------------------------------------------------
doctor=$(outside agentvm doctor 2>&1)
status=$?
# Which of doctor's findings fail it depends on the host (no KVM here); its status must agree
# with them, and the guest must be the installed one.
expected=0
grep -q '^MISSING' <<<"$doctor" && expected=1
grep -q '^ok *guest kernel: /usr/lib/agentvm/vmlinux (from the installed guest)' <<<"$doctor" &&
  grep -q '^ok *guest root filesystem: /usr/lib/agentvm/rootfs.ext4 (from the installed guest)' <<<"$doctor" &&
  ((status == expected))
record $? "agentvm doctor finds the installed guest, exit $status agreeing with its findings" "$doctor"

python_out=$(outside /usr/bin/python3 -c 'import agentvm; print(agentvm.__file__)' 2>&1)
[[ $python_out == /usr/lib/python3/dist-packages/agentvm/__init__.py ]]
record $? "the system's python3 imports agentvm from dist-packages" "$python_out"

# One boot where guests boot: doctor there, then a run that bakes the default snapshot on first
# use into /var/lib/agentvm (shared with the test host read-write, as the overlay's /tmp is its own).
t0=$SECONDS
say "agentvm doctor and agentvm run -- echo hi where a guest boots (the first run bakes the snapshot)"
run_out=$(cd "$scratch" && env -i PATH=$clean_path HOME="$HOME" LANG=C.UTF-8 TMPDIR=/tmp AGENTVM_TESTHOST_QUIET=1 \
  "$repo/tests/testhost/run" --timeout 900 --share /var/lib/agentvm -- \
  /bin/sh -c 'agentvm doctor >doctor-there.txt 2>&1; echo "doctor exit $?" >&2; agentvm run -- echo hi; s=$?
              '"$serve_unit_in_boot"'; exit $s' 2>"$work/run.err")
status=$?
[[ $status -eq 0 && $run_out == hi ]]
record $? "agentvm run -- echo hi prints hi and exits 0 ($((SECONDS - t0)) s)" "stdout: $run_out" "$(tail -n 15 "$work/run.err")"
grep -q '^doctor exit 0$' "$work/run.err"
record $? "agentvm doctor finds nothing missing where the guest booted" "$(grep -v '^ok' "$scratch/doctor-there.txt" 2>&1 | head -n 8)"
[[ -f /var/lib/agentvm/snapshot/manifest.json ]] && grep -q 'baking the default snapshot into /var/lib/agentvm/snapshot' "$work/run.err"
record $? "the first run baked the default snapshot into /var/lib/agentvm/snapshot, saying so"

grep -q '^ok serve_unit: ' "$work/run.err"
record $? "serve started as the installed agentvm-serve.service starts it, as user agentvm: READY=1, /healthz, a sandbox's exec, reload" \
  "$(grep -A 30 'serve_unit: ' "$work/run.err" | head -n 30)"

# --- purge --------------------------------------------------------------------------------------
log=$(apt-get purge -y -qq "${packages[@]}" 2>&1)
status=$?
installed=0
record "$status" "apt-get purge removes both packages" "$( ((status)) && tail -n 10 <<<"$log")"
left=()
while IFS= read -r path; do
  [[ -n $path && -e $path && ! -d $path ]] && left+=("$path")
done <<<"$files_before_purge"
for path in /var/lib/agentvm /usr/lib/agentvm /etc/agentvm /usr/lib/python3/dist-packages/agentvm; do
  [[ -e $path ]] && left+=("$path")
done
record "${#left[@]}" "nothing of the packages is left after the purge" "${left[@]/#/left: }"
id agentvm >/dev/null 2>&1
record $? "the system user agentvm stays after the purge, as Debian policy keeps system users"

finish
