"""What the counted-guest benches share (bench/kernel_dataplane.py, bench/openvpn_dataplane.py).

Each boots kernel_crypto.py's armhf guest (Debian 11's 5.10 armmp kernel, `qemu-system-arm -cpu
cortex-a15 -icount shift=0`: one guest nanosecond is one executed instruction) with a Debian 12
userland of its own in the initramfs, counts the CPU's non-idle time of what it measures, and
turns instructions into board time. Here: the userland's download, the initramfs, the guest
script's common head and the UnixBench loops it ends with, the guest log (a new boot's or the
newest saved one) and its @@RESULT/@@OUT/@@LOOP lines, and the IPC conversion: the loops' counts
against the published Pi 4 loops/s give the Cortex-A72's IPC for kernel code, and a trip's
instructions at that IPC (its scalar crypto at SCALAR_IPC) are its board cycles.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import kernel_crypto as kc  # noqa: E402

from lab.substrate.vm.initramfs import Entry, newc  # noqa: E402

ARCH = kc.ARCHES["armhf"]
CLOCK = ARCH.clock_mhz * 1e6  # one board core's cycles per second
RUNS = kc.CACHE / ARCH.name / "runs"  # the guests' console logs
KERNEL = "5.10.0-32-armmp (Debian 11 5.10.223), armv7l"
#: UnixBench 5.1.3 loops per second of one Pi 4 core (cpu_profiles/pi4.toml, 1.5 GHz)
UNIXBENCH = {"syscall": 491539.0, "pipe": 99812.0}
LOOPS = (20000, 60000)  # two loop counts: the difference removes fork + exec
#: the Cortex-A72's IPC for scalar integer crypto code (aes-armv4, sha1-armv4 are of this
#: class): bench/kernel_crypto.py's fit on published Pi 4 figures (cpu_profiles/pi4.toml)
SCALAR_IPC = 2.26
#: a guest script's report of a step that failed (@@INSMOD_FAILED, @@XFRM_FAILED, ...)
FAILED = re.compile(r"@@\w+_FAILED")


# --- the guest -------------------------------------------------------------------------------
def fetch_userland(name: str, packages: tuple[str, ...]) -> Path:
    """Debian 12's `packages` for armhf unpacked under CACHE/armhf/NAMEroot (cached), with
    versions.json: {package: version} of every .deb unpacked."""
    base = kc.CACHE / ARCH.name
    root = base / f"{name}root"
    if (root / ".done").exists():
        return root
    kc.fetch(ARCH)  # the kernel, and the private apt lists
    apt = kc.apt_argv(ARCH, base / "apt")
    dl = base / f"{name}debs"
    (dl / "partial").mkdir(parents=True, exist_ok=True)
    os.chmod(dl, 0o755)  # apt-get downloads as _apt
    kc.log(f"[{ARCH.name}] apt-get install --download-only {' '.join(packages)}")
    kc.run([*apt, "-o", f"Dir::Cache::archives={dl}", "install", "-y", "--download-only",
            "--no-install-recommends", *packages])  # fmt: skip
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    versions = {}
    for deb in sorted(dl.glob("*.deb")):
        pkg = kc.run(["dpkg-deb", "--show", "--showformat=${Package}\t${Version}", str(deb)])
        pkg_name, ver = pkg.stdout.split("\t")
        versions[pkg_name] = ver
        kc.run(["dpkg-deb", "-x", str(deb), str(root)])
    (root / "versions.json").write_text(json.dumps(versions, indent=1))
    (root / ".done").write_text("")
    return root


def build_loops(out: Path) -> bytes:
    """bench/armloops.S (the UnixBench loops in ARM assembly) assembled and linked at `out`."""
    src = REPO / "bench" / "armloops.S"
    obj = out.with_suffix(".o")
    for tool in ("arm-linux-gnueabihf-as", "arm-linux-gnueabihf-ld"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} missing: apt-get install binutils-arm-linux-gnueabihf")
    kc.run(["arm-linux-gnueabihf-as", "-march=armv7-a", "-o", str(obj), str(src)])
    kc.run(["arm-linux-gnueabihf-ld", "-static", "-o", str(out), str(obj)])
    return out.read_bytes()


GUEST_HEAD = r"""#!/bin/busybox sh
B=/bin/busybox  # its shell runs its own applets (ip too): full paths for the rest
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
$B mount -t proc proc /proc; $B mount -t sysfs sys /sys; $B mount -t devtmpfs dev /dev
$B mount -t tmpfs tmp /run; $B mkdir -p /var; $B ln -s /run /var/run
$B dmesg -n 1
export LD_LIBRARY_PATH=/lib/arm-linux-gnueabihf:/usr/lib/arm-linux-gnueabihf
echo @@BOOTED
# the CPU's non-idle run time in ns (= instructions under -icount shift=0), read without a fork
busy() { while read -r c x y z u v w t r; do [ "$c" = cpu0 ] && { echo "$t"; return; }; done < /proc/schedstat; }
# a counter of /proc/PID/net/snmp (the receiver's namespace), read without a fork
snmp() { local pid=$1 proto="$2:" key=$3 h="" p rest n
  while read -r p rest; do [ "$p" = "$proto" ] || continue
    if [ -z "$h" ]; then h="$rest"; else set -- $h
      for n in $rest; do [ "$1" = "$key" ] && { echo "$n"; return; }; shift; done; fi
  done < /proc/$pid/net/snmp; }
"""
#: namespaces a (10.0.0.1) and b (10.0.0.2) on a veth pair, with fixed MAC addresses
VETH_PAIR = (
    "/bin/ip netns add a; /bin/ip netns add b",
    "/bin/ip link add va netns a address 02:00:00:00:00:0a type veth peer name vb netns b"
    " address 02:00:00:00:00:0b",
    "/bin/ip -n a addr add 10.0.0.1/24 dev va; /bin/ip -n b addr add 10.0.0.2/24 dev vb",
    "for ns in a b; do /bin/ip -n $ns link set lo up; done; /bin/ip -n a link set va up;"
    " /bin/ip -n b link set vb up",
)


def loop_lines() -> list[str]:
    """The guest script's UnixBench loops, two counts each (@@LOOP lines: the IPC anchors)."""
    return [
        f"t0=$(busy); /bin/armloops {kind[0]} {loops}; t1=$(busy); "
        f'echo "@@LOOP {kind} loops={loops} busy_ns=$((t1-t0))"'
        for kind in ("syscall", "pipe")
        for loops in LOOPS
    ]


def build_initramfs(kroot: Path, release: str, userland: Path, loops: bytes, script: str,
                    out: Path, modules: tuple[str, ...],
                    files: dict[str, bytes] | None = None) -> None:  # fmt: skip
    """The guest's initramfs at `out`: `script` as /init, the loops as /bin/armloops, `files`,
    the kernel's base and `modules` (and what they need) under /m, and the userland."""
    entries: list[Entry] = []
    seen: set[str] = set()

    def d(rel: str) -> None:
        parts = rel.split("/")
        for i in range(1, len(parts) + 1):
            p = "/".join(parts[:i])
            if p not in seen:
                seen.add(p)
                entries.append(Entry(p, stat.S_IFDIR | 0o755))

    for dd in ("dev", "proc", "sys", "m", "tmp", "run", "etc", "bin", "sbin", "usr/bin",
               "usr/sbin", "lib", "usr/lib"):  # fmt: skip
        d(dd)
    entries.append(Entry("dev/console", stat.S_IFCHR | 0o600, rdev=(5, 1)))
    entries.append(Entry("init", stat.S_IFREG | 0o755, script.encode()))
    entries.append(Entry("bin/armloops", stat.S_IFREG | 0o755, loops))
    for rel, data in (files or {}).items():
        entries.append(Entry(rel, stat.S_IFREG | 0o600, data))
    for p in kc.module_order(kroot, release, (*ARCH.modules, *modules)):
        if p.name.startswith("tcrypt"):
            continue
        entries.append(Entry(f"m/{p.name}", stat.S_IFREG | 0o644, p.read_bytes()))
    for sub in ("bin", "sbin", "usr/bin", "usr/sbin", "lib", "usr/lib"):
        top = userland / sub
        if not top.exists():
            continue
        for f in sorted(top.rglob("*")):
            rel = f.relative_to(userland).as_posix()
            if any(x in rel for x in ("gconv", "/udev", "/tc/", "python", "/perl")):
                continue
            if f.is_symlink():
                d(str(Path(rel).parent))
                entries.append(Entry(rel, stat.S_IFLNK | 0o777, os.readlink(f).encode()))
            elif f.is_dir():
                d(rel)
            elif f.is_file():
                d(str(Path(rel).parent))
                entries.append(Entry(rel, stat.S_IFREG | 0o755, f.read_bytes()))
    entries.append(Entry("bin/sh", stat.S_IFLNK | 0o777, b"busybox"))
    out.write_bytes(newc(entries))


# --- a bench's command line and its guest log ------------------------------------------------
def arguments(doc: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--packets", type=int, default=4000, help="datagrams per run")
    ap.add_argument("--timeout", type=float, default=3600, help="for the boot, host seconds")
    ap.add_argument("--json", type=Path, help="write the results here too")
    ap.add_argument("--from-log", action="store_true",
                    help=f"no boot: report from the newest saved guest log under {RUNS}")  # fmt: skip
    return ap.parse_args()


def guest_log(a: argparse.Namespace, tag: str, userland: Callable[[], Path],
              script: Callable[[list[str]], str], modules: tuple[str, ...],
              files: dict[str, bytes] | None = None, smp: int = 1) -> str:  # fmt: skip
    """The guest's console log, RUNS/STAMP-TAG.log: with --from-log the newest saved one, else
    a new boot's (root: apt's private download into the cache). `userland()` fetches the root
    to unpack into the initramfs; `script(module file names)` is the guest's /init. The log's
    @@..._FAILED lines are repeated on stderr."""
    if a.from_log:
        saved = sorted(RUNS.glob(f"*-{tag}.log"))
        if not saved:
            raise SystemExit(f"no saved guest log {RUNS}/*-{tag}.log: run once without --from-log")
        kc.log(f"guest log {saved[-1]}")
        text = saved[-1].read_text(errors="replace")
    else:
        if os.geteuid() != 0:
            raise SystemExit("run as root (apt's private download into /var/cache/lab)")
        kroot, _uroot, release = kc.fetch(ARCH)
        root = userland()
        RUNS.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        mods = [p.name for p in kc.module_order(kroot, release, (*ARCH.modules, *modules))]
        with tempfile.TemporaryDirectory(prefix=f"lab-{tag}-") as td:
            loops = build_loops(Path(td) / "armloops")
            initrd = Path(td) / "initrd"
            build_initramfs(kroot, release, root, loops, script(mods), initrd, modules, files)
            text = kc.boot(ARCH, kroot, release, initrd, RUNS / f"{stamp}-{tag}.log", ARCH.cpu,
                           a.timeout, smp)  # fmt: skip
    for line in text.splitlines():
        if FAILED.search(line):
            kc.log(line.strip())
    return text


def run(main: Callable[[], None]) -> None:
    """`main`, with a failed command's name, exit code and stderr as the exit message."""
    try:
        main()
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"{e.cmd[0]} failed ({e.returncode}): {e.stderr.strip()[-800:]}")


# --- counts -> board time --------------------------------------------------------------------
def parse(text: str) -> tuple[dict[str, dict], dict[str, dict[int, int]]]:
    """({run: {packets, received, busy_ns, ..., out_*}}, {loop kind: {loop count: busy ns}})
    from a guest log's @@RESULT, @@OUT and @@LOOP lines."""
    res: dict[str, dict] = {}
    loops: dict[str, dict[int, int]] = {}
    for line in text.splitlines():
        if "@@RESULT " in line:
            name, *kv = line.split("@@RESULT ", 1)[1].split()
            res[name] = {k: float(v) for k, v in (x.split("=", 1) for x in kv if "=" in x)}
        elif "@@OUT " in line:
            name, *kv = line.split("@@OUT ", 1)[1].split()
            res.setdefault(name, {}).update(
                {f"out_{k}": float(v) for k, v in (x.split("=", 1) for x in kv if "=" in x)}
            )
        elif "@@LOOP " in line:
            kind, cnt, ns = line.split("@@LOOP ", 1)[1].split()
            loops.setdefault(kind, {})[int(cnt.split("=")[1])] = int(ns.split("=")[1])
    return res, loops


def ipc_anchors(loops: dict[str, dict[int, int]]) -> tuple[dict[str, float], float]:
    """The board's IPC for kernel code, per UnixBench loop (its instructions counted here over
    its published cycles on a Pi 4) and their mean; printed as a table."""
    print("\nIPC anchors (UnixBench 5.1.3 on a Pi 4, armv7l, 1.5 GHz; loops counted here):")
    ipcs = {}
    for kind, pts in loops.items():
        (n0, t0), (n1, t1) = sorted(pts.items())
        ipl = (t1 - t0) / (n1 - n0)
        cpl = CLOCK / UNIXBENCH[kind]
        ipcs[kind] = ipl / cpl
        print(f"  {kind:8s} {ipl:8.0f} instructions/loop {cpl:8.0f} cycles/loop published"
              f"  IPC {ipl / cpl:.3f}")  # fmt: skip
    if not ipcs:
        raise SystemExit("no UnixBench loops (@@LOOP) in the guest log")
    ipc = sum(ipcs.values()) / len(ipcs)
    print(f"  kernel-path IPC: {ipc:.3f} (mean of {len(ipcs)})")
    return ipcs, ipc


def board_cycles(sides: Sequence[tuple[float, float]], ipc: float) -> list[float]:
    """Board cycles of each side of a packet's trip, given as (instructions of kernel and
    program code, taken at `ipc`; instructions of scalar crypto code, at SCALAR_IPC)."""
    return [code / ipc + crypto / SCALAR_IPC for code, crypto in sides]


def pps_range(sides: Sequence[tuple[float, float]], ipcs: dict[str, float]) -> tuple[int, ...]:
    """Packets/s of one board core, its slower side's, at each anchor's IPC (lowest first)."""
    return tuple(round(CLOCK / max(board_cycles(sides, x))) for x in sorted(ipcs.values()))
