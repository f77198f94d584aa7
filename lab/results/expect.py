"""Expectations: what must hold in a run (`[[expect]]` in a plan), parsed and validated; the
verdicts on a run are judged by lab.results.verdicts.

Three kinds, each an `[[expect]]` table (docs/ci.md):

    [[expect]]                         # an absolute bound on the mean of the repetitions
    test = "tcp"                       # test label (default: every test of the plan)
    profile = "wireguard"              # default: every profile; impairment: every point
    that = "throughput_bps >= 150 Mbit/s"

    [[expect]]                         # a regression against a baseline run (--baseline)
    test = "tcp"
    regression = "10%"                 # not worse than the baseline by more than 10 %

An expectation's `profile = "wireguard"` covers every spec of that profile (`wireguard:mtu=1380`)
when the plan has no spec spelled exactly so.

Bounds keep the value as written (`50 Mbit/s`); a verdict shows the bound and the measured
value in that unit (a regression: in the test's main unit, lab.results.doc.primary).

Pure: parses raw tables; runs nothing, prints nothing.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from lab.core.errors import ConfigError
from lab.results.directions import DIRECTION_DOC, check_direction
from lab.results.columns import SUMMARY_METRICS
from lab.vpn.profiles import split_spec

#: keys of one [[expect]] table -> meaning (for error messages and docs/ci.md)
EXPECT_KEYS = {
    "that": "a bound: 'METRIC OP VALUE [UNIT]', OP one of >= <= == > <",
    "regression": "largest tolerated worsening against the baseline: '10%' or 0.10",
    "profile": "profile spec the expectation is about; a name alone covers its every "
    "PROFILE:key=value spec (default: every profile)",
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

#: unit -> (dimension, factor to the dimension's base unit)
UNITS: dict[str, tuple[str, float]] = {
    "bit/s": ("rate", 1.0),
    "bps": ("rate", 1.0),
    "kbit/s": ("rate", 1e3),
    "Mbit/s": ("rate", 1e6),
    "Gbit/s": ("rate", 1e9),
    "s": ("time", 1.0),
    "ms": ("time", 1e-3),
    "us": ("time", 1e-6),
    "%": ("share", 1.0),
    "B": ("bytes", 1.0),
    "bytes": ("bytes", 1.0),
    "MiB": ("bytes", 2.0**20),
}

#: column name ending -> (dimension, base units per column unit)
COLUMN_UNITS = [
    ("_bps", ("rate", 1.0)),
    ("_ms", ("time", 1e-3)),
    ("_us", ("time", 1e-6)),
    ("seconds", ("time", 1.0)),
    ("_pct", ("share", 1.0)),
    ("_mb", ("bytes", 2.0**20)),
    ("mtu", ("bytes", 1.0)),
    ("_mss", ("bytes", 1.0)),
]

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
    #: the bound's VALUE [UNIT] as written ("50 Mbit/s"); `value` is it in the column's unit
    written: str | None = None
    #: the unit written (None: the column's own) and column units per written unit (1e6)
    unit: str | None = None
    unit_scale: float = 1.0
    #: `profile` is a profile name the plan has only with overrides: it covers each of its specs
    profile_by_name: bool = False
    #: only the records of this direction (a bidir test has one of each: lab.results.directions)
    direction: str | None = None

    def matches(self, profile: str, impairment: str, label: str) -> bool:
        by_name = self.profile_by_name and profile_name(profile) == self.profile
        return (
            (self.profile in (None, profile) or by_name)
            and self.impairment in (None, impairment)
            and self.test in (None, label)
        )

    def show(self, x: float | None) -> str:
        """A value of the column in the unit the bound was written in ('301 Mbit/s')."""
        if x is None:
            return "-"
        return fmt(x / self.unit_scale) + (f" {self.unit}" if self.unit else "")

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}


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


def column_unit(column: str) -> tuple[str, float] | None:
    for end, dim in COLUMN_UNITS:
        if column.endswith(end):
            return dim
    return None


def _unit_scale(unit: str | None, column: str, source: str, fld: str) -> float:
    """Column units per UNIT (Mbit/s for throughput_bps: 1e6; 150 Mbit/s is 150e6 there)."""
    if unit is None:
        return 1.0
    if unit not in UNITS:
        raise _bad(f"unknown unit {unit!r}; accepted: {', '.join(UNITS)}", source, fld)
    dim, factor = UNITS[unit]
    col = column_unit(column)
    if col is None or col[0] != dim:
        ok = [u for u, (d, _) in UNITS.items() if col and d == col[0]]
        raise _bad(
            f"unit {unit!r} does not fit {column}; accepted: "
            + (", ".join(ok) if ok else "no unit (the column's own)"),
            source,
            fld,
        )
    return factor / col[1]


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
        names = {profile_name(p) for p in profiles}
        for key, known in (("profile", profiles), ("impairment", points), ("test", list(tests))):
            v = e.get(key)
            if v is not None and v not in known and not (key == "profile" and v in names):
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
        scope = dict(
            profile=e.get("profile"),
            impairment=e.get("impairment"),
            test=e.get("test"),
            profile_by_name=e.get("profile") is not None and e.get("profile") not in profiles,
            direction=check_direction(e.get("direction"), source, f"{fld}.direction"),
        )
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
            scale = _unit_scale(m["unit"], metric, source, f"{fld}.that")
            written = m["value"] + (f" {m['unit']}" if m["unit"] else "")
            text = " ".join(that.split())
            out.append(
                Expectation(
                    i,
                    "bound",
                    text,
                    name or text,
                    metric=metric,
                    op=m["op"],
                    value=float(m["value"]) * scale,
                    written=written,
                    unit=m["unit"],
                    unit_scale=scale,
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


# -------------------------------------------------- values as shown, profile specs


def fmt(v: float | None) -> str:
    """A figure in a verdict: four significant digits, 5e+07 only beyond what a unit covers."""
    if v is None:
        return "-"
    if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-2):
        return f"{v:.4g}"
    return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"


def profile_name(spec: str) -> str:
    """The profile a spec loads: 'wireguard:mtu=1380' -> 'wireguard'."""
    return split_profile(spec)[0]


def split_profile(spec: str) -> tuple[str, dict[str, str]]:
    """A case's profile spec split as lab.vpn.profiles does; a name that is no spec (an imported
    run's 'IPsec: AES-GCM', say) stays whole, with no overrides."""
    try:
        return split_spec(spec)
    except ConfigError:
        return spec, {}
