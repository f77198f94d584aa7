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
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from lab.core import proc
from lab.core.errors import ConfigError, LabError, PreconditionError, TeardownIncomplete
from lab.core.hostreadings import core_rates, read_proc_stat
from lab.core.interrupts import Interrupts
from lab.campaign.jobs import (
    ALONE_LABS,
    Budget,
    choose_probe,
    interference,
    lab_quota,
    max_labs,
    node_cores,
    node_cpu_seconds,
    overhead_cores,
    probe_margin,
    probe_overrides,
)
from lab.campaign.merge import merge
from lab.campaign.load import load_plan, plan_file
from lab.campaign.plan import Plan
from lab.results.doc import primary
from lab.results.rundir import RunDir, rows
from lab.core.state import read_jsonl
from lab.campaign.setup import check_run_dir
from lab.campaign.shard import Shard, shard_cases
from lab.core.state import lab_dir, write_json_atomic

#: a worker's own teardown after SIGTERM (its runner takes the lab down first)
STOP_GRACE_S = 120.0
#: how often the parent looks at its workers
TICK_S = 0.2
#: the file that makes a directory a `--jobs` run
JOBS_FILE = "jobs.json"


class JobEvents:
    """What a `--jobs` run reports while it works; the CLI prints it."""

    def note(self, text: str) -> None: ...

    def progress(self, done: int, total: int) -> None: ...


@dataclass
class Worker:
    name: str
    out: Path
    argv: list[str]
    log: Path
    popen: object = None
    started_t: float = 0.0
    ended_t: float | None = None
    rc: int | None = None
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "out": str(self.out),
            "log": str(self.log),
            "pid": getattr(self.popen, "pid", None),
            "started_t": self.started_t,
            "ended_t": self.ended_t,
            "rc": self.rc,
            **self.extra,
        }


def is_jobs_run(path: Path) -> bool:
    return (Path(path) / JOBS_FILE).is_file()


def worker_argv(plan: Plan, overrides: list[str], out: Path, shard: Shard | None) -> list[str]:
    argv = [sys.executable, "-m", "lab.cli.main", "run", plan_file(plan.source)]
    for o in overrides:
        argv += ["-o", o]
    if shard is not None:
        argv += ["--shard", str(shard)]
    return [*argv, "--out", str(out)]


def start(w: Worker) -> Worker:
    """The worker in a session of its own: a Ctrl-C on the terminal reaches the parent only,
    which stops each worker by its PID."""
    env = {k: v for k, v in os.environ.items() if k != "LAB_RUN_ARGV"}
    # no report per worker (as in a `lab run --vm` guest): lab.campaign.merge writes the run's report
    env["LAB_RUN_REPORT"] = "host"
    w.log.parent.mkdir(parents=True, exist_ok=True)
    with open(w.log, "ab") as log:
        w.popen = proc.spawn(w.argv, stdout=log, stderr=log, env=env, new_session=True)
    w.started_t = time.time()
    return w


def wait(workers: list[Worker], interrupts: Interrupts, tick=None) -> None:
    """Until every worker has exited; `tick()` between looks."""
    while True:
        for w in workers:
            if w.rc is None and w.popen.poll() is not None:
                w.rc, w.ended_t = w.popen.returncode, time.time()
        if all(w.rc is not None for w in workers):
            return
        interrupts.check()
        if tick:
            tick()
        time.sleep(TICK_S)


def stop(workers: list[Worker]) -> list[str]:
    """SIGTERM each running worker (by PID, through its unreaped Popen), wait for their own
    teardowns, SIGKILL what is left, then tear down from its ledger any lab a worker left.
    Returns what is left over."""
    alive = [w for w in workers if w.popen is not None and w.popen.poll() is None]
    for w in alive:
        w.popen.send_signal(signal.SIGTERM)
    end = time.monotonic() + STOP_GRACE_S
    for w in alive:
        try:
            w.popen.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            w.popen.kill()
            w.popen.wait()
        w.rc, w.ended_t = w.popen.returncode, time.time()
    from lab.core.teardown import teardown

    left: list[str] = []
    for w in workers:
        for lab_id in _lab_ids(w.out):
            if (lab_dir(lab_id) / "ledger.jsonl").exists():
                left += teardown(lab_id)
    return left


def _lab_ids(run_path: Path) -> list[str]:
    events = (
        read_jsonl(run_path / "timeline.jsonl") if (run_path / "timeline.jsonl").is_file() else []
    )
    return sorted({e["lab_id"] for e in events if e.get("lab_id")})


def _finished(run_path: Path) -> int:
    p = run_path / "results.jsonl"
    return len(read_jsonl(p)) if p.is_file() else 0


def busy_cores(seconds: float = 1.0) -> float:
    """Host busy cores over `seconds` (/proc/stat): the load already there before a probe."""
    a = read_proc_stat()
    time.sleep(seconds)
    rates = core_rates(a, read_proc_stat())
    return sum(r["busy_pct"] for r in rates.values()) / 100


# ---------------------------------------------------------------------- the probe


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


def tree_cpu_s(pid: int) -> float | None:
    """CPU seconds of `pid` and of its children it has reaped (utime, stime, cutime, cstime of
    /proc/PID/stat); None when it is gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    f = data[data.rindex(b")") + 2 :].split()
    return sum(int(x) for x in f[11:15]) / os.sysconf("SC_CLK_TCK")


class SessionMeter:
    """The CPU time of a worker's process tree between its runner's session-start and
    session-end events (its timeline), read while it runs; without them (it ended before they
    were seen) the whole life from its rusage."""

    def __init__(self, w: Worker):
        self.w = w
        self.marks: dict[str, tuple[float, float]] = {}

    def tick(self) -> None:
        tl = self.w.out / "timeline.jsonl"
        if len(self.marks) == 2 or not tl.is_file():
            return
        for e in read_jsonl(tl):
            ev = e.get("event")
            if ev in ("session-start", "session-end") and ev not in self.marks:
                cpu = tree_cpu_s(self.w.popen.pid)
                if cpu is not None:
                    self.marks[ev] = (time.monotonic(), cpu)

    def wait(self, interrupts: Interrupts) -> dict:
        """Until the worker exits (reaped here, with its rusage); the measured session."""
        t0 = time.monotonic()
        while True:
            self.tick()
            pid, status, ru = os.wait4(self.w.popen.pid, os.WNOHANG)
            if pid:
                self.w.popen.returncode = self.w.rc = os.waitstatus_to_exitcode(status)
                self.w.ended_t = time.time()
                break
            interrupts.check()
            time.sleep(0.05)
        if len(self.marks) == 2:
            (t_a, c_a), (t_b, c_b) = self.marks["session-start"], self.marks["session-end"]
            return {"tree_cpu_s": c_b - c_a, "session_s": t_b - t_a, "window": "session"}
        return {
            "tree_cpu_s": ru.ru_utime + ru.ru_stime,
            "session_s": time.monotonic() - t0,
            "window": "whole worker (its session events were not seen)",
        }


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
        "plan": plan_file(plan.source),
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
    wait(todo, it, lambda: ev.progress(sum(_finished(w.out) for w in shards), total))
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
