"""Where a run's time went: measurement against bring-up, teardown, impairment and the rest,
from results.jsonl and the run's timeline (`lab report`'s time budget, bench/study_time.py)."""

from __future__ import annotations


def time_budget(results: list[dict], timeline: list[dict]) -> dict:
    """Run time split into measurement and the rest (bring-up, teardown, impairment, other).

    Wall time is the sum of the sessions (a resumed run has several); a session killed
    without its end event ends at its last recorded event.
    """
    sessions: dict[str, dict] = {}
    spent = {"setup": 0.0, "teardown": 0.0, "impairment": 0.0}
    kinds = {"up": "setup", "down": "teardown", "impair": "impairment"}
    for e in timeline:
        s = sessions.setdefault(e.get("session", "?"), {"start": None, "end": None, "last": 0.0})
        t = e.get("t")
        if t is not None:
            s["last"] = max(s["last"], t)
        if e.get("event") == "session-start":
            s["start"] = t
        elif e.get("event") == "session-end":
            s["end"] = t
        elif e.get("event") in kinds:
            spent[kinds[e["event"]]] += e.get("seconds") or 0.0
    for r in results:
        s = sessions.get(r.get("session", "?"))
        if s is not None and r.get("ended_t") is not None:
            s["last"] = max(s["last"], r["ended_t"])
    wall = sum(
        ((s["end"] if s["end"] is not None else s["last"]) - s["start"])
        for s in sessions.values()
        if s["start"] is not None
    )
    measured = sum(r.get("seconds") or 0.0 for r in results)
    other = max(0.0, wall - measured - sum(spent.values()))
    outside = max(0.0, wall - measured)
    return {
        "wall_s": wall,
        "measurement_s": measured,
        **{f"{k}_s": v for k, v in spent.items()},
        "other_s": other,
        "outside_s": outside,
        "outside_share": outside / wall if wall > 0 else None,
        "sessions": len(sessions),
    }
