#!/usr/bin/env python3
"""TCP that stops as it streams against a fixed-length run (issue 33 item 5, must-show 4).

    sudo .venv/bin/python bench/adaptive_tcp.py [--fixed-s 60] [--cap-s 300] [--cases N]
    .venv/bin/python bench/adaptive_tcp.py --replay FILE --rel-pct 10 --out OUT  # no lab
    .venv/bin/python bench/adaptive_tcp.py --recheck FILE  # what the check can show, no lab
    .venv/bin/python bench/adaptive_tcp.py --self FILE...  # the rule on each fixed leg, no lab

For each case (a study A profile at a study A impairment point, two Pi 4 emulations, tcp
client-to-server, the plan's rule: +-5 % at 95 %, 10 s minimum) the test runs twice in the same
lab, the order alternating between cases: **fixed**, one connection of --fixed-s seconds (the
same test with adaptive_min_s = its length, so it cannot stop and its record holds the interval
of its own receiver-side per-second rates at the end); **adaptive**, the plan's test with a cap
of --cap-s (study A: 300 s) that stops as it streams (lab/measure/tcpstream.py). The fixed run's
95 % interval is the batch-means t interval of its receiver's per-second rates after MSER-5
(the rule's arithmetic: its mean +- half-width; centred there rather than on the whole-run
rate, whose start weighs 1/60 of a 60-s run and 1/300 of the study's). A case passes when the
adaptive record's rate (an early stop's: after the warm-up the rule dropped) lies inside it.

Prints one JSON line per case, then a Markdown table, and writes every record to
/tmp/lab-bench-adaptive-tcp.json or --out (which bench/study_time.py --tcp-bench reads: the adaptive
legs' seconds per point group). The figures move with this 2-core machine's other load.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from statistics import NormalDist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.adaptive import run_test  # noqa: E402
from lab.campaign.load import load_plan  # noqa: E402
from lab.core.errors import LabError  # noqa: E402
from lab.core.state import new_lab_id  # noqa: E402
from lab.model.stoprule import Rule  # noqa: E402
from lab.substrate.local.preflight import preflight  # noqa: E402
from lab.substrate.local.substrate import LocalSubstrate  # noqa: E402
from lab.vpn.profiles import load_profile  # noqa: E402

PROFILES = (
    "baseline,ipsec-aes128gcm,ipsec-aes256gcm,ipsec-chacha20poly1305,"
    "openvpn-aes256cbc-static,wireguard"
)
#: (profile, study A point): every point group (delay, jitter, loss, a preset) and profile
CASES = [
    ("wireguard", "delay-40ms"),
    ("baseline", "delay-80ms"),
    ("ipsec-aes128gcm", "delay-20ms"),
    ("openvpn-aes256cbc-static", "delay-60ms"),
    ("ipsec-chacha20poly1305", "jitter-5ms"),
    ("wireguard", "jitter-2ms"),
    ("baseline", "loss-1pct"),
    ("ipsec-aes256gcm", "loss-0.5pct"),
    ("wireguard", "loss-2.5pct"),
    ("openvpn-aes256cbc-static", "network1"),
    ("ipsec-aes256gcm", "network2"),
    ("baseline", "delay-10ms"),
]
OUT = Path("/tmp/lab-bench-adaptive-tcp.json")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fixed-s", type=float, default=60.0, help="fixed run's length (s)")
    ap.add_argument("--cap-s", type=float, default=300.0, help="adaptive run's cap (s)")
    ap.add_argument("--cases", type=int, default=len(CASES))
    ap.add_argument("--start", type=int, default=0, help="first case (index into CASES)")
    ap.add_argument("--pairs", type=int, default=1, help="fixed/adaptive pairs per case")
    ap.add_argument("--rel-pct", type=float, help="adaptive leg's adaptive_rel_pct (the plan's)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--replay", type=Path, metavar="FILE", help="replay --rel-pct on FILE's legs")
    ap.add_argument("--recheck", type=Path, metavar="FILE", help="what FILE's check can show")
    ap.add_argument("--spread", type=Path, nargs="+", metavar="FILE",
                    help="adaptive against the spread of fixed connections, pooled over FILEs")  # fmt: skip
    ap.add_argument("--fixed-also", type=Path, nargs="+", metavar="FILE", default=[],
                    help="with --spread: these files' fixed legs too (not their adaptive legs)")  # fmt: skip
    ap.add_argument("--self", type=Path, nargs="+", metavar="FILE", dest="self_check",
                    help="the rule replayed on each fixed leg against that connection's whole run")  # fmt: skip
    a = ap.parse_args()
    if a.replay:
        return replay(a)
    if a.recheck:
        return recheck(json.loads(a.recheck.read_text()))
    if a.self_check:
        from bench.adaptive_spread import print_self_check

        docs = [json.loads(f.read_text()) for f in a.self_check]
        rel = 5.0 if a.rel_pct is None else a.rel_pct
        return print_self_check(docs, [str(f) for f in a.self_check], rel)
    if a.spread:
        from bench.adaptive_spread import replayed, spread

        docs = [json.loads(f.read_text()) for f in a.spread]
        if a.rel_pct is not None:  # the adaptive legs replayed at that target
            docs = [replayed(d, a.rel_pct) for d in docs]
        also = [json.loads(f.read_text()) for f in a.fixed_also]
        return spread(docs, [str(f) for f in a.spread], also, [str(f) for f in a.fixed_also])
    plan = load_plan("plans/study_a.toml", [f"profiles={PROFILES}", "tests=tcp"])
    spec = preflight(plan)
    points = {p.name: p for p in plan.points}
    tcp = plan.tests[0].params
    target = LocalSubstrate()
    raw = Path(tempfile.mkdtemp(prefix="lab-bench-adaptive-tcp-"))
    rows, dump = [], []
    t_all = time.monotonic()
    load0 = os.getloadavg()
    for n, (profile, cond) in enumerate(CASES[a.start : a.start + a.cases], start=a.start):
        pt = points[cond]
        lab = None
        runs: dict[str, dict] = {}
        more: list[dict] = []  # the pairs after the first (--pairs)
        try:
            for attempt in (1, 2):
                try:
                    lab = target.up(spec, new_lab_id("stream"), load_profile(profile), pt,
                                    plan.placement, )  # fmt: skip
                    target.apply_point(lab, pt, built_impaired=True)
                    more = []
                    for k in range(a.pairs):
                        pair: dict[str, dict] = {}
                        # the order alternates between cases and between a case's pairs
                        first = ("fixed", "adaptive") if (n + k) % 2 == 0 else ("adaptive", "fixed")
                        for mode in first:
                            p = dict(tcp, adaptive=True)
                            if mode == "fixed":
                                p.update(duration_s=a.fixed_s, adaptive_min_s=a.fixed_s)
                            else:
                                p["duration_s"] = a.cap_s
                                if a.rel_pct is not None:
                                    p["adaptive_rel_pct"] = a.rel_pct
                            t0 = time.monotonic()
                            pair[mode] = run_test(lab, "tcp", p, raw / f"{n}-{k}-{mode}-{attempt}")
                            pair[mode]["wall_s"] = time.monotonic() - t0
                        if k == 0:
                            runs = pair
                        else:
                            more.append(pair)
                    break
                except (RuntimeError, LabError) as e:
                    print(f"# {profile} {cond}: {e}; again in a fresh lab", flush=True)
                    if attempt == 2:
                        raise
                    if lab is not None:
                        target.down(lab.id)
                        lab = None
        finally:
            if lab is not None:
                target.down(lab.id)
        iv = runs["fixed"]["adaptive"]["interval"]
        fig = iv["mean"]
        lo, hi = fig - iv["half_width"], fig + iv["half_width"]
        ad = runs["adaptive"]
        # why it stopped (an early stop) or what held it to the cap (tcpstream)
        why = ad["adaptive"].get("stopped_early_because") or ad["adaptive"].get("cycles") or {}
        row = {
            "profile": profile,
            "condition": cond,
            "group": pt.group,
            "fixed_s": runs["fixed"]["measured_s"],
            "fixed": fig * 1e-6,
            "fixed_whole": runs["fixed"]["receiver_bps"] * 1e-6,
            "low": lo * 1e-6,
            "high": hi * 1e-6,
            "adaptive": ad["receiver_bps"] * 1e-6,
            "adaptive_wall_s": ad["wall_s"],
            "measured_s": ad["measured_s"],
            "reason": ad["stop_reason"],
            "mechanism": ad["adaptive"].get("mechanism"),
            "ci_rel_pct": ad["ci_rel_pct"],
            "inside": lo <= ad["receiver_bps"] <= hi,
            # seconds the interval held but the sender's congestion cycles did not (tcpstream)
            "held_by_cycles_s": why.get("held_by_cycles_s", why.get("held_s")),
            # the sender's retransmission timeouts over the run (TCPTimeouts), the last word
            # of the cycle and timeout rules
            "timeouts_in_run": why.get("timeouts_in_run"),
            "cycles": why.get("cycles", why.get("last")),
            "timeouts": why.get("timeouts"),
        }
        rows.append(row)
        dump.append({"row": row, "fixed": runs["fixed"], "adaptive": ad, "more": more})
        print(json.dumps(row), flush=True)
        doc = {"cap_s": a.cap_s, "fixed_s": a.fixed_s, "rel_pct": a.rel_pct, "cases": dump}
        a.out.write_text(json.dumps(doc, indent=1, default=str))
    rel = a.rel_pct if a.rel_pct is not None else tcp["adaptive_rel_pct"]
    print(
        f"\nfixed {a.fixed_s:g} s, adaptive cap {a.cap_s:g} s, target +-{rel:g} %; "
        f"load {load0} -> {os.getloadavg()}; wall {time.monotonic() - t_all:.0f} s"
    )
    table(rows, a.cap_s)
    return 0


def whole_seconds(ivs: list[dict]) -> list[dict]:
    """Each (start, end) once, whole seconds only (3.12 repeats a stopped server's last)."""
    seen, out = set(), []
    for iv in ivs:
        if (iv["start"], iv["end"]) not in seen and iv["end"] - iv["start"] >= 0.9:
            seen.add((iv["start"], iv["end"]))
            out.append(iv)
    return out


def replay(a) -> int:
    """The rule at --rel-pct replayed second by second on each case's adaptive leg's receiver
    rates (iperf3's server intervals, standing in for the live ss rates they track) with the
    sender's rules on what the leg kept (bench/adaptive_spread.replay_leg): where it would have
    stopped, and the figure there. A replay, not a run: a leg that stopped early at the bench's
    own target has no seconds beyond its stop."""
    from bench.adaptive_spread import replay_leg

    src = json.loads(a.replay.read_text())
    plan = load_plan("plans/study_a.toml", [f"profiles={PROFILES}", "tests=tcp"])
    tcp = plan.tests[0].params
    rel = a.rel_pct if a.rel_pct is not None else tcp["adaptive_rel_pct"]
    rule = Rule(rel_half_width=rel / 100, min_s=tcp["adaptive_min_s"])
    rows, dump = [], []
    for case in src["cases"]:
        ad, row = dict(case["adaptive"]), dict(case["row"])
        overhead = ad["wall_s"] - ad["measured_s"]
        got = replay_leg(ad, rule, src["cap_s"])  # the interval and the sender's rules
        if got is not None:
            ad.update(stop_reason="ci", measured_s=float(got[1]), receiver_bps=got[0])
        ad["wall_s"] = ad["measured_s"] + overhead
        lo, hi = row["low"] * 1e6, row["high"] * 1e6
        row.update(adaptive=ad["receiver_bps"] * 1e-6, measured_s=ad["measured_s"],
                   reason=ad["stop_reason"], ci_rel_pct=ad["ci_rel_pct"],
                   inside=lo <= ad["receiver_bps"] <= hi)  # fmt: skip
        rows.append(row)
        dump.append({**case, "row": row, "adaptive": ad})
    a.out.write_text(json.dumps({**src, "rel_pct": rel, "replayed": True, "cases": dump}))
    print(
        f"replayed at +-{rel:g} % on {a.replay} (fixed {src['fixed_s']:g} s, cap {src['cap_s']:g} s)"
    )
    table(rows, src["cap_s"])
    return 0


def lag1(xs: list[float]) -> float:
    """Lag-1 autocorrelation of a series (0 for a constant one)."""
    m = sum(xs) / len(xs)
    den = sum((x - m) ** 2 for x in xs)
    return sum((a - m) * (b - m) for a, b in zip(xs, xs[1:], strict=False)) / den if den else 0.0


def recheck(src: dict) -> int:
    """What the check itself can show, from a run's records (nothing is run; the check and
    its verdicts stay as they are):

    - **replica**: the chance that a second run whose mean is the same as the fixed run's, with
      the adaptive record's 95 % half-width h_a, lands inside the fixed run's interval
      (half-width h_f): P(|Z| < 1.96 h_f / sqrt(h_f^2 + h_a^2)); summed over the cases, the
      count of "inside" a perfect stop rule would expect, and the chance of at least 9 of 10;
    - **rho1**: the lag-1 autocorrelation of the fixed run's 2-s batch means after its warm-up:
      batch means need it near 0 (Law & Kelton); for an AR(1) series the t interval's
      half-width is then short by sqrt((1 + rho1) / (1 - rho1));
    - **difference**: whether adaptive - fixed lies within sqrt(h_f^2 + h_a^2), the two
      independent runs' difference's own 95 % half-width."""
    nd = NormalDist()
    rows, ps = [], []
    for case in src["cases"]:
        row, fixed, ad = case["row"], case["fixed"], case["adaptive"]
        ivs = whole_seconds(fixed["server_intervals"])
        rates = [iv["bps"] for iv in ivs][int(fixed["adaptive"]["warmup_samples"]) :]
        batches = [(a + b) / 2 for a, b in zip(rates[::2], rates[1::2], strict=False)]
        rho = lag1(batches) if len(batches) > 2 else 0.0
        hf = (row["high"] - row["low"]) / 2
        ha_iv = ad["adaptive"].get("interval") or {}
        ha = (ha_iv.get("half_width") or 0.0) * 1e-6
        p = 2 * nd.cdf(1.959964 * hf / math.hypot(hf, ha)) - 1 if hf else 0.0
        ps.append(p)
        short = math.sqrt((1 + rho) / (1 - rho)) if 0 < rho < 1 else 1.0
        diff = abs(row["adaptive"] - row["fixed"])
        rows.append((row, rho, short, p, diff <= math.hypot(hf, ha), diff, math.hypot(hf, ha)))
    print("| profile | point | inside | rho1 of the fixed batch means | its interval short by "
          "| P(a same-mean run inside) | difference within its 95 % | adaptive - fixed |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for row, rho, short, p, ok, diff, hd in rows:
        print(
            f"| {row['profile']} | {row['condition']} | {'yes' if row['inside'] else 'NO'} | "
            f"{rho:.2f} | x{short:.2f} | {p:.2f} | {'yes' if ok else 'no'} | "
            f"{diff:.2f} of +-{hd:.2f} Mbit/s |"
        )
    # the chance of at least n - 1 of n, the cases' chances differing (Poisson binomial)
    dist = [1.0]
    for p in ps:
        dist = [a * (1 - p) + (dist[i - 1] * p if i else 0.0) for i, a in enumerate(dist + [0.0])]
    n = len(ps)
    print(
        f"\ninside: {sum(r[0]['inside'] for r in rows)}/{n}; a perfect rule (each adaptive run the "
        f"fixed run's mean, its own interval) would expect {sum(ps):.1f}/{n}, at least {n - 1} of "
        f"{n} with chance {sum(dist[n - 1 :]):.2f}; differences within their own 95 %: "
        f"{sum(r[4] for r in rows)}/{n}"
    )
    return 0


def table(rows: list[dict], cap_s: float) -> None:
    print(
        "| profile | point | fixed: Mbit/s [95 % interval] | adaptive: Mbit/s, measured s, "
        "stop, +-reached | inside |"
    )
    print("|---|---|---|---|---|")
    for r in rows:
        ci = "" if r["ci_rel_pct"] is None else f"{r['ci_rel_pct']:.1f} %"
        print(
            f"| {r['profile']} | {r['condition']} | {r['fixed']:.2f} [{r['low']:.2f}, "
            f"{r['high']:.2f}] | {r['adaptive']:.2f}, {r['measured_s']:.0f} s, {r['reason']}, "
            f"{ci} | {'yes' if r['inside'] else 'NO'} |"
        )
    inside = sum(r["inside"] for r in rows)
    print(
        f"\n{inside}/{len(rows)} adaptive rates inside the fixed run's 95 % interval; adaptive "
        f"measured {sum(r['measured_s'] for r in rows):.0f} s of {cap_s * len(rows):.0f} s "
        "requested"
    )


if __name__ == "__main__":
    sys.exit(main())
