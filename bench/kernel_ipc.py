#!/usr/bin/env python3
"""Does a code class's IPC carry over to the board kernel's routines the profile prices with it?

    .venv/bin/python bench/kernel_ipc.py [--json FILE]    (fetches as bench/kernel_crypto.py)

cpu_profiles/pi4.toml prices the board kernel's crypto as instructions per byte (counted under
qemu by bench/kernel_crypto.py) over an IPC per code class, fitted on published Pi 4 figures of
a few routines of that class: "scalar" (2.26) on the kernel's aes-arm and OpenSSL's aes-armv4,
"neon" (1.18) on the kernel's bit-sliced AES (aes-arm-bs) and OpenSSL's bit-sliced AES + NEON
GHASH. Other routines are priced at their class's IPC without a figure of their own:
ghash-generic's table walk (the larger half of the kernel's AES-GCM), chacha20-arm and
poly1305-arm (ESP's ChaCha20 in softirq), chacha20-neon and poly1305-neon (kernel WireGuard).

No Pi 4 is at hand to time them, but LLVM has a cycle model of its core: llvm-mca's scheduling
model for the Cortex-A57, which LLVM uses for the Cortex-A72 too (same pipelines: 3-wide
decode, one load and one store pipe, two integer, two FP/NEON). This bench takes the hot loop
of each routine from the same binaries bench/kernel_crypto.py counts (Debian 11's 5.10 armmp
modules; Debian 12's armhf libcrypto, Thumb-2), runs llvm-mca -mcpu=cortex-a72 on it, and
prints the model's IPC per loop, per class the anchors' mean, and each priced routine's IPC
relative to its class's anchors. The relative figure is the point: the model leaves out what
the fitted class IPC already holds (cache misses, branch mispredictions, the rest of the
routine), so the board IPC a routine would have is taken as class IPC x (its model IPC / its
anchors' model IPC), and the effect on the profile's figure is printed with it.

The loop of a routine is its innermost backward branch with the largest body (the round loop of
an AES, the block loop of a MAC). Assumptions: L1 hits throughout (ghash-generic's 4 KiB table
and aes-arm's 1 KiB tables fit the A72's 32 KiB L1D); llvm-mca's model is the A57's; a loop's
IPC stands for its routine (the loops hold 90-99 % of the counted instructions at 1420-byte
messages). Needs arm-linux-gnueabihf-objdump (binutils-arm-linux-gnueabihf) and llvm-mca
(llvm-14), both in setup.sh. docs/cpu.md "The class IPC, checked per routine" has the results.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import kernel_crypto  # noqa: E402

#: the class IPCs cpu_profiles/pi4.toml uses (fitted by bench/kernel_crypto.py)
CLASS_IPC = {"scalar": 2.26, "neon": 1.18}
BRANCH = re.compile(r"b(ne|eq|cc|cs|hi|ls|ge|lt|gt|le|pl|mi|lo|hs)?(\.[wn])?")


@dataclass(frozen=True)
class Routine:
    name: str  # the key PRIMITIVES names it by
    what: str
    cls: str  # "scalar" or "neon"
    #: the IPC bench/kernel_crypto.py fitted on this routine's published figures (docs/cpu.md
    #: "The board kernel's crypto": the anchors' table); None: not an anchor
    fitted: float | None
    file: str  # under the kernel's module tree (lib/modules/RELEASE) or, "usr/...", Debian 12's
    symbol: str
    thumb: bool = False
    follow_call: bool = False  # the exported symbol is a wrapper: its first bl is the routine
    #: bytes one pass of its hot loop processes, where its instructions per byte are taken from
    #: the loop (one 64-byte ChaCha block with its 20 rounds unrolled, one 16-byte Poly1305 block)
    loop_bytes: int | None = None

    @property
    def label(self) -> str:
        return f"{self.name} ({self.what})"


ROUTINES = (
    Routine("aes-arm", "kernel cbc(aes-arm) anchors", "scalar", 2.27,
            "kernel/arch/arm/crypto/aes-arm.ko", "__aes_arm_encrypt"),
    Routine("aes-armv4", "OpenSSL aes-256-cbc anchor", "scalar", 2.23,
            "usr/lib/arm-linux-gnueabihf/libcrypto.so.3", "AES_encrypt", thumb=True,
            follow_call=True),
    Routine("aes-arm-bs", "kernel xts/cbc-aes-neonbs anchors", "neon", 1.17,
            "kernel/arch/arm/crypto/aes-arm-bs.ko", "SRM0"),
    Routine("ghash-generic", "gf128mul_4k_lle, kernel AES-GCM", "scalar", None,
            "kernel/crypto/gf128mul.ko", "gf128mul_4k_lle"),
    Routine("chacha20-arm", "ESP ChaCha20 in softirq", "scalar", None,
            "kernel/arch/arm/crypto/chacha-neon.ko", "chacha_doarm", loop_bytes=64),
    Routine("poly1305-arm", "ESP ChaCha20 in softirq", "scalar", None,
            "kernel/arch/arm/crypto/poly1305-arm.ko", "poly1305_blocks_arm", loop_bytes=16),
    Routine("chacha20-neon", "kernel WireGuard", "neon", None,
            "kernel/arch/arm/crypto/chacha-neon.ko", "chacha_4block_xor_neon"),
    Routine("poly1305-neon", "kernel WireGuard", "neon", None,
            "kernel/arch/arm/crypto/poly1305-arm.ko", "poly1305_blocks_neon"),
)  # fmt: skip

#: the profile's primitives as instructions per byte at 1420 B (bench/kernel_crypto.py's counts,
#: cpu_profiles/pi4.toml): (routine name or class, instructions/byte; None: the routine's loop
#: instructions over its loop_bytes). A routine's part runs at its board IPC where the model is
#: used for its class (APPLIED), else at its class's. A class's entry, last, is the primitive's
#: whole count: its part is what the routines before it leave.
PRIMITIVES = {
    # 55.4 and 62.1 instructions/byte in all: ghash-generic's 32.3, the rest ctr-aes-neonbs (NEON)
    "kernel-gcm-aes-128": (("ghash-generic", 32.3), ("neon", 55.4)),
    "kernel-gcm-aes-256": (("ghash-generic", 32.3), ("neon", 62.1)),
    # rfc7539esp in the NET_RX softirq: 18.5 instructions/byte in all, the rest its glue
    "kernel-esp-chacha20-poly1305": (
        ("chacha20-arm", None),
        ("poly1305-arm", None),
        ("scalar", 18.5),
    ),
    "kernel-chacha20-poly1305": (("chacha20-neon", 6.08), ("poly1305-neon", 2.21)),
}
#: the classes whose routines get the model's relative IPC. Not NEON: there the model's relative
#: figure for poly1305-neon (0.86 of aes-arm-bs) contradicts the published NEON Poly1305 figures
#: (poly1305-armv4.pl's header: 1.25 cycles/byte on a Cortex-A15, which the model's own 1.0 on the
#: A72 agrees with), because the model overrates the bit-sliced AES anchor itself (model / fitted
#: 1.6 against 1.1-1.2 for the scalar anchors)
APPLIED = {"scalar"}
MHZ = 1500

INSN = re.compile(r"\s*([0-9a-f]+):\s+(\S+)\s*(.*)")


@functools.cache
def disassemble(path: Path, start: int | None = None, stop: int | None = None) -> str:
    """objdump's disassembly (once per file and range: two routines share a module)."""
    argv = ["arm-linux-gnueabihf-objdump", "-d", "--no-show-raw-insn", str(path)]
    if start is not None:
        argv += [f"--start-address={start:#x}", f"--stop-address={stop:#x}"]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def instructions(text: str, symbol: str | None) -> list[tuple[int, str, str]]:
    """(address, mnemonic, operands) of `symbol` in objdump's output (all of it: None)."""
    out, inside = [], symbol is None
    for line in text.splitlines():
        if symbol is not None and re.search(rf"<{re.escape(symbol)}(@@\S+)?>:$", line):
            inside = True
            continue
        if inside and symbol is not None and not line.strip():
            break
        m = INSN.match(line)
        if inside and m and not m[2].startswith("."):
            out.append((int(m[1], 16), m[2], m[3].split("@")[0].split(";")[0].strip()))
    return out


def symbol_address(path: Path, symbol: str) -> int:
    text = subprocess.run(["arm-linux-gnueabihf-objdump", "-T", str(path)], capture_output=True,
                          text=True, check=True).stdout  # fmt: skip
    for line in text.splitlines():
        if line.split()[-1:] == [symbol]:
            return int(line.split()[0], 16) & ~1
    raise SystemExit(f"{path}: no dynamic symbol {symbol}")


def routine_code(root: Path, r: Routine) -> list[tuple[int, str, str]]:
    path = root / r.file
    if not r.follow_call:
        ins = instructions(disassemble(path), r.symbol)
        if not ins:
            raise SystemExit(f"{path}: no symbol {r.symbol}")
        return ins
    at = symbol_address(path, r.symbol)
    wrapper = instructions(disassemble(path, at, at + 0x100), None)
    target = next(int(a.split()[0], 16) for _, op, a in wrapper if op == "bl")
    # the called routine runs to the next return; its loop lies before that
    body = instructions(disassemble(path, target, target + 0x1000), None)
    end = next(a for a, op, args in body if op.startswith("ldm") and "pc" in args)
    return [i for i in body if i[0] <= end]


def hot_loop(ins: list[tuple[int, str, str]]) -> list[str]:
    """The body of the innermost backward-branch loop with the most instructions."""
    lo = ins[0][0]
    loops = []
    for addr, op, args in ins:
        m = re.match(r"([0-9a-f]+)", args)
        if BRANCH.fullmatch(op) and m and lo <= int(m[1], 16) < addr:
            loops.append((int(m[1], 16), addr))
    inner = [
        (s, e)
        for s, e in loops
        if not any((s2, e2) != (s, e) and s <= s2 and e2 <= e for s2, e2 in loops)
    ]
    if not inner:
        raise SystemExit("no loop found")
    s, e = max(inner, key=lambda se: sum(1 for a, _, _ in ins if se[0] <= a <= se[1]))
    return [f"{op} {args}".strip() for a, op, args in ins if s <= a <= e]


def llvm_syntax(line: str) -> str:
    """objdump's spelling -> LLVM's assembler's: alignment hints without the space, Thumb-2's
    width suffixes left to the assembler (objdump writes .w on encodings LLVM spells bare)."""
    line = re.sub(r"^(\S+?)\.[wn](?=\s|$)", r"\1", line)
    if BRANCH.fullmatch(line.split()[0]):  # a branch's target: here, as llvm-mca ignores it
        return line.split()[0] + " ."
    return re.sub(r"\s+:(\d+)\]", r":\1]", line)


def mca(lines: list[str], thumb: bool, tool: str) -> dict[str, float]:
    triple = "thumbv7a-linux-gnueabihf" if thumb else "armv7a-linux-gnueabihf"
    src = "\n".join(llvm_syntax(x) for x in lines) + "\n"
    cp = subprocess.run([tool, f"-mtriple={triple}", "-mcpu=cortex-a72", "-iterations=1000"],
                        input=src, capture_output=True, text=True)  # fmt: skip
    if cp.returncode != 0:
        raise SystemExit(f"llvm-mca failed: {cp.stderr.strip()[:600]}")
    get = lambda k: float(re.search(rf"^{k}:\s+([\d.]+)", cp.stdout, re.M)[1])  # noqa: E731
    return {"instructions": get("Instructions") / 1000, "cycles": get("Total Cycles") / 1000,
            "ipc": get("IPC")}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, help="write the results here too")
    a = ap.parse_args()
    tool = shutil.which("llvm-mca") or shutil.which("llvm-mca-14")
    for need, pkg in ((tool, "llvm-14"),
                      (shutil.which("arm-linux-gnueabihf-objdump"), "binutils-arm-linux-gnueabihf")):  # fmt: skip
        if not need:
            raise SystemExit(f"needs {pkg} (./setup.sh installs it)")
    kroot, uroot, release = kernel_crypto.fetch(kernel_crypto.ARCHES["armhf"])
    roots = {"kernel": kroot / "lib" / "modules" / release, "usr": uroot}  # usr/... under uroot
    rows = []
    for r in ROUTINES:
        root = roots["usr"] if r.file.startswith("usr/") else roots["kernel"]
        loop = hot_loop(routine_code(root, r))
        rows.append({"routine": r, **mca(loop, r.thumb, tool)})
    print(f"llvm-mca -mcpu=cortex-a72 ({tool}); Debian 11 {release} modules, Debian 12 libcrypto")
    print(
        f"{'routine':52} {'class':6} {'insns':>6} {'cycles':>7} {'IPC':>5} {'rel':>5} {'board IPC':>9}"
    )
    anchors = {
        c: sum(x["ipc"] for x in rows if x["routine"].cls == c and x["routine"].fitted)
        / sum(1 for x in rows if x["routine"].cls == c and x["routine"].fitted)
        for c in CLASS_IPC
    }
    out = []
    board = {}
    for x in rows:
        r = x["routine"]
        rel = x["ipc"] / anchors[r.cls]
        board[r.name] = CLASS_IPC[r.cls] * rel if r.cls in APPLIED else None
        tag = (f" (anchor: fitted {r.fitted}, model / fitted {x['ipc'] / r.fitted:.2f})"
               if r.fitted else "" if r.cls in APPLIED else " (not applied: NEON)")  # fmt: skip
        print(f"{r.label:52} {r.cls:6} {x['instructions']:6.0f} {x['cycles']:7.1f} "
              f"{x['ipc']:5.2f} {rel:5.2f} {CLASS_IPC[r.cls] * rel:9.2f}{tag}")  # fmt: skip
        out.append({"routine": r.label, "class": r.cls, "fitted_ipc": r.fitted,
                    "loop_instructions": x["instructions"], "loop_cycles": x["cycles"],
                    "mca_ipc": x["ipc"], "relative": round(rel, 3),
                    "board_ipc": round(CLASS_IPC[r.cls] * rel, 3)})  # fmt: skip
    by_name = {x["routine"].name: x for x in rows}
    prims = {}
    print(f"\n{'primitive':30} {'cycles/B':>8} {'MB/s':>6}   at the class IPC alone")
    for name, parts in PRIMITIVES.items():
        cyc = cls_cyc = counted = 0.0
        for what, ipb in parts:
            if what in CLASS_IPC:  # the rest of the primitive's count, at the class's IPC
                cls, ipb, ipc = what, ipb - counted, CLASS_IPC[what]
            else:
                x = by_name[what]
                cls = x["routine"].cls
                if ipb is None:
                    ipb = x["instructions"] / x["routine"].loop_bytes
                ipc = board[what] or CLASS_IPC[cls]
            counted += ipb
            cls_cyc += ipb / CLASS_IPC[cls]
            cyc += ipb / ipc
        prims[name] = {"cycles_per_byte": round(cyc, 2), "mbps": round(MHZ / cyc, 1),
                       "class_only_mbps": round(MHZ / cls_cyc, 1)}  # fmt: skip
        print(f"{name:30} {cyc:8.2f} {MHZ / cyc:6.1f}   {MHZ / cls_cyc:6.1f}")
    print("class anchors' mean model IPC: " + ", ".join(f"{c} {v:.2f}" for c, v in anchors.items()))
    if a.json:
        a.json.write_text(json.dumps({"release": release, "anchors": anchors, "rows": out, "primitives": prims},
                                     indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
