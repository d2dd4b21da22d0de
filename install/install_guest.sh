#!/bin/sh
# meson install's step for the guest's kernel and root filesystem (install/meson.build):
#   install_guest.sh GUEST_DIR LIBDIR
# copies GUEST_DIR/vmlinux and GUEST_DIR/rootfs.ext4 into $DESTDIR/LIBDIR, following the
# symlinks set-up leaves into its cache, and keeping the image's holes (most of it is empty).
set -eu
guest_dir=$1
dest=${DESTDIR:-}$2
for file in vmlinux rootfs.ext4; do
  if [ ! -f "$guest_dir/$file" ]; then
    echo "install_guest.sh: $guest_dir/$file not found: ./setup.sh build makes the guest, or configure with" \
      "-Dguest_dir=DIR naming a directory that holds vmlinux and rootfs.ext4" >&2
    exit 1
  fi
done
mkdir -p "$dest"
cp -L --sparse=always "$guest_dir/vmlinux" "$dest/vmlinux"
cp -L --sparse=always "$guest_dir/rootfs.ext4" "$dest/rootfs.ext4"
chmod 0644 "$dest/vmlinux" "$dest/rootfs.ext4"
echo "install_guest.sh: installed the guest from $guest_dir into $dest"
