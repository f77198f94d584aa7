#!/usr/bin/env bash
# Install everything the lab needs on a fresh Debian 12 / Ubuntu 22.04+ machine. Idempotent.
#   sudo ./setup.sh            # apt packages, .venv with Python deps, compiled helpers, VM kernel
#   LAB_SETUP_SKIP_VM=1 ...    # skip fetching the full-kernel VM image
#   sudo ./setup.sh --arch arm64   # also a board's own binaries (lab arch fetch arm64; repeatable)
#   sudo ./setup.sh --with boringtun   # also build boringtun-cli (Rust, cargo: ~3 min the first
#                                      # time on 2 CPUs, seconds after: cached in /var/cache/lab)
#   sudo ./setup.sh --with rosenpass   # also build rosenpass (Rust + liboqs, cargo: ~4.5 min the
#                                      # first time on 2 CPUs, seconds after; repeatable --with)
set -euo pipefail
arches=()
withs=()
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arches+=("${2:?--arch needs arm64 or armhf}"); shift 2 ;;
    --with)
      case "${2:-}" in
        boringtun|rosenpass) withs+=("$2"); shift 2 ;;
        *) echo "setup.sh: --with ${2:-(nothing)}: accepted: boringtun, rosenpass" >&2; exit 2 ;;
      esac ;;
    *) echo "setup.sh: unknown argument $1 (accepted: --arch arm64|armhf, --with boringtun|rosenpass)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")"
here=$(pwd)

if [ "$(id -u)" -ne 0 ]; then
  echo "setup.sh: run as root (sudo ./setup.sh): it installs packages" >&2
  exit 1
fi

log() { printf '\n== %s\n' "$*"; }

# What this machine needs to host the lab (not run on its nodes): nothing here is a tool the
# lab, a VPN driver or a measurement declares. Those come from packages.txt, generated from the
# declarations (lab/substrate/tools.py says why a file: the virtualenv does not exist yet, and
# python3 is one of the packages); tests/test_vpn_conformance.py checks both lists.
APT_PACKAGES=(
  # processes, capture, kernel modules
  procps psmisc tcpdump kmod
  # sockperf: no test runs it (docs/measurements.md says why rr has its own tools/rr/rr.py);
  # installed for comparisons by hand, as before
  sockperf
  # an emulated board whose login user gets root with sudo (lab boards emulate --sudo)
  sudo
  # strongSwan's systemd front end
  charon-systemd
  # python, build tools for the compiled helpers
  python3-venv python3-dev build-essential pkg-config curl ca-certificates
  # tools/libipsec/build.sh: strongSwan's source (tar.bz2) and the lab's patch to it
  bzip2 patch
  # full-kernel VM substrate
  qemu-system-x86 busybox-static cpio
  # bench/kernel_crypto.py: the board kernel's crypto code counted under qemu-system-arm/-aarch64
  qemu-system-arm
  # bench/kernel_dataplane.py: UnixBench's syscall and pipe loops assembled for the ARM guest
  binutils-arm-linux-gnueabihf
  # bench/kernel_ipc.py: the board kernel's crypto loops on LLVM's Cortex-A72 model (llvm-mca)
  llvm-14
  # nodes of another architecture (arch="arm64"): the board's binaries under qemu-user, called
  # explicitly (no binfmt_misc needed)
  qemu-user-static
  # `vagrant validate` of the Vagrantfile in the tests (no provider needed)
  vagrant
  # tests/test_slurm.py: the Slurm recipe of docs/scale.md on a one-node cluster the test
  # starts itself (the packages' services are not started or enabled by the lab)
  slurm-wlm munge
)
# the declared packages: the first word of each line of packages.txt that is not a comment
while read -r pkg _; do
  case "$pkg" in ''|'#'*) ;; *) APT_PACKAGES+=("$pkg") ;; esac
done < packages.txt

log "apt packages"
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "all present"
fi
log "Python virtualenv (.venv)"
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
ln -sf "$here/.venv/bin/lab" /usr/local/bin/lab

log "TCP congestion control for nodes"
# A Pi 4 (and most boards) run cubic; a node's network namespace may default to an algorithm
# only if the machine-wide allowed list has it (the kernel's rule for namespaces). Add cubic to
# that list, keeping what is there; this machine's own default stays as it is.
allowed=/proc/sys/net/ipv4/tcp_allowed_congestion_control
if [ -w "$allowed" ] && ! grep -qw cubic "$allowed"; then
  if grep -qw cubic /proc/sys/net/ipv4/tcp_available_congestion_control || modprobe tcp_cubic 2>/dev/null; then
    echo "$(cat "$allowed") cubic" > "$allowed" && echo "allowed: $(cat "$allowed")"
  fi
else
  echo "allowed: $(cat "$allowed" 2>/dev/null)"
fi

log "compiled helpers"
if [ -f engine/Cargo.toml ]; then
  if ! command -v cargo >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/cargo" ]; then
    curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
  fi
  export PATH="$HOME/.cargo/bin:$PATH"
  cargo build --release --quiet --manifest-path engine/Cargo.toml
fi
for d in tools/*/; do
  [ -f "$d/Makefile" ] && make -s -C "$d"
done
if [ -d tools/gobench ] && command -v go >/dev/null 2>&1; then
  (cd tools/gobench && go build -o gobench . )
fi

log "strongSwan libipsec with the board's queue limits (tools/libipsec)"
# charon's userspace ESP dropping at the board kernel's queues instead of queueing without a
# limit (lab/vpn/libipsec.py). It says so and goes on when the source cannot be downloaded or
# the installed strongSwan is another version: the lab then runs Debian's and records that.
tools/libipsec/build.sh

# Optional tools built from source, not in Debian: opt-in so a default set-up stays short.
# Installed under ${LAB_CACHE:-/var/cache/lab} (outside the clone: a fresh clone reuses them);
# `cargo install` with the version pinned does nothing when that version is already there.
ensure_cargo() {
  if ! command -v cargo >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/cargo" ]; then
    curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
  fi
  export PATH="$HOME/.cargo/bin:$PATH"
}
for w in "${withs[@]}"; do
  case "$w" in
    boringtun)
      # lab/vpn/drivers/wireguard.py (implementation = "boringtun") looks here
      BORINGTUN_VERSION=0.7.1
      root="${LAB_CACHE:-/var/cache/lab}/boringtun"
      log "boringtun-cli $BORINGTUN_VERSION (cargo, into $root)"
      ensure_cargo
      cargo install --locked --quiet boringtun-cli --version "=$BORINGTUN_VERSION" --root "$root"
      "$root/bin/boringtun-cli" --version
      ;;
    rosenpass)
      # lab/vpn/drivers/rosenpass.py looks here; its BUILD_PACKAGES are what the build needs
      # (liboqs through cmake and libclang, libsodium): read from the driver, not listed here
      ROSENPASS_VERSION=0.2.3
      root="${LAB_CACHE:-/var/cache/lab}/rosenpass"
      log "rosenpass $ROSENPASS_VERSION (cargo, into $root)"
      read -r -a build_pkgs <<< "$(.venv/bin/python -c \
        'from lab.vpn.drivers.rosenpass import BUILD_PACKAGES as p; print(*p)')"
      missing=()
      for p in "${build_pkgs[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
      done
      if [ ${#missing[@]} -gt 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
      fi
      ensure_cargo
      cargo install --locked --quiet rosenpass --version "=$ROSENPASS_VERSION" --root "$root"
      "$root/bin/rosenpass" --version
      ;;
  esac
done

if [ -z "${LAB_SETUP_SKIP_VM:-}" ] && [ -x scripts/fetch-kernel.sh ]; then
  log "full-kernel VM image"
  scripts/fetch-kernel.sh
fi

for a in "${arches[@]}"; do
  log "$a root (a board's own binaries)"
  .venv/bin/lab arch fetch "$a"
done

log "done: try  sudo lab up topologies/pi_pair_middlebox.py"
