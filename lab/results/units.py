"""Units of `[[expect]]` bounds: a value with its unit converted to a results.csv column's own
(150 Mbit/s -> 150e6 for throughput_bps). Pure."""

from __future__ import annotations

from lab.core.errors import ConfigError

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


def column_unit(column: str) -> tuple[str, float] | None:
    for end, dim in COLUMN_UNITS:
        if column.endswith(end):
            return dim
    return None


def convert(value: float, unit: str | None, column: str, source: str, fld: str) -> float:
    """VALUE UNIT -> the column's own unit (150 Mbit/s -> 150e6 for throughput_bps)."""
    if unit is None:
        return value
    if unit not in UNITS:
        raise ConfigError(
            f"unknown unit {unit!r}; accepted: {', '.join(UNITS)}", source=source, field=fld
        )
    dim, factor = UNITS[unit]
    col = column_unit(column)
    if col is None or col[0] != dim:
        ok = [u for u, (d, _) in UNITS.items() if col and d == col[0]]
        raise ConfigError(
            f"unit {unit!r} does not fit {column}; accepted: "
            + (", ".join(ok) if ok else "no unit (the column's own)"),
            source=source,
            field=fld,
        )
    return value * factor / col[1]
