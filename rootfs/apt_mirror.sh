#!/usr/bin/env bash
# Finds the Debian mirror this host's apt already uses, so the guest's debootstrap goes through
# the same (say, company) mirror. rootfs/build.sh calls it; rootfs/test_apt_mirror.sh tests it.
#
#   rootfs/apt_mirror.sh [APT_ETC_DIR]      (default /etc/apt)
#
# Prints "URI SUITE FILE" (URI without a trailing slash, FILE the file the entry came from) for
# the first `deb` entry of the main Debian archive, in apt's own order: APT_ETC_DIR/sources.list,
# then APT_ETC_DIR/sources.list.d/*.list and *.sources sorted by name. Reads the one-line format
# (`deb [options] URI SUITE COMPONENT...`, `#` starts a comment) and deb822 (`Types:`, `URIs:`,
# `Suites:`, `Components:`, `Enabled:`). An entry counts when its type is deb (not deb-src), its
# URI is http, https or file (what debootstrap fetches from), its suite is a Debian release
# name (bookworm, trixie, stable, ...: so not bookworm-security, bookworm-updates, bookworm-backports
# or a third-party repository's own suite), its components include main, and it is not the
# security archive (security.debian.org, or a path ending in /debian-security).
# Exit status: 0 found, 1 none found (the files read are named on stderr), 2 usage.
# shellcheck disable=SC2094 # the files are only read; the output merely names them
set -euo pipefail
export LC_ALL=C   # apt sorts sources.list.d bytewise; so do the globs below

# Release names of the main archive. Anything else (a -security/-updates/-backports suite, a
# vendor's "nodistro" or "cloud-sdk-bookworm") is not the archive debootstrap wants.
readonly DEBIAN_SUITES=(jessie stretch buster bullseye bookworm trixie forky duke sid
                        oldoldstable oldstable stable testing unstable)

[[ $# -le 1 ]] || { echo "usage: $0 [APT_ETC_DIR]" >&2; exit 2; }
apt_etc=${1:-/etc/apt}
[[ $apt_etc == / ]] || apt_etc=${apt_etc%/}

# Succeeds when WORD is one of the remaining arguments.
one_of() {
    local word=$1 each
    shift
    for each in "$@"; do
        [[ $each == "$word" ]] && return 0
    done
    return 1
}

# Succeeds when the entry TYPE URI SUITE COMPONENT... is a deb entry of the main Debian archive.
is_main_archive() {
    local type=$1 uri=$2 suite=$3
    shift 3
    [[ $type == deb ]] || return 1
    [[ $uri =~ ^(https?|file):/ ]] || return 1
    one_of "$suite" "${DEBIAN_SUITES[@]}" || return 1
    one_of main "$@" || return 1
    local host=${uri#*://}
    host=${host%%/*}
    host=${host##*@}
    host=${host%%:*}
    [[ $host != security.debian.org && $host != *.security.debian.org ]] || return 1
    [[ ${uri%/} != */debian-security ]] || return 1
}

found() {
    printf '%s %s %s\n' "${1%/}" "$2" "$3"
    exit 0
}

# One-line format: deb [ options ] URI SUITE COMPONENT...
read_list() {
    local file=$1 line
    local -a words
    while IFS= read -r line || [[ -n $line ]]; do
        line=${line%%#*}
        # Options may hold blanks inside the brackets: "deb [ arch=amd64 signed-by=... ] URI".
        if [[ $line =~ ^([[:space:]]*[^[:space:]]+[[:space:]]+)\[[^]]*\](.*)$ ]]; then
            line="${BASH_REMATCH[1]} ${BASH_REMATCH[2]}"
        fi
        read -r -a words <<<"$line"
        ((${#words[@]} >= 4)) || continue
        if is_main_archive "${words[@]}"; then
            found "${words[1]}" "${words[2]}" "$file"
        fi
    done <"$file"
}

# deb822 format: stanzas separated by blank lines, "Field: value" with continuation lines
# starting with a blank, lines starting with "#" are comments, field names case-insensitive.
stanza_field='' stanza_types='' stanza_uris='' stanza_suites='' stanza_components='' stanza_enabled=''

check_stanza() {
    local file=$1 type uri suite
    local -a types uris suites components
    read -r -a types <<<"$stanza_types"
    read -r -a uris <<<"$stanza_uris"
    read -r -a suites <<<"$stanza_suites"
    read -r -a components <<<"$stanza_components"
    if [[ ${stanza_enabled,,} != no ]]; then
        for type in "${types[@]}"; do
            for uri in "${uris[@]}"; do
                for suite in "${suites[@]}"; do
                    if is_main_archive "$type" "$uri" "$suite" "${components[@]}"; then
                        found "$uri" "$suite" "$file"
                    fi
                done
            done
        done
    fi
    stanza_field='' stanza_types='' stanza_uris='' stanza_suites='' stanza_components='' stanza_enabled=''
}

add_to_field() {
    case ${stanza_field,,} in
        types) stanza_types+=" $1" ;;
        uris) stanza_uris+=" $1" ;;
        suites) stanza_suites+=" $1" ;;
        components) stanza_components+=" $1" ;;
        enabled) stanza_enabled+=${1//[[:space:]]/} ;;
    esac
}

read_sources() {
    local file=$1 line
    while IFS= read -r line || [[ -n $line ]]; do
        if [[ $line =~ ^[[:space:]]*$ ]]; then
            check_stanza "$file"
        elif [[ $line == '#'* ]]; then
            continue
        elif [[ $line =~ ^[[:space:]] ]]; then
            add_to_field "$line"
        elif [[ $line =~ ^([^:[:space:]]+):(.*)$ ]]; then
            stanza_field=${BASH_REMATCH[1]}
            add_to_field "${BASH_REMATCH[2]}"
        fi
    done <"$file"
    check_stanza "$file"
}

read_files=()
if [[ -f $apt_etc/sources.list ]]; then
    read_files+=("$apt_etc/sources.list")
    read_list "$apt_etc/sources.list"
fi
# apt skips names with other characters than these (editor backups, .dpkg-old and the like
# end differently anyway).
for file in "$apt_etc"/sources.list.d/*; do
    name=${file##*/}
    [[ -f $file && $name =~ ^[A-Za-z0-9_.-]+\.(list|sources)$ ]] || continue
    read_files+=("$file")
    case $name in
        *.list) read_list "$file" ;;
        *.sources) read_sources "$file" ;;
    esac
done

{
    if ((${#read_files[@]})); then
        echo "apt_mirror: no deb entry of the main Debian archive (a release suite such as bookworm, component main, http/https/file URI, not the security archive) in:"
        printf '  %s\n' "${read_files[@]}"
    else
        echo "apt_mirror: no apt sources found: neither $apt_etc/sources.list nor $apt_etc/sources.list.d/*.list or *.sources exists"
    fi
} >&2
exit 1
