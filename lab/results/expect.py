"""Expectations: what must hold in a run (`[[expect]]` in a plan), and the verdicts on a run.

Three kinds, each an `[[expect]]` table (docs/ci.md):

    [[expect]]                         # an absolute bound on the mean of the repetitions
    test = "tcp"                       # test label (default: every test of the plan)
    profile = "wireguard"              # default: every profile; impairment: every point
    that = "throughput_bps >= 150 Mbit/s"

    [[expect]]                         # a regression against a baseline run (--baseline)
    test = "tcp"
    regression = "10%"                 # not worse than the baseline by more than 10 %

Every case (profile x impairment x test label) is judged too, without being written: every
repetition ran and succeeded (the tunnel came up and the tool did its work).

The regression rule: a case regresses when its mean is worse than the baseline's by more than
the tolerance AND a one-sided Welch t-test says it is worse at all (p < alpha, default 0.05).
The tolerance is the midpoint between "unchanged" and "a real drop worth failing a build for"
(10 % for 20 %), so noise alone must carry the mean across half the gap, and a real drop must
be both large and significant. With several baseline runs (`--baseline` repeated) the test is
at the run level instead: the spread of the baseline runs' means is the noise (lab.model.stats).

Pure: parses raw tables and judges result rows (lab.results.rundir.rows); runs nothing, prints nothing.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from lab.core.errors import ConfigError
from lab.results.doc import primary
from lab.results.directions import DIRECTION_DOC, check_direction, name_directions, of_direction
from lab.results.rundir import SUMMARY_METRICS
from lab.results.units import convert
from lab.model.stats import mean_sd, regressed, regressed_runs

#: keys of one [[expect]] table -> meaning (for error messages and docs/ci.md)
EXPECT_KEYS = {
    "that": "a bound: 'METRIC OP VALUE [UNIT]', OP one of >= <= == > <",
    "regression": "largest tolerated worsening against the baseline: '10%' or 0.10",
    "profile": "profile spec the expectation is about (default: every profile)",
    "impairment": "impairment point name (default: every point)",
    "test": "test label (default: every test of the plan)",
    "direction": DIRECTION_DOC,
    "metric": "results.csv column a regression is judged on (default: the test's main metric)",
    "alpha": "significance level of the regression test (default 0.05)",
    "of": "what a bound is checked on: 'mean' of the repetitions (default) or 'every' one",
    "name": "label of the expectation in the verdicts and the JUnit file",
}

OPS = {
    ">=": lambda a, b: a >= b,
    "<=": lambda a, b: a <= b,
    "==": lambda a, b: math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9),
    ">": lambda a, b: a > b,
    "<": lambda a, b: a < b,
}

THAT_RE = re.compile(
    r"^\s*(?P<metric>[A-Za-z_][A-Za-z0-9_]*)\s*(?P<op>>=|<=|==|>|<)\s*"
    r"(?P<value>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(?P<unit>[A-Za-z/%]+)?\s*$"
)

DEFAULT_ALPHA = 0.05


@dataclass(frozen=True)
class Expectation:
    """One [[expect]] table, validated. `value` is in the unit of the results.csv column."""

    index: int
    kind: str  # "bound" | "regression"
    text: str  # as written: the `that` string or "regression <= 10%"
    name: str
    profile: str | None = None
    impairment: str | None = None
    test: str | None = None
    metric: str | None = None  # None for a regression: the test's main metric
    op: str | None = None
    value: float | None = None
    tolerance: float | None = None  # regression: fraction (0.10)
    alpha: float = DEFAULT_ALPHA
    of: str = "mean"
    direction: str | None = None

    def matches(self, profile: str, impairment: str, label: str) -> bool:
        return (
            self.profile in (None, profile)
            and self.impairment in (None, impairment)
            and self.test in (None, label)
        )

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class Verdict:
    """The judgement of one case (profile, impairment, test label, point) against one check."""

    profile: str
    impairment: str
    test_label: str
    point: int
    check: str  # "ok" for the case itself, else the expectation's name
    status: str  # "pass" | "fail" | "skip"
    message: str
    measured: float | None = None
    bound: str = ""
    statistic: str = ""
    n: int = 0
    kind: str = "case"  # "case" | "bound" | "regression"
    details: dict[str, Any] = field(default_factory=dict)
    direction: str = ""  # a bidir test's point: its records' (lab.results.directions)

    @property
    def case(self) -> str:
        pt = f" {self.direction}" if self.direction else f" #{self.point}" if self.point else ""
        return f"{self.impairment}/{self.test_label}{pt}"


# ---------------------------------------------------------------------- parsing


def _bad(msg: str, source: str, fld: str) -> ConfigError:
    return ConfigError(msg, source=source, field=fld)


def resolve_metric(name: str, source: str, fld: str) -> str:
    """A results.csv column: its exact name, or a unique column it begins (rtt_avg -> rtt_avg_ms,
    throughput -> throughput_bps)."""
    if name in SUMMARY_METRICS:
        return name
    cands = [c for c in SUMMARY_METRICS if c.startswith(name + "_")]
    if len(cands) == 1:
        return cands[0]
    shown = ", ".join(cands or SUMMARY_METRICS)
    raise _bad(f"unknown metric {name!r}; accepted: {shown}", source, fld)


def _tolerance(v: Any, source: str, fld: str) -> float:
    if isinstance(v, str) and v.strip().endswith("%"):
        try:
            v = float(v.strip()[:-1]) / 100
        except ValueError:
            v = None
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < 1:
        raise _bad("accepted: a share 0..1 (0.10) or a percentage string ('10%')", source, fld)
    return float(v)


def parse_expectations(
    raw: Any,
    *,
    source: str,
    profiles: list[str],
    points: list[str],
    tests: dict[str, str],
) -> list[Expectation]:
    """The plan's `expect` array -> Expectations, checked against the plan's profiles, impairment
    point names and test labels (`tests`: label -> registered test)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _bad("accepted: an array of tables ([[expect]])", source, "expect")
    out: list[Expectation] = []
    for i, e in enumerate(raw):
        fld = f"expect[{i}]"
        if not isinstance(e, dict):
            raise _bad("accepted: a table with that = ... or regression = ...", source, fld)
        unknown = sorted(set(e) - set(EXPECT_KEYS))
        if unknown:
            raise _bad(
                f"unknown key; accepted: {', '.join(EXPECT_KEYS)}", source, f"{fld}.{unknown[0]}"
            )
        for key, known in (("profile", profiles), ("impairment", points), ("test", list(tests))):
            v = e.get(key)
            if v is not None and v not in known:
                raise _bad(f"got {v!r}; the plan has: {', '.join(known)}", source, f"{fld}.{key}")
        if ("that" in e) == ("regression" in e):
            raise _bad("give exactly one of that = '...' or regression = '10%'", source, fld)
        alpha = e.get("alpha", DEFAULT_ALPHA)
        if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < alpha < 0.5:
            raise _bad(
                f"got {alpha!r}; accepted: a number between 0 and 0.5", source, f"{fld}.alpha"
            )
        of = e.get("of", "mean")
        if of not in ("mean", "every"):
            raise _bad(f"got {of!r}; accepted: mean, every", source, f"{fld}.of")
        name = e.get("name")
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise _bad("accepted: a non-empty string", source, f"{fld}.name")
        scope = dict(profile=e.get("profile"), impairment=e.get("impairment"), test=e.get("test"))
        scope["direction"] = check_direction(e.get("direction"), source, f"{fld}.direction")
        if "that" in e:
            that = e["that"]
            m = THAT_RE.match(that) if isinstance(that, str) else None
            if m is None:
                raise _bad(
                    f"got {that!r}; accepted: 'METRIC OP VALUE [UNIT]', e.g. "
                    "'throughput_bps >= 150 Mbit/s', 'rtt_avg_ms <= 2 ms', 'iface_mtu == 1420'",
                    source,
                    f"{fld}.that",
                )
            metric = resolve_metric(m["metric"], source, f"{fld}.that")
            value = convert(float(m["value"]), m["unit"], metric, source, f"{fld}.that")
            text = " ".join(that.split())
            out.append(
                Expectation(
                    i,
                    "bound",
                    text,
                    name or text,
                    metric=metric,
                    op=m["op"],
                    value=value,
                    alpha=float(alpha),
                    of=of,
                    **scope,
                )
            )
        else:
            tol = _tolerance(e["regression"], source, f"{fld}.regression")
            metric = e.get("metric")
            if metric is not None:
                if not isinstance(metric, str):
                    raise _bad("accepted: a results.csv column name", source, f"{fld}.metric")
                metric = resolve_metric(metric, source, f"{fld}.metric")
            text = f"{metric or 'main metric'} not worse than baseline by > {tol:.0%}"
            out.append(
                Expectation(
                    i,
                    "regression",
                    text,
                    name or f"regression {tol:.0%}",
                    metric=metric,
                    tolerance=tol,
                    alpha=float(alpha),
                    of=of,
                    **scope,
                )
            )
    names = [x.name for x in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise _bad(
            f"two expectations named {dup[0]!r}; give each a unique name =", source, "expect"
        )
    return out


def plan_expectations(plan) -> list[Expectation]:
    """The `[[expect]]` tables of a loaded plan (lab.campaign.plan.Plan)."""
    return parse_expectations(
        plan.raw.get("expect"),
        source=plan.source,
        profiles=list(plan.profiles),
        points=[p.name for p in plan.points],
        tests={t.label: t.test for t in plan.tests},
    )


# ---------------------------------------------------------------------- judging


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-2):
        return f"{v:.4g}"
    return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"


def _groups(table: list[dict]) -> dict[tuple, list[dict]]:
    g: dict[tuple, list[dict]] = {}
    for row in table:
        g.setdefault(
            (row["profile"], row["impairment"], row["test_label"], row["point"]), []
        ).append(row)
    return g


def _values(rows_: list[dict], metric: str) -> list[float]:
    return [r[metric] for r in rows_ if r["ok"] and r.get(metric) is not None]


def judge(
    expectations: list[Expectation],
    table: list[dict],
    baselines: list[list[dict]] | None = None,
) -> list[Verdict]:
    """Verdicts for every case of `table` (results.csv rows) and every expectation that matches
    it. `baselines`: the rows of each baseline run (None or []: regressions are skipped, saying
    why); one run is judged over its repetitions (Welch), several at the run level."""
    out: list[Verdict] = []
    groups = _groups(table)
    base_groups = [_groups(b) for b in baselines or []]
    for (profile, imp, label, point), rs in groups.items():
        if point == 0:
            bad = sorted({r["rep"] for r in rs if not r["ok"]})
            reps = len({r["rep"] for r in rs})
            errors = sorted({r["error"] for r in rs if not r["ok"] and r["error"]})
            out.append(
                Verdict(
                    profile,
                    imp,
                    label,
                    point,
                    "ok",
                    "fail" if bad else "pass",
                    (
                        f"{len(bad)} of {reps} repetitions failed (rep {', '.join(map(str, bad))})"
                        + (f": {'; '.join(errors)[:500]}" if errors else "")
                    )
                    if bad
                    else f"{reps} repetitions ran and succeeded",
                    measured=float(reps - len(bad)),
                    bound=f"{reps} of {reps} succeed",
                    n=reps,
                )
            )
    for e in expectations:
        hit = [(k, rs) for k, rs in groups.items() if e.matches(*k[:3])]
        hit = of_direction(e.direction, hit)
        if e.kind == "bound":
            hit = [
                (k, rs)
                for k, rs in hit
                if any(r.get(e.metric) is not None for r in rs) or not any(r["ok"] for r in rs)
            ]
        else:
            hit = [
                (k, rs)
                for k, rs in hit
                if k[3] == 0 or any(r.get(_metric(e, rs)) is not None for r in rs)
            ]
        if not hit:
            out.append(
                Verdict(
                    e.profile or "*",
                    e.impairment or "*",
                    e.test or "*",
                    0,
                    e.name,
                    "fail",
                    f"no case of the run matches {e.text!r}",
                    kind=e.kind,
                )
            )
            continue
        for key, rs in hit:
            if e.kind == "bound":
                out.append(_bound(e, key, rs))
            else:
                out.append(_regression(e, key, rs, base_groups))
    name_directions(out, table)
    return out


def _metric(e: Expectation, rs: list[dict]) -> str:
    return e.metric or primary(rs[0]["test"]).column


def _bound(e: Expectation, key: tuple, rs: list[dict]) -> Verdict:
    vals = _values(rs, e.metric)
    bound = f"{e.metric} {e.op} {_fmt(e.value)}"
    v = Verdict(*key, e.name, "fail", "", bound=bound, n=len(vals), kind="bound")
    if not vals:
        v.message = f"no successful repetition measured {e.metric}"
        return v
    if e.of == "every":
        worst = [x for x in vals if not OPS[e.op](x, e.value)]
        v.measured = worst[0] if worst else (min(vals) if e.op in (">=", ">") else max(vals))
        v.status = "fail" if worst else "pass"
        v.statistic = f"every repetition (n={len(vals)}): {', '.join(_fmt(x) for x in vals)}"
        v.message = f"{e.metric} = {_fmt(v.measured)}; bound {bound}; {v.statistic}"
        return v
    mean, sd = mean_sd(vals)
    v.measured = mean
    v.status = "pass" if OPS[e.op](mean, e.value) else "fail"
    v.statistic = f"mean of n={len(vals)}, sd {_fmt(sd)}"
    v.message = f"{e.metric} = {_fmt(mean)} (mean of {len(vals)}, sd {_fmt(sd)}); bound {bound}"
    return v


def _regression(e: Expectation, key: tuple, rs: list[dict], base_groups: list[dict]) -> Verdict:
    metric = _metric(e, rs)
    hib = primary(rs[0]["test"]).higher_is_better if e.metric is None else _higher(metric)
    limit = 1 - e.tolerance if hib else 1 + e.tolerance
    bound = f"{metric} {'>=' if hib else '<='} {limit:.0%} of the baseline's mean"
    v = Verdict(*key, e.name, "skip", "", bound=bound, kind="regression")
    if not base_groups:
        v.message = "no --baseline given"
        return v
    new = _values(rs, metric)
    runs = [x for x in (_values(g.get(key, []), metric) for g in base_groups) if x]
    base = [x for r in runs for x in r]
    v.n = len(new)
    if not base:
        v.message = f"the baseline has no successful {metric} for this case"
        return v
    if not new:
        v.status = "fail"
        v.message = f"no successful repetition measured {metric}"
        return v
    if len(runs) > 1:
        bad, ratio, w = regressed_runs(runs, new, e.tolerance, hib, e.alpha)
        base_mean = sum(sum(r) / len(r) for r in runs) / len(runs)
        of = f"mean of {len(runs)} runs' means"
    else:
        bad, ratio, w = regressed(base, new, e.tolerance, hib, e.alpha)
        base_mean = sum(base) / len(base)
        of = f"mean of {len(base)}"
    v.status = "fail" if bad else "pass"
    v.measured = sum(new) / len(new)
    name = "Welch t" if w.kind == "welch" else f"t against {len(runs)} baseline runs"
    stat = (
        f"{name} = {w.t:.2f}, df = {w.df:.1f}, one-sided p = {w.p:.3g}"
        if w.t is not None
        else f"no t-test (n = {len(runs) if len(runs) > 1 else len(base)}/{len(new)} or no "
        "spread): decided on the means"
    )
    v.statistic = f"ratio {ratio:.3f}; {stat}; alpha {e.alpha:g}"
    v.details = {
        "baseline_mean": base_mean,
        "baseline_n": len(base),
        "baseline_runs": len(runs),
        "test": w.kind,
        "ratio": ratio,
        "t": w.t,
        "df": w.df,
        "p": w.p,
    }
    v.message = (
        f"{metric} = {_fmt(v.measured)} (mean of {len(new)}) vs baseline "
        f"{_fmt(base_mean)} ({of}): {v.statistic}; "
        f"fails when beyond {limit:.0%} of the baseline and p < {e.alpha:g}"
    )
    return v


def _higher(metric: str) -> bool:
    """Direction of a column given explicitly: rates up, times, losses and CPU down."""
    return not any(
        metric.endswith(s) for s in ("_ms", "_us", "seconds", "_pct", "retransmits", "_mb")
    )


def summary(verdicts: list[Verdict]) -> dict[str, int]:
    return {s: sum(1 for v in verdicts if v.status == s) for s in ("pass", "fail", "skip")}
