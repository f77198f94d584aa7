#!/usr/bin/env python3
"""`lab run --jobs auto` against `--jobs 1` on the same plan, one after the other on this
machine (issue 17, must-show 3): wall times and their ratio, the N auto chose and why, the
probe's interference figures, and every test's mean per profile in both runs side by side.

    sudo .venv/bin/python bench/jobs.py [--plan quick] [-o topology.cpu=0.3 ...] [--out DIR]

The quick plan as shipped (cpu="pi4": two 4-core Pi nodes, ~1.9 host cores a lab) gets one lab
on a 2-core machine; the decision for it is printed first, without running it. The default
`-o topology.cpu=0.3` caps each node at 0.3 of a core so that two labs can fit here. Figures
move with the machine's load (printed): compare within one run of this script only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from lab.campaign.jobs import Budget, interference, lab_quota, max_labs, probe_margin
from lab.campaign.load import load_plan
from lab.results.doc import primary
from lab.core.state import read_jsonl
from lab.results.rundir import rows
from lab.substrate.local.preflight import preflight


def decision_only(plan_name: str) -> str:
    plan = load_plan(plan_name)
    quota, _ = lab_quota(preflight(plan), os.cpu_count() or 1)
    b = Budget(os.cpu_count() or 1, quota, None, max_labs(plan))
    return f"{plan_name} as shipped: jobs {b.largest()} before any probe ({b.explain()})"


def timed_run(argv: list[str], log: Path) -> float:
    t = time.monotonic()
    with open(log, "w") as f:
        rc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, cwd=REPO).returncode
    if rc not in (0, 1):
        sys.exit(f"failed ({rc}): {' '.join(argv)}; see {log}")
    return time.monotonic() - t


def values(run: Path) -> dict[tuple[str, str, str, str], list[float]]:
    """(profile, point, test label, test) -> the primary metric of each successful repetition."""
    out: dict[tuple[str, str, str, str], list[float]] = {}
    for row in rows(run.name, read_jsonl(run / "results.jsonl")):
        v = row.get(primary(row["test"]).column)
        if row["ok"] and row["point"] == 0 and v is not None:
            key = (row["profile"], row["impairment"], row["test_label"], row["test"])
            out.setdefault(key, []).append(v)
    return out


def compare(one: Path, par: Path, plan) -> None:
    """Every test's mean in both runs, the ratio, and where both have repetitions the verdict
    of lab.campaign.jobs.interference (two-sided Welch p against both runs' spread, and the test's
    margin)."""
    v1, va = values(one), values(par)
    margins = {t.label: probe_margin(t)[0] for t in plan.tests}
    print("per profile/point/test: mean --jobs 1, mean --jobs auto, ratio, Welch p (n >= 2)")
    changed = significant = judged = 0
    for k in sorted(v1):
        if k not in va or not statistics.mean(v1[k]):
            continue
        m1, ma = statistics.mean(v1[k]), statistics.mean(va[k])
        p = ""
        if len(v1[k]) > 1 and len(va[k]) > 1:
            hib = primary(k[3]).higher_is_better
            verdict = interference([v1[k]], [va[k]], hib, margins.get(k[2], 0.05))
            judged += 1
            changed += verdict["changed"]
            significant += verdict["p"] < verdict["alpha"]
            p = f"p = {verdict['p']:.3f}" + (" CHANGED" if verdict["changed"] else "")
        print(f"  {'/'.join(k[:3]):45s} {m1:11.4g} {ma:11.4g}  {ma / m1:.3f}  {p}")
    print(
        f"{significant} of {judged} tests with repetitions differ at p < 0.05, {changed} of them "
        "by the test's margin (5 % unless adaptive) or more"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", default="quick")
    ap.add_argument("-o", dest="override", action="append", default=None)
    ap.add_argument("--out", default=f"/tmp/bench-jobs-{time.strftime('%Y%m%dT%H%M%S')}")
    a = ap.parse_args()
    overrides = a.override if a.override is not None else ["topology.cpu=0.3"]
    out = Path(a.out)
    out.mkdir(parents=True)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()}")
    print(decision_only(a.plan))
    lab = [
        sys.executable,
        "-m",
        "lab.cli.main",
        "run",
        a.plan,
        *(x for o in overrides for x in ("-o", o)),
    ]
    walls = {}
    for jobs in ("1", "auto"):
        run = out / f"jobs-{jobs}"
        walls[jobs] = timed_run([*lab, "--jobs", jobs, "--out", str(run)], out / f"jobs-{jobs}.log")
        print(f"--jobs {jobs}: {walls[jobs]:.0f} s (load average after {os.getloadavg()})")
    rec = json.loads((out / "jobs-auto" / "jobs.json").read_text())
    print(
        f"plan {a.plan} -o {' -o '.join(overrides)}: {len(read_jsonl(out / 'jobs-1' / 'results.jsonl'))} cases"
    )
    print(f"auto chose {rec['reason']}")
    print(f"  probe {rec.get('probe_s', 0):.0f} s, shards {rec.get('shards_s', 0):.0f} s")
    probe = rec.get("probe") or {}
    if probe:
        al, ch = probe["alone"], probe["choice"]
        print(f"  probe case: {probe['profile']} {probe['test']}: {ch['reason']}")
        for name, sc in ch.get("scores", {}).items():
            print(f"    screened {name}: {sc['utilisation']:.0%} of quota ({sc['cores']})")
        print(f"  margin {probe['margin']:g}: {probe['margin_from']}")
        print(f"  overhead per lab: {al['overhead']}")
        print(f"  machine busy before the probe: {al.get('busy_cores_before')} cores")
        for lv in probe["levels"]:
            v = lv["verdict"]
            print(
                f"  probe {al['metric']} with {lv['n']} labs: alone {v['alone']['mean']:.4g} ± "
                f"{v['alone']['sd']:.2g} (lab means {[f'{m:.4g}' for m in v['alone']['lab_means']]}), "
                f"beside {v['beside']['mean']:.4g} ± {v['beside']['sd']:.2g} (lab means "
                f"{[f'{m:.4g}' for m in v['beside']['lab_means']]}), shift {v['shift']:+.2%}, "
                f"p = {v['p']:.3f}, TOST equivalent {v['equivalent']}: {v['verdict']}"
            )
    print(f"wall --jobs 1 {walls['1']:.0f} s, --jobs auto {walls['auto']:.0f} s: "
          f"ratio auto/1 = {walls['auto'] / walls['1']:.2f}")  # fmt: skip
    compare(out / "jobs-1", out / "jobs-auto", load_plan(a.plan, overrides))


if __name__ == "__main__":
    main()
