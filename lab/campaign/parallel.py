"""`lab run PLAN --jobs N|auto`: several labs of one plan at once on this machine.

The plan is cut as for several machines (lab.campaign.shard): N worker processes each run
`lab run PLAN --shard i/N --out RUN/shards/shard-i`, a lab of their own each (the same code path
as any run: its ledger, its teardown, its resume), and lab.campaign.merge joins them into RUN, whose
results and report are a one-machine run's. Before the shards, N is checked (lab.campaign.jobs): the CPU
budget (node quotas plus the overhead measured while a probe case ran alone) and the
interference (a screen of every profile picks the probe's profile, the one nearest its CPU
quota; the probe case then runs alone in two labs one after the other and in N labs at once);
`auto` falls back to fewer labs when either fails, an explicit N is refused unless forced.

Layout of RUN while it runs: jobs.json (the decision, updated as it goes), probe/ (the probe
runs and their logs), shards/ (each shard's run directory and log). After the merge RUN holds
the merged run with probe/, shards/ and jobs.json beside it, and manifest key `jobs`.

SIGINT/SIGTERM: every worker gets SIGTERM by its PID (each tears its own lab down, as any
`lab run` does), is waited for, SIGKILLed after STOP_GRACE_S, and a lab a killed worker left is
torn down from its ledger (the lab ids in the shard's timeline). `lab run --resume RUN`
resumes the unfinished shards side by side and merges again. Nothing here prints.

This module decides N and runs the shards; the worker processes are lab.campaign.workers, the
probe's labs and readings lab.campaign.probe.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import time
from pathlib import Path

from lab.campaign.jobs import ALONE_LABS, Budget, interference, lab_quota, max_labs, probe_margin
from lab.campaign.load import load_plan, plan_file
from lab.campaign.merge import merge
from lab.campaign.plan import Plan
from lab.campaign.probe import run_alone, run_beside
from lab.campaign.setup import check_run_dir
from lab.campaign.shard import Shard, shard_cases
from lab.campaign.workers import Worker, finished_count, start, stop, wait, worker_argv
from lab.core.errors import ConfigError, LabError, PreconditionError, TeardownIncomplete
from lab.core.interrupts import Interrupts
from lab.core.state import write_json_atomic
from lab.results.rundir import RunDir

#: the file that makes a directory a `--jobs` run
JOBS_FILE = "jobs.json"


class JobEvents:
    """What a `--jobs` run reports while it works; the CLI prints it."""

    def note(self, text: str) -> None: ...

    def progress(self, done: int, total: int) -> None: ...


def is_jobs_run(path: Path) -> bool:
    return (Path(path) / JOBS_FILE).is_file()


# ---------------------------------------------------------------------- deciding N


def precheck(plan: Plan, spec, requested, force: bool) -> tuple[Budget, dict, int]:
    """Before anything is created: the budget from the node quotas alone, the labs the plan
    can keep busy, and an explicit N refused when it exceeds either (unless `force` for the
    CPU). Returns (budget, node quotas, N to try)."""
    host = os.cpu_count() or 1
    quota, per_node = lab_quota(spec, host)
    most = max_labs(plan)
    budget = Budget(host, quota, None, most)
    if requested == "auto":
        return budget, per_node, max_labs(plan, budget.largest())
    n = int(requested)
    if max_labs(plan, n) != n:
        raise ConfigError(
            f"{n} labs at once, but cut into {n} shards this plan leaves some empty (it keeps "
            f"at most {most} busy; its repetition blocks, docs/scale.md); use --jobs "
            f"{max_labs(plan, n)}",
            source="lab run",
            field="--jobs",
        )
    if not budget.fits(n) and not force:
        raise PreconditionError(_refusal(budget, n))
    return budget, per_node, n


def decide(plan: Plan, spec, requested, force: bool, run_path: Path, rec: dict, ev, it,
           workers: list[Worker]) -> int:  # fmt: skip
    """The number of labs, into `rec` with the figures it was decided by; refuses an explicit
    N that the budget or the probe rejects unless `force`."""
    budget, per_node, n = precheck(plan, spec, requested, force)
    rec["budget"] = {**budget.to_json(), "node_quotas": per_node}
    if n < 2:
        rec["reason"] = f"jobs: 1 ({budget.explain()})"
        return 1
    test = plan.tests[0]
    ev.note(f"probe: {test.label} of {len(plan.profiles)} profile(s) alone, the one nearest its "
            f"CPU quota alone again in {ALONE_LABS - 1} more lab(s), then beside others")  # fmt: skip
    choice, alone = run_alone(plan, run_path, per_node, it, workers)
    profile = choice["profile"]
    margin, margin_from = probe_margin(test)
    rec["probe"] = {"choice": choice, "profile": profile, "test": test.label, "margin": margin,
                    "margin_from": margin_from, "alone": alone, "levels": []}  # fmt: skip
    ev.note(f"probe case: {profile} {test.label} ({choice['reason']})")
    if sum(len(v) for v in alone["values"]) < 2:
        raise PreconditionError(
            f"the interference probe gave {sum(len(v) for v in alone['values'])} value(s) of "
            f"its primary metric alone, 2 or more are needed; see {alone['dirs']}"
        )
    budget = Budget(budget.host_cores, budget.quota_cores, alone["overhead"]["cores"],
                    budget.max_labs)  # fmt: skip
    rec["budget"] = {**budget.to_json(), "node_quotas": per_node}
    write_json_atomic(run_path / JOBS_FILE, rec)
    if requested == "auto":
        n = max_labs(plan, min(n, budget.largest()))
    elif not budget.fits(n) and not force:
        raise PreconditionError(_refusal(budget, n))
    while n >= 2:
        level = run_beside(plan, run_path, profile, n, it, workers)
        if sum(len(vs) for vs in level["values"]) < 2:
            raise PreconditionError(
                f"the interference probe with {n} labs gave fewer than 2 values; see "
                f"{level['dirs']}"
            )
        level["verdict"] = v = interference(alone["values"], level["values"],
                                            alone["higher_is_better"], margin)  # fmt: skip
        rec["probe"]["levels"].append(level)
        write_json_atomic(run_path / JOBS_FILE, rec)
        ev.note(f"probe with {n} labs: {_figures(alone['metric'], v)}: {v['verdict']}")
        if not v["changed"]:
            break
        if requested != "auto":
            if force:
                rec["forced_past_interference"] = True
                break
            raise PreconditionError(
                f"--jobs {n}: running {n} labs at once changed the probe's results beyond their "
                f"noise and the margin ({profile} {test.label}, {_figures(alone['metric'], v)} "
                f"< {v['alpha']}); use fewer jobs, --jobs auto, or --force (figures in "
                f"{run_path / JOBS_FILE})"
            )
        n = max_labs(plan, n - 1)
    rec["reason"] = f"jobs: {n} ({budget.explain(n)})"
    return n


def _figures(metric: str, v: dict) -> str:
    a, b = v["alone"], v["beside"]
    return (
        f"{metric} alone {a['mean']:.4g} ± {a['sd']:.2g} ({a['labs']} labs), beside "
        f"{b['mean']:.4g} ± {b['sd']:.2g} ({b['labs']} labs), shift {v['shift']:+.1%} (margin "
        f"{v['margin']:.0%}), p = {v['p']:.3f}"
    )


def _refusal(budget: Budget, n: int) -> str:
    return (
        f"--jobs {n} does not fit this machine's CPU: {budget.explain(n)} > "
        f"{budget.room:.2f}; at most {budget.largest()} fit (--jobs auto), or --force runs "
        f"{n} anyway (their CPU caps are then not honoured)"
    )


# ---------------------------------------------------------------------- the run


def run_jobs(plan: Plan, spec, run_path: Path, requested: str, force: bool, ev: JobEvents,
             argv: list[str]) -> dict:  # fmt: skip
    """Decide N, run the shards side by side, merge them into `run_path`; the report summary."""
    check_run_dir(run_path)
    run_path.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    rec: dict = {
        "requested": requested,
        "force": force,
        "argv": argv,
        "plan": plan.file or plan_file(plan.source),
        "overrides": list(plan.overrides),
        "host_cores": os.cpu_count(),
    }
    write_json_atomic(run_path / JOBS_FILE, rec)
    workers: list[Worker] = []
    with Interrupts(ev.note) as it:
        try:
            n = decide(plan, spec, requested, force, run_path, rec, ev, it, workers)
            rec["n"] = n
            rec["probe_s"] = round(time.time() - t0, 2)
            write_json_atomic(run_path / JOBS_FILE, rec)
            ev.note(rec["reason"])
            shards = [
                Worker(
                    f"shard-{i}",
                    run_path / "shards" / f"shard-{i}",
                    worker_argv(
                        plan, plan.overrides, run_path / "shards" / f"shard-{i}", Shard(i, n)
                    ),  # fmt: skip
                    run_path / "shards" / f"shard-{i}.log",
                    extra={"shard": {"index": i, "count": n}},
                )
                for i in range(n)
            ]
            return _shards(plan, run_path, shards, rec, ev, it, workers, t0)
        except BaseException:
            _stop(workers, rec, run_path, it)
            raise


def resume_jobs(run_path: Path, ev: JobEvents, argv: list[str]) -> dict:
    """Continue a `--jobs` run: the unfinished shards side by side, then merge again."""
    rec = json.loads((run_path / JOBS_FILE).read_text())
    if not rec.get("n") or not (run_path / "shards").is_dir():
        raise ConfigError(
            "this --jobs run stopped before its shards started (while probing); start a new run",
            source=str(run_path),
            field="--resume",
        )
    n = rec["n"]
    plan = load_plan(rec["plan"], rec["overrides"])
    t0 = time.time()
    shards = []
    for i in range(n):
        d = run_path / "shards" / f"shard-{i}"
        w = Worker(f"shard-{i}", d, [sys.executable, "-m", "lab.cli.main", "run", "--resume", str(d)],
                   d.with_suffix(".log"), extra={"shard": {"index": i, "count": n}})  # fmt: skip
        done = RunDir(d).finished_keys() if (d / "plan.json").is_file() else set()
        if not (d / "plan.json").is_file():
            w.argv = worker_argv(plan, plan.overrides, d, Shard(i, n))
        elif {c.key for c in shard_cases(plan, Shard(i, n))} <= done:
            w.rc = 0  # finished: nothing to start
        shards.append(w)
    rec["resumed"] = [*rec.get("resumed", []), {"t": t0, "argv": argv}]
    workers: list[Worker] = []
    with Interrupts(ev.note) as it:
        try:
            return _shards(plan, run_path, shards, rec, ev, it, workers, t0)
        except BaseException:
            _stop(workers, rec, run_path, it)
            raise


def _stop(workers: list[Worker], rec: dict, run_path: Path, it: Interrupts) -> None:
    """On the way out of a failed or interrupted run: every worker stopped, what is left said."""
    with it.shielded():
        left = stop(workers)
        rec["stopped"] = [w.to_json() for w in workers]  # every worker started, how it ended
        rec["left_over"] = left
        write_json_atomic(run_path / JOBS_FILE, rec)
    if left:
        raise TeardownIncomplete(left)


def _shards(plan, run_path, shards, rec, ev, it, workers, t0) -> dict:
    total = len(plan.cases())
    todo = [w for w in shards if w.rc is None]
    workers += todo
    for w in todo:
        start(w)
        ev.note(f"{w.name}: pid {w.popen.pid}, log {w.log}")
    rec["workers"] = [w.to_json() for w in shards]
    write_json_atomic(run_path / JOBS_FILE, rec)
    wait(todo, it, lambda: ev.progress(sum(finished_count(w.out) for w in shards), total))
    rec["workers"] = [w.to_json() for w in shards]
    rec["shards_s"] = round(time.time() - t0 - rec.get("probe_s", 0), 2)
    write_json_atomic(run_path / JOBS_FILE, rec)
    bad = [w for w in todo if w.rc not in (0, 1)]
    if bad:
        raise LabError(
            "; ".join(f"{w.name} ended with exit code {w.rc} (log {w.log})" for w in bad)
            + f"; continue: lab run --resume {run_path}"
        )
    return finish(run_path, [w.out for w in shards], rec, t0)


def finish(run_path: Path, shard_dirs: list[Path], rec: dict, t0: float) -> dict:
    """lab.campaign.merge into a new directory beside RUN, probe/, shards/ and jobs.json moved into it,
    and it put in RUN's place (RUN's earlier merge, if any, is removed)."""
    tag = secrets.token_hex(3)
    work = run_path.parent / f".{run_path.name}.jobs-{tag}"
    work.mkdir()
    merged = work / run_path.name  # the merged manifest and report name the run by its name
    try:
        summary = merge(shard_dirs, merged)
    except BaseException:
        shutil.rmtree(work)
        raise
    rec["wall_s"] = round(time.time() - t0, 2)
    for name in ("probe", "shards"):
        if (run_path / name).is_dir():
            (run_path / name).rename(merged / name)
    write_json_atomic(merged / JOBS_FILE, rec)
    m = json.loads((merged / "manifest.json").read_text())
    m["jobs"] = {k: v for k, v in rec.items() if k != "argv"}
    write_json_atomic(merged / "manifest.json", m)
    old = work / "old"
    run_path.rename(old)
    merged.rename(run_path)
    shutil.rmtree(work)  # `old`: jobs.json and an earlier merge's files, all written here
    for k in ("report", "html"):  # the report's paths where they are now
        if summary.get(k):
            summary[k] = str(run_path / Path(summary[k]).relative_to(merged))
    return summary
