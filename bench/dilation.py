#!/usr/bin/env python3
"""A time-dilated run next to an undilated one where both fit this machine (issue 16).

    sudo .venv/bin/python bench/dilation.py [--factor 2] [--cores 2] [--duration 5] [--reps 2]
                                            [--profiles a,b] [--out DIR] [--reread DIR]

Runs the same small plan through the lab's own CLI (`lab run`) twice per VPN profile, once
undilated and once with `-o topology.dilation=FACTOR`, alternating which goes first from one
profile to the next so that a drift of this machine's load falls on both alike. The plan:
topologies/pi_pair.py, both nodes a Pi 4 limited to `--cores` emulated cores (a copy of
cpu_profiles/pi4.toml with that `emulated_cores`, using this machine's pi4 calibration), so the
undilated lab fits this 2-core machine without scaling; iperf3 TCP, UDP 400 Mbit/s x 1300 B
(study A's), ping; without impairment and under study A's "network1" (40 ms +- 5 ms, 0.5 %
loss). It prints, per profile, test and metric, the undilated mean, the dilated mean (scaled
back by the lab) and their ratio dilated / undilated; 1.0 means the dilated run reproduced the
undilated one. `--reread DIR` prints the table again from an earlier output directory.

Figures move with this host's load (shared by other work; 10-30 % between runs here): they are
bench output, never a test's assertion. About 12 minutes with the defaults.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAB = REPO / ".venv" / "bin" / "lab"
PROFILES = ["baseline", "wireguard", "ipsec-chacha20poly1305", "openvpn-aes256cbc-static"]
CAL = Path("/var/lib/lab/calibration")
#: (test label, metric, scale to the printed unit, unit)
FIGURES = [
    ("tcp", "throughput_bps", 1e-6, "Mbit/s"),
    ("udp-400m", "throughput_bps", 1e-6, "Mbit/s"),
    ("udp-400m", "loss_pct", 1.0, "%"),
    ("udp-400m", "jitter_ms", 1.0, "ms"),
    ("ping", "rtt_avg_ms", 1.0, "ms"),
]

PLAN = """schema = 1
name = "dilation"
description = "bench/dilation.py: the same cases undilated and time-dilated"
profiles = ["baseline"]
impairments = ["none", "network1"]
reps = {reps}
impaired_reps = 1
duration = {duration}

[topology]
file = "topologies/pi_pair.py"
cpu = "{cpu}"

[[tests]]
test = "tcp"

[[tests]]
test = "udp"
name = "udp-400m"
rate_mbit = 400
size = 1300

[[tests]]
test = "ping"
count = 20
interval_s = 0.1
"""


def board_profile(out: Path, cores: int) -> tuple[str, dict]:
    """A copy of the pi4 profile with `cores` emulated cores and this machine's calibration;
    returns (profile name, environment for `lab run`)."""
    name = f"pi4c{cores}"
    text = (REPO / "cpu_profiles" / "pi4.toml").read_text()
    text = re.sub(r'(?m)^name = "pi4"$', f'name = "{name}"', text)
    text = re.sub(r"(?m)^emulated_cores = .*$", f"emulated_cores = {cores}", text)
    (out / "profiles").mkdir(parents=True, exist_ok=True)
    (out / "profiles" / f"{name}.toml").write_text(text)
    (out / "calibration").mkdir(exist_ok=True)
    src = CAL / "pi4.json"
    if not src.is_file():
        raise SystemExit(
            f"no pi4 calibration on this machine ({src}): run `sudo lab calibrate pi4`"
        )
    # the same references and masks as pi4, so the calibration's fingerprint still matches
    shutil.copy(src, out / "calibration" / f"{name}.json")
    env = dict(os.environ)
    env["LAB_CPU_PROFILES"] = str(out / "profiles")
    env["LAB_CALIBRATION_DIR"] = str(out / "calibration")
    return name, env


def run(plan: Path, profile: str, factor: float, out: Path, env: dict) -> Path:
    d = out / f"{profile}-x{factor:g}"
    if (d / "summary.csv").exists():
        return d  # an earlier invocation finished it
    argv = [str(LAB), "run", str(plan), "-o", f"profiles={profile}"]
    argv += ["-o", f"topology.dilation={factor:g}", "--out", str(d)]
    t0 = time.monotonic()
    cp = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    print(
        f"  {profile} x{factor:g}: exit {cp.returncode}, {time.monotonic() - t0:.0f} s", flush=True
    )
    if cp.returncode not in (0, 1):  # 1: a case failed, the rest is still worth reading
        sys.stderr.write(cp.stderr[-3000:])
        raise SystemExit(f"lab run failed (exit {cp.returncode})")
    return d


def figures(run_dir: Path) -> dict[tuple[str, str, str], float]:
    """{(impairment, test label, metric): mean} from the run's summary.csv."""
    out = {}
    with open(run_dir / "summary.csv", newline="") as f:
        for row in csv.DictReader(f):
            if row["mean"]:
                out[(row["impairment"], row["test_label"], row["metric"])] = float(row["mean"])
    return out


def cpu_line(run_dir: Path) -> str:
    m = json.loads((run_dir / "manifest.json").read_text())
    c = (m.get("cpu") or {}).get("client") or {}
    return (
        f"dilation {m.get('dilation')}, client quota {c.get('cores', 0):.3f} host cores, "
        f"core group {c.get('slot_cores')}, board cores emulated {c.get('board_cores_emulated')}"
    )


def table(out: Path, profiles: list[str], factor: float) -> list[float]:
    ratios = []
    print(
        f"\n{'profile':26} {'condition':9} {'figure':25} {'x1':>9} {f'x{factor:g}':>9} {'ratio':>6}"
    )
    for p in profiles:
        a, b = out / f"{p}-x1", out / f"{p}-x{factor:g}"
        if not (a / "summary.csv").exists() or not (b / "summary.csv").exists():
            print(f"{p:26} (missing)")
            continue
        fa, fb = figures(a), figures(b)
        for cond in ("none", "network1"):
            for label, metric, scale, _unit in FIGURES:
                x, y = fa.get((cond, label, metric)), fb.get((cond, label, metric))
                if x is None or y is None:
                    continue
                ratio = y / x if x else None
                if ratio and metric != "loss_pct":
                    ratios.append(ratio)
                print(
                    f"{p:26} {cond:9} {label + ' ' + metric:25} {x * scale:9.3g} "
                    f"{y * scale:9.3g} {ratio if ratio is not None else float('nan'):6.2f}"
                )
        print(f"  x1: {cpu_line(a)}\n  x{factor:g}: {cpu_line(b)}")
    if ratios:
        logs = [math.log(r) for r in ratios]
        gm = math.exp(sum(logs) / len(logs))
        worst = max(ratios, key=lambda r: abs(math.log(r)))
        inside = sum(1 for r in ratios if abs(math.log(r)) <= math.log(1.15))
        print(
            f"\n{len(ratios)} figures (loss shares left out): geometric mean ratio {gm:.3f}, "
            f"worst {worst:.2f}, {inside} within 15 %"
        )
    return ratios


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--factor", type=float, default=2.0)
    ap.add_argument("--cores", type=int, default=2, help="emulated Pi 4 cores per node")
    ap.add_argument("--duration", type=float, default=5)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--profiles", default=",".join(PROFILES))
    ap.add_argument("--out", type=Path, help="output directory (default runs/dilation-<time>)")
    ap.add_argument("--reread", type=Path, help="print the table of an earlier --out directory")
    args = ap.parse_args()
    profiles = [p for p in args.profiles.split(",") if p]
    if args.reread:
        table(args.reread, profiles, args.factor)
        return 0
    if os.geteuid() != 0:
        raise SystemExit("needs root (it runs `lab run`); or pass --reread DIR")
    out = args.out or REPO / "runs" / time.strftime("dilation-%Y%m%dT%H%M%SZ", time.gmtime())
    out.mkdir(parents=True, exist_ok=True)
    name, env = board_profile(out, args.cores)
    plan = out / "plan.toml"
    plan.write_text(PLAN.format(reps=args.reps, duration=args.duration, cpu=name))
    t0 = time.monotonic()
    print(f"output {out}; load average {os.getloadavg()[0]:.1f}", flush=True)
    for i, p in enumerate(profiles):
        order = (1.0, args.factor) if i % 2 == 0 else (args.factor, 1.0)
        for f in order:
            run(plan, p, f, out, env)
    print(f"took {time.monotonic() - t0:.0f} s; load average {os.getloadavg()[0]:.1f}")
    table(out, profiles, args.factor)
    return 0


if __name__ == "__main__":
    sys.exit(main())
