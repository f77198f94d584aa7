#!/usr/bin/env python3
"""How long a whole plan would take here, from a run of part of it (a shard).

    .venv/bin/python bench/study_time.py RUN_DIR [RUN_DIR ...] [--plan PLAN] [-o key=value ...]

RUN_DIR is a finished `lab run` (typically `--shard i/N` of a long plan; several are pooled,
e.g. shards that sample different point groups). The plan to extrapolate to is the first
run's own plan.json, or PLAN with its -o overrides (e.g. the plan as it ships now, after
changes made since the run). The extrapolation, printed with every input:

- **tests**: the mean seconds a case took (results line `seconds`: the tool's own time, an
  adaptive repetition the rule did not run counts 0) per test label and point group (`none`,
  `delay`, `jitter`, `loss`, a preset), times the plan's number of such cases. A (label,
  group) the run did not sample takes the label's mean over the cases it did sample with
  impairment (or without, as the missing group's point), and is marked so: the figure is
  then only as good as that stand-in.
- **bring-ups and teardowns**: their mean (timeline `up`/`down`) times the plan's count (a
  lab per profile and point group kind, lab.campaign.plan.Plan.groups: at most two per profile).
- **payloads**: a file a lab writes once and reuses (scp's, per size: the records'
  `payload.prepare_s`, taken out of the case that wrote it), its mean times the plan's labs.
- **impairment changes**: their mean times one per (profile, point).
- **other** (gaps between cases: monitors, result files, progress): the run's per-case mean
  times the plan's cases.
- **how sure**: each (label, group) row is a stratum of a stratified sample (Cochran 1977,
  ch. 5): its total has variance cases^2 x s^2 / sampled x (1 - sampled / cases), s the
  row's spread over its sampled cases (a row of one: its label's spread over every sampled
  case of that kind); the printed 95 % interval of the total is the tests' part's alone, and
  a stand-in row's bias (a group measured by another) is not in it.
- **floor**: the tests' time if every adaptive test stopped at its first check (tcp/udp:
  one segment of adaptive_min_s + 5 s; ping: adaptive_min_s), the others as measured: no
  stop rule can make the plan shorter than that.

**--replace RUN_DIR ...**: runs re-measured after a change (e.g. one test's cases on the same
shards, `-o tests=LABEL`, or one point group run whole on one machine, `-o impairments=none`,
where adaptive repetitions can stop): their cases replace the RUN_DIRs' cases of each (test
label, point group) they hold; their bring-ups, teardowns and gaps join the others'.

**--tcp-bench FILE** (bench/adaptive_tcp.py's records) takes the `tcp` label's seconds per
point group from that bench's adaptive legs instead (RUN_DIRs are then optional: without one
only the plan's tcp cases are counted). A leg that reached the bench's cap, when that is below
the plan's duration, counts as running on to the plan's duration. With **--before** the same
legs count as the pre-streaming rule (lab.measure.adaptive.run_segments, one connection cut
into segments) would have run them: its 15-s first segment's rule replayed on the first 15 s of
the case's fixed leg's receiver rates, and when that does not settle, 15 s + the plan's
duration (one more connection for the full length). Each leg's own overhead (bring-up of the
client, the server's wait: wall minus measured seconds) is added to both.

The machine's load moves every figure (note `uptime` with the result); the part of a plan a
shard holds is small, so a group with a few cases of long caps weighs a lot.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dataclasses import replace  # noqa: E402

from lab.measure.adaptive import FIRST_EXTRA_S  # noqa: E402
from lab.model.stoprule import Rule, evaluate, mser5  # noqa: E402
from lab.campaign.load import load_plan  # noqa: E402
from lab.measure import get_test  # noqa: E402
from lab.results.rundir import RunDir  # noqa: E402
from lab.results.timebudget import time_budget  # noqa: E402
from lab.campaign.shard import plan_from_json  # noqa: E402


def _group(point: dict) -> str:
    return point.get("group") or point.get("name") or "?"


def first_check_s(test: str, params: dict) -> float | None:
    """The shortest an adaptive test can run (None: not adaptive)."""
    if not params.get("adaptive"):
        return None
    if test == "ping":
        return min(params["count"] * params["interval_s"], params["adaptive_min_s"])
    # scp has no duration (its cap is its time-out): its floor is the rule's first check too
    return min(params.get("duration_s", math.inf), params["adaptive_min_s"] + FIRST_EXTRA_S)


def segments_rule_s(rates: list[float], rule: Rule, cap_s: float) -> float:
    """Seconds the pre-streaming TCP rule (run_segments) spends on a stream whose receiver
    rates are `rates`: its first segment's decision, replayed on that segment's seconds."""
    first = min(cap_s, rule.min_s + FIRST_EXTRA_S)
    head = rates[: int(first)]
    d = evaluate(head[mser5(head) :], replace(rule, warmup_s=0.0), elapsed_s=first, cap_s=cap_s)
    return first if d.stop else first + cap_s


def tcp_bench_seconds(bench: dict, plan, *, before: bool) -> dict[str, list[float]]:
    """Seconds per point group of the plan's tcp test, from bench/adaptive_tcp.py's records."""
    (test,) = [t for t in plan.tests if t.label == "tcp"]
    cap = test.params["duration_s"]
    rule = Rule(
        rel_half_width=test.params["adaptive_rel_pct"] / 100, min_s=test.params["adaptive_min_s"]
    )
    out: dict[str, list[float]] = defaultdict(list)
    for case in bench["cases"]:
        row = case["row"]
        # every pair's adaptive leg (bench/adaptive_tcp.py --pairs K keeps the later ones in more)
        for pair in [case, *(case.get("more") or [])]:
            ad = pair["adaptive"]
            overhead = max(0.0, ad["wall_s"] - ad["measured_s"])
            if before:
                ivs = pair["fixed"]["server_intervals"]
                rates = [iv["bps"] for iv in ivs if not iv["omitted"]]
                out[row["group"]].append(segments_rule_s(rates, rule, cap) + overhead)
            elif ad["stop_reason"] == "cap" and bench["cap_s"] < cap:
                out[row["group"]].append(cap + overhead)  # it would have run on
            else:
                out[row["group"]].append(ad["measured_s"] + overhead)
    return out


def prepared_s(line: dict) -> float:
    """Seconds a case spent writing a file a lab writes once and reuses (scp's payload:
    `payload.prepare_s` of its records; 0 when it reused one or the run predates it)."""
    return sum(
        float(((rec or {}).get("payload") or {}).get("prepare_s") or 0.0)
        for rec in line.get("records") or []
    )


def _cases(results: list[dict]) -> list[tuple[str, str, bool, float]]:
    """(label, point group, impaired, seconds less prepared_s) of each results line."""
    return [
        (
            r["label"],
            _group(r["impairment"]),
            bool(r["impairment"].get("spec")),
            float(r.get("seconds") or 0.0) - prepared_s(r),
        )
        for r in results
    ]


def extrapolate(
    runs: list[RunDir],
    plan,
    tcp: dict[str, list[float]] | None = None,
    replace: list[RunDir] | tuple = (),
) -> dict:
    """`replace`: runs re-measured after a change, whose cases replace the other runs' cases of
    every (label, point group) they hold."""
    older = [r for run in runs for r in run.load_results()]
    newer = [r for run in replace for r in run.load_results()]
    results = older + newer
    timeline = [e for run in [*runs, *replace] for e in run.load_timeline()]
    budget = time_budget(results, timeline)
    per: dict[tuple[str, str], list[float]] = defaultdict(list)
    # stand-ins: per label and whether the point was impaired
    per_label: dict[tuple[str, bool], list[float]] = defaultdict(list)
    remeasured = _cases(newer)
    redone = {c[:2] for c in remeasured}
    kept = [c for c in _cases(older) if c[:2] not in redone]
    for label, group, impaired, s in kept + remeasured:
        if tcp is not None and label == "tcp":
            continue
        per[(label, group)].append(s)
        per_label[(label, impaired)].append(s)
    for group, secs in (tcp or {}).items():
        per[("tcp", group)] = list(secs)
        per_label[("tcp", group != "none")] += secs
    ups = [e["seconds"] for e in timeline if e.get("event") == "up" and e.get("ok")]
    downs = [e["seconds"] for e in timeline if e.get("event") == "down"]
    imps = [e["seconds"] for e in timeline if e.get("event") == "impair" and e.get("ok")]
    cases = plan.cases()
    counts: dict[tuple[str, str], int] = defaultdict(int)
    impaired: dict[tuple[str, str], bool] = {}
    floor = {t.label: first_check_s(t.test, t.params) for t in plan.tests}
    nominal = {t.label: get_test(t.test).estimate_s(t.params) for t in plan.tests}
    for c in cases:
        counts[(c.test.label, c.point.group)] += 1
        impaired[(c.test.label, c.point.group)] = c.point.impaired
    rows = []
    tests_s = floor_s = var_s = 0.0
    for (label, group), n in counts.items():
        measured = per.get((label, group))
        stand_in = not measured
        kind = impaired[(label, group)]
        pool = measured or per_label.get((label, kind)) or per_label.get((label, not kind)) or []
        # a label no run sampled at all: the test's own estimate of its length (udp-sweep:
        # steps x duration, fixed-length), never 0
        mean = statistics.fmean(pool) if pool else nominal[label]
        # stratified sampling (Cochran 1977, ch. 5): the row's total n x mean has variance
        # n^2 s^2 / k (1 - k / n); a row of one sampled case takes its label's spread over
        # every sampled case of that kind (s of one case is not defined)
        spread = pool if len(pool) >= 2 else per_label.get((label, kind)) or []
        sd = statistics.stdev(spread) if len(spread) >= 2 else 0.0
        k = len(pool)
        var = n * n * sd * sd / k * max(0.0, 1 - k / n) if k else 0.0
        var_s += var
        tests_s += mean * n
        floor_s += (floor[label] if floor[label] is not None else mean) * n
        rows.append(
            {
                "label": label,
                "group": group,
                "sampled": len(measured or []),
                "mean_s": mean,
                "stand_in": stand_in,
                "pooled": bool(pool),
                "cases": n,
                "seconds": mean * n,
                "se_s": math.sqrt(var),
            }
        )
    labs = len(plan.profiles) * len(plan.groups())
    points = len({(c.profile, c.point.name) for c in cases})
    other_per_case = budget["other_s"] / len(results) if results else 0.0
    # a file a lab writes once (scp's payload, per client node and size): once per lab
    prepared = [p for p in map(prepared_s, results) if p > 0]
    sizes = {t.params.get("size_mb") for t in plan.tests if t.test == "scp"}
    parts = {
        "tests": tests_s,
        "payloads": (statistics.fmean(prepared) if prepared else 0.0) * labs * len(sizes),
        "bring-up": (statistics.fmean(ups) if ups else 0.0) * labs,
        "teardown": (statistics.fmean(downs) if downs else 0.0) * labs,
        "impairment": (statistics.fmean(imps) if imps else 0.0) * points,
        "other": other_per_case * len(cases),
    }
    return {
        "run_cases": len(results),
        "run_budget": budget,
        "plan_cases": len(cases),
        "labs": labs,
        "points": points,
        "rows": sorted(rows, key=lambda r: -r["seconds"]),
        "parts": parts,
        "total_s": sum(parts.values()),
        "tests_se_s": math.sqrt(var_s),
        "floor_s": floor_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="*", metavar="RUN_DIR")
    ap.add_argument("--plan", help="plan file to extrapolate to (default: the run's plan.json)")
    ap.add_argument("-o", dest="overrides", action="append", default=[])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--tcp-bench", metavar="FILE", nargs="+",
                    help="bench/adaptive_tcp.py's JSON (several: their legs pooled)")  # fmt: skip
    ap.add_argument("--replace", nargs="+", default=[], metavar="RUN_DIR",
                    help="runs re-measured after a change: their cases replace the RUN_DIRs' "
                    "cases of every (test label, point group) they hold")  # fmt: skip
    ap.add_argument("--before", action="store_true", help="--tcp-bench as the segments rule")
    ap.add_argument("--tcp-rel", type=float, metavar="PCT",
                    help="--tcp-bench's adaptive legs replayed at +-PCT (bench/adaptive_spread.py)")  # fmt: skip
    a = ap.parse_args()
    if not a.runs and not a.replace and not (a.tcp_bench and a.plan):
        ap.error("give RUN_DIR, or --tcp-bench FILE with --plan PLAN")
    runs = [RunDir(Path(r)).check() for r in a.runs]
    replace = [RunDir(Path(r)).check() for r in a.replace]
    if a.plan:
        plan = load_plan(a.plan, a.overrides)
    else:
        run = (runs or replace)[0]
        plan = plan_from_json(run.plan_json(), source=str(run.path / "plan.json"))
    tcp = None
    if a.tcp_bench:
        tcp = defaultdict(list)
        for f in a.tcp_bench:
            doc = json.loads(Path(f).read_text())
            if a.tcp_rel is not None:
                from bench.adaptive_spread import replayed

                doc = replayed(doc, a.tcp_rel)
            for group, secs in tcp_bench_seconds(doc, plan, before=a.before).items():
                tcp[group] += secs
    x = extrapolate(runs, plan, tcp, replace)
    if a.json:
        print(json.dumps(x, indent=2))
        return
    b = x["run_budget"]
    names = ", ".join(str(r.path) for r in [*runs, *replace])
    if runs or replace:
        print(f"run {names}: {x['run_cases']} cases, wall {b['wall_s']:.0f} s")
        for k in ("measurement_s", "setup_s", "teardown_s", "impairment_s", "other_s"):
            print(f"  {k[:-2]:<12} {b[k]:8.1f} s  {100 * b[k] / b['wall_s']:5.1f} %")
    if tcp is not None:
        how = "the segments rule replayed" if a.before else "streaming, as measured"
        if a.tcp_rel is not None and not a.before:
            how = f"streaming, replayed at +-{a.tcp_rel:g} %"
        print(f"tcp from {', '.join(a.tcp_bench)} ({how}): {sum(map(len, tcp.values()))} legs")
    print(
        f"\nplan {plan.name}: {x['plan_cases']} cases, {len(plan.profiles)} profiles, "
        f"{x['points']} (profile, point) cells, {x['labs']} bring-ups"
    )
    print(f"{'test':<16}{'group':<10}{'sampled':>8}{'mean s':>9}{'cases':>7}{'hours':>8}{'+-h':>7}")
    for r in x["rows"]:
        mark = " (stand-in: not sampled)" if r["stand_in"] else ""
        if r["stand_in"] and not r["pooled"]:
            mark = " (the test's own estimate: not sampled)"
        print(
            f"{r['label']:<16}{r['group']:<10}{r['sampled']:>8}{r['mean_s']:>9.1f}"
            f"{r['cases']:>7}{r['seconds'] / 3600:>8.2f}{1.96 * r['se_s'] / 3600:>7.2f}{mark}"
        )
    for k, v in x["parts"].items():
        print(f"  {k:<12}{v / 3600:8.2f} h")
    print(f"  {'total':<12}{x['total_s'] / 3600:8.2f} h")
    half = 1.96 * x["tests_se_s"] / 3600
    print(
        f"  95 % interval of the total from the sampled tests' spread alone (stratified, "
        f"rows as strata): {x['total_s'] / 3600 - half:.2f} to {x['total_s'] / 3600 + half:.2f} h"
        " (a stand-in row's bias is not in it)"
    )
    print(f"floor (every adaptive test stops at its first check): {x['floor_s'] / 3600:.2f} h")


if __name__ == "__main__":
    main()
