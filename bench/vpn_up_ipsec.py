#!/usr/bin/env python3
"""Time from tunnel start to the first packet through it, per ipsec-* profile (goal < 3 s).

    sudo .venv/bin/python bench/vpn_up_ipsec.py [--n 5] [--profiles ipsec-aes128gcm,...]

One lab (pi_pair_middlebox, CPU profile as in the topology) stays up; each cycle brings the
tunnel up with lab.vpn.tunnel.bring_up (secrets, render, start both charons, load over vici,
initiate, then ping through the tunnel until a reply) and tears it down again. `start` is
bring_up's start phase (charons up, CHILD_SA established), `first packet` is when the first ping
reply came back through the tunnel; both are measured from the start of bring_up.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from lab.substrate.local import build as labmod
from lab.core.teardown import teardown
from lab.model.topology import load_topology
from lab.vpn import tunnel
from lab.vpn.teardown import tear_down

PROFILES = "ipsec-aes128gcm,ipsec-aes256gcm,ipsec-chacha20poly1305,ipsec-modern"
GOAL_S = 3.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=5)
    ap.add_argument("--profiles", default=PROFILES)
    ap.add_argument("--topology", default=str(REPO / "topologies" / "pi_pair_middlebox.py"))
    a = ap.parse_args()
    lab_id = "bipsec" + secrets.token_hex(2)
    lab = labmod.up(load_topology(a.topology), lab_id)
    worst = 0.0
    try:
        print(f"topology {a.topology}, {a.n} cycles per profile, lab {lab_id}")
        for profile in a.profiles.split(","):
            starts, readies, path = [], [], None
            for _ in range(a.n):
                rec = tunnel.bring_up(lab, tunnel.prepare(lab.spec, profile))
                starts.append(rec.timing.start_s)
                readies.append(rec.timing.ready_s)
                path = rec.path
                tear_down(lab)
            med = statistics.median(readies)
            worst = max(worst, med)
            print(
                f"{profile:24s} {path:16s} start median {statistics.median(starts):.3f} s   "
                f"first packet median {med:.3f} s (min {min(readies):.3f}, max {max(readies):.3f})"
                f"  goal < {GOAL_S:.0f} s: {'ok' if med < GOAL_S else 'MISSED'}"
            )
    finally:
        left = teardown(lab_id)
        if left:
            print("teardown left:", *left, sep="\n  ")
    return 0 if worst < GOAL_S else 1


if __name__ == "__main__":
    sys.exit(main())
