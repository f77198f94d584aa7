#!/usr/bin/env python3
"""scp that stops as it streams against whole copies (issue 33 item 5; docs/measurements.md).

    sudo .venv/bin/python bench/adaptive_scp.py [--pairs 2] [--start 0] [--cases N] [--out F]
    .venv/bin/python bench/adaptive_tcp.py --spread F [F ...]   # the check, no lab

For each case (a study A profile at a study A impairment point, two Pi 4 emulations with their
cards, study A's 256 MiB scp, its 286 s time-out) the copy runs `--pairs` times whole
(adaptive = false) and as many times adaptive (adaptive = true: it stops once its rate is known
and projects its time), alternating, in one lab. The cases are points where a whole copy
finishes inside study A's time-out (the points where it cannot are failures either way); every
one is slower than the card, so the adaptive copies may stop. Writes the records in
bench/adaptive_tcp.py's format (`--spread` reads either: scp's figure is `rate_bps`) to
/tmp/lab-bench-adaptive-scp.json or --out, and prints one line per copy. The figures move with
this 2-core machine's other load.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.adaptive import run_test  # noqa: E402
from lab.campaign.load import load_plan  # noqa: E402
from lab.core.errors import LabError  # noqa: E402
from lab.core.state import new_lab_id  # noqa: E402
from lab.substrate.local.preflight import preflight  # noqa: E402
from lab.substrate.local.substrate import LocalSubstrate  # noqa: E402
from lab.vpn.profiles import load_profile  # noqa: E402

PROFILES = "baseline,ipsec-aes128gcm,ipsec-chacha20poly1305,openvpn-aes256cbc-static,wireguard"
#: (profile, study A point): delay, jitter and loss groups
CASES = [
    ("wireguard", "delay-40ms"),
    ("openvpn-aes256cbc-static", "delay-60ms"),
    ("ipsec-aes128gcm", "loss-0.5pct"),
    ("baseline", "jitter-2ms"),
    ("ipsec-chacha20poly1305", "delay-20ms"),
    ("wireguard", "loss-1pct"),
    # slow points: copies of 1-5 min whole, where streaming can save time
    ("ipsec-chacha20poly1305", "jitter-5ms"),
    ("wireguard", "loss-2.5pct"),
    ("baseline", "jitter-6ms"),
]
OUT = Path("/tmp/lab-bench-adaptive-scp.json")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=2, help="whole/adaptive pairs per case")
    ap.add_argument("--start", type=int, default=0, help="first case (index into CASES)")
    ap.add_argument("--cases", type=int, default=len(CASES))
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    plan = load_plan("plans/study_a.toml", [f"profiles={PROFILES}", "tests=scp"])
    spec = preflight(plan)
    points = {p.name: p for p in plan.points}
    scp = plan.tests[0].params
    target = LocalSubstrate()
    raw = Path(tempfile.mkdtemp(prefix="lab-bench-adaptive-scp-"))
    dump = []
    t_all, load0 = time.monotonic(), os.getloadavg()
    for n, (profile, cond) in enumerate(CASES[a.start : a.start + a.cases], start=a.start):
        pt = points[cond]
        lab = target.up(spec, new_lab_id("scps"), load_profile(profile), pt, plan.placement)
        pairs: list[dict[str, dict]] = []
        try:
            target.apply_point(lab, pt, built_impaired=True)
            for k in range(a.pairs):
                pair: dict[str, dict] = {}
                order = ("fixed", "adaptive") if (n + k) % 2 == 0 else ("adaptive", "fixed")
                for mode in order:
                    p = dict(scp, adaptive=mode == "adaptive")
                    t0 = time.monotonic()
                    try:
                        rec = run_test(lab, "scp", p, raw / f"{n}-{k}-{mode}")
                    except (RuntimeError, LabError) as e:
                        rec = {"ok": False, "error": str(e)}
                    rec["wall_s"] = time.monotonic() - t0
                    pair[mode] = rec
                    ad = rec.get("adaptive") or {}
                    print(json.dumps({
                        "profile": profile, "point": cond, "pair": k, "mode": mode,
                        "ok": rec.get("ok", True), "mbit": (rec.get("rate_bps") or 0) * 1e-6,
                        "wall_s": round(rec["wall_s"], 1), "projected": rec.get("projected"),
                        "copied_mib": (rec.get("copied_bytes") or 0) / 2**20,
                        "stop": ad.get("reason"), "stream": ad.get("stream"),
                        "error": rec.get("error"),
                    }), flush=True)  # fmt: skip
                pairs.append(pair)
        finally:
            target.down(lab.id)
        ok = [pr for pr in pairs if pr["fixed"].get("rate_bps") and pr["adaptive"].get("rate_bps")]
        if ok:
            dump.append({
                "row": {"profile": profile, "condition": cond, "group": pt.group},
                "fixed": ok[0]["fixed"], "adaptive": ok[0]["adaptive"], "more": ok[1:],
            })  # fmt: skip
        a.out.write_text(json.dumps({"test": "scp", "cases": dump}, indent=1, default=str))
    print(f"load {load0} -> {os.getloadavg()}; wall {time.monotonic() - t_all:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
