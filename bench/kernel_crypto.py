#!/usr/bin/env python3
"""The board kernel's own crypto speed, per kernel data plane (ESP, MACsec, kernel WireGuard).

    sudo .venv/bin/python bench/kernel_crypto.py [--arch armhf arm64] [--sec 1] [--json FILE]

A Pi 4's kernel data planes encrypt with the kernel's crypto code (arch/arm{,64}/crypto), which
nothing on this x86 host runs. So that code is run here, as the board would run it, and counted:

1. fetch (once, into /var/cache/lab/kernel-crypto/ARCH; nothing is installed on the host): with
   a private apt configuration (its own sources, lists and cache, as lab.core.arch.fetch does),
   Debian 11's 5.10 kernel for the architecture (linux-image-5.10.0-N-armmp for armhf,
   -arm64 for arm64: the kernel version of study A's Raspberry Pi OS 2021), and Debian 12's
   busybox-static, openssl, libssl3 and libc6 for it; `depmod -b` indexes the modules;
2. an initramfs holding busybox, openssl and only the crypto modules Raspberry Pi OS's 5.10
   kernel ships (raspberrypi/firmware modules/5.10.63-v7l+ and -v8+: no ghash-arm-ce / ghash-ce,
   so GCM takes ghash-generic), loaded explicitly;
3. QEMU (qemu-system-arm -cpu cortex-a15: NEON, no AES/PMULL; qemu-system-aarch64 -cpu
   cortex-a72, whose crypto-extension modules are left out and OpenSSL masked with
   OPENSSL_armcap=0x1) under `-icount shift=0`: guest time advances 1 ns per executed
   instruction, so a "1 second" tcrypt test (`sec=1`) or `openssl speed -seconds 1` run counts
   the bytes processed per 10^9 instructions;
4. the instructions per byte become cycles per byte on the board through an IPC fitted on
   OpenSSL code counted the same way in the same VM, against published Pi 4 figures for that
   code (ANCHORS below); the spread of IPC across the anchors is printed with the result.

With --what-if, armhf boots once more with ghash-arm-ce loaded (the NEON GHASH Raspberry Pi OS
does not build) and prints the GCM figures it would give.

armhf also boots once with NEON off (`-cpu cortex-a15,neon=off`): the scalar code that 5.10
armv7l falls back to where kernel-mode NEON is not allowed (softirq: arch/arm/include/asm/simd.h
may_use_simd() is !in_interrupt() in 5.10), which is where ESP with rfc7539esp decrypts.

Prints instructions/byte per primitive and size, the fitted IPC per anchor, MB/s per primitive
at 1420-byte messages (interpolated between tcrypt's sizes), and the published cross-checks.
Takes about 5 minutes per word size on a quiet 2-core host (the two can run in parallel, one
`--arch` each; 16 minutes each when the host was loaded), plus ~20 s of downloads (~150 MB) the
first time; `--from-logs` re-reports from the guest logs kept under the cache without booting.
docs/cpu.md "The board kernel's crypto" has the results.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from lab.substrate.vm.initramfs import Entry, newc  # noqa: E402

CACHE = Path(os.environ.get("LAB_KERNEL_CRYPTO_CACHE", "/var/cache/lab/kernel-crypto"))
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
SUITES = (
    ("http://deb.debian.org/debian", "bullseye"),
    ("http://deb.debian.org/debian", "bullseye-updates"),
    ("http://deb.debian.org/debian", "bookworm"),
)  # the security suites are left out: this mirror serves neither of them whole for armhf
#: the guest's userland, with its dependency closure (Debian 12: the board's own roots are Debian 12,
#: lab.core.arch.fetch); cryptsetup for the published kernel figures measured with it
USERLAND = ("busybox-static/bookworm", "openssl/bookworm", "cryptsetup-bin/bookworm")
#: ESP packets are ~1400 bytes: every per-primitive figure is given at this size
MSG = 1420


@dataclass(frozen=True)
class Arch:
    name: str
    flavour: str  # Debian kernel flavour
    qemu: str
    machine: str
    cpu: str
    profile: str  # cpu_profiles/<profile>.toml
    clock_mhz: int
    triplet: str
    #: Raspberry Pi OS 5.10's crypto modules for this word size (raspberrypi/firmware
    #: modules/5.10.63-v7l+ and -v8+ kernel/arch/*/crypto and kernel/crypto), plus tcrypt
    modules: tuple[str, ...]
    env: str = ""  # environment for openssl in the guest


#: templates Raspberry Pi OS builds in and Debian builds as modules, loaded first: aes-neonbs's
#: tfm init instantiates cbc(aes) (its CBC encryption fallback) when the module registers
TEMPLATES = ("ecb", "cbc", "xts", "ctr", "cts")
COMMON = ("gcm", "ghash_generic", "chacha20poly1305", "cryptd", "crypto_simd", "af_alg", "algif_skcipher",
          "tcrypt")  # fmt: skip
ARCHES = {
    "armhf": Arch(
        "armhf", "armmp", "qemu-system-arm", "virt,highmem=off", "cortex-a15", "pi4", 1500,
        "arm-linux-gnueabihf",
        (*TEMPLATES, "aes_arm", "aes_arm_bs", "chacha_neon", "poly1305_arm", *COMMON),
    ),
    "arm64": Arch(
        "arm64", "arm64", "qemu-system-aarch64", "virt", "cortex-a72", "pi4-64", 1800,
        "aarch64-linux-gnu",
        (*TEMPLATES, "aes_arm64", "aes_neon_blk", "aes_neon_bs", "chacha_neon", "poly1305_neon", *COMMON),
        env="OPENSSL_armcap=0x1",
    ),
}  # fmt: skip

#: tcrypt runs (5.10 crypto/tcrypt.c do_test()): mode, extra parameters, what it measures. AEAD
#: sizes 16..8192 (aead_sizes: 1024 and 2048 around ESP's ~1420), skcipher sizes 16..8192 with
#: 1472 (block_sizes); mode 500 (ctr(aes) among ~290 other AES tests) would take too long.
TCRYPT = (
    (211, "", "rfc4106(gcm(aes)) and gcm(aes) 128/192/256, encrypt and decrypt"),
    (213, "", "rfc7539esp(chacha20,poly1305) encrypt and decrypt"),
    (214, "", "chacha20 skcipher"),
    (318, "", "ghash (16-byte key)"),
    (321, "", "poly1305"),
)
TCRYPT_SCALAR = TCRYPT[1:3] + TCRYPT[4:]
#: what-if (armhf): the NEON GHASH Raspberry Pi OS leaves out (ghash-arm-ce's vmull.p8 fallback
#: on a core without PMULL, arch/arm/crypto/ghash-ce-glue.c), counted alone
TCRYPT_GHASH_CE = ((318, "", "ghash with ghash-arm-ce loaded (not in Raspberry Pi OS)"),)

#: Published Pi 4 figures (MB/s = 10^6 bytes/s, one core) for code counted in the same VM: (what,
#: code class, measurement key, MB/s, clock MHz, source). The class says which IPC the figure
#: fits: "scalar" (integer table-lookup code: aes-armv4, the kernel's aes-arm) or "neon"
#: (throughput NEON code: bit-sliced AES, NEON GHASH). A measurement key is "openssl:<cipher>"
#: (openssl speed, 16 KiB) or "cryptsetup:<cipher>:<bits>:<enc|dec>" (cryptsetup benchmark:
#: AF_ALG, the kernel's own xts(aes)/cbc(aes) drivers). MiB/s figures are converted here.
MIB = 1.048576
KUBESAIL = "kubesail/pibox-os issue 17 (cryptsetup benchmark, CM4 = BCM2711 at 1.5 GHz; armv7l assumed: 2.2x the arm64 figures)"
CRYPTMYPI = "unixabg/cryptmypi issue 53 (cryptsetup benchmark, Pi 4, Raspberry Pi OS bullseye arm64 2022-09-22; clock not stated, 1.8 GHz assumed)"
ANCHORS = {
    "armhf": (
        ("OpenSSL aes-256-cbc (aes-armv4)", "scalar", "openssl:aes-256-cbc", 64.7, 1500,
         "openssl issue 11377 (Pi 4 5.15.72-v7l+, OpenSSL 1.1.1n armv7l: 64738.65k at 16 KiB)"),
        ("OpenSSL aes-256-gcm (bsaes-armv7 + ghash-armv4 NEON)", "neon", "openssl:aes-256-gcm", 55.9,
         1500, "openssl issue 16573 (Pi 4, Debian 11 armhf, OpenSSL 3.0.0 armv4: 55885.82k at 16 KiB)"),
        ("kernel xts-aes-neonbs 128 enc", "neon", "cryptsetup:aes-xts:256b:enc", 85.8 * MIB, 1500, KUBESAIL),
        ("kernel xts-aes-neonbs 256 enc", "neon", "cryptsetup:aes-xts:512b:enc", 68.1 * MIB, 1500, KUBESAIL),
        ("kernel cbc-aes-neonbs 128 dec", "neon", "cryptsetup:aes-cbc:128b:dec", 79.8 * MIB, 1500, KUBESAIL),
        ("kernel cbc-aes-neonbs 256 dec", "neon", "cryptsetup:aes-cbc:256b:dec", 63.3 * MIB, 1500, KUBESAIL),
        ("kernel cbc(aes-arm) 128 enc", "scalar", "cryptsetup:aes-cbc:128b:enc", 76.1 * MIB, 1500, KUBESAIL),
        ("kernel cbc(aes-arm) 256 enc", "scalar", "cryptsetup:aes-cbc:256b:enc", 62.1 * MIB, 1500, KUBESAIL),
    ),
    "arm64": (
        ("OpenSSL aes-256-cbc (vpaes-armv8, serial)", "neon-serial", "openssl:aes-256-cbc", 36.2, 1800,
         "lelegard/aesbench arm-rpi4-cortex-a72-linux.txt (OpenSSL 3.0.10, 1.8 GHz, 16000 B)"),
        ("OpenSSL aes-128-gcm (vpaes-armv8 + ghash)", "neon-serial", "openssl:aes-128-gcm", 37.3, 1800,
         "lelegard/aesbench arm-rpi4-cortex-a72-linux.txt (same run)"),
        ("OpenSSL aes-256-gcm (vpaes-armv8 + ghash)", "neon-serial", "openssl:aes-256-gcm", 28.9, 1800,
         "lelegard/aesbench arm-rpi4-cortex-a72-linux.txt (same run)"),
        ("kernel xts-aes-neonbs 128 enc", "neon", "cryptsetup:aes-xts:256b:enc", 36.0 * MIB, 1800, CRYPTMYPI),
        ("kernel cbc-aes-neonbs 128 dec", "neon", "cryptsetup:aes-cbc:128b:dec", 33.3 * MIB, 1800, CRYPTMYPI),
        ("kernel cbc-aes-neonbs 256 dec", "neon", "cryptsetup:aes-cbc:256b:dec", 26.6 * MIB, 1800, CRYPTMYPI),
        ("kernel cbc-aes-neon 128 enc", "neon-serial", "cryptsetup:aes-cbc:128b:enc", 34.7 * MIB, 1800, CRYPTMYPI),
        ("kernel cbc-aes-neon 256 enc", "neon-serial", "cryptsetup:aes-cbc:256b:enc", 27.1 * MIB, 1800, CRYPTMYPI),
    ),
}  # fmt: skip


#: `cryptsetup benchmark` runs (the same tool as the published kernel figures: AF_ALG, so the
#: kernel's own xts(aes)/cbc(aes) code): cipher, key bits
CRYPTSETUP = (("aes-xts-plain64", 256), ("aes-xts-plain64", 512), ("aes-cbc-plain64", 128),
              ("aes-cbc-plain64", 256))  # fmt: skip
#: counted too, for comparison with the kernel's code (no published Pi figure used)
OPENSSL_INFO = ("aes-128-gcm", "chacha20-poly1305")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, text=True, capture_output=True, **kw)


# --- fetch -----------------------------------------------------------------------------------
def apt_argv(arch: Arch, d: Path) -> list[str]:
    opts = {
        "APT::Architecture": arch.name,
        "APT::Architectures": arch.name,
        "Dir::State": d / "state",
        "Dir::State::status": d / "state" / "status",
        "Dir::Cache": d / "cache",
        "Dir::Etc::SourceList": d / "sources.list",
        "Dir::Etc::SourceParts": d / "sources.list.d",
        "Dir::Etc::Preferences": d / "preferences",
        "Dir::Etc::PreferencesParts": d / "preferences.d",
        "Acquire::Retries": "3",
        "Debug::NoLocking": "1",  # private state: no lock on the host's dpkg or apt
    }
    out = ["apt-get", "-q"]
    for k, v in opts.items():
        out += ["-o", f"{k}={v}"]
    return out


def fetch(arch: Arch) -> tuple[Path, Path, str]:
    """(kernel root, userland root, kernel release); downloads and unpacks what is missing."""
    base = CACHE / arch.name
    done = base / "fetched.json"
    if done.exists():
        m = json.loads(done.read_text())
        return base / "kernel", base / "root", m["release"]
    d = base / "apt"
    for sub in ("state/lists/partial", "cache/archives/partial", "sources.list.d", "preferences.d"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    (d / "state" / "status").write_text("")
    (d / "sources.list").write_text(
        "".join(f"deb [arch={arch.name} signed-by={KEYRING}] {u} {s} main\n" for u, s in SUITES)
    )
    apt = apt_argv(arch, d)
    log(f"[{arch.name}] apt-get update (private lists under {d})")
    run([*apt, "update"])
    cache_argv = [apt[0].replace("apt-get", "apt-cache"), *apt[1:]]
    names = run(
        [*cache_argv, "search", "--names-only", rf"^linux-image-5\.10\.0-[0-9]+-{arch.flavour}$"]
    )
    pkgs = sorted(
        (ln.split()[0] for ln in names.stdout.splitlines() if ln.strip()),
        key=lambda p: int(re.search(r"5\.10\.0-(\d+)-", p).group(1)),
    )
    if not pkgs:
        raise SystemExit(f"no linux-image-5.10.0-N-{arch.flavour} in Debian 11's lists")
    kpkg = pkgs[-1]
    dl = base / "debs"
    shutil.rmtree(dl, ignore_errors=True)
    (dl / "partial").mkdir(parents=True)
    os.chmod(dl, 0o755)  # apt-get download runs as _apt
    log(f"[{arch.name}] apt-get download {kpkg}; install --download-only {' '.join(USERLAND)}")
    run([*apt, "download", kpkg], cwd=dl)
    # nothing is "installed" in the private status: apt fetches the whole closure (libc too)
    run([*apt, "-o", f"Dir::Cache::archives={dl}", "install", "-y", "--download-only",
         "--no-install-recommends", *USERLAND])  # fmt: skip
    kroot, uroot = base / "kernel", base / "root"
    for p in (kroot, uroot):
        shutil.rmtree(p, ignore_errors=True)
        p.mkdir()
    versions = {}
    for deb in sorted(dl.glob("*.deb")):
        pkg = run(["dpkg-deb", "--show", "--showformat=${Package}\t${Version}", str(deb)]).stdout
        name, ver = pkg.split("\t")
        versions[name] = ver
        run(["dpkg-deb", "-x", str(deb), str(kroot if name == kpkg else uroot)])
    release = kpkg.removeprefix("linux-image-")
    run(["depmod", "-b", str(kroot), release])
    done.write_text(json.dumps({"release": release, "packages": versions}, indent=1))
    return kroot, uroot, release


# --- initramfs -------------------------------------------------------------------------------
def module_order(kroot: Path, release: str, names: tuple[str, ...]) -> list[Path]:
    mdir = kroot / "lib/modules" / release
    deps: dict[str, tuple[str, list[str]]] = {}
    for line in (mdir / "modules.dep").read_text().splitlines():
        target, _, rest = line.partition(":")
        deps[Path(target).name.split(".ko")[0].replace("-", "_")] = (target, rest.split())
    builtin = {
        Path(x).name.split(".ko")[0].replace("-", "_")
        for x in (mdir / "modules.builtin").read_text().split()
    }
    order: list[Path] = []
    seen: set[str] = set()

    def visit(n: str) -> None:
        if n in seen:
            return
        seen.add(n)
        if n not in deps:
            if n in builtin:
                return
            raise SystemExit(f"kernel {release} has no module {n}")
        target, needs = deps[n]
        for dep in needs:
            visit(Path(dep).name.split(".ko")[0].replace("-", "_"))
        order.append(mdir / target)

    for n in names:
        visit(n)
    return order


def guest_script(arch: Arch, mods: list[str], tcrypt: tuple, openssl: bool, sec: int) -> str:
    sh = [
        "#!/bin/busybox sh",
        "B=/bin/busybox",
        "$B mount -t proc proc /proc; $B mount -t sysfs sys /sys; $B mount -t devtmpfs dev /dev",
        "$B dmesg -n 1",
        "$B echo @@BOOTED; $B cat /proc/cpuinfo | $B grep -i -m2 -E 'features|model name'",
    ]
    for m in mods:
        if m.startswith("tcrypt"):
            continue
        sh.append(f"$B insmod /m/{m} || $B echo @@INSMOD_FAILED {m}")
    sh.append("$B dmesg -c >/dev/null")
    for mode, extra, what in tcrypt:
        sh += [
            f"$B echo '@@TCRYPT mode={mode} {extra} ({what})'",
            f"$B insmod /m/tcrypt.ko.xz mode={mode} sec={sec} {extra} 2>/dev/null",
            "$B dmesg -c",
        ]
    sh += [
        "$B echo @@PROC_CRYPTO",
        "$B grep -E '^(name|driver|priority)' /proc/crypto",
    ]
    if openssl:
        env = f"LD_LIBRARY_PATH=/lib/{arch.triplet}:/usr/lib/{arch.triplet} {arch.env}"
        ciphers = [
            k.split(":")[1] for _, _, k, *_ in ANCHORS[arch.name] if k.startswith("openssl:")
        ]
        for cipher in dict.fromkeys([*ciphers, *OPENSSL_INFO]):
            flag = ""
            sh += [
                f"$B echo '@@OPENSSL {cipher}{flag}'",
                f"{env} /usr/bin/openssl speed -elapsed -seconds {sec} -bytes 16384{flag} "
                f"-evp {cipher} 2>&1 | $B grep -E 'Doing|version'",
            ]
        for cipher, bits in CRYPTSETUP:
            sh += [
                f"$B echo '@@CRYPTSETUP {cipher} {bits}'",
                f"{env} /sbin/cryptsetup benchmark -c {cipher} -s {bits} 2>&1 | $B tail -1",
            ]
        sh += ["$B echo @@PROC_CRYPTO_USED", "$B grep -B1 -A4 -E '^driver.*(xts|cbc)' /proc/crypto"]
    sh += ["$B echo @@DONE", "$B poweroff -f"]
    return "\n".join(sh) + "\n"


def build_initramfs(arch: Arch, kroot: Path, uroot: Path, release: str, script: str,
                    out: Path, openssl: bool) -> list[str]:  # fmt: skip
    entries: list[Entry] = []
    dirs = ["bin", "dev", "proc", "sys", "m", "tmp", "lib", "usr", "usr/bin", "usr/lib"]
    for dd in dirs:
        entries.append(Entry(dd, stat.S_IFDIR | 0o755))
    entries.append(Entry("dev/console", stat.S_IFCHR | 0o600, rdev=(5, 1)))
    entries.append(Entry("bin/busybox", stat.S_IFREG | 0o755, (uroot / "bin/busybox").read_bytes()))
    entries.append(Entry("bin/sh", stat.S_IFLNK | 0o777, b"busybox"))
    entries.append(Entry("init", stat.S_IFREG | 0o755, script.encode()))
    names = []
    for p in module_order(kroot, release, arch.modules):
        data = p.read_bytes()
        if p.name == "tcrypt.ko":
            # tcrypt's init runs the tests, then fails (-EAGAIN) on purpose; busybox insmod then
            # retries finit_module(2) with init_module(2), running them twice. xz-compressed, the
            # first attempt fails before init (5.10 cannot decompress modules) and busybox
            # decompresses it for the one init_module call.
            data = lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC32)
        entries.append(Entry(f"m/{p.name}" + (".xz" if p.name == "tcrypt.ko" else ""),
                             stat.S_IFREG | 0o644, data))  # fmt: skip
        names.append(p.name)
    if openssl:
        entries.append(Entry("sbin", stat.S_IFDIR | 0o755))
        for exe in ("usr/bin/openssl", "sbin/cryptsetup"):
            entries.append(Entry(exe, stat.S_IFREG | 0o755, (uroot / exe).read_bytes()))
        seen_dirs = set(dirs)
        for sub in ("lib", "usr/lib"):
            top = uroot / sub
            for f in sorted(top.rglob("*")):
                rel = f.relative_to(uroot).as_posix()
                if "gconv" in rel or "/engines-" in rel or "/ossl-modules" in rel:
                    continue
                if f.is_dir():
                    if rel not in seen_dirs:
                        entries.append(Entry(rel, stat.S_IFDIR | 0o755))
                        seen_dirs.add(rel)
                elif f.is_symlink():
                    entries.append(Entry(rel, stat.S_IFLNK | 0o777, os.readlink(f).encode()))
                elif f.is_file() and (".so" in f.name or f.name.startswith("ld-")):
                    entries.append(Entry(rel, stat.S_IFREG | 0o755, f.read_bytes()))
    out.write_bytes(newc(entries))
    return names


# --- run -------------------------------------------------------------------------------------
def boot(arch: Arch, kroot: Path, release: str, initrd: Path, log_path: Path, cpu: str,
         timeout: float, smp: int = 1) -> str:  # fmt: skip
    """Boot the guest, its console into `log_path`. One CPU runs under `-icount shift=0` (a
    guest nanosecond is an instruction: the counts); several (`smp`) run multi-threaded TCG
    without icount, which counts nothing (icount's round robin over several CPUs stalls this
    kernel's boot: soft lockups) but lets them run at once (bench/kernel_tcp.py's ordering)."""
    kernel = kroot / "boot" / f"vmlinuz-{release}"
    qemu = shutil.which(arch.qemu)
    if not qemu:
        raise SystemExit(f"{arch.qemu} missing: apt-get install qemu-system-arm")
    argv = [
        qemu, "-M", arch.machine, "-cpu", cpu, "-smp", str(smp), "-m", "512",
        *(("-icount", "shift=0", "-accel", "tcg") if smp == 1 else ("-accel", "tcg,thread=multi")),
        "-kernel", str(kernel), "-initrd", str(initrd),
        "-append", "console=ttyAMA0 panic=-1 quiet",
        "-display", "none", "-monitor", "none", "-serial", f"file:{log_path}",
        "-no-reboot", "-nodefaults",
    ]  # fmt: skip
    log(f"[{arch.name}] booting {release} ({cpu}), log {log_path}")
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise SystemExit(
            f"{arch.qemu} (pid {proc.pid}) timed out after {timeout:.0f} s; see {log_path}"
        )
    text = log_path.read_text(errors="replace")
    log(f"[{arch.name}] guest done in {time.monotonic() - t0:.0f} s (exit {proc.returncode})")
    if "@@DONE" not in text:
        raise SystemExit(f"guest did not finish (stderr: {err.strip()[-500:]}); see {log_path}")
    return text


# --- parse ---------------------------------------------------------------------------------------
SPEED_HEAD = re.compile(r"testing speed of (?:async |sync |multibuffer )?(\S+) \((\S+)\)\s*(\w+)?")
CIPHER_TEST = re.compile(r"test\s*\d+ \((\d+) bit key, (\d+) byte blocks?\):")
CIPHER_RES = re.compile(r"(\d+) operations in (\d+) seconds \((\d+) bytes\)")
HASH_TEST = re.compile(
    r"test\s*\d+ \(\s*(\d+) byte blocks,\s*(\d+) bytes per update,\s*\d+ updates\):"
)
HASH_RES = re.compile(r"(\d+) opers/sec,\s*(\d+) bytes/sec")


def parse_tcrypt(text: str) -> list[dict]:
    """Rows {alg, driver, dir, key_bits, size, bytes_per_s} from tcrypt's dmesg output (a test's
    header and its result may share a line or not: pr_cont vs printk)."""
    rows: list[dict] = []
    cur: dict | None = None
    test: dict | None = None
    for line in text.splitlines():
        m = SPEED_HEAD.search(line)
        if m:
            cur = {"alg": m.group(1), "driver": m.group(2), "dir": m.group(3) or ""}
            test = None
            continue
        if cur is None:
            continue
        m = CIPHER_TEST.search(line)
        if m:
            test = {"key_bits": int(m.group(1)), "size": int(m.group(2)), "whole": True}
        m = HASH_TEST.search(line)
        if m:
            blk, upd = int(m.group(1)), int(m.group(2))
            # one update per digest: a whole message hashed at once, as ESP and WireGuard do
            test = {"key_bits": 0, "size": blk, "whole": blk == upd}
        if test is None:
            continue
        m = CIPHER_RES.search(line)
        if m:
            _ops, secs, nbytes = map(int, m.groups())
            rows.append({**cur, "key_bits": test["key_bits"], "size": test["size"],
                         "bytes_per_s": nbytes / secs})  # fmt: skip
            test = None
            continue
        m = HASH_RES.search(line)
        if m:
            if test["whole"]:
                rows.append({**cur, "key_bits": 0, "size": test["size"],
                             "bytes_per_s": float(m.group(2))})  # fmt: skip
            test = None
    return rows


OPENSSL_LINE = re.compile(r"Doing (\S+) .*for (\d+)s on (\d+) size blocks: (\d+) \S+ in ([\d.]+)s")


def parse_openssl(text: str) -> dict[str, float]:
    out = {}
    for m in OPENSSL_LINE.finditer(text):
        name, _s, size, n, secs = m.groups()
        out[name.lower()] = int(n) * int(size) / float(secs)
    return out


CS_LINE = re.compile(r"^\s*(aes-\w+)\s+(\d+b)\s+([\d.]+) MiB/s\s+([\d.]+) MiB/s", re.MULTILINE)


def parse_cryptsetup(text: str) -> dict[str, float]:
    """{"cryptsetup:aes-xts:256b:enc": bytes/s, ...} from `cryptsetup benchmark` lines."""
    out = {}
    for m in CS_LINE.finditer(text):
        name, bits, enc, dec = m.groups()
        out[f"cryptsetup:{name}:{bits}:enc"] = float(enc) * MIB * 1e6
        out[f"cryptsetup:{name}:{bits}:dec"] = float(dec) * MIB * 1e6
    return out


def ipb(bytes_per_s: float) -> float:
    """Instructions per byte: under -icount shift=0 one guest second is 10^9 instructions."""
    return 1e9 / bytes_per_s


def at_size(rows: list[dict], size: int = MSG) -> float | None:
    """Instructions per byte at `size`, linear in 1/size between tcrypt's two nearest sizes
    (a fixed per-request cost plus a per-byte cost), or the exact size when tcrypt has it."""
    pts = sorted((r["size"], ipb(r["bytes_per_s"])) for r in rows)
    for s, v in pts:
        if s == size:
            return v
    below = [p for p in pts if p[0] < size]
    above = [p for p in pts if p[0] > size]
    if not below or not above:
        return None
    (s0, v0), (s1, v1) = below[-1], above[0]
    # cost per message c(s) = a + b*s; per byte c/s. Solve from the two points.
    c0, c1 = v0 * s0, v1 * s1
    b = (c1 - c0) / (s1 - s0)
    a = c0 - b * s0
    return (a + b * size) / size


def pick(rows: list[dict], alg: str, direction: str, key_bits: int | None) -> list[dict]:
    return [
        r
        for r in rows
        if r["alg"] == alg
        and (not direction or r["dir"] == direction)
        and (key_bits is None or r["key_bits"] == key_bits)
    ]


# --- report --------------------------------------------------------------------------------------
#: (profile primitive, tcrypt alg, key bits as tcrypt prints them, what uses it)
PRIMS = (
    ("kernel-gcm-aes-128", "rfc4106(gcm(aes))", 160, "ESP aes128gcm8 (rfc4106: 128-bit key + salt)"),
    ("kernel-gcm-aes-128", "gcm(aes)", 128, "MACsec gcm(aes) 128"),
    ("kernel-gcm-aes-256", "gcm(aes)", 256, "ESP aes256gcm (rfc4106 adds only the IV/salt handling)"),
    ("kernel-chacha20-poly1305", "rfc7539esp(chacha20,poly1305)", 288, "ESP chacha20poly1305"),
)  # fmt: skip


def fit_ipc(arch: Arch, measured: dict[str, float]) -> tuple[list[dict], dict[str, list[float]]]:
    """Each anchor's IPC = instructions/byte counted here / cycles/byte published."""
    anchors, by_class = [], {}
    for what, cls, key, mbps, mhz, src in ANCHORS[arch.name]:
        if key not in measured:
            continue
        i_b, c_b = ipb(measured[key]), mhz / mbps
        anchors.append({"what": what, "class": cls, "key": key, "ipb": i_b, "cpb_published": c_b,
                        "ipc": i_b / c_b, "source": src})  # fmt: skip
        by_class.setdefault(cls, []).append(i_b / c_b)
    return anchors, by_class


def report(arch: Arch, rows: list[dict], scalar_rows: list[dict], measured: dict[str, float],
           ipc_from: dict[str, list[float]] | None = None,
           ghash_ce_rows: list[dict] | None = None) -> dict:  # fmt: skip
    """Print and return the figures. IPC per code class from this arch's anchors, or from
    `ipc_from` (the armhf classes: same core) when given."""
    out: dict = {"arch": arch.name, "clock_mhz": arch.clock_mhz, "primitives": []}
    print(f"\n=== {arch.name} ({arch.profile}, {arch.clock_mhz} MHz) ===")
    anchors, by_class = fit_ipc(arch, measured)
    out["anchors"] = anchors
    print("anchors: instructions/byte counted here, published cycles/byte, IPC")
    for x in anchors:
        print(f"  {x['what']:52s} {x['class']:11s} {x['ipb']:6.2f} ipb {x['cpb_published']:6.2f} cpb"
              f"  IPC {x['ipc']:.2f}")  # fmt: skip
    for k, v in measured.items():
        if k.startswith("openssl:") and k.split(":")[1] in OPENSSL_INFO:
            print(f"  (counted, no anchor) {k:40s} {ipb(v):6.2f} ipb")
    classes = ipc_from or by_class
    ipc = {c: sum(v) / len(v) for c, v in classes.items()}
    span = {c: (min(v), max(v)) for c, v in classes.items()}
    out["ipc"] = {c: {"mean": ipc[c], "min": span[c][0], "max": span[c][1], "n": len(classes[c])}
                  for c in ipc}  # fmt: skip
    print("IPC per class" + (" (transferred from armhf: same core)" if ipc_from else "") + ": "
          + ", ".join(f"{c} {ipc[c]:.2f} ({span[c][0]:.2f}-{span[c][1]:.2f}, n={len(classes[c])})"
                      for c in ipc))  # fmt: skip
    if "scalar" not in ipc or "neon" not in ipc:
        print("  (no scalar/neon classes: kernel estimates skipped)")
        return out

    def est(label: str, driver: str, direction: str, neon: float, scalar: float) -> None:
        """cycles/byte = NEON instructions / NEON IPC + scalar instructions / scalar IPC."""
        cpb = neon / ipc["neon"] + scalar / ipc["scalar"]
        lo = neon / span["neon"][1] + scalar / span["scalar"][1]
        hi = neon / span["neon"][0] + scalar / span["scalar"][0]
        mbps = arch.clock_mhz / cpb
        rng = (arch.clock_mhz / hi, arch.clock_mhz / lo)
        out["primitives"].append({"primitive": label, "driver": driver, "dir": direction,
                                  "ipb_neon": neon, "ipb_scalar": scalar, "cpb": cpb, "mbps": mbps,
                                  "mbps_range": rng})  # fmt: skip
        print(f"  {label:26s} {direction[:7]:8s} {driver:56s} {neon + scalar:6.1f} ({neon:4.1f}+{scalar:4.1f})"
              f" {cpb:6.1f} {mbps:6.1f} ({rng[0]:.0f}-{rng[1]:.0f})")  # fmt: skip

    def at(
        sel_rows: list[dict], alg: str, direction: str, bits: int | None
    ) -> tuple[float, str] | None:
        sel = pick(sel_rows, alg, direction, bits)
        v = at_size(sel) if sel else None
        return (v, sel[0]["driver"]) if v else None

    ghash = at(rows, "ghash", "", None)
    chacha = at(rows, "chacha20", "encryption", 256)
    poly = at(rows, "poly1305", "", None)
    comp = {"ghash": ghash, "chacha20": chacha, "poly1305": poly}
    out["components"] = {k: {"ipb": v[0], "driver": v[1]} for k, v in comp.items() if v}
    print(
        f"\nkernel primitives at {MSG} bytes, one {arch.clock_mhz} MHz core: instructions/byte "
        "(NEON + scalar part), cycles/byte, MB/s (range over the anchors' IPC)"
    )
    for prim, alg, bits, _note in PRIMS:
        for direction in ("encryption", "decryption"):
            m = at(rows, alg, direction, bits)
            if not m:
                continue
            v, drv = m
            if alg.endswith("(gcm(aes))") or alg == "gcm(aes)":
                # ghash-generic is table-lookup C: scalar; the rest is ctr-aes-neonbs and glue
                g = ghash[0] if ghash else 0.0
                est(prim, drv, direction, v - g, g)
            elif chacha and poly:
                # chacha20-neon + poly1305-neon: NEON; the template's own work: scalar
                cp = chacha[0] + poly[0]
                est(prim, drv, direction, cp, max(v - cp, 0.0))
    if chacha and poly:
        est("kernel-chacha20-poly1305", f"lib chacha20poly1305 ({chacha[1]} + {poly[1]})", "wg-lib",
            chacha[0] + poly[0], 0.0)  # fmt: skip
    print("\n  components (instructions/byte at the size):")
    for k, v in comp.items():
        if v:
            print(f"    {k:10s} {v[1]:30s} {v[0]:6.2f}")
    if scalar_rows:
        print(
            "\n  NEON off (5.10 armv7l, where kernel-mode NEON is not allowed: softirq), all scalar IPC:"
        )
        for alg, bits, direction in (
            ("rfc7539esp(chacha20,poly1305)", 288, "encryption"),
            ("rfc7539esp(chacha20,poly1305)", 288, "decryption"),
            ("chacha20", 256, "encryption"),
            ("poly1305", None, ""),
        ):  # fmt: skip
            m = at(scalar_rows, alg, direction, bits)
            if m:
                est(f"scalar {alg}", m[1], direction or "hash", 0.0, m[0])
    ce = at(ghash_ce_rows, "ghash", "", None) if ghash_ce_rows else None
    if ce and ghash:
        print(f"\n  what if the kernel had {ce[1]} ({ce[0]:.2f} instructions/byte, NEON) in place of "
              f"{ghash[1]}:")  # fmt: skip
        for prim, alg, bits, _note in PRIMS[:3]:
            m = at(rows, alg, "encryption", bits)
            if m:
                est(f"what-if {prim}", m[1].replace(ghash[1], ce[1]), "encryption",
                    m[0] - ghash[0] + ce[0], 0.0)  # fmt: skip
    return out


def measure(arch: Arch, a: argparse.Namespace) -> tuple[str, str, str, str]:
    """Boot the guest(s); the console logs (kept under CACHE/ARCH/runs) and the kernel release."""
    kroot, uroot, release = fetch(arch)
    runs = CACHE / arch.name / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    mods = [p.name for p in module_order(kroot, release, arch.modules)]
    text2 = text3 = ""
    with tempfile.TemporaryDirectory(prefix="lab-kcrypto-") as td:
        initrd = Path(td) / "initrd"
        build_initramfs(arch, kroot, uroot, release, guest_script(arch, mods, TCRYPT, True, a.sec),
                        initrd, True)  # fmt: skip
        text = boot(arch, kroot, release, initrd, runs / f"{stamp}-neon.log", arch.cpu, a.timeout)
        if arch.name == "armhf" and not a.no_scalar:
            script = guest_script(arch, mods, TCRYPT_SCALAR, False, a.sec)
            build_initramfs(arch, kroot, uroot, release, script, initrd, False)
            text2 = boot(arch, kroot, release, initrd, runs / f"{stamp}-noneon.log",
                         arch.cpu + ",neon=off", a.timeout)  # fmt: skip
        if arch.name == "armhf" and a.what_if:
            ce = [p.name for p in module_order(kroot, release, (*arch.modules, "ghash_arm_ce"))]
            script = guest_script(arch, ce, TCRYPT_GHASH_CE, False, a.sec)
            arch_ce = Arch(**{**arch.__dict__, "modules": (*arch.modules, "ghash_arm_ce")})
            build_initramfs(arch_ce, kroot, uroot, release, script, initrd, False)
            text3 = boot(arch, kroot, release, initrd, runs / f"{stamp}-ghashce.log", arch.cpu,
                         a.timeout)  # fmt: skip
    return text, text2, text3, release


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", nargs="+", choices=list(ARCHES), default=list(ARCHES))
    ap.add_argument(
        "--sec", type=int, default=1, help="tcrypt/openssl seconds per test (guest time)"
    )
    ap.add_argument("--timeout", type=float, default=3600, help="per boot, host seconds")
    ap.add_argument("--no-scalar", action="store_true", help="skip armhf's NEON-off boot")
    ap.add_argument("--what-if", action="store_true",
                    help="armhf: one more boot counting ghash-arm-ce's NEON GHASH")  # fmt: skip
    ap.add_argument("--json", type=Path, help="write the results here too")
    ap.add_argument("--from-logs", action="store_true",
                    help="no boot: report from the newest guest logs under the cache")  # fmt: skip
    a = ap.parse_args()
    if os.geteuid() != 0 and not a.from_logs:
        raise SystemExit("run as root (apt's private download into /var/cache/lab)")
    t_start = time.monotonic()
    results = []
    armhf_classes: dict[str, list[float]] = {}
    for name in a.arch:
        arch = ARCHES[name]
        runs = CACHE / arch.name / "runs"
        if a.from_logs:
            release = json.loads((CACHE / name / "fetched.json").read_text())["release"]
            neon = sorted(runs.glob("*-neon.log"))[-1]
            text = neon.read_text(errors="replace")
            noneon = neon.with_name(neon.name.replace("-neon.log", "-noneon.log"))
            text2 = noneon.read_text(errors="replace") if noneon.exists() else ""
            ces = sorted(runs.glob("*-ghashce.log"))
            text3 = ces[-1].read_text(errors="replace") if ces else ""
            log(f"[{name}] from {neon}" + (f" and {noneon}" if text2 else ""))
        else:
            text, text2, text3, release = measure(arch, a)
        for bad in re.findall(r"@@INSMOD_FAILED (\S+)", text):
            log(f"[{arch.name}] module failed to load: {bad}")
        rows = parse_tcrypt(text)
        measured = {f"openssl:{k}": v for k, v in parse_openssl(text).items()}
        measured.update(parse_cryptsetup(text))
        scalar_rows = parse_tcrypt(text2) if text2 else []
        res = report(
            arch, rows, scalar_rows, measured, None, parse_tcrypt(text3) if text3 else None
        )
        (CACHE / name / "results.json").write_text(json.dumps(res, indent=1))
        if name == "arm64" and not armhf_classes and (CACHE / "armhf" / "results.json").exists():
            saved = json.loads((CACHE / "armhf" / "results.json").read_text())
            for x in saved["anchors"]:
                armhf_classes.setdefault(x["class"], []).append(x["ipc"])
        if name == "arm64" and armhf_classes:
            print("\n--- arm64 again, with armhf's per-class IPC (same Cortex-A72 core) ---")
            res["with_armhf_ipc"] = report(arch, rows, [], measured, armhf_classes)
        if name == "armhf":
            armhf_classes = fit_ipc(arch, measured)[1]
        res["kernel"] = release
        res["raw"] = rows
        results.append(res)
    print(f"\ntotal {time.monotonic() - t_start:.0f} s")
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
