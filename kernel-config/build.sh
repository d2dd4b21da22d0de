#!/usr/bin/env bash
# Builds the guest kernel: Debian's linux-source-6.1 configured as tinyconfig + agentvm.config,
# as an uncompressed vmlinux ELF (PVH note and 64-bit entry). See kernel-config/README.md.
#
#   kernel-config/build.sh OUT_PATH
#
# OUT_PATH becomes a symlink into the cache, so a rebuild with unchanged inputs costs nothing.
set -euo pipefail

readonly SRC_PACKAGE=linux-source-6.1
readonly SRC_TARBALL=/usr/src/linux-source-6.1.tar.xz
# Fixed build identity, so two builds from the same inputs give the same vmlinux.
readonly BUILD_ENV=(
    KBUILD_BUILD_TIMESTAMP="@${SOURCE_DATE_EPOCH:-1700000000}"
    KBUILD_BUILD_USER=agentvm
    KBUILD_BUILD_HOST=agentvm
    KBUILD_BUILD_VERSION=1
)
# Old kernels are pruned down to this many, so switching branches rarely rebuilds.
readonly KEEP_KERNELS=3

start_us=${EPOCHREALTIME/./}

progress() {
    local now_us=${EPOCHREALTIME/./}
    local tenths=$(( (now_us - start_us) / 100000 ))
    printf 'kernel: [%d.%ds] %s\n' $(( tenths / 10 )) $(( tenths % 10 )) "$*" >&2
}

die() {
    printf 'kernel: error: %s\n' "$*" >&2
    exit 1
}

usage() {
    printf 'usage: %s OUT_PATH\n' "$0" >&2
    exit 2
}

[[ $# -eq 1 ]] || usage
out_path=$1

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
fragment=$script_dir/agentvm.config
[[ -f $fragment ]] || die "config fragment not found: $fragment"

src_version=$(dpkg-query -W -f='${Status} ${Version}' "$SRC_PACKAGE" 2>/dev/null || true)
[[ $src_version == "install ok installed "* ]] ||
    die "$SRC_PACKAGE is not installed: apt-get install $SRC_PACKAGE"
src_version=${src_version##* }
[[ -f $SRC_TARBALL ]] || die "$SRC_TARBALL missing although $SRC_PACKAGE is installed: apt-get install --reinstall $SRC_PACKAGE"

hash_of() { sha256sum | cut -c1-16; }

key=$( { cat "$fragment" "${BASH_SOURCE[0]}"; printf '%s\n' "$src_version"; } | hash_of)
cache_root=${AGENTVM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agentvm}/kernel
out_dir=$cache_root/$key
vmlinux=$out_dir/vmlinux

# Replaces $2 with a symlink to $1 in one rename, so readers never see a missing OUT_PATH.
install_link() {
    local target=$1 link=$2
    mkdir -p "$(dirname "$link")"
    ln -sfn "$target" "$link.tmp.$$"
    mv -fT "$link.tmp.$$" "$link"
}

if [[ -f $vmlinux ]]; then
    install_link "$vmlinux" "$out_path"
    exit 0
fi

for tool in make gcc flex bison bc perl strip readelf; do
    command -v "$tool" >/dev/null ||
        die "$tool not found: apt-get install build-essential flex bison bc libelf-dev libssl-dev"
done
[[ -f /usr/include/gelf.h ]] || die "libelf headers not found (objtool needs them): apt-get install libelf-dev"

mkdir -p "$cache_root/work"
# Two builds (say, from two build directories) must not share the kernel tree at once.
exec {lock_fd}>"$cache_root/.lock"
flock "$lock_fd"
if [[ -f $vmlinux ]]; then
    progress "built meanwhile by another process"
    install_link "$vmlinux" "$out_path"
    exit 0
fi

# The source tree stays pristine; all objects go to one build tree per source version. It is
# reused across configs: kbuild rebuilds only what a config change touches.
src_dir=$cache_root/work/src-$src_version
build_dir=$cache_root/work/build-$src_version
# Anything temporary left here was left by a build that died: we hold the lock.
rm -rf "$cache_root"/work/*.tmp.* "$cache_root"/*/vmlinux.tmp.*

if [[ ! -f $src_dir/.agentvm-unpacked ]]; then
    progress "unpacking $SRC_TARBALL ($SRC_PACKAGE $src_version)"
    rm -rf "$src_dir" "$src_dir.tmp.$$"
    mkdir -p "$src_dir.tmp.$$"
    tar -xf "$SRC_TARBALL" -C "$src_dir.tmp.$$" --strip-components=1
    touch "$src_dir.tmp.$$/.agentvm-unpacked"
    mv -T "$src_dir.tmp.$$" "$src_dir"
    # Trees and objects of other source versions are dead weight now.
    find "$cache_root/work" -mindepth 1 -maxdepth 1 \( -name 'src-*' -o -name 'build-*' \) \
        ! -name "src-$src_version" ! -name "build-$src_version" -exec rm -rf {} +
else
    progress "reusing unpacked source $src_dir"
fi

mkdir -p "$out_dir" "$build_dir"
log=$out_dir/build.log
: >"$log"

kmake() {
    env "${BUILD_ENV[@]}" make -C "$src_dir" O="$build_dir" ARCH=x86_64 "$@" >>"$log" 2>&1
}

fail() {
    tail -n 40 "$log" >&2
    die "$* (full log: $log)"
}

# Turns the fragment into scripts/config arguments. Only the forms Kconfig itself writes
# are accepted, so a typo fails here instead of being ignored.
config_args() {
    local line n=0
    while IFS= read -r line || [[ -n $line ]]; do
        n=$(( n + 1 ))
        if [[ $line =~ ^CONFIG_([A-Za-z0-9_]+)=(.*)$ ]]; then
            local name=${BASH_REMATCH[1]} value=${BASH_REMATCH[2]}
            case $value in
                y) printf '%s\n' --enable "$name" ;;
                m) die "$fragment:$n: =m, but this kernel has no modules" ;;
                \"*\") value=${value#\"}; printf '%s\n' --set-str "$name" "${value%\"}" ;;
                *) printf '%s\n' --set-val "$name" "$value" ;;
            esac
        elif [[ $line =~ ^#\ CONFIG_([A-Za-z0-9_]+)\ is\ not\ set$ ]]; then
            printf '%s\n' --disable "${BASH_REMATCH[1]}"
        elif [[ $line =~ ^[[:space:]]*(#.*)?$ ]]; then
            continue
        else
            die "$fragment:$n: cannot parse: $line"
        fi
    done <"$fragment"
}

# Lists every fragment line that does not hold in the final .config.
config_mismatches() {
    local config=$1 line
    while IFS= read -r line || [[ -n $line ]]; do
        if [[ $line =~ ^CONFIG_[A-Za-z0-9_]+= ]]; then
            grep -qxF -- "$line" "$config" || printf '  want %s, got %s\n' "$line" \
                "$(grep -E "^(# )?${line%%=*}[= ]" "$config" || echo 'nothing (dependency missing?)')"
        elif [[ $line =~ ^#\ (CONFIG_[A-Za-z0-9_]+)\ is\ not\ set$ ]]; then
            local name=${BASH_REMATCH[1]}
            ! grep -qE "^$name=" "$config" || printf '  want %s off, got %s\n' "$name" \
                "$(grep -E "^$name=" "$config")"
        fi
    done <"$fragment"
}

progress "configuring: tinyconfig + $fragment"
mapfile -t args < <(config_args)
kmake tinyconfig || fail "make tinyconfig failed"
# Twice: options under a menu this pass makes visible only stick on the second pass.
for _ in 1 2; do
    "$src_dir/scripts/config" --file "$build_dir/.config" "${args[@]}"
    kmake olddefconfig || fail "make olddefconfig failed"
done
mismatches=$(config_mismatches "$build_dir/.config")
[[ -z $mismatches ]] || die "$(printf 'agentvm.config options did not survive Kconfig:\n%s' "$mismatches")"

progress "make -j$(nproc) vmlinux (log: $log)"
kmake -j"$(nproc)" vmlinux || fail "make vmlinux failed"
progress "compiled"

# The build must not have changed the configuration behind our back (syncconfig can).
mismatches=$(config_mismatches "$build_dir/.config")
[[ -z $mismatches ]] || die "$(printf 'agentvm.config options lost during the build:\n%s' "$mismatches")"

tmp=$vmlinux.tmp.$$
trap 'rm -f "$tmp"' EXIT
strip --strip-debug -o "$tmp" "$build_dir/vmlinux"
readelf -h "$tmp" | grep -q 'Machine:.*X86-64' || die "vmlinux is not an x86-64 ELF"
# XEN_ELFNOTE_PHYS32_ENTRY (type 18): the PVH entry point the VMM can jump to in 32-bit mode.
readelf -n "$tmp" | grep -Eq 'Xen.*(0x00000012|PHYS32_ENTRY)' || die "vmlinux has no PVH entry note"
cp "$build_dir/.config" "$out_dir/config"
mv -f "$tmp" "$vmlinux"
trap - EXIT
install_link "$vmlinux" "$out_path"

# Keeps the $KEEP_KERNELS most recently built kernels. Cache paths are ours: no odd names.
# shellcheck disable=SC2012
ls -1dt "$cache_root"/*/vmlinux 2>/dev/null | tail -n +$(( KEEP_KERNELS + 1 )) | while read -r old; do
    progress "pruning ${old%/vmlinux}"
    rm -rf -- "${old%/vmlinux}"
done
progress "vmlinux $vmlinux: $(( $(stat -c %s "$vmlinux") / 1048576 )) MiB"
