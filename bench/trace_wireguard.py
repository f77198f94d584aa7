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
import struct
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
LAB = [sys.executable, "-m", "lab.cli.main"]
SERVER_UNDERLAY = "10.0.2.2"  # pi_pair_middlebox's server: the outer packets' source

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
        # iperf3 started here, not through `lab exec`: its JSON stamps its start in whole seconds
        # only, so the start is the moment before it runs (its test begins a few ms later,
        # once connected: the series are lined up to that much)
        pcap = args.out / "client.pcap"
        tcpdump = lab.node("client").popen(
            ["tcpdump", "-i", "client-eth0", "-n", "-s", "64", "-U", "-Z", "root", "-w",
             str(pcap), "ip", "src", SERVER_UNDERLAY],
            stderr=subprocess.PIPE,
        )  # fmt: skip
        if b"listening on" not in tcpdump.stderr.readline():
            sys.exit("tcpdump did not start on the client")
        t_start_ns = time.clock_gettime_ns(time.CLOCK_REALTIME)
        po = lab.node("client").popen(
            ["iperf3", "-c", vpn_server, "-p", "5301", "-R", "-J", "-t", str(args.seconds),
             "-i", str(args.bin)],
            stdout=subprocess.PIPE,
        )  # fmt: skip
        out, _ = po.communicate(timeout=args.seconds + 60)
        shown = eng.show()[d]
        time.sleep(0.3)
        tcpdump.terminate()
        tcpdump.wait(timeout=5)
    finally:
        subprocess.run([*LAB, "down", "--id", args.id], capture_output=True, cwd=REPO)
    res = json.loads(out)
    t0_ms = (t_start_ns - offset - start_ns) / 1e6
    # the outer packets' arrival times at the client, on the trace's clock (ms)
    wire = [((ts_ns - offset - start_ns) / 1e6, n) for ts_ns, n in ip_packets(pcap)]
    pcap.unlink()
    rows = []
    for iv in res["intervals"]:
        s = iv["sum"]
        a, b = t0_ms + s["start"] * 1000, t0_ms + s["end"] * 1000
        opp = trace.opportunities(int(a), int(b))
        cap = opp * BYTES_PER_OPPORTUNITY * 8 / (s["seconds"]) / 1e6
        # an opportunity at ms m delivers in [m, m + 1)
        got = sum(n for t, n in wire if int(a) + 1 <= t < int(b) + 1) * 8 / s["seconds"] / 1e6
        rows.append((s["start"], s["end"], s["bits_per_second"] / 1e6, cap, got))
    with open(args.out / "trace_wireguard.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["start_s", "end_s", "tcp_goodput_mbit", "trace_capacity_mbit",
                    "delivered_ip_mbit"])  # fmt: skip
        w.writerows(rows)
    cap = [r[3] for r in rows[2:]]  # the first second: slow start
    print(f"trace {trace.path}: mean {trace.mean_bps / 1e6:.2f} Mbit/s over its period")
    print(f"{args.profile}: {len(rows)} intervals of {args.bin} s; after the first second, "
          f"trace capacity mean {statistics.fmean(cap):.2f} Mbit/s:")  # fmt: skip
    for label, col in (("outer IP packets at the client (capture)", 4), ("TCP goodput", 2)):
        got = [r[col] for r in rows[2:]]
        print(f"  {label}: mean {statistics.fmean(got):.2f} Mbit/s, ratio "
              f"{statistics.fmean(got) / statistics.fmean(cap):.3f}, correlation "
              f"{statistics.correlation(got, cap):.3f}")  # fmt: skip
    print(f"  engine: {shown.get('trace')}; queue drops {shown['counters']['dropped_limit']}")
    plot(rows, args.out, trace.path, args.profile)
    print(f"wrote {args.out}/trace_wireguard.png, .svg, .csv")
    return 0


def ip_packets(pcap: Path) -> list[tuple[int, int]]:
    """(CLOCK_REALTIME ns, IP total length) of every IPv4 packet in an Ethernet pcap."""
    data = pcap.read_bytes()
    magic = struct.unpack("<I", data[:4])[0]
    end = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    unit = 1 if magic in (0xA1B23C4D, 0x4D3CB2A1) else 1000
    out, i = [], 24
    while i + 16 <= len(data):
        sec, frac, incl, _ = struct.unpack(end + "IIII", data[i : i + 16])
        pkt = data[i + 16 : i + 16 + incl]
        i += 16 + incl
        if len(pkt) >= 18 and pkt[12:14] == b"\x08\x00":
            out.append((sec * 1_000_000_000 + frac * unit, struct.unpack("!H", pkt[16:18])[0]))
    return out


def plot(rows, out: Path, name: str, profile: str) -> None:
    import matplotlib  # only here: the plot is the one use of it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    mid = [(r[0] + r[1]) / 2 for r in rows]
    ax.step(
        mid,
        [r[3] for r in rows],
        where="mid",
        lw=2.5,
        alpha=0.5,
        label="trace capacity (opportunities x 1500 B)",
    )
    ax.step(
        mid,
        [r[4] for r in rows],
        where="mid",
        lw=1,
        color="k",
        label="delivered: outer IP bytes captured at the client",
    )
    ax.plot(mid, [r[2] for r in rows], marker=".", alpha=0.8,
            label=f"TCP goodput through {profile} (iperf3 -R, at the client)")  # fmt: skip
    ax.set_xlabel("time (s)")
    ax.set_ylabel("Mbit/s per interval")
    ax.set_title(f"{Path(name).name} on server->client, pi_pair_middlebox, lab engine")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(out / f"trace_wireguard.{ext}")
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
