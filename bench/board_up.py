#!/usr/bin/env python3
"""Median time of `lab up --boards` / `lab down` of a topology with a VPN on an emulated board
farm (goal: up < 5 s), next to the same `lab up` as namespaces here, measured in the same run.

    sudo .venv/bin/python bench/board_up.py [--n 5] [--vpn wireguard]
        [--topology topologies/pi_pair_middlebox.py]

Times the whole CLI invocation, as a user sees it. The farm is built for the run and removed
after it (a private LAB_STATE_DIR, so labs of this machine are not touched).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAB = [sys.executable, "-m", "lab.cli.main"]


def timed(argv) -> float:
    t = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, cwd=REPO)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(map(str, argv))}\n{r.stderr}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=5)
    ap.add_argument("--topology", default="topologies/pi_pair_middlebox.py")
    ap.add_argument("--vpn", default="wireguard")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="board-up-"))
    os.environ["LAB_STATE_DIR"] = str(tmp / "state")
    os.environ["LAB_RUN_DIR"] = str(tmp / "run")
    inv = tmp / "farm.toml"
    timed([*LAB, "boards", "emulate", a.topology, "--out", inv, "--id", "benchfarm"])
    try:
        b_up, b_down, l_up, l_down = [], [], [], []
        for _ in range(a.n):
            b_up.append(timed([*LAB, "up", a.topology, "--boards", inv, "--vpn", a.vpn,
                               "--id", "benchb"]))  # fmt: skip
            b_down.append(timed([*LAB, "down", "--id", "benchb"]))
            l_up.append(timed([*LAB, "up", a.topology, "--vpn", a.vpn, "--id", "benchl"]))
            l_down.append(timed([*LAB, "down", "--id", "benchl"]))
    finally:
        timed([*LAB, "boards", "emulate", "--down", "--id", "benchfarm"])
    m = {k: statistics.median(v) for k, v in
         (("bup", b_up), ("bdown", b_down), ("lup", l_up), ("ldown", l_down))}  # fmt: skip
    print(f"{a.topology} with {a.vpn}, {a.n} cycles each")
    print(f"boards up   median {m['bup']:.2f} s (min {min(b_up):.2f}, max {max(b_up):.2f})  "
          f"goal < 5 s: {'ok' if m['bup'] < 5 else 'MISSED'}")  # fmt: skip
    print(f"boards down median {m['bdown']:.2f} s (min {min(b_down):.2f}, max {max(b_down):.2f})")
    print(f"local  up   median {m['lup']:.2f} s, down {m['ldown']:.2f} s")
    print(f"ratio boards/local: up {m['bup'] / m['lup']:.1f}x, down {m['bdown'] / m['ldown']:.1f}x")


if __name__ == "__main__":
    main()
