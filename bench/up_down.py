#!/usr/bin/env python3
"""Median time of N `lab up` / `lab down` cycles of a topology (goal: up < 1 s, down < 1 s).

    sudo .venv/bin/python bench/up_down.py [--n 10] [--topology topologies/pi_pair_middlebox.py]

Times the whole CLI invocation (Python start-up included), as a user sees it.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def timed(argv):
    t = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, cwd=REPO)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(argv)}\n{r.stderr}")
    return dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--topology", default="topologies/pi_pair_middlebox.py")
    ap.add_argument("--id", default="benchud")
    a = ap.parse_args()
    lab = [sys.executable, "-m", "lab.cli.main"]
    ups, downs = [], []
    for _ in range(a.n):
        ups.append(timed([*lab, "up", a.topology, "--id", a.id]))
        downs.append(timed([*lab, "down", "--id", a.id]))
    mu, md = statistics.median(ups), statistics.median(downs)
    print(f"topology {a.topology}, {a.n} cycles")
    print(
        f"up   median {mu:.3f} s  (min {min(ups):.3f}, max {max(ups):.3f})  goal < 1 s: "
        f"{'ok' if mu < 1 else 'MISSED'}"
    )
    print(
        f"down median {md:.3f} s  (min {min(downs):.3f}, max {max(downs):.3f})  goal < 1 s: "
        f"{'ok' if md < 1 else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
