"""Adaptive repetitions (issue 17): a case whose earlier repetitions already agree is not run.

For a test entry with `adaptive = true`, repetition k >= 2 of a (profile, impairment point,
test label, ip) is skipped once the Student-t interval over the primary metric of repetitions
0..k-1 is within the test's adaptive_rel_pct of their mean (lab.model.stoprule.repetitions; Georges
et al., OOPSLA 2007; netperf -i max,min -I level,width). The plan's reps stay the maximum and
two repetitions the minimum. A skipped repetition still gets its results line (so --resume,
shards and merges see every case) with one ok record whose metrics are empty and whose
stop_reason is "reps", so summaries count only measured repetitions.
"""

from __future__ import annotations

from collections.abc import Callable

from lab.measure import TESTS
from lab.campaign.plan import Case
from lab.model.stoprule import Rule, repetitions

#: stop_reason of a repetition that was not run because earlier ones agreed
REPS_CONVERGED = "reps"


def _same(entry: dict, case: Case) -> bool:
    return (
        entry.get("profile") == case.profile
        and (entry.get("impairment") or {}).get("name") == case.point.name
        and entry.get("label") == case.test.label
        and entry.get("ip", 4) == case.test.ip
        and isinstance(entry.get("rep"), int)
        and entry["rep"] < case.rep
    )


def converged(load_results: Callable[[], list[dict]], case: Case, max_reps: int) -> dict | None:
    """The `repetitions` block of a result line when `case` need not run, else None
    (the results are read only for an adaptive test's third repetition or later)."""
    params = case.test.params
    test = TESTS.get(case.test.test)
    if not params.get("adaptive") or case.rep < 2 or test is None or test.primary is None:
        return None
    earlier = [e for e in load_results() if _same(e, case)]
    if any(e.get("repetitions", {}).get("stopped") for e in earlier):
        first = next(e for e in earlier if e.get("repetitions", {}).get("stopped"))
        return {**first["repetitions"], "after_rep": first["rep"]}
    col = test.primary.column
    key = next((m.key for m in test.metrics if m.name == col), col)
    values = []
    for e in sorted(earlier, key=lambda e: e["rep"]):
        recs = e.get("records") or []
        if not e.get("ok") or len(recs) != 1 or not isinstance(recs[0].get(key), int | float):
            return None
        values.append(float(recs[0][key]))
    if len(values) != case.rep:
        return None
    rule = Rule(rel_half_width=params.get("adaptive_rel_pct", 5.0) / 100)
    d = repetitions(values, rule, max_reps=max_reps)
    if d.reason != "ci":
        return None
    return {
        "stopped": True,
        "reason": "ci",
        "metric": col,
        "values": values,
        "interval": d.interval.to_json() if d.interval else None,
        "max_reps": max_reps,
        "after_rep": case.rep - 1,
    }


def skipped_record(case: Case, info: dict) -> dict:
    """The one record of a repetition the rule did not run."""
    return {
        "test": case.test.test,
        "ok": True,
        "error": None,
        "raw_files": [],
        "stop_reason": REPS_CONVERGED,
        "measured_s": 0.0,
        "repetitions": info,
    }
