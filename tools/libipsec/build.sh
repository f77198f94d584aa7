#!/usr/bin/env bash
# Build strongSwan's libipsec with the lab's queue limit (queue-limit.patch beside this file) and
# install it as the only file of ${LAB_CACHE:-/var/cache/lab}/libipsec/lib (not over Debian's
# /usr/lib/ipsec/libipsec.so.0). charon's kernel-libipsec plugin finds libipsec.so.0 through its
# RUNPATH /usr/lib/ipsec, which LD_LIBRARY_PATH precedes: lab/vpn/libipsec.py starts the lab's
# charons with LD_LIBRARY_PATH at that directory, libstrongswan and the rest stay Debian's.
#
# Only libipsec is built, from the upstream source of the installed strongSwan's version, so the
# library keeps the ABI of the installed libstrongswan (libipsec links to it by soname). Skipped,
# saying why, with exit 0, when the installed strongSwan is another version or the source cannot
# be downloaded: the lab then runs Debian's unbounded libipsec and records so.
# Idempotent: a build whose stamp names this patch's sha256 is kept.
#   sudo tools/libipsec/build.sh        (setup.sh runs it)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
VERSION=5.9.8
URL="http://deb.debian.org/debian/pool/main/s/strongswan/strongswan_${VERSION}.orig.tar.bz2"
SHA256=d3303a43c0bd7b75a12b64855e8edcb53696f06190364f26d1533bde1f2e453c
root="${LAB_CACHE:-/var/cache/lab}/libipsec"
patch_sha=$(sha256sum "$here/queue-limit.patch" | cut -d' ' -f1)

skip() { echo "libipsec: skipped: $*; the lab runs Debian's unbounded libipsec"; exit 0; }

installed=$(dpkg-query -W -f='${Version}' libstrongswan 2>/dev/null || true)
case "$installed" in
  "$VERSION"-*) ;;
  "") skip "libstrongswan is not installed" ;;
  *) skip "installed libstrongswan is $installed, the patch is for $VERSION" ;;
esac
if [ -f "$root/lib/libipsec.so.0" ] && grep -qs "\"patch_sha256\": \"$patch_sha\"" "$root/stamp.json" \
    && grep -qs "\"libstrongswan\": \"$installed\"" "$root/stamp.json"; then
  echo "libipsec: $root/lib/libipsec.so.0 is built from this patch against $installed"
  exit 0
fi

mkdir -p "$root"
tarball="$root/strongswan_${VERSION}.orig.tar.bz2"
if ! echo "$SHA256  $tarball" | sha256sum -c --quiet >/dev/null 2>&1; then
  rm -f "$tarball.part"
  curl -sSfL --retry 2 -o "$tarball.part" "$URL" || skip "download of $URL failed"
  echo "$SHA256  $tarball.part" | sha256sum -c --quiet \
    || { rm -f "$tarball.part"; skip "$URL has not the sha256 $SHA256"; }
  mv "$tarball.part" "$tarball"
fi

build=$(mktemp -d "$root/build.XXXXXX")
trap 'rm -rf "$build"' EXIT
tar xjf "$tarball" -C "$build"
src="$build/strongswan-$VERSION"
patch -s -d "$src" -p1 < "$here/queue-limit.patch"
# libipsec alone (and the libstrongswan it links to at build time, not installed): no plugins,
# no charon; the paths Debian's build uses, so the installed library's RUNPATH is Debian's too
(cd "$src" && ./configure -q --disable-defaults --enable-libipsec --prefix=/usr \
  --libdir=/usr/lib --with-ipseclibdir=/usr/lib/ipsec CFLAGS="-O2 -fstack-protector-strong" \
  > "$build/configure.log" 2>&1) || { tail -20 "$build/configure.log" >&2; exit 1; }
make -s -C "$src/src/libstrongswan" -j"$(nproc)" > "$build/make.log" 2>&1 \
  && make -s -C "$src/src/libipsec" -j"$(nproc)" >> "$build/make.log" 2>&1 \
  && make -s -C "$src/src/libipsec" install DESTDIR="$build/dest" >> "$build/make.log" 2>&1 \
  || { tail -30 "$build/make.log" >&2; exit 1; }

mkdir -p "$root/lib"
install -m 0644 "$build/dest/usr/lib/ipsec/libipsec.so.0.0.0" "$root/lib/libipsec.so.0.tmp"
mv "$root/lib/libipsec.so.0.tmp" "$root/lib/libipsec.so.0"
lib_sha=$(sha256sum "$root/lib/libipsec.so.0" | cut -d' ' -f1)
cat > "$root/stamp.json.tmp" <<EOF
{"strongswan": "$VERSION", "source_sha256": "$SHA256", "patch_sha256": "$patch_sha",
 "libstrongswan": "$installed", "library_sha256": "$lib_sha"}
EOF
mv "$root/stamp.json.tmp" "$root/stamp.json"
echo "libipsec: built $root/lib/libipsec.so.0 (strongSwan $VERSION + queue-limit.patch, against libstrongswan $installed)"
