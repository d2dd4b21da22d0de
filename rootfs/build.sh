#!/usr/bin/env bash
# Builds the guest root filesystem: a minimal Debian 12 (bookworm) ext4 image with our init
# at /sbin/agentvm-init and the tool-call agent at /sbin/agentvm-agent. See rootfs/README.md
# for what is inside and how the cache works.
#
#   rootfs/build.sh INIT_BINARY AGENT_BINARY OUT_PATH
#
# OUT_PATH becomes a symlink into the cache, so a rebuild with unchanged inputs costs nothing.
# Needs root (debootstrap, and mkfs.ext4 -d must read root-owned files and device nodes).
set -euo pipefail

# The guest is bookworm whatever the host runs: the kernel is bookworm's linux-source-6.1 and
# the guest tools are built for it. Only the mirror comes from the host (see find_mirror).
readonly SUITE=bookworm
# minbase already brings bash, coreutils, util-linux, findutils, grep, sed, tar, gzip, dpkg, apt.
# curl, pip (python3-pip) and ca-certificates: what an agent's tool calls reach for first, and
# what reaches the outside through a sandbox's egress proxy (HTTP_PROXY) when its policy allows.
readonly PACKAGES=(python3 procps curl python3-pip ca-certificates)
# Where find_mirror reads the host's apt sources when AGENTVM_DEBIAN_MIRROR is not set.
readonly APT_ETC=${AGENTVM_APT_ETC:-/etc/apt}
# Guest writes land in the VMM's copy-on-write overlay, but ext4 still has to find free blocks.
# Unwritten blocks cost nothing: the image is sparse and the overlay stores only writes.
readonly HEADROOM_MIB=${AGENTVM_ROOTFS_HEADROOM_MIB:-512}
# Fixed identity and timestamps: two builds from the same inputs give the same image bytes
# as far as cheaply possible, and the guest sees a stable root UUID.
readonly FS_UUID=6a0e1f2c-7a6b-4d1e-9c3a-a9e47f00d0c1
readonly FS_HASH_SEED=3b2f8f0e-4c59-4b8e-8d1a-5f0c2e7d9b10
readonly EPOCH=${SOURCE_DATE_EPOCH:-1700000000}
# Old trees and images are pruned down to this many, so switching branches rarely rebuilds.
readonly KEEP_TREES=2
readonly KEEP_IMAGES=3

start_us=${EPOCHREALTIME/./}

progress() {
    local now_us=${EPOCHREALTIME/./}
    local tenths=$(( (now_us - start_us) / 100000 ))
    printf 'rootfs: [%d.%ds] %s\n' $(( tenths / 10 )) $(( tenths % 10 )) "$*" >&2
}

die() {
    printf 'rootfs: error: %s\n' "$*" >&2
    exit 1
}

usage() {
    printf 'usage: %s INIT_BINARY AGENT_BINARY OUT_PATH\n' "$0" >&2
    exit 2
}

[[ $# -eq 3 ]] || usage
script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
init_binary=$1
agent_binary=$2
out_path=$3

[[ $EUID -eq 0 ]] || die "must run as root: debootstrap and mkfs.ext4 -d need to read and create root-owned files"
command -v debootstrap >/dev/null || die "debootstrap not found: apt-get install debootstrap"
command -v mkfs.ext4 >/dev/null || die "mkfs.ext4 not found: apt-get install e2fsprogs"
[[ -f $init_binary ]] || die "init binary not found: $init_binary"
[[ -f $agent_binary ]] || die "agent binary not found: $agent_binary"

cache_root=${AGENTVM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agentvm}/rootfs
mkdir -p "$cache_root"
# Two builds (say, from two build directories) must not debootstrap into the same tree.
exec {lock_fd}>"$cache_root/.lock"
flock "$lock_fd"

# Anything temporary left here was left by a build that died: we hold the lock.
rm -rf "$cache_root"/*.tmp.* "$cache_root"/staging.*

hash_of() { sha256sum | cut -c1-16; }

tree_key=$( { cat "${BASH_SOURCE[0]}"; printf '%s\n' "$SUITE" "${PACKAGES[@]}"; } | hash_of)
guest_hash=$(cat "$init_binary" "$agent_binary" | hash_of)
tree_dir=$cache_root/tree-$tree_key
image=$cache_root/image-$tree_key-$guest_hash.ext4

# Replaces $2 with a symlink to $1 in one rename, so readers never see a missing OUT_PATH.
install_link() {
    local target=$1 link=$2
    mkdir -p "$(dirname "$link")"
    ln -sfn "$target" "$link.tmp.$$"
    mv -fT "$link.tmp.$$" "$link"
}

# Keeps the $2 most recently used entries matching glob $1.
prune() {
    local glob=$1 keep=$2
    # shellcheck disable=SC2086,SC2012 # the glob is meant to expand; names are our hex keys
    ls -1dt $glob 2>/dev/null | tail -n +$(( keep + 1 )) | while read -r old; do
        progress "pruning $old"
        rm -rf -- "$old"
    done
}

if [[ -f $image ]]; then
    # Marks it most recently used for prune(), unless it already is: a touch moves the image's
    # mtime and ctime, which the VMM's snapshot check and setup.sh's bake key both read, so a
    # needless one would cost a rehash at every restore and a bake at every setup.sh run.
    # shellcheck disable=SC2012 # cache names are our hex keys
    [[ $(ls -1t "$cache_root"/image-*.ext4 | head -n 1) == "$image" ]] || touch "$image"
    install_link "$image" "$out_path"
    progress "cached image $image"
    exit 0
fi

trim_tree() {
    local dir=$1
    rm -rf "$dir"/usr/share/{doc,man,info,lintian,linda,bug,bash-completion}
    find "$dir/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
    rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/* "$dir"/var/cache/debconf/*-old
    rm -rf "$dir"/var/log/* "$dir"/var/lib/dpkg/*-old
    # Host leftovers from debootstrap: the guest has no network and its own identity.
    rm -f "$dir"/etc/resolv.conf "$dir"/etc/machine-id
    # Keep trimmed paths trimmed if someone apt-gets inside a guest (with network later).
    cat >"$dir/etc/dpkg/dpkg.cfg.d/agentvm-nodoc" <<'EOF'
path-exclude /usr/share/doc/*
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
    cat >"$dir/etc/apt/apt.conf.d/agentvm-nocache" <<'EOF'
APT::Keep-Downloaded-Packages "false";
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
}

# The account E2B's base image has and its SDKs name by default ("user": commands and file
# calls with a user run as it): uid 1000, its own group 1000, home /home/user from /etc/skel,
# bash, password locked. Calls still run as root unless they name it (the agent's "user"
# field) or a template's image makes it the default (/etc/agentvm/user). Written as useradd
# would, without running the tree's useradd (no chroot needed, same bytes every build).
add_user_account() {
    local dir=$1 home=$1/home/user
    if ! grep -q '^user:' "$dir/etc/passwd"; then
        echo 'user:x:1000:1000::/home/user:/bin/bash' >>"$dir/etc/passwd"
        echo 'user:x:1000:' >>"$dir/etc/group"
        echo "user:!:$(( EPOCH / 86400 )):0:99999:7:::" >>"$dir/etc/shadow"
        echo 'user:!::' >>"$dir/etc/gshadow"
    fi
    mkdir -p "$home"
    [[ -d $dir/etc/skel ]] && cp -a "$dir/etc/skel/." "$home/"
    chown -R 1000:1000 "$home"
    chmod 0755 "$home"
}

configure_tree() {
    local dir=$1
    echo agentvm >"$dir/etc/hostname"
    cat >"$dir/etc/hosts" <<'EOF'
127.0.0.1	localhost
127.0.1.1	agentvm
::1		localhost ip6-localhost ip6-loopback
EOF
    # The init mounts everything itself; fstab only documents that for a curious guest user.
    cat >"$dir/etc/fstab" <<'EOF'
# agentvm: /sbin/agentvm-init mounts proc, sys, dev, dev/pts, dev/shm, tmp and run.
EOF
    mkdir -p "$dir"/{root,tmp,run,proc,sys,dev}
    chmod 0700 "$dir/root"
    chmod 1777 "$dir/tmp"
    add_user_account "$dir"
    # The kernel opens the console for init before init mounts devtmpfs; a static node in
    # the image covers kernels without DEVTMPFS_MOUNT.
    [[ -e $dir/dev/console ]] || mknod -m 0600 "$dir/dev/console" c 5 1
    [[ -e $dir/dev/null ]] || mknod -m 0666 "$dir/dev/null" c 1 3
}

# Sets mirror and mirror_from: AGENTVM_DEBIAN_MIRROR, else the first entry of the main Debian
# archive in this host's apt sources (rootfs/apt_mirror.sh), so a host behind a company mirror
# builds its guest from that mirror too. Only a tree that is not cached needs it.
find_mirror() {
    if [[ -n ${AGENTVM_DEBIAN_MIRROR:-} ]]; then
        mirror=$AGENTVM_DEBIAN_MIRROR
        mirror_from=AGENTVM_DEBIAN_MIRROR
        return
    fi
    local found host_suite
    found=$("$script_dir/apt_mirror.sh" "$APT_ETC") ||
        die "no Debian mirror in this host's apt sources (above); set AGENTVM_DEBIAN_MIRROR, e.g. AGENTVM_DEBIAN_MIRROR=http://deb.debian.org/debian"
    read -r mirror host_suite mirror_from <<<"$found"
    # The host may run another release (or name it stable): the guest stays $SUITE, taken from
    # the same mirror, which a full Debian mirror carries. debootstrap says so if it does not.
    if [[ $host_suite != "$SUITE" ]]; then
        progress "this host's apt uses suite $host_suite; the guest is $SUITE all the same, from the same mirror"
    fi
}

build_tree() {
    local tmp=$tree_dir.tmp.$$
    local log=$cache_root/debootstrap-$tree_key.log
    local include
    include=$(IFS=,; echo "${PACKAGES[*]}")
    local mirror mirror_from
    find_mirror
    rm -rf "$tmp"
    mkdir -p "$cache_root/debs"
    progress "debootstrap $SUITE (minbase + $include) from $mirror (from $mirror_from), log: $log"
    if ! debootstrap --variant=minbase --include="$include" --components=main \
            --cache-dir="$cache_root/debs" "$SUITE" "$tmp" "$mirror" >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        rm -rf "$tmp"
        die "debootstrap of $SUITE from $mirror (from $mirror_from) failed, full log: $log; another mirror: AGENTVM_DEBIAN_MIRROR=URI"
    fi
    progress "debootstrap done ($(du -sm "$tmp" | cut -f1) MiB)"
    trim_tree "$tmp"
    configure_tree "$tmp"
    find "$tmp" -newermt "@$EPOCH" -exec touch -h -d "@$EPOCH" {} +
    progress "trimmed tree: $(du -sm "$tmp" | cut -f1) MiB"
    mv -T "$tmp" "$tree_dir"
    # Its mtime, not its contents', tells prune() how recently it was used.
    touch "$tree_dir"
    prune "$cache_root/tree-*/" "$KEEP_TREES"
    prune "$cache_root/debootstrap-*.log" "$KEEP_TREES"
}

if [[ -d $tree_dir ]]; then
    progress "cached tree $tree_dir"
    touch "$tree_dir"
else
    build_tree
fi

# The staging tree hard-links the cached one: only files added here are new, and nothing
# below writes into an existing file, so the cache stays untouched.
staging=$cache_root/staging.$$
image_tmp=$image.tmp.$$
trap 'rm -rf "$staging" "$image_tmp"' EXIT
cp -al "$tree_dir" "$staging"
install -m 0755 "$init_binary" "$staging/sbin/agentvm-init"
install -m 0755 "$agent_binary" "$staging/sbin/agentvm-agent"
# Debug info is of no use in the guest (no debugger there); the build tree keeps it.
if command -v strip >/dev/null; then
    strip --strip-debug "$staging/sbin/agentvm-init" "$staging/sbin/agentvm-agent"
fi
# sbin/. rather than sbin: bookworm's /sbin is a symlink to usr/sbin.
touch -d "@$EPOCH" "$staging/sbin/agentvm-init" "$staging/sbin/agentvm-agent" "$staging/sbin/." "$staging"

# Size: the content's 4 KiB blocks, plus what ext4 needs for it (measured: ~10% of the
# content for a Debian tree, plus inode tables at ~2% of the whole), plus the headroom,
# rounded up to 4 MiB (a multiple of 4 KiB, as the VMM requires). Checked after mkfs.
content_mib=$(( $(du -s -B4096 "$staging" | cut -f1) * 4096 / 1048576 ))
size_mib=$(( (content_mib * 112 / 100 + HEADROOM_MIB * 102 / 100 + 16 + 3) / 4 * 4 ))

make_image() {
    # Created beforehand, or mkfs.ext4 announces that it creates it despite -q.
    : >"$image_tmp"
    # No journal: every guest write goes to a throwaway overlay, so there is nothing to
    # recover after a crash and a journal would only double the writes. -m 0: everything in
    # the guest runs as root, reserved blocks would just hide headroom. lazy_itable_init=0:
    # zero the inode tables here, or the guest's ext4lazyinit thread does it at every boot,
    # writing megabytes into the overlay.
    E2FSPROGS_FAKE_TIME=$EPOCH mkfs.ext4 -q -F -d "$staging" -L root -U "$FS_UUID" \
        -E "hash_seed=$FS_HASH_SEED,root_owner=0:0,lazy_itable_init=0" -O ^has_journal -m 0 -b 4096 \
        "$image_tmp" "${size_mib}M"
}

free_mib() {
    dumpe2fs -h "$1" 2>/dev/null | awk -F: '/^Free blocks/ { gsub(/ /, "", $2); print int($2 * 4096 / 1048576) }'
}

progress "mkfs.ext4 ${size_mib} MiB (content ${content_mib} MiB)"
make_image
free=$(free_mib "$image_tmp")
if (( free < HEADROOM_MIB )); then
    size_mib=$(( (size_mib + HEADROOM_MIB - free + 3) / 4 * 4 ))
    progress "only ${free} MiB free, retrying at ${size_mib} MiB"
    make_image
    free=$(free_mib "$image_tmp")
    (( free >= HEADROOM_MIB )) || die "image has ${free} MiB free, want ${HEADROOM_MIB}"
fi
mv -f "$image_tmp" "$image"
install_link "$image" "$out_path"
prune "$cache_root/image-*.ext4" "$KEEP_IMAGES"
progress "image $image: ${size_mib} MiB, ${free} MiB free"
