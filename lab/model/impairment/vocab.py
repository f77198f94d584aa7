"""The tc-netem vocabulary: keywords, units, limits, and single values parsed and written.

The words `parse_spec` takes (lab.model.impairment.words), the ranges `Impairment` checks
(lab.model.impairment.model) and the canonical form `to_netem_words` writes all come from here. No I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from lab.core.errors import ConfigError


#: Delay distributions netem knows. "uniform" is the kernel default (no table is loaded), so it
#: is stored as "no distribution" and never written to tc (iproute2 ships no uniform.dist).
DISTRIBUTIONS = ("uniform", "normal", "pareto", "paretonormal")


#: Time units, as iproute2's get_time64(); value = nanoseconds per unit. Case-insensitive.
TIME_UNITS: dict[str, int] = {
    "s": 10**9, "sec": 10**9, "secs": 10**9,
    "ms": 10**6, "msec": 10**6, "msecs": 10**6,
    "us": 10**3, "usec": 10**3, "usecs": 10**3,
    "ns": 1, "nsec": 1, "nsecs": 1,
}  # fmt: skip


#: Rate units, as iproute2's get_rate64() (lib/utils_math.c); value = bit/s per unit.
#: Case-insensitive like tc, so "Mbps" is megaBYTES per second, exactly as tc reads it.
RATE_UNITS: dict[str, int] = {
    "bit": 1, "kibit": 1024, "kbit": 1000, "mibit": 1024**2, "mbit": 10**6,
    "gibit": 1024**3, "gbit": 10**9, "tibit": 1024**4, "tbit": 10**12,
    "bps": 8, "kibps": 8 * 1024, "kbps": 8000, "mibps": 8 * 1024**2, "mbps": 8 * 10**6,
    "gibps": 8 * 1024**3, "gbps": 8 * 10**9, "tibps": 8 * 1024**4, "tbps": 8 * 10**12,
}  # fmt: skip


#: Keywords of the language with their syntax (for error messages); aliases map to these.
SYNTAX: dict[str, str] = {
    "delay": "delay TIME [JITTER [CORRELATION]]",
    "distribution": "distribution {uniform|normal|pareto|paretonormal}",
    "loss": "loss {[random] PERCENT [CORRELATION] | state P13 [P31 [P32 [P23 [P14]]]]"
    " | gemodel P [R [1-H [1-K]]]}",
    "duplicate": "duplicate PERCENT [CORRELATION]",
    "corrupt": "corrupt PERCENT [CORRELATION]",
    "reorder": "reorder PERCENT [CORRELATION] [gap DISTANCE]",
    "gap": "gap DISTANCE",
    "rate": "rate RATE [PACKETOVERHEAD | packetoverhead BYTES]",
    "limit": "limit PACKETS",
    "seed": "seed NUMBER",
    "trace": "trace FILE (a link trace in Mahimahi's format, or a name in traces/)",
}


KEYWORDS = tuple(SYNTAX)


ALIASES = {"latency": "delay", "drop": "loss"}  # tc accepts both spellings


#: netem words this lab deliberately does not take, with the reason given to the user.
UNSUPPORTED = {
    "slot": "slot is not supported: the userspace engine cannot emulate slotted MACs",
    "ecn": "ecn is not supported: the userspace engine drops instead of marking",
    "cellsize": "rate cell size is not supported (ATM-like cells)",
    "celloverhead": "rate cell overhead is not supported (ATM-like cells)",
    "jitter": "jitter is written as the second value of delay: 'delay 40ms 5ms'",
}


PCT_RANGE = "0..100 %"


MAX_TIME_US = 60_000_000  # 60 s: far beyond any campaign; fits every iproute2's delay field


TIME_RANGE = "0..60 s"


U32_MAX = 2**32 - 1


U64_MAX = 2**64 - 1


OVERHEAD_MIN, OVERHEAD_MAX = -65535, 65535


NETEM_DEFAULT_LIMIT = 1000


NUM = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"


VALUE_START = "0123456789.+-"  # a token starting with one of these is a value, not a keyword


def units_list(d: Mapping[str, int]) -> str:
    return ", ".join(d)


def check_pct(value: Any, name: str, source: str, field: str | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ConfigError(
            f"{name} must be a number {PCT_RANGE}, got {value!r}",
            source=source,
            field=field or name,
        )
    if not 0 <= value <= 100:
        raise ConfigError(
            f"{name} must be {PCT_RANGE}, got {fmt_num(value)}", source=source, field=field or name
        )
    return float(value)


def fmt_num(x: float) -> str:
    """Shortest exact decimal, no exponent (tc and the parser both read it)."""
    if isinstance(x, int) or float(x).is_integer():
        return str(int(x))
    return format(Decimal(repr(float(x))).normalize(), "f")


def fmt_pct(x: float) -> str:
    return fmt_num(x) + "%"


def fmt_time(us: int) -> str:
    return format((Decimal(us) / 1000).normalize(), "f") + "ms"


def fmt_rate(bps: int) -> str:
    for unit, scale in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bps % scale == 0:
            return f"{bps // scale}{unit}"
    return f"{bps}bit"


def _match(pattern: str, tok: str, name: str, expected: str, source: str) -> re.Match[str]:
    """`tok` read whole by `pattern`, else a ConfigError: "NAME must be EXPECTED, got 'TOK'"."""
    m = re.fullmatch(pattern, tok)
    if not m:
        raise ConfigError(f"{name} must be {expected}, got {tok!r}", source=source, field=name)
    return m


def parse_pct(tok: str, name: str, source: str) -> float:
    m = _match(rf"({NUM})(%?)", tok, name, f"a percentage {PCT_RANGE} (e.g. 0.5 or 0.5%)", source)
    v = float(m[1])
    if not 0 <= v <= 100:
        raise ConfigError(f"{name} must be {PCT_RANGE}, got {m[1]}", source=source, field=name)
    return v


def parse_time_us(tok: str, name: str, source: str) -> int:
    time = f"a time {TIME_RANGE} such as 40ms (units: {units_list(TIME_UNITS)})"
    m = _match(rf"({NUM})([A-Za-z]*)", tok, name, time, source)
    value, unit = Decimal(m[1]), m[2].lower()
    if value < 0:
        raise ConfigError(f"{name} must be {TIME_RANGE}, got {tok}", source=source, field=name)
    if not unit:
        if value != 0:
            # tc(8) says a bare number is microseconds, tc-netem(8) says milliseconds, and
            # iproute2 >= 6.9 (get_time64) reads nanoseconds: refuse rather than guess.
            raise ConfigError(
                f"{name} needs a unit ({units_list(TIME_UNITS)}): a bare number is microseconds to "
                f"iproute2 < 6.9 but nanoseconds to iproute2 >= 6.9; got {tok}",
                source=source,
                field=name,
            )
        return 0
    if unit not in TIME_UNITS:
        raise ConfigError(
            f"{name}: unknown time unit {m[2]!r} in {tok!r}; valid units: {units_list(TIME_UNITS)}",
            source=source,
            field=name,
        )
    us = value * TIME_UNITS[unit] / 1000
    if us != us.to_integral_value():
        raise ConfigError(
            f"{name} must be a whole number of microseconds, got {tok}", source=source, field=name
        )
    if us > MAX_TIME_US:
        raise ConfigError(f"{name} must be {TIME_RANGE}, got {tok}", source=source, field=name)
    return int(us)


def parse_rate_bps(tok: str, source: str) -> int:
    name = "rate"
    if tok.endswith("%"):
        raise ConfigError(
            "rate as a percentage of the device speed is not supported (the speed of a veth is "
            f"not defined); give an absolute rate such as 100mbit (units: {units_list(RATE_UNITS)}), "
            f"got {tok}",
            source=source,
            field=name,
        )
    rate = f"a rate > 0 such as 100mbit (units: {units_list(RATE_UNITS)})"
    m = _match(rf"({NUM})([A-Za-z]*)", tok, name, rate, source)
    unit = m[2].lower() or "bit"  # tc(8): a bare number is bit/s
    if unit not in RATE_UNITS:
        raise ConfigError(
            f"rate: unknown rate unit {m[2]!r} in {tok!r}; valid units: {units_list(RATE_UNITS)} "
            "(bps = bytes/s, as in tc)",
            source=source,
            field=name,
        )
    bits = Decimal(m[1]) * RATE_UNITS[unit]
    if bits < 8:
        raise ConfigError(
            f"rate must be > 0 (at least 8bit, e.g. 100mbit), got {tok}", source=source, field=name
        )
    if bits > U64_MAX:
        raise ConfigError(f"rate must be at most {U64_MAX} bit/s, got {tok}", source=source,
                          field=name)  # fmt: skip
    return int(bits)


def parse_int(tok: str, name: str, lo: int, hi: int, what: str, source: str) -> int:
    _match(r"[+-]?\d+", tok, name, f"a whole number {lo}..{hi} {what}", source)
    v = int(tok)
    if not lo <= v <= hi:
        raise ConfigError(f"{name} must be {lo}..{hi} {what}, got {tok}", source=source, field=name)
    return v
