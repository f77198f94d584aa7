"""How many labs of a plan may run at once on this machine (`lab run --jobs N|auto`), and
whether running them side by side changed a probe case's results beyond their noise.

Pure arithmetic over data the caller measured (docs/scale.md "Parallel labs"):
- the CPU budget: per lab, the sum of its nodes' CPU quotas as their profiles ask them (before
  lab.substrate.local.cpuplan.scale_to_host shrinks them to fit one lab onto the host) plus the uncapped
  overhead measured while a probe case ran alone (the runner itself, routers' and engines'
  processes, bring-ups: the CPU time of the lab's process tree beyond its nodes' cgroups, per
  second of its session); N labs fit when N times that is within HOST_BUDGET_FRACTION of the cores;
- the probe case (choose_probe): the plan's first test without impairment, for the profile
  whose nodes came closest to their CPU quota in a screen of every profile (PROBE_REPS short
  repetitions each, in one lab alone): the largest, over the profile's nodes, of the cores a
  node used during the case (mean over the repetitions) divided by its quota. A data plane that runs at its cap turns any CPU a
  neighbour takes into lost throughput or added delay; one with room to spare absorbs it.
  Ties go to the plan's order; without CPU samples the first profile is taken, and says so;
- the interference verdict (interference): the probe case in ALONE_LABS labs one after the
  other (the screen's lab the first) and in N labs at once, PROBE_REPS repetitions in each lab, so both sides carry the
  spread between bring-ups. Each side's values are pooled and their means compared by a
  two-sided Welch test. A level **changed the results** when p < ALPHA *and* the relative
  shift |mean beside / mean alone - 1| is at least the margin: the probe test's own precision
  target (its `adaptive_rel_pct` when the test is adaptive, else FIXED_MARGIN, the stop
  rule's default), since the plan claims its results to that precision and a smaller shift
  is not a changed result even when significant. The margin is the equivalence margin of the
  two one-sided tests (TOST: Schuirmann, J. Pharmacokinet. Biopharm. 15(6), 1987; with
  significance, Lakens, Soc. Psychol. Personal. Sci. 8(4), 2017); TOST's outcome at ALPHA is
  recorded as `equivalent` beside the verdict, it does not decide it. Pooling repetitions of
  one lab treats them as independent though they share a bring-up: the test's degrees of
  freedom are overstated and p errs low, i.e. towards refusing, which costs time only.
Nothing here starts a process; lab.campaign.parallel does.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from lab.substrate.local.cpuplan import HOST_BUDGET_FRACTION
from lab.model.cpuprofile import load_cpu_profile
from lab.campaign.plan import Plan
from lab.campaign.shard import Shard, cells, shard_cases
from lab.model.stats import mean_sd, t_sf, welch_worse
from lab.model.stoprule import Rule
from lab.core.errors import ConfigError

#: significance of the interference test: a probe whose results beside others differ from its
#: results alone with p below this (and by the margin or more) is refused
ALPHA = 0.05
#: repetitions of the probe case per lab
PROBE_REPS = 3
#: labs the probe case runs in alone, one after the other (the spread between bring-ups); the
#: first is the screen that runs every profile's probe test
ALONE_LABS = 2
#: the equivalence margin when the probe test is not adaptive: the stop rule's default target
#: half-width (the precision an adaptive run of the same plan would aim at)
FIXED_MARGIN = Rule().rel_half_width
#: how the probe's profile is chosen (recorded with the choice)
CRITERION = (
    "the profile whose nodes came closest to their CPU quota in the screen: max over its nodes "
    "of (cores used during the probe test) / (the node's quota)"
)
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
    before lab.substrate.local.cpuplan.scale_to_host fits one lab onto the host. An uncapped node (no cpu= or a
    profile without a cap) may take every core: it counts as `host_cores`."""
    per: dict[str, float] = {}
    for n in spec.hosts():
        if n.cpu is None:
            per[n.name] = float(host_cores)
        elif isinstance(n.cpu, float):
            per[n.name] = n.cpu
        else:
            q = load_cpu_profile(n.cpu).quota_cores
            per[n.name] = float(host_cores) if q is None else q
    return sum(per.values()), per


def max_labs(plan: Plan, most: int | None = None) -> int:
    """The most labs (at most `most`) the plan's cases keep busy: the largest N whose cut into
    N shards (lab.campaign.shard) leaves no shard empty; never more than its repetition blocks."""
    blocks = sum(reps for _, _, reps, _ in cells(plan))
    for n in range(min(blocks, most or blocks), 1, -1):
        if all(shard_cases(plan, Shard(i, n)) for i in range(n)):
            return n
    return 1


def node_cpu_by_node(samples: list[dict]) -> dict[str, float]:
    """CPU seconds each node's cgroup used over a case, from lab.substrate.local.monitor's samples (each: `t`
    seconds since the monitor started, every node's CPU % of one core since the sample
    before)."""
    out: dict[str, float] = {}
    prev = 0.0
    for s in samples:
        dt = max(0.0, s["t"] - prev)
        prev = s["t"]
        for name, v in s.get("nodes", {}).items():
            out[name] = out.get(name, 0.0) + dt * (v.get("total") or 0.0) / 100
    return out


def node_cpu_seconds(samples: list[dict]) -> float:
    """CPU seconds all the nodes' cgroups used over a case (node_cpu_by_node, summed)."""
    return sum(node_cpu_by_node(samples).values())


def node_cores(samples: list[dict]) -> dict[str, float]:
    """Cores each node used on average over a case: its CPU seconds over the samples' span."""
    span = samples[-1]["t"] if samples else 0.0
    if span <= 0:
        return {}
    return {n: s / span for n, s in node_cpu_by_node(samples).items()}


def choose_probe(profiles: list[str], used: dict[str, dict[str, float]],
                 quotas: dict[str, float]) -> dict:  # fmt: skip
    """The probe's profile by CRITERION: `used` holds, per screened profile, the cores each
    node used during its probe-test case(s) (node_cores); `quotas` each node's quota in cores
    (lab_quota). The largest utilisation wins, ties to the plan's order; a profile without
    samples scores nothing, and with none at all the plan's first profile is taken."""
    scores = {}
    for p in profiles:
        util = {n: c / quotas[n] for n, c in used.get(p, {}).items() if quotas.get(n)}
        if util:
            node = max(util, key=lambda n: util[n])
            scores[p] = {
                "utilisation": round(util[node], 4),
                "node": node,
                "cores": {n: round(c, 4) for n, c in used[p].items()},
            }
    if not scores:
        return {
            "profile": profiles[0],
            "criterion": CRITERION,
            "scores": {},
            "reason": "no CPU samples in the screen: the plan's first profile",
        }
    best = max(profiles, key=lambda p: scores[p]["utilisation"] if p in scores else -1.0)
    s = scores[best]
    return {
        "profile": best,
        "criterion": CRITERION,
        "scores": scores,
        "reason": (
            f"{best}: its node {s['node']} used {s['utilisation']:.0%} of its quota "
            f"({s['cores'][s['node']]:.3g} of {quotas[s['node']]:.3g} cores), the most of "
            f"{len(scores)} profile(s) screened"
        ),
    }


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


def probe_margin(test) -> tuple[float, str]:
    """The equivalence margin of the interference verdict for the probe test (a plancases
    TestEntry), and where it comes from."""
    if test.params.get("adaptive") and test.params.get("adaptive_rel_pct"):
        pct = test.params["adaptive_rel_pct"]
        return pct / 100, f"test {test.label}: adaptive_rel_pct = {pct:g} (its stop rule's target)"
    return FIXED_MARGIN, (
        f"lab.campaign.jobs.FIXED_MARGIN = {FIXED_MARGIN:g} (test {test.label} is not adaptive: the "
        "stop rule's default target)"
    )


def interference(alone: list[list[float]], beside: list[list[float]], higher_is_better: bool,
                 margin: float = FIXED_MARGIN, alpha: float = ALPHA) -> dict:  # fmt: skip
    """Did running beside other labs change the probe's figures beyond their noise and the
    margin? `alone` and `beside` hold one list of values per lab. Changed: the two-sided Welch
    test of the pooled values gives p < alpha and the means differ by `margin` (relative to
    the alone mean) or more; with no spread on either side any difference is significant.
    `equivalent`: TOST at alpha, both one-sided Welch tests reject a shift of -margin and
    +margin (recorded, not part of the verdict)."""
    a = [v for vs in alone for v in vs]
    b = [v for vs in beside for v in vs]
    if len(a) < 2 or len(b) < 2:
        raise ValueError(
            f"the interference test needs 2 or more values on each side, got {len(a)} "
            f"alone and {len(b)} beside"
        )
    ma, sa = mean_sd(a)
    mb, sb = mean_sd(b)
    w = welch_worse(a, b, higher_is_better)
    p = 2 * min(w.p, 1 - w.p) if w.t is not None else (1.0 if ma == mb else 0.0)
    shift = mb / ma - 1 if ma else math.inf
    significant = p < alpha
    beyond = abs(shift) >= margin
    verdict = "changed" if significant and beyond else (
        "within the margin" if significant else "within the noise")  # fmt: skip
    return {
        "alone": _side(alone, ma, sa),
        "beside": _side(beside, mb, sb),
        "ratio": mb / ma if ma else None,
        "shift": shift,
        "t": w.t,
        "df": w.df,
        "p": p,
        "alpha": alpha,
        "margin": margin,
        "equivalent": _tost(a, b, margin * abs(ma), alpha),
        "verdict": verdict,
        "changed": verdict == "changed",
    }


def _side(labs: list[list[float]], mean: float, sd: float) -> dict:
    values = [v for vs in labs for v in vs]
    means = [sum(vs) / len(vs) for vs in labs if vs]
    return {"n": len(values), "labs": len(labs), "mean": mean, "sd": sd, "values": values,
            "lab_means": means}  # fmt: skip


def _tost(a: list[float], b: list[float], m: float, alpha: float) -> bool:
    """Two one-sided Welch tests: is mean(b) - mean(a) shown to lie within (-m, +m)?"""
    ma, sa = mean_sd(a)
    mb, sb = mean_sd(b)
    va, vb = sa * sa / len(a), sb * sb / len(b)
    d = mb - ma
    if va + vb == 0:
        return abs(d) < m
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va * va / (len(a) - 1) + vb * vb / (len(b) - 1))
    p_low = t_sf((d + m) / se, df)  # H0: d <= -m
    p_high = t_sf((m - d) / se, df)  # H0: d >= +m
    return max(p_low, p_high) < alpha


def probe_overrides(plan: Plan, profiles: list[str], reps: int = PROBE_REPS) -> list[str]:
    """`-o` options that cut the plan to its probe case: `profiles` (the chosen one, or every
    profile for the screen), no impairment, its first test, `reps` repetitions and at most
    PROBE_DURATION_S seconds."""
    own = plan.tests[0].params.get("duration_s")
    duration = min(PROBE_DURATION_S, own) if own else PROBE_DURATION_S
    return [
        *plan.overrides,
        f"profiles={','.join(profiles)}",
        "impairments=none",
        f"tests={plan.tests[0].label}",
        f"reps={reps}",
        f"duration={duration:g}",
    ]


#: labs a `--jobs N` may ask for (a typo of 1000 would start a thousand workers)
MAX_JOBS = 256


def parse_jobs(text: str) -> int | str:
    """`auto` or a whole number from 1 to MAX_JOBS; else a ConfigError naming both."""

    t = (text or "").strip().lower()
    if t == "auto":
        return "auto"
    if t.isdigit() and 1 <= int(t) <= MAX_JOBS:
        return int(t)
    raise ConfigError(
        f"got {text!r}; accepted: auto or a whole number from 1 to {MAX_JOBS}", source="--jobs"
    )
