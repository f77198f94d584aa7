#!/bin/sh
# Fetch a stock Debian kernel and a static busybox into the lab's cache, for the full-kernel VM
# (lab/substrate/vm). Nothing is installed on the host: the .debs are only unpacked (dpkg-deb -x) and the
# module index is built with `depmod -b` inside the cache.
#
#   ${LAB_CACHE:-/var/cache/lab}/kernel/
#     <kver>/boot/vmlinuz-<kver>, <kver>/lib/modules/<kver>/...   the unpacked linux-image
#     current -> <kver>                                            what lab/substrate/vm boots
#     busybox                                                      static busybox (initramfs)
#
# Idempotent: when `current` is complete and busybox is present, it does nothing.
# LAB_KERNEL_PKG=linux-image-<ver>-amd64 pins a package; by default the newest 6.12 flavour
# "amd64" (not -cloud, not -rt, not the meta package) that apt-cache knows is used.
set -eu

CACHE="${LAB_CACHE:-/var/cache/lab}/kernel"
log() { printf 'fetch-kernel: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

for tool in apt-get apt-cache dpkg-deb depmod; do
    command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] || [ -x "/sbin/$tool" ] ||
        die "'$tool' not found (Debian/Ubuntu host with apt and kmod needed)"
done
PATH="$PATH:/usr/sbin:/sbin"

complete() {  # $1 = unpacked kernel root; true when it holds a kernel and a module index
    kver=$(basename "$1")
    [ -f "$1/boot/vmlinuz-$kver" ] && [ -s "$1/lib/modules/$kver/modules.dep.bin" ]
}

mkdir -p "$CACHE"
WORK=$(mktemp -d "$CACHE/.fetch.XXXXXX")
chmod 0755 "$WORK"  # apt-get download runs as _apt and must write here
trap 'rm -rf "$WORK"' EXIT INT TERM

# --- kernel -------------------------------------------------------------------------------
if [ -L "$CACHE/current" ] && complete "$CACHE/$(readlink "$CACHE/current")" \
    && [ -z "${LAB_KERNEL_PKG:-}" ]; then
    log "kernel present: $CACHE/$(readlink "$CACHE/current")"
else
    pkg="${LAB_KERNEL_PKG:-}"
    if [ -z "$pkg" ]; then
        pkg=$(apt-cache search --names-only '^linux-image-6\.12\.[0-9]+[^ ]*-amd64$' \
              | awk '{print $1}' | grep -Ev -- '-(cloud|rt)-amd64$' | sort -V | tail -n 1)
        [ -n "$pkg" ] || die "apt-cache knows no linux-image-6.12.*-amd64 (run apt-get update?)"
    fi
    kver=${pkg#linux-image-}
    dest="$CACHE/$kver"
    if complete "$dest"; then
        log "kernel present: $dest"
    else
        log "downloading $pkg"
        (cd "$WORK" && apt-get download "$pkg" >&2) || die "apt-get download $pkg failed"
        deb=$(ls "$WORK"/*.deb)
        mkdir "$WORK/root"
        dpkg-deb -x "$deb" "$WORK/root"
        # Debian 12 ships modules in /lib/modules; later releases in /usr/lib/modules.
        if [ ! -d "$WORK/root/lib/modules/$kver" ] && [ -d "$WORK/root/usr/lib/modules/$kver" ]; then
            mkdir -p "$WORK/root/lib/modules"
            mv "$WORK/root/usr/lib/modules/$kver" "$WORK/root/lib/modules/$kver"
        fi
        if [ ! -f "$WORK/root/boot/vmlinuz-$kver" ]; then
            die "$deb holds no boot/vmlinuz-$kver"
        fi
        depmod -b "$WORK/root" "$kver"
        rm -rf "$dest"
        mv "$WORK/root" "$dest"
        log "unpacked $kver into $dest"
    fi
    ln -sfn "$kver" "$CACHE/current.new"
    mv -T "$CACHE/current.new" "$CACHE/current"
fi

# --- busybox (static; the initramfs has no libc) --------------------------------------------
if [ -x "$CACHE/busybox" ]; then
    log "busybox present: $CACHE/busybox"
else
    if [ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1; then
        cp /bin/busybox "$WORK/busybox"          # busybox-static is installed: use it
    else
        (cd "$WORK" && apt-get download busybox-static >&2) || die "apt-get download busybox-static failed"
        mkdir "$WORK/bb"
        dpkg-deb -x "$WORK"/busybox-static_*.deb "$WORK/bb"
        cp "$WORK/bb/bin/busybox" "$WORK/busybox"
    fi
    chmod 0755 "$WORK/busybox"
    mv "$WORK/busybox" "$CACHE/busybox"
    log "busybox ready: $CACHE/busybox"
fi
