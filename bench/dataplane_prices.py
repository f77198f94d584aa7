#!/usr/bin/env python3
"""The kernel data planes' prices, with and without the board kernel's packet path.

    .venv/bin/python bench/dataplane_prices.py [--profile pi4]

Reads the profile and this machine's calibration (`lab calibrate PROFILE`, full mode: the
stand-ins' whole-process rates) and prints, per kernel data plane a stand-in imitates, what
lab.model.boardkernel.plan makes of it twice: "before", the stand-in's own packet path priced at
a board core's speed (the profile's `[kernel.dataplane.NAME.path]` left out), and "after", the
board kernel's counted path (bench/kernel_dataplane.py). Columns: the share of a host core each
group gets, and the board data plane's predicted rate, one group (one board core) and all of
them (4 for kernel WireGuard's per-CPU workers). Where a tunnel is CPU-bound in its data plane
its lab figure moves with the share: the ratio after / before is printed too. Nothing runs; no
root needed.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab.model import boardkernel  # noqa: E402
from lab.model.boardkernel import DataPlaneCpu  # noqa: E402
from lab.model.cpuprofile import load_cpu_profile  # noqa: E402

STAND_INS = {"xfrm-esp": "charon", "wireguard": "wireguard-go"}


def without_paths(prof):
    """The same profile with no board packet path (the model before it)."""
    dps = {k: dataclasses.replace(v, path=None) for k, v in (prof.kernel.dataplanes or {}).items()}
    return dataclasses.replace(prof, kernel=dataclasses.replace(prof.kernel, dataplanes=dps))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="pi4")
    a = ap.parse_args()
    prof = load_cpu_profile(a.profile)
    if not prof.calibrated or not (prof.calibration or {}).get("process_mbps"):
        raise SystemExit(
            f"no full calibration of {a.profile} here: `sudo lab calibrate {a.profile}`"
        )
    if prof.kernel is None:
        raise SystemExit(f"profile {a.profile} states no [kernel] data planes")
    before_prof = without_paths(prof)
    cores = int(prof.emulated_cores)
    print(f"profile {prof.name}, kernel {prof.kernel.version} {prof.kernel.arch}, "
          f"core_share {prof.core_share:.4f} (calibrated {prof.calibration.get('created')})")  # fmt: skip
    print(f"{'data plane':28s} {'groups':>6s} {'share before':>12s} {'after':>8s} "
          f"{'board MB/s/core before':>22s} {'after':>7s} {'Mbit/s all groups before':>24s} "
          f"{'after':>7s} {'lab x':>6s}")  # fmt: skip
    for name, kdp in prof.kernel.dataplanes.items():
        daemon = STAND_INS.get(name)
        if not daemon:
            continue
        for prim in kdp.crypto:
            dp = DataPlaneCpu(daemon, prim, f"kernel:{name}")
            b = boardkernel.plan(before_prof, dp, cores=cores)
            r = boardkernel.plan(prof, dp, cores=cores)
            pb, pa = b.get("board_mbps_predicted"), r.get("board_mbps_predicted")
            g = r["groups"]
            print(f"{name + ' ' + prim:28s} {g:6d} {b['share']:12.4f} {r['share']:8.4f} "
                  f"{pb or 0:22.2f} {pa or 0:7.2f} {(pb or 0) * 8 * g:24.1f} {(pa or 0) * 8 * g:7.1f} "
                  f"{r['share'] / b['share']:6.2f}")  # fmt: skip
            if r.get("why"):
                print(f"    ({r['why']})")


if __name__ == "__main__":
    main()
