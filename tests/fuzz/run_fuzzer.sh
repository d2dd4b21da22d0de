#!/usr/bin/env bash
# run_fuzzer.sh FUZZER SECONDS SEED_DIR ARTIFACT_DIR [LIBFUZZER FLAGS OR READ-ONLY CORPUS DIRS...]
#
# Fuzzes for SECONDS from a scratch corpus: the target's own seeds (AGENTVM_FUZZ_SEEDS, see
# fuzz_support.hpp), SEED_DIR's files if it exists, and the target's reproducers in crashes/.
# The scratch corpus goes away afterwards, so nothing checked in is ever modified. A crash,
# leak, sanitizer report, timeout or out-of-memory is saved as ARTIFACT_DIR/<target>-crash-<sha1>
# (or -leak-, -timeout-, -oom-) and fails the run. Exits 0 when libFuzzer found nothing, else 1
# (never 77, which meson would count as a skip: libFuzzer's own error code is 77).
set -uo pipefail
fuzzer=$(realpath "$1") seconds=$2 seeds=$3 artifacts=$4
shift 4
name=$(basename "$fuzzer")

work=$(mktemp -d "${TMPDIR:-/tmp}/agentvm-fuzz-XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus" "$artifacts" || exit 1
if ! AGENTVM_FUZZ_SEEDS="$work/corpus" "$fuzzer" >"$work/seeds.log" 2>&1; then
  echo "$name: writing its seeds failed:" >&2
  cat "$work/seeds.log" >&2
  exit 1
fi
if [[ -d $seeds ]]; then
  cp -- "$seeds"/* "$work/corpus/" 2>/dev/null
fi
# Reproducers of bugs the fuzzers found (crashes/<target>-<what>) run first, every time: a
# regression test once fixed, a certain failure until then.
here=$(dirname "${BASH_SOURCE[0]}")
for crash in "$here/crashes/${name#fuzz_}-"*; do
  [[ -f $crash ]] && cp -- "$crash" "$work/corpus/"
done

# Text targets have a dictionary of their format's words.
dict=$here/dict/${name#fuzz_}.dict
dict_flag=()
[[ -f $dict ]] && dict_flag=(-dict="$dict")

# UBSan reports are errors here, as in the unit tests under build-asan/.
export UBSAN_OPTIONS=${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=1

# Files a target makes for itself (fuzz_serve's socket and fake episode) go in the scratch dir:
# libFuzzer ends without running static destructors, which would remove them.
TMPDIR=$work "$fuzzer" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
  -error_exitcode=1 -timeout_exitcode=1 -print_final_stats=1 "${dict_flag[@]}" \
  -artifact_prefix="$artifacts/$name-" "$work/corpus" "$@"
status=$?
if ((status != 0)); then
  echo "$name: FOUND A PROBLEM (libFuzzer exit $status); reproducer(s):" >&2
  ls -t "$artifacts/$name-"* 2>/dev/null | head -3 >&2
  echo "replay with: UBSAN_OPTIONS=halt_on_error=1 $fuzzer <reproducer>" >&2
  exit 1
fi
exit 0
