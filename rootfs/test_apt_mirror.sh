#!/usr/bin/env bash
# Tests rootfs/apt_mirror.sh on the apt configurations in rootfs/testdata/apt/: each CASE/apt/ is
# an apt etc directory, CASE/expected the one line the script must print ("URI SUITE FILE", FILE
# relative to CASE/apt/), or "error FILE..." when it must fail, naming each FILE on stderr. One
# more case, an apt directory with no sources at all, is made here (git keeps no empty dirs).
# Exits non-zero when any case fails. APT_MIRROR_SCRIPT runs another parser on the same cases.
#
#   bash rootfs/test_apt_mirror.sh
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
script=${APT_MIRROR_SCRIPT:-$here/apt_mirror.sh}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

passed=0 failed=0

fail() {
    printf 'FAIL %s: %s\n' "$1" "$2"
    printf '  stdout: %s\n' "$(cat "$tmp/out")"
    printf '  stderr: %s\n' "$(cat "$tmp/err")"
    failed=$((failed + 1))
}

# check NAME APT_DIR EXPECTED_LINE [TEXT_STDERR_MUST_HOLD]
check() {
    local name=$1 apt=$2 expected=$3 must_say=${4:-} status=0 file
    bash "$script" "$apt" >"$tmp/out" 2>"$tmp/err" || status=$?
    if [[ $expected == error* ]]; then
        if ((status != 1)); then
            fail "$name" "exit status $status, want 1"
            return
        fi
        if [[ -s $tmp/out ]]; then
            fail "$name" "printed something on stdout despite failing"
            return
        fi
        for file in ${expected#error}; do
            if ! grep -qF -- "$apt/$file" "$tmp/err"; then
                fail "$name" "the error message does not name $apt/$file"
                return
            fi
        done
        if [[ -n $must_say ]] && ! grep -qF -- "$must_say" "$tmp/err"; then
            fail "$name" "the error message does not say: $must_say"
            return
        fi
    else
        local uri suite rel
        read -r uri suite rel <<<"$expected"
        if ((status != 0)); then
            fail "$name" "exit status $status, want 0"
            return
        fi
        if [[ $(cat "$tmp/out") != "$uri $suite $apt/$rel" ]]; then
            fail "$name" "want: $uri $suite $apt/$rel"
            return
        fi
    fi
    printf 'ok   %s\n' "$name"
    passed=$((passed + 1))
}

for dir in "$here"/testdata/apt/*/; do
    dir=${dir%/}
    name=${dir##*/}
    if [[ ! -f $dir/expected || ! -d $dir/apt ]]; then
        printf 'FAIL %s: needs %s/expected and %s/apt/\n' "$name" "$dir" "$dir"
        failed=$((failed + 1))
        continue
    fi
    check "$name" "$dir/apt" "$(<"$dir/expected")"
done

mkdir -p "$tmp/empty/apt/sources.list.d"
check empty "$tmp/empty/apt" error 'no apt sources found'

# A vanished fixture directory must not pass as zero failures.
if ((passed + failed < 10)); then
    printf 'FAIL: only %d cases ran, want at least 10\n' $((passed + failed))
    failed=$((failed + 1))
fi

printf '%d passed, %d failed\n' "$passed" "$failed"
((failed == 0))
