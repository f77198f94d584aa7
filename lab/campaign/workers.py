"""The worker processes of a `lab run --jobs` run: each one a `lab run` of its own, started in a
session of its own, watched until it exits, its CPU time metered, and stopped (SIGTERM, then
SIGKILL after STOP_GRACE_S, then a teardown from the ledger of any lab it left). Nothing here
prints.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from lab.campaign.load import plan_file
from lab.campaign.plan import Plan
from lab.campaign.shard import Shard
from lab.core import proc
from lab.core.interrupts import Interrupts
from lab.core.state import lab_dir, read_jsonl
from lab.core.teardown import teardown

#: a worker's own teardown after SIGTERM (its runner takes the lab down first)
STOP_GRACE_S = 120.0
#: how often the parent looks at its workers
TICK_S = 0.2


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
    left: list[str] = []
    for w in workers:
        for lab_id in lab_ids(w.out):
            if (lab_dir(lab_id) / "ledger.jsonl").exists():
                left += teardown(lab_id)
    return left


def lab_ids(run_path: Path) -> list[str]:
    events = (
        read_jsonl(run_path / "timeline.jsonl") if (run_path / "timeline.jsonl").is_file() else []
    )
    return sorted({e["lab_id"] for e in events if e.get("lab_id")})


def finished_count(run_path: Path) -> int:
    p = run_path / "results.jsonl"
    return len(read_jsonl(p)) if p.is_file() else 0


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
