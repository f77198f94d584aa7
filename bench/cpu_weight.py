#!/usr/bin/env python3
"""What the lab's CPU weight buys a capped node while the host is busy (docs/cpu.md "The lab's
CPU weight"): two node-like groups under the lab's cgroup parent, each capped at the quota a pi4
node gets on this machine and running one busy thread, beside as many busy processes of the
host's own (nice 0, the caller's cgroup) as it has cores. Per round, alternated: the share of
their quota the two groups got over SECONDS with the default weight and with
lab.core.cgroups.WEIGHT_FACTOR; then the same alone (no host load) as the reference.

    sudo .venv/bin/python bench/cpu_weight.py [--seconds 5] [--rounds 3] [--quota 0.9]

A bench, not a test: the figures move with the host's other work. Nothing is left behind: the
groups are removed and the shared parent's weight is put back as it was.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.core import cgroups  # noqa: E402

BUSY = [sys.executable, "-c", "while True: pass"]


def _round(layout, rels, quota, seconds, factor, hogs) -> float:
    for r in rels:
        cgroups.set_weight(layout, r, factor)
    cgroups.set_weight(layout, "lab", factor)
    procs, hog = [], []
    try:
        for r in rels:
            files = cgroups.procs_files(layout, r)
            procs.append(subprocess.Popen(BUSY, preexec_fn=lambda f=files: cgroups.join(f)))
        hog = [subprocess.Popen(BUSY) for _ in range(hogs)]
        time.sleep(0.5)  # everyone running
        u0 = sum(cgroups.usage(layout, r)["total"] for r in rels)
        t0 = time.monotonic()
        time.sleep(seconds)
        used = sum(cgroups.usage(layout, r)["total"] for r in rels) - u0
        return used / (quota * len(rels) * (time.monotonic() - t0))
    finally:
        for p in procs + hog:
            p.kill()
            p.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quota", type=float, default=0.9, help="host cores per group (pi4 here)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/cpu_weight.py: needs root (cgroups)")
    layout = cgroups.probe()
    cores = os.cpu_count() or 1
    existed = cgroups.cpu_dir(layout, "lab").is_dir()
    cgroups.ensure_dir(layout, "lab")
    before = cgroups.weight(layout, "lab")
    rels = [f"lab/bench-weight-{os.getpid()}-{i}" for i in range(2)]
    rows: dict[str, list[float]] = {
        "alone": [],
        "busy host, default": [],
        "busy host, weighted": [],
    }
    try:
        for r in rels:
            cgroups.ensure_dir(layout, r)
            cgroups.set_cpu(layout, r, a.quota, cgroups.all_cpus(layout), period_us=10_000)
        for i in range(a.rounds):
            order = [1, cgroups.WEIGHT_FACTOR][:: 1 if i % 2 == 0 else -1]
            for f in order:
                key = "busy host, weighted" if f > 1 else "busy host, default"
                rows[key].append(_round(layout, rels, a.quota, a.seconds, f, cores))
            rows["alone"].append(_round(layout, rels, a.quota, a.seconds, 1, 0))
    finally:
        for r in rels:
            cgroups.remove_dir(layout, r)
        if existed and before is not None:
            cgroups.set_weight(layout, "lab", before)
        elif not existed:
            cgroups.remove_dir(layout, "lab")
    print(
        f"cgroup v{layout.version}, {cores} host cores, 2 groups x {a.quota} cores (10 ms "
        f"period), {cores} busy host processes, {a.rounds} rounds x {a.seconds} s, weight "
        f"factor {cgroups.WEIGHT_FACTOR}"
    )
    for k, v in rows.items():
        print(f"  {k:22s} share of quota used: " + ", ".join(f"{x:.3f}" for x in v))
    ref = sum(rows["alone"]) / len(rows["alone"])
    for k in ("busy host, default", "busy host, weighted"):
        m = sum(rows[k]) / len(rows[k])
        print(f"  {k:22s} / alone: {m / ref:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
