"""`lab calibrate`'s per-packet rows: the kernel work a userspace data plane does per packet
(entries into the kernel and small copies: read(TUN), sendto, recvfrom, write(TUN)), measured
here and compared with the board's published figure under the fitted core_share.

core_share is fitted on masked crypto only, so everything else a capped node runs is priced at
the crypto ratio. The board's memory system, caches and kernel entry are slower relative to its
NEON crypto than this host's are relative to its masked crypto, so a capped node may do its
per-packet work faster than the board: this module says by how much. The loops are UnixBench's
(the Pi 4 figures published with them: [reference.unixbench-*] in the profile), run here by
tools/unixloops with the node's environment, single-threaded, in interleaved rounds, keeping
the best rate per CPU second of the loop's own process (what a quota hands out, as for crypto).

They are never fitted: core_share stays the crypto fit. Each row's `residual` is
core_share x host rate / board figure - 1 (+0.5: a capped node does that work 1.5x as fast as
the board); with verification the loop runs again in a throwaway cgroup `lab/calib-pkt-<pid>`
capped at core_share (removed afterwards), and `capped_vs_board` is its rate per elapsed
second against the board's. docs/cpu.md "Per-packet work".
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass

from lab import REPO
from lab.core import cgroups, proc
from lab.core.errors import CommandError, ConfigError
from lab.model.cpuprofile import PRIMITIVES, CpuProfile
from lab.model.dilation import cfs_period_us

#: PRIMITIVES' tool kind of the per-packet loops
TOOL = "syscall"
UNIXLOOPS = REPO / "tools" / "unixloops" / "unixloops"
#: bytes one loop moves through the kernel (written, and read back), for a figure in MB/s
BYTES_PER_LOOP = {"pipe": 512, "syscall": 0}
#: a capped run that got less CPU per elapsed second than this share of its quota was held back
#: by other work on the host (as calibrate.verify_in_cgroup)
CONTENDED = 0.85


@dataclass
class LoopRun:
    primitive: str
    loops: int
    elapsed_s: float
    cpu_s: float

    @property
    def cpu_rate(self) -> float:
        """Loops per CPU second of the loop's process."""
        return self.loops / self.cpu_s if self.cpu_s > 0 else 0.0

    @property
    def elapsed_rate(self) -> float:
        return self.loops / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(cpu_rate=round(self.cpu_rate, 1), elapsed_rate=round(self.elapsed_rate, 1))
        return d


def primitives() -> list[str]:
    """Every per-packet primitive (measured whether or not the profile has a figure for it)."""
    return [p for p, d in PRIMITIVES.items() if d["tool"] == TOOL]


def missing() -> str | None:
    """Why the loops cannot run here, or None."""
    if not os.access(UNIXLOOPS, os.X_OK):
        return f"{UNIXLOOPS} is not built; ./setup.sh builds it (make -C tools/unixloops)"
    return None


def parse(text: str, primitive: str) -> LoopRun:
    """tools/unixloops' JSON line -> LoopRun; ValueError if it is not one for this loop."""
    d = json.loads(text.strip().splitlines()[-1])
    if d.get("loop") != PRIMITIVES[primitive]["loop"]:
        raise ValueError(f"ran loop {d.get('loop')!r}, wanted {PRIMITIVES[primitive]['loop']!r}")
    return LoopRun(primitive, int(d["loops"]), float(d["elapsed_s"]), float(d["cpu_s"]))


def run_loop(primitive: str, env: dict[str, str], seconds: int, preexec=None) -> LoopRun:
    argv = [str(UNIXLOOPS), PRIMITIVES[primitive]["loop"], str(seconds)]
    cp = proc.run(argv, env=env, timeout=seconds * 10 + 30, preexec=preexec, where="calibrate")
    try:
        return parse(cp.stdout, primitive)
    except (ValueError, KeyError, IndexError):
        raise CommandError(
            argv, cp.returncode, "unexpected output:\n" + cp.stdout, where="calibrate"
        )


def in_unit(loops_per_s: float, primitive: str, unit: str, src: str = "") -> float:
    """A rate in loops/s in a reference's unit (loops/s, or MB/s for a loop that moves bytes)."""
    if unit == "loops/s":
        return loops_per_s
    per_loop = BYTES_PER_LOOP[PRIMITIVES[primitive]["loop"]]
    if not per_loop:
        raise ConfigError(
            f"{primitive} moves no bytes: its figure must be in loops/s",
            source=src,
            field=f"reference.{primitive}.unit",
        )
    return loops_per_s * per_loop / 1e6


def rows(
    prof: CpuProfile, share: float, best: dict[str, LoopRun], capped: dict[str, LoopRun]
) -> list[dict]:
    """One row per measured loop: this host's rate, the board's figure, the rate core_share
    predicts for the board and its residual, and (if `capped` has it) the rate a group capped at
    core_share delivered per elapsed second against the board's figure."""
    out = []
    for p, run in best.items():
        ref = prof.references.get(p)
        unit = ref.unit if ref else "loops/s"
        host = in_unit(run.cpu_rate, p, unit, prof.path)
        row = {
            "primitive": p,
            "loop": PRIMITIVES[p]["loop"],
            "unit": unit,
            "host_per_cpu_s": round(host, 1),
            "predicted_board": round(share * host, 1),
            "board": ref.mbps if ref else None,
            "residual": round(share * host / ref.mbps - 1, 4) if ref else None,
            "confidence": ref.confidence if ref else None,
            "source": ref.source if ref else None,
        }
        c = capped.get(p)
        if c is not None:
            rate = in_unit(c.elapsed_rate, p, unit, prof.path)
            row["capped"] = round(rate, 1)
            row["capped_vs_board"] = round(rate / ref.mbps - 1, 4) if ref else None
            row["cpu_per_elapsed"] = round(c.cpu_s / c.elapsed_s, 3) if c.elapsed_s else None
            row["contended"] = bool(c.elapsed_s and c.cpu_s / c.elapsed_s < CONTENDED * share)
        out.append(row)
    return out


def run_capped(
    share: float, env: dict[str, str], prims: list[str], seconds: int, say: Callable[[str], None]
) -> tuple[dict[str, LoopRun], dict]:
    """Each loop once in a throwaway cgroup lab/calib-pkt-<pid> capped at `share` host cores
    (the CFS period a lab's node would get), removed in `finally`; (runs, where/left over)."""
    layout = cgroups.probe()
    rel = f"lab/calib-pkt-{os.getpid()}"
    where = {"cgroup_version": layout.version, "cgroup": rel, "quota_cores": round(share, 4)}
    runs: dict[str, LoopRun] = {}
    try:
        cgroups.ensure_dir(layout, "lab")  # shared parent of every lab; left in place
        cgroups.ensure_dir(layout, rel)
        cgroups.weigh_lab(layout, "lab", rel, capped=True)  # as a capped lab's
        where["period_us"] = period = cfs_period_us(1.0, min_share=share)
        cgroups.set_cpu(layout, rel, share, cgroups.all_cpus(layout), period_us=period)
        files = cgroups.procs_files(layout, rel)
        for p in prims:
            runs[p] = run_loop(p, env, seconds, preexec=lambda: cgroups.join(files))
            say(f"capped {p}: {runs[p].elapsed_rate:.0f} loops per elapsed second")
    finally:
        where["left_over"] = cgroups.remove_dir(layout, rel)
    return runs, where


def measure(
    prof: CpuProfile,
    env: dict[str, str],
    share: float,
    rounds: int,
    seconds: int,
    verify_seconds: int,
    say: Callable[[str], None],
) -> dict:
    """The calibration record's `per_packet`: every loop in interleaved rounds (best rate per
    CPU second), and with verify_seconds > 0 once more capped at `share`."""
    prims = primitives()
    why = missing()
    if why:
        return {"skipped": why, "rows": []}
    runs: dict[str, list[LoopRun]] = {p: [] for p in prims}
    for i in range(rounds):
        for p in prims:
            runs[p].append(run_loop(p, env, seconds))
            say(f"round {i + 1}/{rounds} {p}: {runs[p][-1].cpu_rate:.0f} loops per CPU second")
    best = {p: max(ms, key=lambda m: m.cpu_rate) for p, ms in runs.items()}
    capped, where = (
        run_capped(share, env, prims, verify_seconds, say) if verify_seconds else ({}, None)
    )
    return {
        "method": (
            f"tools/unixloops LOOP {seconds} (UnixBench's loops), {rounds} interleaved round(s), "
            "best rate per CPU second of the loop's process; residual = core_share x host rate / "
            "board figure - 1, not fitted"
        ),
        "rounds": {p: [m.as_dict() for m in ms] for p, ms in runs.items()},
        "rows": rows(prof, share, best, capped),
        "verification": where,
    }
