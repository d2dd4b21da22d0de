#!/usr/bin/env bash
# The fleet tier (tests/fleet/fleet_check.py): real Slurm, HAProxy and serve, with three
# network namespaces as hosts, in one boot of the test host where no hardware KVM is (on
# hardware KVM it runs here directly, as root).
#
#   tests/fleet/run.sh        results in TAP: build/fleet-tests.tap (tests/run_all.sh counts them)
#
# Needs build/ built, Slurm (slurm-wlm) and HAProxy installed (setup.sh installs them), and the
# E2B SDKs (tests/e2b/install.sh) for its E2B case.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
die() {
  printf 'fleet: error: %s\n' "$*" >&2
  exit 2
}
for bin in build/agentvm build/agentvm-serve; do
  [[ -x $bin ]] || die "$bin is not built: ninja -C build"
done
for tool in slurmctld slurmd sbatch haproxy; do
  command -v "$tool" >/dev/null || die "$tool is missing: apt-get install slurm-wlm haproxy (./setup.sh build does)"
done
[[ $EUID -eq 0 ]] || die "the fleet tier makes network namespaces and runs Slurm's daemons: run it as root"
# Three serves, 30 sandboxes at once and /run_code's beside them fit in 6 GiB.
exec tests/testhost/run --mem 6144 --timeout 1500 -- /usr/bin/env FLEET_UP_WITHIN="${FLEET_UP_WITHIN:-300}" /usr/bin/python3 tests/fleet/fleet_check.py \
  --tap "$repo/build/fleet-tests.tap"
