#!/usr/bin/env bash
# Runs every test tier and ends with one line: "N passed, N failed, N skipped".
#   unit  in build/ and again in build-asan/ (AddressSanitizer + UBSan)
#   kvm   tiny freestanding guests on this host's /dev/kvm (skipped without one)
#   vm    the real kernel and rootfs, through tests/testhost/run
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

status=0
# A stale log from an earlier run must never be counted as this run's result.
rm -f build/meson-logs/testlog.json build-asan/meson-logs/testlog.json
echo "tests: unit tier under AddressSanitizer and UBSan (build-asan/)" >&2
if [[ ! -f build-asan/build.ninja ]]; then
  meson setup build-asan -Db_sanitize=address,undefined -Db_lundef=false >/dev/null || status=1
fi
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  meson test -C build-asan --suite unit --print-errorlogs || status=1

# --- fuzz targets (tests/fuzz/) ---------------------------------------------------------
# Each libFuzzer target fuzzes for a few seconds in build-fuzz/ (clang, ASan + UBSan), set up
# and built (the fuzz targets only) by tests/fuzz/configure.sh; bench/fuzz runs them longer.
# Without clang or libFuzzer every fuzz test reports SKIP with the reason.
echo "tests: fuzz targets, briefly (build-fuzz/)" >&2
rm -f build-fuzz/meson-logs/testlog.json  # never count an earlier run's
if tests/fuzz/configure.sh build-fuzz; then
  meson test -C build-fuzz --suite fuzz --no-rebuild --print-errorlogs || status=1
else
  status=1
fi
# --- end of fuzz targets ------------------------------------------------------------------

echo "tests: every tier (build/)" >&2
meson test -C build --print-errorlogs || status=1

python3 - build-asan/meson-logs/testlog.json build-fuzz/meson-logs/testlog.json build/meson-logs/testlog.json <<'PY'
import json, sys
passed = failed = skipped = 0
for path in sys.argv[1:]:
    try:
        lines = open(path).read().splitlines()
    except FileNotFoundError:
        failed += 1
        print(f"tests: {path} missing: that build's tests never ran", file=sys.stderr)
        continue
    for line in lines:
        result = json.loads(line)["result"]
        if result in ("OK", "EXPECTEDFAIL"):
            passed += 1
        elif result == "SKIP":
            skipped += 1
        else:
            failed += 1
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
PY
summary=$?
exit $(( status || summary ))
