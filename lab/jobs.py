"""How many labs of a plan may run at once on this machine (`lab run --jobs N|auto`), and
whether running them side by side changed a probe case's results beyond their noise.

Pure arithmetic over data the caller measured (docs/scale.md "Parallel labs"):
- the CPU budget: per lab, the sum of its nodes' CPU quotas as their profiles ask them (before
  lab.cpuplan.scale_to_host shrinks them to fit one lab onto the host) plus the uncapped
  overhead measured while a probe case ran alone (the runner itself, routers' and engines'
  processes, bring-ups: the CPU time of the lab's process tree beyond its nodes' cgroups, per
  second of its session); N labs fit when N times that is within HOST_BUDGET_FRACTION of the cores;
- the interference verdict: the probe case's primary metric beside N-1 other labs against the
  same case alone, a two-sided Welch test at ALPHA (a shift within the alone run's spread is
  noise, one beyond it is a changed result).
Nothing here starts a process; lab.parallel does.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .cpuplan import HOST_BUDGET_FRACTION
from .cpuprofile import load_profile
from .plancases import Plan
from .shard import Shard, cells, shard_cases
from .stats import mean_sd, welch_worse

#: significance of the interference test: a probe whose results beside others differ from its
#: results alone with p below this is refused
ALPHA = 0.05
#: repetitions of the probe case per lab (the alone run's spread is the noise it is judged by)
PROBE_REPS = 3
#: seconds of a probe test that takes a duration (the plan's own if shorter)
PROBE_DURATION_S = 2


@dataclass(frozen=True)
class Budget:
    """The CPU arithmetic of `--jobs`: all figures in host cores."""

    host_cores: int
    #: per lab: the nodes' quotas as their profiles ask (not shrunk to the host)
    quota_cores: float
    #: per lab: measured uncapped work (None before the probe measured it)
    overhead_cores: float | None
    #: the most labs the plan can keep busy (non-empty shards)
    max_labs: int
    headroom: float = HOST_BUDGET_FRACTION

    @property
    def per_lab(self) -> float:
        return self.quota_cores + (self.overhead_cores or 0.0)

    @property
    def room(self) -> float:
        return self.host_cores * self.headroom

    def fits(self, n: int) -> bool:
        return n * self.per_lab <= self.room + 1e-9

    def largest(self) -> int:
        """The most labs that fit (at least 1: one lab is what `lab run` always runs)."""
        if self.per_lab <= 0:
            return max(1, self.max_labs)
        return max(1, min(self.max_labs, math.floor(self.room / self.per_lab + 1e-9)))

    def explain(self, n: int | None = None) -> str:
        over = (
            f" + {self.overhead_cores:.2f} measured overhead"
            if self.overhead_cores is not None
            else ""
        )
        head = (
            f"each lab needs {self.per_lab:.2f} cores ({self.quota_cores:.2f} node quotas{over}), "
            f"this machine has {self.host_cores} ({self.headroom:.0%}: {self.room:.2f})"
        )
        if n is not None:
            head += f"; {n} labs need {n * self.per_lab:.2f}"
        return head

    def to_json(self) -> dict:
        return {**asdict(self), "per_lab": round(self.per_lab, 4), "room": round(self.room, 4)}


def lab_quota(spec, host_cores: int) -> tuple[float, dict[str, float]]:
    """(sum, per node) of the host cores a lab's nodes ask for, as their CPU profiles say
    before lab.cpuplan.scale_to_host fits one lab onto the host. An uncapped node (no cpu= or a
    profile without a cap) may take every core: it counts as `host_cores`."""
    per: dict[str, float] = {}
    for n in spec.hosts():
        if n.cpu is None:
            per[n.name] = float(host_cores)
        elif isinstance(n.cpu, float):
            per[n.name] = n.cpu
        else:
            q = load_profile(n.cpu).quota_cores
            per[n.name] = float(host_cores) if q is None else q
    return sum(per.values()), per


def max_labs(plan: Plan, most: int | None = None) -> int:
    """The most labs (at most `most`) the plan's cases keep busy: the largest N whose cut into
    N shards (lab.shard) leaves no shard empty; never more than its repetition blocks."""
    blocks = sum(reps for _, _, reps, _ in cells(plan))
    for n in range(min(blocks, most or blocks), 1, -1):
        if all(shard_cases(plan, Shard(i, n)) for i in range(n)):
            return n
    return 1


def node_cpu_seconds(samples: list[dict]) -> float:
    """CPU seconds the nodes' cgroups used over a case, from lab.monitor's samples (each: `t`
    seconds since the monitor started, every node's CPU % of one core since the sample
    before)."""
    total, prev = 0.0, 0.0
    for s in samples:
        dt = max(0.0, s["t"] - prev)
        prev = s["t"]
        total += dt * sum(v.get("total", 0.0) for v in s.get("nodes", {}).values()) / 100
    return total


def overhead_cores(tree_cpu_s: float, session_s: float, node_cpu_s: float) -> dict:
    """The uncapped work of one lab: the CPU time of its `lab run` process tree over a session
    (the runner, the commands it runs, every process it started and reaped, nodes' included)
    minus what the nodes' cgroups used during the cases, per second of the session. Startup and
    bring-ups are in it (they run in parallel labs too); softirq charged to ksoftirqd is not."""
    cores = max(0.0, tree_cpu_s - node_cpu_s) / session_s if session_s > 0 else None
    return {
        "cores": None if cores is None else round(cores, 4),
        "tree_cpu_s": round(tree_cpu_s, 3),
        "node_cpu_s": round(node_cpu_s, 3),
        "session_s": round(session_s, 3),
    }


def interference(
    alone: list[float], beside: list[float], higher_is_better: bool, alpha: float = ALPHA
) -> dict:
    """Did running beside other labs change the probe's figures beyond the alone run's noise?
    Two-sided Welch test of the means; with no spread on either side any difference counts."""
    if len(alone) < 2 or len(beside) < 2:
        raise ValueError(
            f"the interference test needs 2 or more values on each side, got {len(alone)} "
            f"alone and {len(beside)} beside"
        )
    ma, sa = mean_sd(alone)
    mb, sb = mean_sd(beside)
    w = welch_worse(alone, beside, higher_is_better)
    p = 2 * min(w.p, 1 - w.p) if w.t is not None else (1.0 if ma == mb else 0.0)
    return {
        "alone": {"n": len(alone), "mean": ma, "sd": sa, "values": alone},
        "beside": {"n": len(beside), "mean": mb, "sd": sb, "values": beside},
        "ratio": mb / ma if ma else None,
        "t": w.t,
        "df": w.df,
        "p": p,
        "alpha": alpha,
        "changed": p < alpha,
    }


def probe_overrides(plan: Plan) -> list[str]:
    """`-o` options that cut the plan to its probe case: its first profile, no impairment, its
    first test, PROBE_REPS repetitions and at most PROBE_DURATION_S seconds."""
    own = plan.tests[0].params.get("duration_s")
    duration = min(PROBE_DURATION_S, own) if own else PROBE_DURATION_S
    return [
        *plan.overrides,
        f"profiles={plan.profiles[0]}",
        "impairments=none",
        f"tests={plan.tests[0].label}",
        f"reps={PROBE_REPS}",
        f"duration={duration:g}",
    ]


#: labs a `--jobs N` may ask for (a typo of 1000 would start a thousand workers)
MAX_JOBS = 256


def parse_jobs(text: str) -> int | str:
    """`auto` or a whole number from 1 to MAX_JOBS; else a ConfigError naming both."""
    from .errors import ConfigError

    t = (text or "").strip().lower()
    if t == "auto":
        return "auto"
    if t.isdigit() and 1 <= int(t) <= MAX_JOBS:
        return int(t)
    raise ConfigError(
        f"got {text!r}; accepted: auto or a whole number from 1 to {MAX_JOBS}", source="--jobs"
    )
