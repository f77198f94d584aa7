#!/usr/bin/env python3
"""Time from `lab up --vpn PROFILE` start to the first packet through the tunnel, median of N.

    sudo .venv/bin/python bench/vpn_up.py [--n 5] [--profiles wireguard,openvpn-tls]
                                          [--topology topologies/pi_pair_middlebox.py] [-p cpu=0.5]

Runs the real CLI (Python start-up included, as a user sees it). The start is time.monotonic()
just before the CLI is started; the end is the moment the readiness ping first got a reply,
which bring_up records as lab.info["vpn"]["timing"]["ready_monotonic"] (same clock, same boot).
Goals: WireGuard < 2 s, OpenVPN < 3 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAB = [sys.executable, "-m", "lab.cli.main"]
GOALS = {"wireguard": 2.0, "openvpn": 3.0, "strongswan": 3.0}
DEFAULT = [
    "baseline",
    "wireguard",
    "ipsec-aes128gcm",
    "ipsec-aes256gcm",
    "ipsec-chacha20poly1305",
    "ipsec-modern",
    "openvpn-aes256cbc-static",
    "openvpn-tls",
    "openvpn-none",
]


def one(profile: str, topology: str, params: list[str], lab_id: str) -> dict:
    argv = [*LAB, "up", topology, "--id", lab_id, "--vpn", profile, "--json"]
    for p in params:
        argv += ["-p", p]
    t0 = time.monotonic()
    r = subprocess.run(argv, check=False, capture_output=True, text=True, cwd=REPO)
    t_cli = time.monotonic() - t0
    try:
        if r.returncode != 0:
            sys.exit(f"failed: {' '.join(argv)}\n{r.stderr}")
        vpn = json.loads(r.stdout)["vpn"]
        ready = vpn["timing"]["ready_monotonic"] - t0
        return {
            "first_packet": ready,
            "tunnel": vpn["timing"]["ready_s"],
            "cli": t_cli,
            "driver": vpn["driver"],
            "path": vpn["describe"]["path"],
        }
    finally:
        subprocess.run([*LAB, "down", "--id", lab_id], check=False, capture_output=True, cwd=REPO)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=5)
    ap.add_argument("--profiles", default=",".join(DEFAULT))
    ap.add_argument("--topology", default="topologies/pi_pair_middlebox.py")
    ap.add_argument("-p", "--param", action="append", default=[], help="topology parameter")
    ap.add_argument("--id", default="benchvpn")
    a = ap.parse_args()
    print(f"topology {a.topology} {' '.join(a.param)}, {a.n} runs per profile")
    print(
        f"{'profile':26} {'path':14} {'first packet (median)':>22} {'min':>7} {'max':>7} "
        f"{'tunnel part':>12} {'goal':>8}"
    )
    for profile in a.profiles.split(","):
        runs = [one(profile, a.topology, a.param, a.id) for _ in range(a.n)]
        fp = [r["first_packet"] for r in runs]
        med = statistics.median(fp)
        tun = statistics.median(r["tunnel"] for r in runs)
        goal = GOALS.get(runs[0]["driver"])
        verdict = (
            "-" if goal is None else (f"<{goal:.0f}s ok" if med < goal else f"<{goal:.0f}s MISSED")
        )
        print(
            f"{profile:26} {runs[0]['path']:14} {med:>20.3f} s {min(fp):>7.3f} {max(fp):>7.3f} "
            f"{tun:>10.3f} s {verdict:>8}"
        )


if __name__ == "__main__":
    main()
