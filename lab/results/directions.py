"""Which direction a result is about. A tcp or udp test with `bidir = true` returns one record per
direction (lab.measure.iperf3json), so its results.csv rows have `point` 0 client-to-server and 1
server-to-client: the report titles its tables, and `lab check` names its verdicts, by that
direction, and an `[[expect]]` table's `direction` picks one. Pure."""

from __future__ import annotations

from typing import Any

from lab.core.errors import ConfigError
from lab.measure.tcp import DIRECTIONS

DIRECTION_DOC = (
    "client-to-server or server-to-client: only records of that direction (a tcp or udp "
    "bidir = true test has one of each; default: every record)"
)


def point_directions(rows_) -> dict[int, str] | None:
    """{point: direction} when a test's records are one per direction (tcp/udp `bidir = true`:
    point 0 client-to-server, 1 server-to-client), else None."""
    by_point: dict[int, set] = {}
    for r in rows_:
        by_point.setdefault(r["point"], set()).add(r.get("direction") or "")
    names = [next(iter(d)) for d in by_point.values() if len(d) == 1]
    if len(by_point) < 2 or len(names) < len(by_point) or "" in names:
        return None
    if len(set(names)) < len(names):  # udp-sweep: every step runs the same way
        return None
    return {p: next(iter(d)) for p, d in by_point.items()}


def check_direction(value: Any, source: str, fld: str) -> str | None:
    """An `[[expect]]` table's `direction`, or ConfigError naming the accepted ones."""
    if value is not None and value not in DIRECTIONS:
        raise ConfigError(
            f"got {value!r}; accepted: {', '.join(DIRECTIONS)}", source=source, field=fld
        )
    return value


def of_direction(direction: str | None, hits: list[tuple[tuple, list[dict]]]) -> list:
    """The (case key, rows) of `hits` whose rows are of `direction` (None: all of them)."""
    if direction is None:
        return hits
    return [(k, rs) for k, rs in hits if any(r.get("direction") == direction for r in rs)]


def name_directions(verdicts: list, table: list[dict]) -> None:
    """Set `direction` on the verdicts of a case whose points are directions (a bidir test:
    "none/tcp-bidir server-to-client" rather than "none/tcp-bidir #1")."""
    cases: dict[tuple, list[dict]] = {}
    for row in table:
        cases.setdefault((row["profile"], row["impairment"], row["test_label"]), []).append(row)
    named = {k: point_directions(rs) for k, rs in cases.items()}
    for v in verdicts:
        dirs = named.get((v.profile, v.impairment, v.test_label)) or {}
        v.direction = dirs.get(v.point, "")
