#!/usr/bin/env bash
# configure.sh [BUILD_DIR]: sets up the fuzz build (default build-fuzz/, beside the repository's
# other build dirs) unless it exists, and builds its fuzz targets; tests/run_all.sh and
# bench/fuzz both use it.
#
# clang, the product code built with -fsanitize=fuzzer-no-link (coverage for libFuzzer) and
# AddressSanitizer + UBSan; the fuzz executables link libFuzzer (tests/fuzz/meson.build).
# -Dwerror=false: GCC is the compiler that gates warnings (build/, build-asan/); a warning only
# clang gives must not stop the fuzzers. Without clang the build dir is set up with the default
# compiler, and each fuzz test reports SKIP with the reason.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-$repo/build-fuzz}

if [[ ! -f $build/build.ninja ]]; then
  if command -v clang >/dev/null && command -v clang++ >/dev/null; then
    args=(-Dfuzz=true -Dwerror=false -Db_sanitize=address,undefined -Db_lundef=false
          -Dcpp_args=-fsanitize=fuzzer-no-link)
    export CC=clang CXX=clang++
  else
    args=(-Dfuzz=true)
  fi
  if ! log=$(meson setup "$build" "$repo" "${args[@]}" 2>&1); then
    printf '%s\n' "$log" >&2
    exit 1
  fi
  # tests/fuzz/meson.build says so when the targets cannot be built (no clang, no libFuzzer).
  grep 'WARNING: fuzz' <<<"$log" >&2 || true
fi
# Only the fuzz targets: the rest of the project is built and tested in build/ and build-asan/.
# ninja's progress goes to stderr (edges finished/total, seconds so far); it shows the command
# of a step that fails.
if ninja -C "$build" -t query fuzz-targets >/dev/null 2>&1; then
  NINJA_STATUS=${NINJA_STATUS:-'[%f/%t %es] '} ninja -C "$build" fuzz-targets >&2
fi
