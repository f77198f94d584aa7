"""A trace-driven run through WireGuard: does TCP throughput follow the trace's capacity?

    sudo .venv/bin/python bench/trace_wireguard.py [--trace cellular-walk.down] [--seconds 30]
                                                   [--bin 0.5] [--out DIR] [--profile wireguard]

Brings pi_pair_middlebox up with the VPN profile, puts the trace on server->client (the
downlink: what the VPN client, the phone, receives) with `lab impair set`, and runs iperf3 TCP
downloads (`-R`) through the tunnel for --seconds. The trace's capacity per bin is counted from
the trace itself (opportunities x 1500 bytes), lined up with iperf3's intervals through the
engine's `start_ns` (the trace's millisecond 0, CLOCK_MONOTONIC) and iperf3's start time
(CLOCK_REALTIME). Writes trace_wireguard.png/.svg (both series over time) and .csv to --out, and
prints the mean of each, their ratio and the correlation of the per-bin series.

The tunnel's packets are 1500-byte IP packets at most (WireGuard's 1420-byte MTU + 80 bytes of
outer headers), so one opportunity carries one; TCP's payload is 1368 bytes of them (about 91 %).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
LAB = [sys.executable, "-m", "lab.cli.main"]

from lab.impair.runtime import engine_client
from lab.impair.where import directions
from lab.model.impairment.trace import BYTES_PER_OPPORTUNITY, load_trace
from lab.substrate.local.lab import Lab


def lab_cli(*args: str, timeout: float = 180) -> str:
    r = subprocess.run([*LAB, *args], capture_output=True, text=True, cwd=REPO, timeout=timeout)
    if r.returncode != 0:
        sys.exit(f"failed: lab {' '.join(args)}\n{r.stderr}")
    return r.stdout


def downlink(lab: Lab):
    """(engine client, direction) of the engine direction carrying server->client."""
    st = lab.info["impair"]
    for key, w in directions(lab.spec, st).items():
        name, d = key.split(":")
        rec = next((e for e in st["engines"] if e["name"] == name), None)
        if rec is not None and w["way"] == "server->client":
            return engine_client(lab, rec), d
    sys.exit("no engine direction carries server->client")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="cellular-walk.down")
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--bin", type=float, default=0.5, help="seconds per point")
    ap.add_argument("--profile", default="wireguard")
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "trace_wireguard")
    ap.add_argument("--id", default="trwg")
    args = ap.parse_args()
    trace = load_trace(args.trace)
    args.out.mkdir(parents=True, exist_ok=True)
    up = json.loads(
        lab_cli(
            "up",
            "topologies/pi_pair_middlebox.py",
            "--id",
            args.id,
            "--vpn",
            args.profile,
            "--impair",
            "none",
            "--impair-backend",
            "userspace",
            "--json",
        )  # fmt: skip
    )
    try:
        vpn_server = up["vpn"]["traffic"]["v4"]
        lab = Lab.open(args.id)
        lab_cli("exec", "--id", args.id, "server", "--", "iperf3", "-s", "-D", "-1", "-p", "5301")
        lab_cli("impair", "set", "--id", args.id, "all", f"server->client: trace {trace.path}")
        eng, d = downlink(lab)
        deadline = time.monotonic() + 5
        while "trace" not in eng.show()[d] and time.monotonic() < deadline:
            time.sleep(0.01)
        start_ns = eng.show()[d]["trace"]["start_ns"]
        offset = time.clock_gettime_ns(time.CLOCK_REALTIME) - time.monotonic_ns()
        out = lab_cli(
            "exec", "--id", args.id, "client", "--", "iperf3", "-c", vpn_server, "-p", "5301",
            "-R", "-J", "-t", str(args.seconds), "-i", str(args.bin),
            timeout=args.seconds + 60,
        )  # fmt: skip
        shown = eng.show()[d]
    finally:
        subprocess.run([*LAB, "down", "--id", args.id], capture_output=True, cwd=REPO)
    res = json.loads(out)
    t0_ms = (res["start"]["timestamp"]["timesecs"] * 1e9 - offset - start_ns) / 1e6
    rows = []
    for iv in res["intervals"]:
        s = iv["sum"]
        a, b = t0_ms + s["start"] * 1000, t0_ms + s["end"] * 1000
        opp = trace.opportunities(int(a), int(b))
        cap = opp * BYTES_PER_OPPORTUNITY * 8 / (s["seconds"]) / 1e6
        rows.append((s["start"], s["end"], s["bits_per_second"] / 1e6, cap))
    with open(args.out / "trace_wireguard.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["start_s", "end_s", "tcp_goodput_mbit", "trace_capacity_mbit"])
        w.writerows(rows)
    got = [r[2] for r in rows[2:]]  # the first second: slow start
    cap = [r[3] for r in rows[2:]]
    corr = statistics.correlation(got, cap)
    ratio = statistics.fmean(got) / statistics.fmean(cap)
    print(f"trace {trace.path}: mean {trace.mean_bps / 1e6:.2f} Mbit/s over its period")
    print(f"{args.profile}: {len(rows)} intervals of {args.bin} s; after the first second:")
    print(f"  TCP goodput mean {statistics.fmean(got):.2f} Mbit/s, trace capacity mean "
          f"{statistics.fmean(cap):.2f} Mbit/s, ratio {ratio:.3f}, correlation {corr:.3f}")  # fmt: skip
    print(f"  engine: {shown.get('trace')}; queue drops {shown['counters']['dropped_limit']}")
    plot(rows, args.out, trace.path, args.profile)
    print(f"wrote {args.out}/trace_wireguard.png, .svg, .csv")
    return 0


def plot(rows, out: Path, name: str, profile: str) -> None:
    import matplotlib  # only here: the plot is the one use of it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    mid = [(r[0] + r[1]) / 2 for r in rows]
    ax.step(mid, [r[3] for r in rows], where="mid", label="trace capacity (opportunities x 1500 B)")
    ax.plot(
        mid, [r[2] for r in rows], marker=".", label=f"TCP goodput through {profile} (iperf3 -R)"
    )
    ax.set_xlabel("time (s)")
    ax.set_ylabel("Mbit/s")
    ax.set_title(f"{Path(name).name} on server->client, pi_pair_middlebox, lab engine")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(out / f"trace_wireguard.{ext}")
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
