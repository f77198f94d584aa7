"""The interference probe of a `lab run --jobs` run: its labs (RUN/probe/NAME) run alone and
beside each other, and what they read: the host's load before, the cores each profile's nodes
used in the screen, the probe's primary metric per lab. lab.campaign.jobs judges the figures,
lab.campaign.parallel decides N from them. Nothing here prints.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from lab.campaign.jobs import (
    ALONE_LABS,
    choose_probe,
    node_cores,
    node_cpu_seconds,
    overhead_cores,
    probe_overrides,
)
from lab.campaign.plan import Plan
from lab.campaign.workers import SessionMeter, Worker, start, wait, worker_argv
from lab.core.errors import PreconditionError
from lab.core.hostreadings import core_rates, read_proc_stat
from lab.results.doc import primary
from lab.results.rundir import RunDir, rows


def busy_cores(seconds: float = 1.0) -> float:
    """Host busy cores over `seconds` (/proc/stat): the load already there before a probe."""
    a = read_proc_stat()
    time.sleep(seconds)
    rates = core_rates(a, read_proc_stat())
    return sum(r["busy_pct"] for r in rates.values()) / 100


def _ok_results(run_path: Path) -> list[dict]:
    results = RunDir(run_path).load_results()
    for r in results:
        if not r.get("ok"):
            raise PreconditionError(
                f"the interference probe's case {r['case']} failed ({r.get('error')}); see "
                f"{run_path}/raw and its log; fix it or run with --jobs 1"
            )
    return results


def probe_values(run_path: Path, key: dict, profile: str | None = None) -> list[float]:
    """The probe's primary metric (the results.csv column the report ranks its test by), one
    value per successful repetition (of `profile` only, if given); `key` gets the metric's name
    and direction."""
    run = RunDir(run_path)
    results = [r for r in _ok_results(run_path) if profile in (None, r.get("profile"))]
    out = []
    for row in rows(run.name, results):
        p = primary(row["test"])
        key.setdefault("metric", p.column)
        key.setdefault("higher_is_better", p.higher_is_better)
        if row["point"] == 0 and row.get(p.column) is not None:
            out.append(float(row[p.column]))
    return out


def run_labs(plan: Plan, run_path: Path, names: list[str], overrides: list[str], interrupts,
             workers: list[Worker], meter: bool = False) -> tuple[list[Worker], dict | None]:  # fmt: skip
    """Probe labs RUN/probe/NAME, all at once (one name: alone); with `meter`, the CPU time of
    the first one's session (SessionMeter)."""
    ws = []
    for name in names:
        d = run_path / "probe" / name
        ws.append(Worker(d.name, d, worker_argv(plan, overrides, d, None), d.with_suffix(".log")))
    workers += ws
    for w in ws:
        start(w)
    session = SessionMeter(ws[0]).wait(interrupts) if meter else None
    wait(ws, interrupts)
    for w in ws:
        if w.rc not in (0, 1):
            raise PreconditionError(
                f"the interference probe {w.out} ended with exit code {w.rc}; see {w.log}"
            )
    return ws, session


def screen_cores(run_path: Path) -> dict[str, dict[str, float]]:
    """Per profile of a screen run, the cores each node used during its case(s) (lab.substrate.local.monitor's
    samples, lab.campaign.jobs.node_cores; the mean over the profile's repetitions)."""
    profile_of = {r["case"]: r["profile"] for r in _ok_results(run_path)}
    per: dict[str, list[dict[str, float]]] = {}
    for f in sorted((run_path / "monitor").glob("*.json")):
        data = json.loads(f.read_text())
        cores = node_cores(data.get("samples", []))
        if cores and data.get("case") in profile_of:
            per.setdefault(profile_of[data["case"]], []).append(cores)
    return {
        p: {n: sum(c.get(n, 0.0) for c in cs) / len(cs) for n in cs[0]} for p, cs in per.items()
    }


def run_alone(plan: Plan, run_path: Path, quotas: dict[str, float], interrupts,
              workers: list[Worker]) -> tuple[dict, dict]:  # fmt: skip
    """The probe alone: first the screen, one lab that runs every profile's probe test
    PROBE_REPS times (its session metered: the overhead, lab.campaign.jobs.overhead_cores), which picks
    the profile (lab.campaign.jobs.choose_probe) and is the first alone lab of it; then ALONE_LABS - 1
    more labs of that profile one after the other. Returns (choice, alone record with the
    chosen profile's values, one list per lab)."""
    base = busy_cores()  # the machine's load, for the record
    overrides = probe_overrides(plan, plan.profiles)
    (scr,), session = run_labs(plan, run_path, ["screen"], overrides, interrupts, workers, True)
    choice = {**choose_probe(plan.profiles, screen_cores(scr.out), quotas), "dir": str(scr.out)}
    if len(plan.profiles) == 1:
        choice["reason"] = "the plan's only profile"
    key: dict = {}
    ws = [scr]
    for i in range(1, ALONE_LABS):
        more = probe_overrides(plan, [choice["profile"]])
        ws += run_labs(plan, run_path, [f"alone-{i}"], more, interrupts, workers)[0]
    samples = []
    for f in sorted((scr.out / "monitor").glob("*.json")):
        samples.append(node_cpu_seconds(json.loads(f.read_text()).get("samples", [])))
    return choice, {
        "n": 1,
        "values": [probe_values(w.out, key, choice["profile"]) for w in ws],
        **key,
        "dirs": [str(w.out) for w in ws],
        "busy_cores_before": round(base, 4),
        "overhead": {
            **overhead_cores(session["tree_cpu_s"], session["session_s"], sum(samples)),
            "window": session["window"],
        },
    }


def run_beside(plan: Plan, run_path: Path, profile: str, n: int, interrupts,
               workers: list[Worker]) -> dict:  # fmt: skip
    """The probe case of `profile` in `n` labs at once: their values, one list per lab."""
    names = [f"n{n}-{i}" for i in range(n)]
    ws, _ = run_labs(plan, run_path, names, probe_overrides(plan, [profile]), interrupts, workers)
    key: dict = {}
    values = [probe_values(w.out, key) for w in ws]
    return {"n": n, "values": values, **key, "dirs": [str(w.out) for w in ws]}
