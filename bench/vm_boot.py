#!/usr/bin/env python3
"""Median boot-to-ready time of the full-kernel lab VM (goal under TCG: < 10 s).

    sudo .venv/bin/python bench/vm_boot.py [--n 3] [--accel tcg|kvm] [--mem 2048] [--cpus 2]

"Ready" is the agent's first message (QEMU start to agent up, as boot() measures it); the time to
the first command's answer, the round trip of a trivial command (`true`, median of 10) and the
time to a complete shutdown are reported too. Also prints the host's
load average before each boot: on a shared 2-core host, other work inflates TCG boots a lot.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab.substrate.vm import boot, find_kernel, probe_accel


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=3)
    ap.add_argument("--accel", choices=["kvm", "tcg"], default=None)
    ap.add_argument("--mem", type=int, default=2048)
    ap.add_argument("--cpus", type=int, default=2)
    a = ap.parse_args()
    kernel = find_kernel()
    accel = a.accel or probe_accel(kernel=kernel)
    rows = []
    for i in range(a.n):
        load = os.getloadavg()[0]
        with tempfile.TemporaryDirectory(prefix="lab-vm-bench-") as d:
            t0 = time.monotonic()
            vm = boot(Path(d) / "vm", accel=accel, mem_mb=a.mem, cpus=a.cpus)
            t_ready = time.monotonic() - t0
            vm.run(["uname", "-r"])
            t_cmd = time.monotonic() - t0
            rtts = []
            for _ in range(10):
                t = time.monotonic()
                vm.run(["true"])
                rtts.append(time.monotonic() - t)
            t_rtt = statistics.median(rtts)
            t1 = time.monotonic()
            vm.shutdown()
            t_down = time.monotonic() - t1
        rows.append({"ready_s": t_ready, "first_command_s": t_cmd, "command_roundtrip_s": t_rtt,
                     "shutdown_s": t_down, "load1_before": load})  # fmt: skip
        print(f"boot {i + 1}/{a.n}: ready {t_ready:.2f} s, first command {t_cmd:.2f} s, "
              f"`true` round trip {t_rtt * 1000:.0f} ms, shutdown {t_down:.2f} s "
              f"(load {load:.2f})", file=sys.stderr)  # fmt: skip
    med = {k: round(statistics.median(r[k] for r in rows), 2) for k in rows[0]}
    print(json.dumps({"kernel": kernel.release, "accel": accel, "cpus": a.cpus, "mem_mb": a.mem,
                      "n": a.n, "median": med, "goal_ready_s": 10.0,
                      "runs": [{k: round(v, 3) for k, v in r.items()} for r in rows]}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
