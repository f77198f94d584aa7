"""Verdicts on a run: every case of its results judged, and every expectation (lab.results.expect)
that matches a case, against its bound or against the baseline runs.

Every case (profile x impairment x test label) is judged without being written: every
repetition ran and succeeded (the tunnel came up and the tool did its work).

The regression rule: a case regresses when its mean is worse than the baseline's by more than
the tolerance AND a one-sided Welch t-test says it is worse at all (p < alpha, default 0.05).
The tolerance is the midpoint between "unchanged" and "a real drop worth failing a build for"
(10 % for 20 %), so noise alone must carry the mean across half the gap, and a real drop must
be both large and significant. With several baseline runs (`--baseline` repeated) the test is
at the run level instead: the spread of the baseline runs' means is the noise (lab.model.stats).

Which baseline case a case is compared with (`match_baseline`): the one with the same profile
spec, impairment point, test label and sweep point; else, across profile parameter overrides
(`wireguard:mtu=1380` against `wireguard`), the one case with the same profile name (the part
before ':'), impairment, test and point; the verdict then names it and the overrides that differ.
No such case, or several (`wireguard:mtu=1280` and `wireguard:mtu=1420` for `wireguard`): the
regression FAILS naming the case and the baseline's candidates (a gate is never dropped
silently); `allow_missing` turns "no such case" (or a baseline case with no successful
measurement) into a skip that says so.

Pure: judges result rows (lab.results.rundir.rows); runs nothing, prints nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lab.model.stats import mean_sd, regressed, regressed_runs
from lab.results.directions import name_directions, of_direction
from lab.results.doc import Primary, lower_is_better, primary
from lab.results.expect import OPS, Expectation, fmt, profile_name, split_profile


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
    #: `measured` (kept in the column's unit) as shown, in the bound's unit ('301 Mbit/s')
    measured_text: str = ""
    #: the records' direction where the case's points are directions (a bidir test), else ""
    direction: str = ""

    @property
    def case(self) -> str:
        pt = f" {self.direction}" if self.direction else f" #{self.point}" if self.point else ""
        return f"{self.impairment}/{self.test_label}{pt}"


def _groups(table: list[dict]) -> dict[tuple, list[dict]]:
    g: dict[tuple, list[dict]] = {}
    for row in table:
        g.setdefault(
            (row["profile"], row["impairment"], row["test_label"], row["point"]), []
        ).append(row)
    return g


def _values(rows_: list[dict], metric: str) -> list[float]:
    return [r[metric] for r in rows_ if r["ok"] and r.get(metric) is not None]


def match_baseline(key: tuple, groups: dict[tuple, list[dict]]) -> tuple[tuple | None, list[str]]:
    """The baseline case `key` (profile, impairment, test label, point) is compared with, and the
    baseline's profile specs that fit it. The same spec first; else every spec of the same
    profile name at the same impairment, test and point: one is the match, none or several is
    no match (the caller fails, naming the candidates)."""
    if key in groups:
        return key, [key[0]]
    profile, rest = key[0], key[1:]
    name = profile_name(profile)
    fits = sorted({k[0] for k in groups if k[1:] == rest and profile_name(k[0]) == name})
    return ((fits[0], *rest) if len(fits) == 1 else None), fits


def overrides_differ(spec: str, base: str) -> dict[str, list[str | None]]:
    """{parameter: [value here, value in the baseline]} where two specs of one profile differ
    (None: not overridden, the profile file's own value)."""
    a, b = split_profile(spec)[1], split_profile(base)[1]
    return {k: [a.get(k), b.get(k)] for k in sorted({*a, *b}) if a.get(k) != b.get(k)}


def _differ_text(diff: dict[str, list[str | None]]) -> str:
    own = "the profile's own"
    return "; ".join(
        f"{k} {a if a is not None else own} here, {b if b is not None else own} in the baseline"
        for k, (a, b) in diff.items()
    )


def judge(
    expectations: list[Expectation],
    table: list[dict],
    baselines: list[list[dict]] | None = None,
    *,
    allow_missing: bool = False,
    primaries: Mapping[str, Primary] | None = None,
) -> list[Verdict]:
    """Verdicts for every case of `table` (results.csv rows) and every expectation that matches
    it. `baselines`: the rows of each baseline run (None or []: regressions are skipped, saying
    why); one run is judged over its repetitions (Welch), several at the run level. A case no
    baseline run has (match_baseline) fails its regression, or is skipped with `allow_missing`.
    `primaries`: each test label's main metric (doc.label_primaries of the run's plan: a
    rekey-only handshake entry's is its rekey recovery), a regression's default; a label not
    in it goes by its test's."""

    def main(rs: list[dict]) -> Primary:
        return (primaries or {}).get(rs[0]["test_label"]) or primary(rs[0]["test"])

    out: list[Verdict] = []
    groups = _groups(table)
    bases = [
        (b[0]["run"] if b and b[0].get("run") else f"baseline {i + 1}", _groups(b))
        for i, b in enumerate(baselines or [])
    ]
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
        hit = of_direction(e.direction, [(k, rs) for k, rs in groups.items() if e.matches(*k[:3])])
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
                if k[3] == 0 or any(r.get(e.metric or main(rs).column) is not None for r in rs)
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
                out.append(_regression(e, key, rs, bases, allow_missing, main(rs)))
    name_directions(out, table)
    return out


def _bound(e: Expectation, key: tuple, rs: list[dict]) -> Verdict:
    vals = _values(rs, e.metric)
    bound = f"{e.metric} {e.op} {e.written or fmt(e.value)}"
    v = Verdict(*key, e.name, "fail", "", bound=bound, n=len(vals), kind="bound")
    if not vals:
        v.message = f"no successful repetition measured {e.metric}"
        return v
    if e.of == "every":
        worst = [x for x in vals if not OPS[e.op](x, e.value)]
        v.measured = worst[0] if worst else (min(vals) if e.op in (">=", ">") else max(vals))
        v.measured_text = e.show(v.measured)
        v.status = "fail" if worst else "pass"
        v.statistic = f"every repetition (n={len(vals)}): {', '.join(e.show(x) for x in vals)}"
        v.message = f"{e.metric} = {v.measured_text}; bound {bound}; {v.statistic}"
        return v
    mean, sd = mean_sd(vals)
    v.measured = mean
    v.measured_text = e.show(mean)
    v.status = "pass" if OPS[e.op](mean, e.value) else "fail"
    v.statistic = f"mean of n={len(vals)}, sd {e.show(sd)}"
    v.message = (
        f"{e.metric} = {v.measured_text} (mean of {len(vals)}, sd {e.show(sd)}); bound {bound}"
    )
    return v


def _shown(main: Primary, metric: str) -> tuple[float, str]:
    """(scale, unit) a regression's values are shown in: the main metric's unit for the main
    metric (throughput in Mbit/s), else the column's own (no unit)."""
    return (main.scale, main.unit.split()[0]) if main.column == metric else (1.0, "")


def _regression(
    e: Expectation,
    key: tuple,
    rs: list[dict],
    bases: list[tuple[str, dict]],
    allow_missing: bool,
    main: Primary,
) -> Verdict:
    metric = e.metric or main.column
    hib = main.higher_is_better if e.metric is None else not lower_is_better(metric)
    limit = 1 - e.tolerance if hib else 1 + e.tolerance
    bound = f"{metric} {'>=' if hib else '<='} {limit:.0%} of the baseline's mean"
    v = Verdict(*key, e.name, "skip", "", bound=bound, kind="regression")
    if not bases:
        v.message = "no --baseline given"
        return v
    scale, unit = _shown(main, metric)

    def show(x: float) -> str:
        return fmt(x * scale) + (f" {unit}" if unit else "")

    case = f"{key[0]} {key[1]}/{key[2]}" + (f" #{key[3]}" if key[3] else "")
    matched = [(run, match_baseline(key, g), g) for run, g in bases]
    several = [(run, fits) for run, (k, fits), _ in matched if k is None and len(fits) > 1]
    if several:
        v.status = "fail"
        v.message = (
            "; ".join(
                f"{case}: the baseline {run} has {len(fits)} cases it could be compared with: "
                f"{', '.join(fits)} (same profile, impairment and test, other overrides)"
                for run, fits in several
            )
            + f"; judge against a baseline run with {key[0]} itself or with one of them only"
        )
        v.details = {"baseline_candidates": {run: fits for run, fits in several}}
        return v
    found = [(run, k, _values(g[k], metric)) for run, (k, _), g in matched if k is not None]
    lacking = [run for run, (k, _), _ in matched if k is None]
    if not found:
        others = sorted({k[0] for _, g in bases for k in g if k[1:] == key[1:]})
        v.status = "skip" if allow_missing else "fail"
        v.message = (
            f"the baseline ({', '.join(lacking)}) has no case {case} nor one of "
            f"{profile_name(key[0])} with other overrides"
            + (
                f"; its profiles at {key[1]}/{key[2]}: {', '.join(others)}"
                if others
                else f"; it ran no {key[1]}/{key[2]}"
            )
            + (
                ": skipped (--allow-missing-baseline)"
                if allow_missing
                else "; --allow-missing-baseline skips a case the baseline lacks"
            )
        )
        v.details = {"baseline_candidates": others}
        return v
    runs = [vals for _, _, vals in found if vals]
    base = [x for r in runs for x in r]
    used = list(dict.fromkeys(k[0] for _, k, _ in found))
    diff = {b: overrides_differ(key[0], b) for b in used if b != key[0]}
    compared = (
        "compared with the baseline's "
        + ", ".join(f"{b} ({_differ_text(diff[b])})" if b in diff else b for b in used)
        if diff
        else ""
    )
    v.details = {
        "baseline_case": used,
        "overrides_differ": diff,
        "compared_with": compared,
        "baseline_lacking": lacking,
    }
    v.n = len(_values(rs, metric))
    if not base:
        v.status = "skip" if allow_missing else "fail"
        v.message = (
            f"the baseline's {' and '.join(used)} {key[1]}/{key[2]} has no successful {metric} "
            "(every repetition failed there)"
            + (
                ": skipped (--allow-missing-baseline)"
                if allow_missing
                else "; --allow-missing-baseline skips it"
            )
        )
        return v
    new = _values(rs, metric)
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
    v.measured_text = show(v.measured)
    name = "Welch t" if w.kind == "welch" else f"t against {len(runs)} baseline runs"
    stat = (
        f"{name} = {w.t:.2f}, df = {w.df:.1f}, one-sided p = {w.p:.3g}"
        if w.t is not None
        else f"no t-test (n = {len(runs) if len(runs) > 1 else len(base)}/{len(new)} or no "
        "spread): decided on the means"
    )
    v.statistic = f"ratio {ratio:.3f}; {stat}; alpha {e.alpha:g}"
    v.bound = f"{bound} ({show(base_mean * limit)})"
    v.details.update(
        {
            "baseline_mean": base_mean,
            "baseline_n": len(base),
            "baseline_runs": len(runs),
            "test": w.kind,
            "ratio": ratio,
            "t": w.t,
            "df": w.df,
            "p": w.p,
        }
    )
    v.message = (
        (f"{compared}: " if compared else "")
        + f"{metric} = {v.measured_text} (mean of {len(new)}) vs baseline "
        f"{show(base_mean)} ({of}): {v.statistic}; "
        f"fails when beyond {limit:.0%} of the baseline and p < {e.alpha:g}"
        + (f"; baseline run(s) without this case: {', '.join(lacking)}" if lacking else "")
    )
    return v


def summary(verdicts: list[Verdict]) -> dict[str, int]:
    return {s: sum(1 for v in verdicts if v.status == s) for s in ("pass", "fail", "skip")}
