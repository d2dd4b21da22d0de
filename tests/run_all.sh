#!/usr/bin/env bash
# Runs every test tier and ends with one line: "N passed, N failed, N skipped".
#   unit  in build/ and again in build-asan/ (AddressSanitizer + UBSan)
#   kvm   tiny freestanding guests on this host's /dev/kvm (skipped without one)
#   vm    the real kernel and rootfs, through tests/testhost/run
#   the Python client's pytest suite, through tests/testhost/run, beside the tiers of build/
#   the E2B tier (the official E2B SDKs against serve, node --test), after the Python client's
#   the Debian package (built, lintian, installed, used, purged), last and alone
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

status=0
start=$SECONDS
say() { printf 'tests: [%4ds] %s\n' "$((SECONDS - start))" "$*" >&2; }

# Builds show ninja's progress on stderr (stdout is the tests' results): edges finished/total
# and seconds since that ninja started.
export NINJA_STATUS=${NINJA_STATUS:-'[%f/%t %es] '}

# build_for_tests DIR [SUITE]: builds what the tests of DIR (of SUITE only, if given) need, the
# targets `meson test` would rebuild, with ninja's progress on stderr. meson test still checks
# (its own rebuild prints to stdout, amid the results; here it finds nothing left to do). When
# the build fails, that build's tests are not run and its missing testlog counts as a failure.
build_for_tests() {
  local dir=$1 suite=${2:-} targets t0=$SECONDS
  say "building ${suite:-all} tests in $dir/"
  targets=$(meson introspect "$dir" --tests --targets | python3 -c '
import json, os, sys
build, suite = sys.argv[1:]
info = json.load(sys.stdin)
files = {target["id"]: target["filename"] for target in info["targets"]}
wanted = set()
for test in info["tests"]:
    if not suite or any(s == suite or s.endswith(":" + suite) for s in test["suite"]):
        for dep in test["depends"]:
            wanted.update(os.path.relpath(f, build) for f in files.get(dep, []))
print("\n".join(sorted(wanted)))
' "$dir" "$suite") || return 1
  # shellcheck disable=SC2086 # meson's target paths have no blanks
  ninja -C "$dir" $targets >&2 || return 1
  say "built ${suite:-all} tests in $dir/ in $((SECONDS - t0))s"
}

# A stale log from an earlier run must never be counted as this run's result.
rm -f build/meson-logs/testlog.json build-asan/meson-logs/testlog.json
say "unit and jail tiers under AddressSanitizer and UBSan (build-asan/)"
if [[ ! -f build-asan/build.ninja ]]; then
  say "configuring build-asan/ (meson setup)"
  # -O0: the unit tests run for seconds, while compiling the large single-translation-unit
  # libraries with ASan + UBSan is most of this tier's time (service: 118 s of CPU at -O1,
  # 43 s at -O0; build-asan/ took 456 s at -O1 on a quiet 2-core machine). At -O0 every
  # memory access the sanitizers check stays in the code; optimisation can only remove some.
  if ! log=$(meson setup build-asan -Db_sanitize=address,undefined -Db_lundef=false -Doptimization=0 2>&1); then
    printf '%s\n' "$log" >&2
    status=1
  fi
fi
if build_for_tests build-asan unit && build_for_tests build-asan jail; then
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    meson test -C build-asan --suite unit --suite jail --print-errorlogs || status=1
else
  status=1
fi

# --- fuzz targets (tests/fuzz/) ---------------------------------------------------------
# Each libFuzzer target fuzzes for a few seconds in build-fuzz/ (clang, ASan + UBSan), set up
# and built (the fuzz targets only) by tests/fuzz/configure.sh; bench/fuzz runs them longer.
# Without clang or libFuzzer every fuzz test reports SKIP with the reason.
say "fuzz targets, briefly (build-fuzz/)"
rm -f build-fuzz/meson-logs/testlog.json  # never count an earlier run's
if tests/fuzz/configure.sh build-fuzz; then
  meson test -C build-fuzz --suite fuzz --no-rebuild --print-errorlogs || status=1
else
  status=1
fi
# --- end of fuzz targets ------------------------------------------------------------------

# --- every tier in build/, with the Python client beside it ------------------------------
# The Python client's suite (python/tests, pytest: every test against both transports) runs
# where a real guest boots: here on hardware KVM, else in one boot of the test host.
# In the test host it runs beside meson's tests: each test-host boot is a machine of its own
# that keeps one core busy, and meson runs two at a time, so run after them it left the
# second core idle for its ~9 minutes (and the hostile groups, which run alone, left it idle
# too). Its output waits in a file until meson's tests are done, so that the two never mix.
# Run directly (hardware KVM) it comes after them: the hostile groups count every agentvm
# process and cgroup on the host as theirs.
# Its tests marked no_guest (typing, packaging, signatures: ~150 s under emulation) run here on
# the host first, in seconds; the rest where a guest boots.
python_tier() {
  local status=0
  /usr/bin/python3 -m pytest python/tests -q -m no_guest -p no:cacheprovider \
    --junitxml=build/python-host-tests.xml || status=1
  AGENTVM_TESTHOST_QUIET=1 python/tests/run.sh -m 'not no_guest' -p no:cacheprovider \
    --junitxml=build/python-tests.xml || status=1
  return "$status"
}
# The E2B tier (tests/e2b/run.sh: one boot, its own serve) runs where the Python client's does,
# after it: in the test host the same second core, which a third boot at once would only share.
# Its TAP (build/e2b-tests.tap) is counted below; its exit status too, for a failure the TAP
# cannot show (serve not stopping clean, a file that never ran).
e2b_tier() {
  local status=0
  AGENTVM_TESTHOST_QUIET=1 tests/e2b/run.sh || status=$?
  echo "$status" >build/e2b-tests.status
  return "$status"
}
# The fleet tier (tests/fleet/run.sh: one boot; Slurm, HAProxy and three serves in network
# namespaces) comes after them on the same core. Its TAP (build/fleet-tests.tap) is counted
# below, its exit status too.
fleet_tier() {
  local status=0
  AGENTVM_TESTHOST_QUIET=1 tests/fleet/run.sh || status=$?
  echo "$status" >build/fleet-tests.status
  return "$status"
}
client_tiers() {
  local status=0 t0=$SECONDS
  python_tier || status=1
  say "the Python client's tests took $((SECONDS - t0))s; the E2B tier (tests/e2b/run.sh):"
  t0=$SECONDS
  e2b_tier || status=1
  say "the E2B tier took $((SECONDS - t0))s; the fleet tier (tests/fleet/run.sh):"
  t0=$SECONDS
  fleet_tier || status=1
  say "the fleet tier took $((SECONDS - t0))s"
  return "$status"
}
# never count or show an earlier run's
rm -f build/python-host-tests.xml build/python-tests.xml build/python-tests.log build/e2b-tests.tap build/e2b-tests.status \
  build/fleet-tests.tap build/fleet-tests.status
beside=0
[[ $(tests/testhost/run --where) == testhost ]] && beside=1
say "every tier (build/)$( ((beside)) && echo ", and the Python client's and the E2B tier beside it")"
if build_for_tests build; then
  if ((beside)); then
    client_tiers >build/client-tests.log 2>&1 </dev/null &
    clients_pid=$!
    trap 'kill "$clients_pid" 2>/dev/null' EXIT
  fi
  meson test -C build --print-errorlogs || status=1
  if ((beside)); then
    say "meson's tests done; the Python client's and the E2B tier's:"
    wait "$clients_pid" || status=1
    trap - EXIT
    cat build/client-tests.log
  else
    client_tiers || status=1
  fi
else
  status=1
fi

# --- the Debian package (tests/package/package_check.sh) ------------------------------------
# Last and alone: it builds the project once more (dpkg-buildpackage) and, for a minute or two,
# installs agentvm on this machine, where no other tier may see it (the Python client looks for
# agentvm in PATH before the checkout's build/). Its TAP is counted below, its status too.
rm -f build/package-tests.tap build/package-tests.status
say "the Debian package: build, lintian, install, use, purge (tests/package/package_check.sh)"
t0=$SECONDS
package_status=0
tests/package/package_check.sh build/package-tests.tap || package_status=$?
echo "$package_status" >build/package-tests.status
((package_status)) && status=1
say "the Debian package's check took $((SECONDS - t0))s"

python3 - build-asan/meson-logs/testlog.json build-fuzz/meson-logs/testlog.json build/meson-logs/testlog.json \
  build/python-host-tests.xml build/python-tests.xml build/e2b-tests.tap build/fleet-tests.tap \
  build/package-tests.tap <<'PY'
import json, re, sys
import xml.etree.ElementTree as ElementTree
passed = failed = skipped = 0
for path in sys.argv[1:]:
    try:
        text = open(path).read()
    except FileNotFoundError:
        failed += 1
        print(f"tests: {path} missing: those tests never ran", file=sys.stderr)
        continue
    if path.endswith(".tap"):
        # node --test's TAP (and the fleet tier's) ends with its counts ("# pass N", "# fail N",
        # ...) over every test of every file; a cancelled test (its file died, a hook failed) did not pass. A tier
        # that failed without a failed test (serve left something behind) counts one more.
        counts = dict(re.findall(r"(?m)^# (pass|fail|cancelled|skipped|todo) (\d+)$", text))
        if "pass" not in counts or "fail" not in counts:
            failed += 1
            print(f"tests: {path} has no closing counts: the tier stopped early", file=sys.stderr)
            continue
        passed += int(counts["pass"])
        failed += int(counts["fail"]) + int(counts.get("cancelled", 0))
        skipped += int(counts.get("skipped", 0)) + int(counts.get("todo", 0))
        try:
            tier_status = open(path.removesuffix(".tap") + ".status").read().strip()
        except FileNotFoundError:
            tier_status = "missing"
        if tier_status != "0" and int(counts["fail"]) + int(counts.get("cancelled", 0)) == 0:
            failed += 1
            print(f"tests: {path}: the tier exited {tier_status} with no failed test", file=sys.stderr)
        continue
    if path.endswith(".xml"):
        # pytest's JUnit XML: a testcase with <failure> or <error> failed, with <skipped> skipped.
        for case in ElementTree.fromstring(text).iter("testcase"):
            kinds = {child.tag for child in case}
            if kinds & {"failure", "error"}:
                failed += 1
            elif "skipped" in kinds:
                skipped += 1
            else:
                passed += 1
        continue
    for line in text.splitlines():
        test = json.loads(line)
        result = test["result"]
        # A TAP test (the vm and hostile tiers) counts each of its results; one that failed
        # without a failed result (a crash, a timeout) counts one failure more.
        tap = test.get("stdout") or ""
        if re.search(r"(?m)^1\.\.\d+$", tap):
            oks = len(re.findall(r"(?m)^ok \d+", tap))
            not_oks = len(re.findall(r"(?m)^not ok \d+", tap))
            passed += oks
            failed += not_oks + (1 if result not in ("OK", "EXPECTEDFAIL") and not_oks == 0 else 0)
            continue
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
