#!/usr/bin/env bash
# The E2B tier: the official E2B JS SDKs, unmodified, against a real `agentvm serve`, where a
# real guest boots (the emulated test host when there is no hardware KVM), in one boot.
#
#   tests/e2b/run.sh [NODE_TEST_OPTIONS...] [FILE.test.mjs...]
#     e.g. tests/e2b/run.sh --test-name-pattern 'watchDir'
#          tests/e2b/run.sh tests/e2b/files.test.mjs
#
# Needs tests/e2b/install.sh first (setup.sh runs it) and build/ built. The results, in TAP,
# go to build/e2b-tests.tap (tests/run_all.sh counts them); a readable report to stderr.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
# shellcheck source=tests/e2b/node_env.sh
source tests/e2b/node_env.sh

die() {
  printf 'e2b: error: %s\n' "$*" >&2
  exit 2
}

node=$(e2b_find_node) || die "run tests/e2b/install.sh (or ./setup.sh build) first"
e2b_sdks_current || die "the E2B SDKs of tests/e2b/package-lock.json are not installed: run tests/e2b/install.sh"
for bin in build/agentvm build/agentvm-serve; do
  [[ -x $bin ]] || die "$bin is not built: ninja -C build"
done

# The template the tier's template test runs on, built here (a template build needs root and
# a loop mount, not KVM) and baked inside the run (tests/e2b/harness/suite.mjs). Its source is
# the default guest's own Debian tree, so that E2B's commands find bash, python3 and procps,
# plus an --env and a --copy the test looks for. Store and tree are kept in the cache: a
# rebuild with nothing changed costs a fraction of a second, and the bake is skipped.
template_store=$e2b_cache_root/e2b-template/store
build_template() {
  local image tree_key tree
  image=$(readlink -f build/guest/rootfs.ext4) || return 1
  # rootfs/build.sh names its image image-<tree key>-<guest hash>.ext4, made from tree-<tree key>.
  tree_key=${image##*/image-}
  tree_key=${tree_key%%-*}
  tree=$e2b_cache_root/rootfs/tree-$tree_key
  [[ -d $tree ]] || { echo "e2b: the default guest's tree $tree is missing: ./setup.sh build" >&2; return 1; }
  # The tree as it is, /dev's links into /proc among it: what a user's Debian tree holds.
  rm -rf "$e2b_cache_root"/e2b-template/tree-*
  build/agentvm --log-level warn template build e2b-tier --store "$template_store" --no-bake --from "dir:$tree" \
    --env E2B_TIER_TEMPLATE=e2b-tier --copy "$repo/tests/e2b/template:/opt/e2b-tier"
}
if [[ $EUID -ne 0 ]]; then
  echo "e2b: not root: the template (agentvm template build) is not built, and its test fails" >&2
elif ! build_template; then
  echo "e2b: building the tier's template failed (above); its test fails" >&2
fi

# One boot for the whole suite: serve, its VMs and 20 sandboxes at once fit in 4 GiB.
export E2B_TIER_TEMPLATE_STORE=$template_store
exec tests/testhost/run --mem 4096 --timeout 1800 -- "$node" tests/e2b/harness/suite.mjs "$@"
