"""Adaptive length against a fixed-length run (issue 17, "must show" 2).

For each case (profile x condition x test, between two Pi 4 emulations as study A) the test runs
once at a fixed length and once adaptively (lab.model.stoprule, default 5 % at 95 %, the same length
as its cap), in the same lab one after the other (the order alternates between cases). The
fixed run's 95 % interval is its primary figure +- the half-width of the batch-means t interval
of its own per-second rates (ping: per-echo RTTs), after MSER-5's warm-up, the same arithmetic
the rule uses. A case passes when the adaptive figure lies inside it. The fixed leg is the
test with adaptive_min_s = its length: one segment of the full length, so that its record
holds the receiver's per-second rates (--get-server-output) and the interval at the cap.

Study A's lengths (TCP 300 s, UDP 60 s, 500 pings at 0.2 s) would take about an hour for ten
cases on this 2-core machine; the fixed lengths here are shortened (TCP 30 s, UDP 20 s, 100
pings at 0.2 s), the adaptive caps the same, so the table fits in about ten minutes.

Usage: sudo .venv/bin/python bench/adaptive.py [--quick]   (--quick: three cases)
Prints a Markdown table (docs/measurements.md, "Adaptive length") and writes the records
as JSON to /tmp/lab-bench-adaptive.json.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.core.errors import LabError
from lab.measure import TESTS, Context
from lab.campaign.load import load_plan
from lab.substrate.local.substrate import LocalSubstrate
from lab.substrate.local.preflight import preflight
from lab.core.state import new_lab_id
from lab.vpn.profiles import load_profile
from lab.vpn.record import TunnelRecord

TCP = ("tcp", {"duration_s": 30.0})
UDP = ("udp", {"rate_mbit": 100.0, "size": 1300, "duration_s": 20.0})
PING = ("ping", {"count": 100, "interval_s": 0.2})

#: (profile, condition, test): conditions are the quick plan's points
CASES = [
    ("baseline", "none", TCP),
    ("wireguard", "none", TCP),
    ("ipsec-aes128gcm", "none", TCP),
    ("openvpn-aes256cbc-static", "none", TCP),
    ("baseline", "none", PING),
    ("wireguard", "none", PING),
    ("openvpn-aes256cbc-static", "none", UDP),
    ("wireguard", "network1", TCP),
    ("ipsec-aes128gcm", "network1", UDP),
    ("wireguard", "network1", UDP),
    ("wireguard", "network1", PING),
    ("baseline", "network1", PING),
]
QUICK = [CASES[1], CASES[5], CASES[9]]


def fixed_interval(test: str, rec: dict) -> tuple[float, float, float]:
    """(figure, low, high): the primary figure +- the half-width of the batch-means interval
    of the run's own receiver-side per-second rates (ping: RTTs) after MSER-5."""
    fig = primary(test, rec)
    iv = rec["adaptive"]["interval"]
    half = iv["half_width"] if iv else math.inf
    return fig, fig - half, fig + half


def pt_or_none(pt):
    return pt if pt.impaired else None


def primary(test: str, rec: dict) -> float:
    return rec["rtt_avg_ms"] if test == "ping" else rec["receiver_bps"]


def run_test(lab, test: str, params: dict, raw: Path) -> dict:
    rec = TunnelRecord.of(lab)
    t = rec.traffic
    ctx = Context(
        client=lab.node(t.client),
        server=lab.node(t.server),
        server_addr=t.v4,
        raw_dir=raw,
        iface=rec.interface if t.client == rec.client else None,
        timeout_s=30,
        state_dir=lab.dir / "measure",
    )
    tt = TESTS[test]
    (out,) = tt.run(ctx, tt.validate(params, source="bench/adaptive.py"))
    if not out["ok"]:
        raise RuntimeError(f"{test} failed: {out['error']}")
    return out


def main() -> int:
    cases = QUICK if "--quick" in sys.argv else CASES
    plan = load_plan("quick")
    spec = preflight(plan)
    points = {p.name: p for p in plan.points}
    target = LocalSubstrate()
    placement = plan.placement
    out = Path("/tmp/lab-bench-adaptive.json")
    rows, dump = [], []
    raw = Path(tempfile.mkdtemp(prefix="lab-bench-adaptive-"))
    t_all = time.monotonic()
    order = sorted(range(len(cases)), key=lambda i: (cases[i][0], cases[i][1]))
    current, lab = None, None
    try:
        for n, i in enumerate(order):
            profile, cond, (test, params) = cases[i]
            if current != (profile, cond):
                if lab is not None:
                    target.down(lab.id)
                    lab = None
                pt = points[cond]
                lab = target.up(
                    spec, new_lab_id("b"), load_profile(profile), pt_or_none(pt), placement
                )
                if pt.impaired:
                    target.apply_point(lab, pt, built_impaired=True)
                current = (profile, cond)
            runs = {}
            cap = params.get("duration_s") or params["count"] * params["interval_s"]
            for mode in ("fixed", "adaptive") if n % 2 == 0 else ("adaptive", "fixed"):
                # the fixed leg: the same test with adaptive_min_s = its length, so it runs
                # one full-length segment (receiver-side rates, --get-server-output) and its
                # record carries the interval the rule computes at the cap
                p = dict(params, adaptive=True)
                if mode == "fixed":
                    p["adaptive_min_s"] = cap
                for attempt in (1, 2):
                    t0 = time.monotonic()
                    try:
                        runs[mode] = run_test(lab, test, p, raw / f"{i}-{mode}-{attempt}")
                        break
                    except (RuntimeError, LabError) as e:
                        # once more in a fresh lab (what failed may have taken this one down)
                        print(f"# {profile} {cond} {test} {mode}: {e}; again", flush=True)
                        if attempt == 2:
                            raise
                        target.down(lab.id)
                        lab = target.up(
                            spec, new_lab_id("b"), load_profile(profile), pt_or_none(pt), placement
                        )
                        if pt.impaired:
                            target.apply_point(lab, pt, built_impaired=True)
                runs[mode]["wall_s"] = time.monotonic() - t0
            fig, lo, hi = fixed_interval(test, runs["fixed"])
            a = runs["adaptive"]
            ad = primary(test, a)
            scale, unit = (1.0, "ms") if test == "ping" else (1e-6, "Mbit/s")
            row = {
                "profile": profile,
                "condition": cond,
                "test": test,
                "unit": unit,
                "fixed_s": runs["fixed"]["wall_s"],
                "fixed": fig * scale,
                "low": lo * scale,
                "high": hi * scale,
                "adaptive": ad * scale,
                "adaptive_s": a["wall_s"],
                "measured_s": a["measured_s"],
                "reason": a["stop_reason"],
                "ci_rel_pct": a["ci_rel_pct"],
                "inside": lo <= ad <= hi,
            }
            rows.append(row)
            dump.append({"row": row, "fixed": runs["fixed"], "adaptive": a})
            print(json.dumps(row), flush=True)
            out.write_text(json.dumps(dump, indent=1, default=str))
    finally:
        if lab is not None:
            target.down(lab.id)
    print()
    print(
        "| profile | condition | test | fixed: s, mean [95 % interval] | adaptive: s (measured),"
        " mean, stop, reached | inside |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        ci = "" if r["ci_rel_pct"] is None else f"{r['ci_rel_pct']:.1f} %"
        print(
            f"| {r['profile']} | {r['condition']} | {r['test']} | {r['fixed_s']:.0f} s, "
            f"{r['fixed']:.2f} [{r['low']:.2f}, {r['high']:.2f}] {r['unit']} | "
            f"{r['adaptive_s']:.0f} s ({r['measured_s']:.0f}), {r['adaptive']:.2f}, "
            f"{r['reason']}, +-{ci} | {'yes' if r['inside'] else 'NO'} |"
        )
    inside = sum(r["inside"] for r in rows)
    fixed_t = sum(r["fixed_s"] for r in rows)
    adapt_t = sum(r["adaptive_s"] for r in rows)
    print(
        f"\n{inside}/{len(rows)} adaptive means inside the fixed run's 95 % interval; "
        f"test time fixed {fixed_t:.0f} s, adaptive {adapt_t:.0f} s; "
        f"wall {time.monotonic() - t_all:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
