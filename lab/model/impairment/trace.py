"""Link traces for the `trace FILE` word: Mahimahi's format read, validated and found.

A trace file has one line per delivery opportunity: the millisecond, counted from the start of
the trace, at which up to BYTES_PER_OPPORTUNITY bytes (one MTU-sized packet) may leave. Lines
are whole numbers that never decrease; the last one is the period: the trace repeats after it.
This is the format of Mahimahi's link shell (`mm-link UPLINK DOWNLINK`), so its files and the
ones in traces/ (made by tools/make_traces.py) are read alike. The engine's half is
engine/src/trace.rs; docs/impairment.md "Trace-driven links" describes both for users.

`load_trace(word)` is the one function here that reads a file (the spec parser calls it for
`trace WORD`); everything else is pure. A `Trace` carries its opportunities, so the engine gets
them over its control socket and the lab's records need no file afterwards.
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from lab import REPO
from lab.core.errors import ConfigError

#: Bytes one delivery opportunity lets leave (Mahimahi: one 1500-byte packet), IP bytes.
BYTES_PER_OPPORTUNITY = 1500
#: The traces the project ships (tools/make_traces.py writes them; traces/README.md).
TRACES_DIR = REPO / "traces"
#: Lines a trace may have: they travel in one control-socket line to the engine
#: (engine/src/trace.rs MAX_LINES; ~8 MB of JSON at most).
MAX_LINES = 2_000_000
#: A timestamp's bound: 2**32 ms is 49 days, far beyond any trace.
MAX_MS = 2**32

FORMAT = (
    "Mahimahi's format: one whole number of milliseconds >= 0 per line, never decreasing, "
    "the last one > 0"
)


@dataclass(frozen=True, repr=False)
class Trace:
    """A validated trace: `path` where it was read (absolute; in words and records) and `ms`,
    the opportunities of one period. Equal traces are equal objects (path and lines)."""

    path: str
    ms: tuple[int, ...]

    def __post_init__(self):
        check_ms(self.ms, self.path)

    @property
    def period_ms(self) -> int:
        return self.ms[-1]

    @property
    def mean_bps(self) -> float:
        """The capacity over one period, in bit/s of IP packets."""
        return len(self.ms) * BYTES_PER_OPPORTUNITY * 8 * 1000 / self.period_ms

    def opportunities(self, start_ms: int, end_ms: int) -> int:
        """Opportunities at times t with start_ms < t <= end_ms (the trace repeating)."""
        return _count_le(self, end_ms) - _count_le(self, start_ms)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "ms": list(self.ms)}

    @classmethod
    def from_json(cls, d: Any, *, source: str = "impairment JSON") -> Trace:
        if (
            not isinstance(d, dict)
            or set(d) != {"path", "ms"}
            or not isinstance(d["path"], str)
            or not isinstance(d["ms"], list)
        ):
            raise ConfigError(
                f'trace must be an object {{"path": TEXT, "ms": [MILLISECONDS...]}}, got '
                f"{str(d)[:80]}",
                source=source,
                field="trace",
            )
        return cls(d["path"], tuple(d["ms"]))

    def __str__(self) -> str:
        return self.path

    def __repr__(self) -> str:  # not the whole list in an error message
        return f"Trace({self.path!r}, {len(self.ms)} opportunities, period {self.period_ms} ms)"


def _count_le(t: Trace, ms: int) -> int:
    k, r = divmod(ms, t.period_ms)
    return k * len(t.ms) + bisect.bisect_right(t.ms, r)


def check_ms(ms: Any, path: str) -> None:
    """Refuse a list of opportunities that is not a trace (the file checks of parse_trace_text,
    for a trace that arrives as JSON)."""
    if not isinstance(ms, tuple | list) or not ms:
        raise ConfigError(f"{path}: empty; accepted: {FORMAT}", field="trace")
    if len(ms) > MAX_LINES:
        raise ConfigError(f"{path}: {len(ms)} lines, at most {MAX_LINES} accepted", field="trace")
    prev = 0
    for i, x in enumerate(ms):
        if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= MAX_MS or x < prev:
            raise ConfigError(
                f"{path}: opportunity {i + 1} is {x!r}; accepted: {FORMAT}", field="trace"
            )
        prev = x
    if ms[-1] == 0:
        raise ConfigError(
            f"{path}: the last timestamp is 0; it must be > 0 (the trace repeats after it)",
            field="trace",
        )


def parse_trace_text(text: str, path: str) -> tuple[int, ...]:
    """The opportunities of a trace file's text; `path` names it in errors, with the line."""
    lines = text.splitlines()
    while lines and not lines[-1].strip():  # a blank line at the end is a final newline
        lines.pop()
    if not lines:
        raise ConfigError(f"{path}: empty; accepted: {FORMAT}", field="trace")
    if len(lines) > MAX_LINES:
        raise ConfigError(
            f"{path}: {len(lines)} lines, at most {MAX_LINES} accepted", field="trace"
        )
    out: list[int] = []
    prev = 0
    for n, line in enumerate(lines, 1):
        tok = line.strip()
        if not tok.isascii() or not tok.isdigit():
            raise ConfigError(
                f"{path} line {n}: expected a whole number of milliseconds >= 0, got {tok!r} "
                f"(format: {FORMAT})",
                field="trace",
            )
        x = int(tok)
        if x > MAX_MS:
            raise ConfigError(f"{path} line {n}: {x} ms is beyond {MAX_MS} ms", field="trace")
        if x < prev:
            raise ConfigError(
                f"{path} line {n}: {x} is before line {n - 1}'s {prev}; timestamps must not "
                "decrease",
                field="trace",
            )
        out.append(x)
        prev = x
    if out[-1] == 0:
        raise ConfigError(
            f"{path} line {len(out)}: the last timestamp is 0; it must be > 0 (the trace repeats "
            "after it)",
            field="trace",
        )
    return tuple(out)


def shipped() -> list[str]:
    """The names of the traces in traces/ (what `trace NAME` finds without a path)."""
    if not TRACES_DIR.is_dir():
        return []
    return sorted(p.name for p in TRACES_DIR.iterdir() if p.is_file() and p.suffix != ".md")


def resolve(word: str) -> Path:
    """The file `trace WORD` means: WORD as a path (relative to the current directory), else a
    trace shipped in traces/ by that name."""
    p = Path(word).expanduser()
    if p.is_file():
        return p.resolve()
    if not p.is_absolute() and "/" not in word and (TRACES_DIR / word).is_file():
        return (TRACES_DIR / word).resolve()
    if p.exists():
        raise ConfigError(f"{word}: not a file; accepted: a trace file ({FORMAT})", field="trace")
    names = ", ".join(shipped()) or "none"
    raise ConfigError(
        f"{word}: no such file; accepted: the path of a trace file ({FORMAT}) or the name of "
        f"a shipped trace in {TRACES_DIR} ({names})",
        field="trace",
    )


def load_trace(word: str) -> Trace:
    """Read and validate the trace `trace WORD` names (resolve); the same unchanged file is
    read once."""
    path = resolve(word)
    try:
        st = path.stat()
    except OSError as e:
        raise ConfigError(f"{word}: {e.strerror}", field="trace") from None
    return _load(str(path), st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=16)
def _load(path: str, _mtime_ns: int, _size: int) -> Trace:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(
            f"{path}: cannot read: {os.strerror(e.errno or 0)}", field="trace"
        ) from None
    return Trace(path, parse_trace_text(text, path))
