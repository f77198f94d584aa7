"""The impairment spec language: tc-netem words in, one validated `Impairment` out.

`parse_spec("delay 40ms 5ms 25% distribution normal loss 0.5%")` accepts the words users paste
from `tc qdisc ... netem` (see tc-netem(8)); `Impairment.to_json()` is the form in
docs/impairment-spec.md that the userspace engine consumes; `Impairment.to_netem_words()` is the
canonical tc form the kernel backend passes to `tc` (and which parses back to the same object).
Asymmetric links use `parse_directional("a2b: delay 10ms; b2a: delay 30ms loss 1%")`.
The language is described for users in docs/impairment.md. This module does no I/O.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, ClassVar

from ..errors import ConfigError

# --------------------------------------------------------------------------------------------
# Vocabulary
# --------------------------------------------------------------------------------------------

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

_NUM = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_VALUE_START = "0123456789.+-"  # a token starting with one of these is a value, not a keyword


def _units(d: Mapping[str, int]) -> str:
    return ", ".join(d)


# --------------------------------------------------------------------------------------------
# Loss models
# --------------------------------------------------------------------------------------------


def _check_pct(value: Any, name: str, source: str, field: str | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ConfigError(
            f"{name} must be a number {PCT_RANGE}, got {value!r}",
            source=source,
            field=field or name,
        )
    if not 0 <= value <= 100:
        raise ConfigError(
            f"{name} must be {PCT_RANGE}, got {_fmt_num(value)}", source=source, field=field or name
        )
    return float(value)


@dataclass(frozen=True)
class RandomLoss:
    """Independent loss with probability p_pct (tc: `loss [random] P [CORR]`)."""

    p_pct: float
    corr_pct: float = 0.0
    model: ClassVar[str] = "random"

    def __post_init__(self):
        object.__setattr__(self, "p_pct", _check_pct(self.p_pct, "loss", "impairment"))
        object.__setattr__(
            self, "corr_pct", _check_pct(self.corr_pct, "loss correlation", "impairment")
        )

    def to_json(self) -> dict:
        return {"model": "random", "p_pct": self.p_pct, "corr_pct": self.corr_pct}

    def words(self) -> list[str]:
        w = ["loss", _pct(self.p_pct)]
        return w + [_pct(self.corr_pct)] if self.corr_pct else w


@dataclass(frozen=True)
class StateLoss:
    """netem's 4-state Markov loss (tc: `loss state P13 [P31 [P32 [P23 [P14]]]]`), percent.

    Defaults as iproute2 fills them: p31 = 100 - p13, p32 = 0, p23 = 100, p14 = 0.
    """

    p13: float
    p31: float
    p32: float = 0.0
    p23: float = 100.0
    p14: float = 0.0
    model: ClassVar[str] = "state"
    PARAMS: ClassVar[tuple[str, ...]] = ("p13", "p31", "p32", "p23", "p14")

    def __post_init__(self):
        for p in self.PARAMS:
            v = _check_pct(getattr(self, p), f"loss state {p}", "impairment")
            object.__setattr__(self, p, v)

    def to_json(self) -> dict:
        return {"model": "state", **{p: getattr(self, p) for p in self.PARAMS}}

    def words(self) -> list[str]:
        return ["loss", "state", *(_pct(getattr(self, p)) for p in self.PARAMS)]


@dataclass(frozen=True)
class GELoss:
    """Gilbert-Elliott loss (tc: `loss gemodel P [R [1-H [1-K]]]`), percent.

    Defaults as iproute2 fills them: r = 100 - p, 1-h = 100, 1-k = 0.
    """

    p: float
    r: float
    one_h: float = 100.0
    one_k: float = 0.0
    model: ClassVar[str] = "gemodel"
    PARAMS: ClassVar[tuple[str, ...]] = ("p", "r", "one_h", "one_k")
    NAMES: ClassVar[dict[str, str]] = {"p": "p", "r": "r", "one_h": "1-h", "one_k": "1-k"}

    def __post_init__(self):
        for p in self.PARAMS:
            v = _check_pct(getattr(self, p), f"loss gemodel {self.NAMES[p]}", "impairment")
            object.__setattr__(self, p, v)

    def to_json(self) -> dict:
        return {"model": "gemodel", **{p: getattr(self, p) for p in self.PARAMS}}

    def words(self) -> list[str]:
        return ["loss", "gemodel", *(_pct(getattr(self, p)) for p in self.PARAMS)]


Loss = RandomLoss | StateLoss | GELoss
LOSS_MODELS = ("random", "state", "gemodel")


def _loss_from_json(d: Any, source: str) -> Loss:
    if not isinstance(d, Mapping):
        raise ConfigError(
            f"loss must be an object with a model ({', '.join(LOSS_MODELS)}), got {d!r}",
            source=source,
            field="loss",
        )
    model = d.get("model")
    keys = {
        "random": ("p_pct", "corr_pct"),
        "state": StateLoss.PARAMS,
        "gemodel": GELoss.PARAMS,
    }
    if model not in keys:
        raise ConfigError(
            f"loss model must be one of {', '.join(LOSS_MODELS)}, got {model!r}",
            source=source,
            field="loss.model",
        )
    extra = set(d) - set(keys[model]) - {"model"}
    if extra:
        raise ConfigError(
            f"unknown {model} loss field(s) {', '.join(sorted(extra))}; "
            f"valid: model, {', '.join(keys[model])}",
            source=source,
            field="loss",
        )
    first = keys[model][0]
    if first not in d:
        raise ConfigError(f"{model} loss needs {first}", source=source, field=f"loss.{first}")
    vals = {k: _check_pct(d[k], f"loss.{k}", source) for k in keys[model] if k in d}
    if model == "random":
        return RandomLoss(**vals)
    if model == "state":
        vals.setdefault("p31", 100.0 - vals["p13"])
        return StateLoss(**vals)
    vals.setdefault("r", 100.0 - vals["p"])
    return GELoss(**vals)


# --------------------------------------------------------------------------------------------
# Impairment
# --------------------------------------------------------------------------------------------

_PCT_FIELDS = {
    "delay_corr_pct": "delay correlation",
    "duplicate_pct": "duplicate",
    "duplicate_corr_pct": "duplicate correlation",
    "corrupt_pct": "corrupt",
    "corrupt_corr_pct": "corrupt correlation",
    "reorder_pct": "reorder",
    "reorder_corr_pct": "reorder correlation",
}
#: JSON field -> spec word used in messages
_FIELD_WORD = {
    "delay_us": "delay",
    "jitter_us": "jitter",
    "distribution": "distribution",
    "loss": "loss",
    "reorder_gap": "gap",
    "rate_bps": "rate",
    "rate_packet_overhead": "rate packetoverhead",
    "limit": "limit",
    "seed": "seed",
    **_PCT_FIELDS,
}


@dataclass(frozen=True)
class Impairment:
    """One direction's impairment; None means off. Field names and units are those of
    docs/impairment-spec.md (microseconds, percent 0..100, bits/s).

    Construction validates and normalises, so equal behaviour means equal objects: zero values
    mean off (None), a distribution or correlation without jitter is dropped (it has no effect),
    "uniform" is the default (None), `gap 1` is what tc
    sets for plain reorder (None).
    """

    delay_us: int | None = None
    jitter_us: int | None = None
    delay_corr_pct: float | None = None
    distribution: str | None = None
    loss: Loss | None = None
    duplicate_pct: float | None = None
    duplicate_corr_pct: float | None = None
    corrupt_pct: float | None = None
    corrupt_corr_pct: float | None = None
    reorder_pct: float | None = None
    reorder_corr_pct: float | None = None
    reorder_gap: int | None = None
    rate_bps: int | None = None
    rate_packet_overhead: int | None = None
    limit: int | None = None
    seed: int | None = None

    def __post_init__(self):
        norm = _normalize(self._fields(), "impairment")
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, norm.get(f.name))

    # -- views ---------------------------------------------------------------------------------

    def _fields(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None}  # fmt: skip

    def is_empty(self) -> bool:
        return not self._fields()

    def to_json(self) -> dict:
        """The docs/impairment-spec.md object: only the fields that are on."""
        out: dict[str, Any] = {}
        for name, value in self._fields().items():
            out[name] = value.to_json() if name == "loss" else value
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any], *, source: str = "impairment JSON") -> Impairment:
        if not isinstance(d, Mapping):
            raise ConfigError(f"impairment must be a JSON object, got {d!r}", source=source)
        valid = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(d) - set(valid))
        if unknown:
            raise ConfigError(
                f"unknown field(s) {', '.join(unknown)}; valid fields: {', '.join(valid)}",
                source=source,
                field=unknown[0],
            )
        fields = {k: v for k, v in d.items() if v is not None}
        if "loss" in fields:
            fields["loss"] = _loss_from_json(fields["loss"], source)
        return cls(**_normalize(fields, source))

    def to_netem_words(self) -> list[str]:
        """Canonical tc-netem words (always with units, so every iproute2 reads them alike)."""
        w: list[str] = []
        if self.delay_us is not None or self.jitter_us is not None:
            w += ["delay", _time(self.delay_us or 0)]
            if self.jitter_us:
                w.append(_time(self.jitter_us))
                if self.delay_corr_pct:
                    w.append(_pct(self.delay_corr_pct))
                if self.distribution:
                    w += ["distribution", self.distribution]
        if self.loss is not None:
            w += self.loss.words()
        for kw in ("duplicate", "corrupt", "reorder"):
            p = getattr(self, f"{kw}_pct")
            if p is not None:
                w += [kw, _pct(p)]
                c = getattr(self, f"{kw}_corr_pct")
                if c:
                    w.append(_pct(c))
        if self.reorder_gap is not None:
            w += ["gap", str(self.reorder_gap)]
        if self.rate_bps is not None:
            w += ["rate", _rate(self.rate_bps)]
            if self.rate_packet_overhead:
                w.append(str(self.rate_packet_overhead))  # positional: tc has no keyword for it
        if self.limit is not None:
            w += ["limit", str(self.limit)]
        if self.seed is not None:
            w += ["seed", str(self.seed)]
        return w

    def __str__(self) -> str:
        return " ".join(self.to_netem_words()) or "none"

    def merge(self, other: Impairment | str, *, source: str = "--impair") -> Impairment:
        """Setting one parameter keeps the others.

        `other` as words follows parse_spec(text, base=self). As an Impairment, each field that
        is on in `other` replaces the same field here (the loss model as a whole).
        """
        if isinstance(other, str):
            return parse_spec(other, source=source, base=self)
        merged = _merge_fields(self._fields(), other._fields())
        return _build(merged, source)

    def warnings(self) -> list[str]:
        """Legal but probably surprising settings, for the CLI to show (netem allows them)."""
        out = []
        if self.jitter_us and self.jitter_us > (self.delay_us or 0):
            out.append(
                f"jitter {_time(self.jitter_us)} exceeds delay {_time(self.delay_us or 0)}: netem "
                "allows it, sends packets whose random delay is below 0 at once, and so also "
                "reorders packets"
            )
        if self.jitter_us and self.rate_bps:
            out.append(
                "jitter together with rate: netem keeps packets in order behind the rate "
                "limiter, so the effective jitter is smaller than asked"
            )
        if self.duplicate_corr_pct and not (
            self.delay_corr_pct
            or isinstance(self.loss, RandomLoss)
            and self.loss.corr_pct
            or self.reorder_corr_pct
            or self.corrupt_corr_pct
        ):
            out.append(
                "duplicate correlation alone: tc (q_netem.c) only sends the correlation "
                "attribute when another correlation is set, so the kernel path ignores it"
            )
        return out


def _normalize(fields: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Validate every field and return the canonical form (see the Impairment docstring)."""
    f = {k: v for k, v in fields.items() if v is not None}

    def err(msg: str, name: str):
        raise ConfigError(msg, source=source, field=_FIELD_WORD.get(name, name))

    def integer(name: str, lo: int, hi: int, what: str) -> None:
        if name not in f:
            return
        v = f[name]
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            err(f"{_FIELD_WORD[name]} must be a whole number {lo}..{hi} {what}, got {v!r}", name)
        if not lo <= v <= hi:
            err(f"{_FIELD_WORD[name]} must be {lo}..{hi} {what}, got {v}", name)
        f[name] = v

    for name in ("delay_us", "jitter_us"):
        integer(name, 0, MAX_TIME_US, "us (0..60 s)")
    for name, word in _PCT_FIELDS.items():
        if name in f:
            f[name] = _check_pct(f[name], word, source)
    integer("reorder_gap", 1, U32_MAX, "packets")
    integer("rate_bps", 1, U64_MAX, "bit/s")
    if f.get("rate_bps") == 0:
        err("rate must be > 0 bit/s (e.g. 100mbit)", "rate_bps")
    integer("rate_packet_overhead", OVERHEAD_MIN, OVERHEAD_MAX, "bytes")
    integer("limit", 1, U32_MAX, "packets")
    integer("seed", 0, U64_MAX, "")
    if "distribution" in f and f["distribution"] not in DISTRIBUTIONS:
        err(
            f"distribution must be one of {', '.join(DISTRIBUTIONS)}, got {f['distribution']!r}",
            "distribution",
        )
    if "loss" in f and not isinstance(f["loss"], (RandomLoss, StateLoss, GELoss)):
        err(f"loss must be a loss model object, got {f['loss']!r}", "loss")

    # Zero means off; dependent values go with their parent.
    for name in ("delay_us", "jitter_us"):
        if f.get(name) == 0:
            del f[name]
    if "jitter_us" not in f:
        f.pop("delay_corr_pct", None)
        f.pop("distribution", None)
    if f.get("distribution") == "uniform":
        del f["distribution"]
    if isinstance(f.get("loss"), RandomLoss) and f["loss"].p_pct == 0:
        del f["loss"]
    if "reorder_gap" in f and "reorder_pct" not in f:
        err("gap needs reorder (tc refuses 'gap' without a reorder percentage)", "reorder_gap")
    for kw in ("duplicate", "corrupt", "reorder"):
        if f.get(f"{kw}_pct") == 0:
            del f[f"{kw}_pct"]
        if f"{kw}_pct" not in f:
            f.pop(f"{kw}_corr_pct", None)
    if "reorder_pct" not in f:
        f.pop("reorder_gap", None)
    for name in ("delay_corr_pct", "duplicate_corr_pct", "corrupt_corr_pct", "reorder_corr_pct"):
        if f.get(name) == 0:
            del f[name]
    if f.get("reorder_gap") == 1:
        del f["reorder_gap"]  # tc sets gap 1 for plain reorder: the same behaviour
    if "rate_packet_overhead" in f and "rate_bps" not in f:
        err("rate packetoverhead needs a rate (e.g. 'rate 100mbit 14')", "rate_packet_overhead")
    if f.get("rate_packet_overhead") == 0:
        del f["rate_packet_overhead"]
    if "reorder_pct" in f and "delay_us" not in f:
        err(
            "reorder needs a delay: netem sends the reordered packets at once and the others "
            "after the delay (e.g. 'delay 10ms reorder 25%')",
            "reorder_pct",
        )
    return f


def _merge_fields(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    out.update(over)
    return out


def _build(fields: Mapping[str, Any], source: str) -> Impairment:
    return Impairment(**_normalize(fields, source))


# --------------------------------------------------------------------------------------------
# Formatting
# --------------------------------------------------------------------------------------------


def _fmt_num(x: float) -> str:
    """Shortest exact decimal, no exponent (tc and the parser both read it)."""
    if isinstance(x, int) or float(x).is_integer():
        return str(int(x))
    return format(Decimal(repr(float(x))).normalize(), "f")


def _pct(x: float) -> str:
    return _fmt_num(x) + "%"


def _time(us: int) -> str:
    return format((Decimal(us) / 1000).normalize(), "f") + "ms"


def _rate(bps: int) -> str:
    for unit, scale in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bps % scale == 0:
            return f"{bps // scale}{unit}"
    return f"{bps}bit"


# --------------------------------------------------------------------------------------------
# Parsing tc-netem words
# --------------------------------------------------------------------------------------------


def _parse_pct(tok: str, name: str, source: str) -> float:
    m = re.fullmatch(rf"({_NUM})(%?)", tok)
    if not m:
        raise ConfigError(
            f"{name} must be a percentage {PCT_RANGE} (e.g. 0.5 or 0.5%), got {tok!r}",
            source=source,
            field=name,
        )
    v = float(m[1])
    if not 0 <= v <= 100:
        raise ConfigError(f"{name} must be {PCT_RANGE}, got {m[1]}", source=source, field=name)
    return v


def _parse_time_us(tok: str, name: str, source: str) -> int:
    m = re.fullmatch(rf"({_NUM})([A-Za-z]*)", tok)
    if not m:
        raise ConfigError(
            f"{name} must be a time {TIME_RANGE} such as 40ms (units: {_units(TIME_UNITS)}), "
            f"got {tok!r}",
            source=source,
            field=name,
        )
    value, unit = Decimal(m[1]), m[2].lower()
    if value < 0:
        raise ConfigError(f"{name} must be {TIME_RANGE}, got {tok}", source=source, field=name)
    if not unit:
        if value != 0:
            # tc(8) says a bare number is microseconds, tc-netem(8) says milliseconds, and
            # iproute2 >= 6.9 (get_time64) reads nanoseconds: refuse rather than guess.
            raise ConfigError(
                f"{name} needs a unit ({_units(TIME_UNITS)}): a bare number is microseconds to "
                f"iproute2 < 6.9 but nanoseconds to iproute2 >= 6.9; got {tok}",
                source=source,
                field=name,
            )
        return 0
    if unit not in TIME_UNITS:
        raise ConfigError(
            f"{name}: unknown time unit {m[2]!r} in {tok!r}; valid units: {_units(TIME_UNITS)}",
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


def _parse_rate_bps(tok: str, source: str) -> int:
    name = "rate"
    if tok.endswith("%"):
        raise ConfigError(
            "rate as a percentage of the device speed is not supported (the speed of a veth is "
            f"not defined); give an absolute rate such as 100mbit (units: {_units(RATE_UNITS)}), "
            f"got {tok}",
            source=source,
            field=name,
        )
    m = re.fullmatch(rf"({_NUM})([A-Za-z]*)", tok)
    if not m:
        raise ConfigError(
            f"rate must be a rate > 0 such as 100mbit (units: {_units(RATE_UNITS)}), got {tok!r}",
            source=source,
            field=name,
        )
    unit = m[2].lower() or "bit"  # tc(8): a bare number is bit/s
    if unit not in RATE_UNITS:
        raise ConfigError(
            f"rate: unknown rate unit {m[2]!r} in {tok!r}; valid units: {_units(RATE_UNITS)} "
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


def _parse_int(tok: str, name: str, lo: int, hi: int, what: str, source: str) -> int:
    m = re.fullmatch(r"[+-]?\d+", tok)
    if not m:
        raise ConfigError(
            f"{name} must be a whole number {lo}..{hi} {what}, got {tok!r}",
            source=source,
            field=name,
        )
    v = int(tok)
    if not lo <= v <= hi:
        raise ConfigError(f"{name} must be {lo}..{hi} {what}, got {tok}", source=source, field=name)
    return v


class _Tokens:
    def __init__(self, text: str):
        self.toks = text.split()
        self.i = 0

    def more(self) -> bool:
        return self.i < len(self.toks)

    def peek(self) -> str | None:
        return self.toks[self.i] if self.more() else None

    def take(self) -> str:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def value(self, kw: str, what: str, source: str) -> str:
        """The required argument of `kw`."""
        if not self.more():
            raise ConfigError(
                f"{kw} needs {what}: {SYNTAX.get(kw.split()[0], kw)}", source=source, field=kw
            )
        return self.take()

    def optional(self) -> str | None:
        """The next token if it is a value (tc: NEXT_IS_NUMBER, widened to signs and '.')."""
        tok = self.peek()
        if tok is not None and tok[0] in _VALUE_START:
            return self.take()
        return None


@dataclass
class _Fragment:
    """What one piece of text sets: `reset` drops the base (a preset, `none`, `clear`)."""

    fields: dict[str, Any]
    reset: bool = False
    explicit: frozenset[str] = frozenset()


def _parse_fragment(text: str, source: str) -> _Fragment:
    from . import presets  # presets builds on this module

    if not isinstance(text, str):
        raise ConfigError(f"impairment spec must be text, got {text!r}", source=source)
    t = _Tokens(text)
    fields: dict[str, Any] = {}
    reset = False
    if t.peek() == "netem":  # pasted from 'tc qdisc add dev X root netem ...'
        t.take()
    if t.peek() in presets.PRESETS:
        name = t.take()
        reset = True
        fields.update(_parse_fragment(presets.PRESETS[name], f"preset {name}").fields)
    seen: dict[str, str] = {}
    explicit: set[str] = set()
    last: str | None = None
    while t.more():
        tok = t.take()
        kw = ALIASES.get(tok, tok)
        if kw in SYNTAX:
            if kw in seen:
                raise ConfigError(
                    f"{kw} given twice ({seen[kw]!r} and {tok!r}); give each keyword once",
                    source=source,
                    field=kw,
                )
            seen[kw] = tok
            parsed = _KEYWORD_PARSERS[kw](t, source)
            fields.update(parsed)
            explicit.update(parsed)
            last = kw
            continue
        if tok in presets.PRESETS:
            raise ConfigError(
                f"preset {tok!r} must come first (e.g. '{tok} loss 2%'), and only one preset "
                f"per spec; presets: {', '.join(presets.PRESETS)}",
                source=source,
                field="preset",
            )
        if tok in UNSUPPORTED or tok == "packetoverhead":
            if tok == "packetoverhead":
                msg = "packetoverhead must follow a rate: 'rate 100mbit packetoverhead 14'"
            else:
                msg = UNSUPPORTED[tok]
            raise ConfigError(
                f"{msg}; supported keywords: {', '.join(KEYWORDS)}", source=source, field=tok
            )
        if tok[0] in _VALUE_START and last is not None:
            raise ConfigError(
                f"unexpected value {tok!r} after {last}: {last} takes {SYNTAX[last]}",
                source=source,
                field=last,
            )
        raise ConfigError(
            f"unknown keyword {tok!r}; valid keywords: {', '.join(KEYWORDS)} "
            f"(aliases: {', '.join(ALIASES)}); presets: {', '.join(presets.PRESETS)}",
            source=source,
            field="keyword",
        )
    return _Fragment(fields, reset, frozenset(explicit))


def _kw_delay(t: _Tokens, source: str) -> dict:
    out: dict[str, Any] = {"delay_us": _parse_time_us(t.value("delay", "a TIME", source),
                                                      "delay", source)}  # fmt: skip
    tok = t.optional()
    if tok is not None:
        out["jitter_us"] = _parse_time_us(tok, "jitter", source)
        tok = t.optional()
        if tok is not None:
            out["delay_corr_pct"] = _parse_pct(tok, "delay correlation", source)
    return out


def _kw_distribution(t: _Tokens, source: str) -> dict:
    tok = t.value("distribution", "a name", source)
    if tok not in DISTRIBUTIONS:
        raise ConfigError(
            f"distribution must be one of {', '.join(DISTRIBUTIONS)}, got {tok!r}",
            source=source,
            field="distribution",
        )
    return {"distribution": tok}


def _kw_loss(t: _Tokens, source: str) -> dict:
    tok = t.value("loss", "a model or PERCENT", source)
    if tok == "random" or tok[0] in _VALUE_START:
        if tok == "random":
            tok = t.value("loss random", "PERCENT", source)
        p = _parse_pct(tok, "loss", source)
        c = t.optional()
        corr = _parse_pct(c, "loss correlation", source) if c is not None else 0.0
        return {"loss": RandomLoss(p, corr)}
    if tok == "state":
        if t.peek() is None or t.peek()[0] not in _VALUE_START:
            raise ConfigError(
                "loss state needs P13 (percent 0..100): loss state P13 [P31 [P32 [P23 [P14]]]]",
                source=source,
                field="loss state p13",
            )
        vals = {"p13": _parse_pct(t.take(), "loss state p13", source)}
        for p in StateLoss.PARAMS[1:]:
            tok = t.optional()
            if tok is None:
                break
            vals[p] = _parse_pct(tok, f"loss state {p}", source)
        vals.setdefault("p31", 100.0 - vals["p13"])
        return {"loss": StateLoss(**vals)}
    if tok == "gemodel":
        if t.peek() is None or t.peek()[0] not in _VALUE_START:
            raise ConfigError(
                "loss gemodel needs P (percent 0..100): loss gemodel P [R [1-H [1-K]]]",
                source=source,
                field="loss gemodel p",
            )
        vals = {"p": _parse_pct(t.take(), "loss gemodel p", source)}
        for p in GELoss.PARAMS[1:]:
            tok = t.optional()
            if tok is None:
                break
            vals[p] = _parse_pct(tok, f"loss gemodel {GELoss.NAMES[p]}", source)
        vals.setdefault("r", 100.0 - vals["p"])
        return {"loss": GELoss(**vals)}
    raise ConfigError(
        f"loss model must be one of {', '.join(LOSS_MODELS)} or a PERCENT, got {tok!r}; "
        f"{SYNTAX['loss']}",
        source=source,
        field="loss",
    )


def _kw_prob(kw: str):
    def parse(t: _Tokens, source: str) -> dict:
        out = {f"{kw}_pct": _parse_pct(t.value(kw, "a PERCENT", source), kw, source)}
        tok = t.optional()
        if tok is not None:
            out[f"{kw}_corr_pct"] = _parse_pct(tok, f"{kw} correlation", source)
        if kw == "reorder" and t.peek() == "gap":
            t.take()
            out.update(_kw_gap(t, source))
        return out

    return parse


def _kw_gap(t: _Tokens, source: str) -> dict:
    tok = t.value("gap", "a DISTANCE", source)
    return {"reorder_gap": _parse_int(tok, "gap", 1, U32_MAX, "packets", source)}


def _kw_rate(t: _Tokens, source: str) -> dict:
    out: dict[str, Any] = {"rate_bps": _parse_rate_bps(t.value("rate", "a RATE", source), source)}
    tok = t.optional()
    if tok is None and t.peek() == "packetoverhead":  # as 'tc qdisc show' prints it
        t.take()
        tok = t.value("rate packetoverhead", "BYTES", source)
    if tok is not None:
        out["rate_packet_overhead"] = _parse_int(
            tok, "rate packetoverhead", OVERHEAD_MIN, OVERHEAD_MAX, "bytes", source
        )
        if t.optional() is not None or t.peek() in ("cellsize", "celloverhead"):
            raise ConfigError(
                f"{UNSUPPORTED['cellsize']}; {SYNTAX['rate']}", source=source, field="rate"
            )
    return out


def _kw_limit(t: _Tokens, source: str) -> dict:
    tok = t.value("limit", "PACKETS", source)
    return {"limit": _parse_int(tok, "limit", 1, U32_MAX, "packets", source)}


def _kw_seed(t: _Tokens, source: str) -> dict:
    tok = t.value("seed", "a NUMBER", source)
    return {"seed": _parse_int(tok, "seed", 0, U64_MAX, "", source)}


_KEYWORD_PARSERS = {
    "delay": _kw_delay,
    "distribution": _kw_distribution,
    "loss": _kw_loss,
    "duplicate": _kw_prob("duplicate"),
    "corrupt": _kw_prob("corrupt"),
    "reorder": _kw_prob("reorder"),
    "gap": _kw_gap,
    "rate": _kw_rate,
    "limit": _kw_limit,
    "seed": _kw_seed,
}


def parse_spec(
    text: str, *, source: str = "--impair", base: Impairment | None = None
) -> Impairment:
    """Parse tc-netem words (optionally starting with a preset) into a validated Impairment.

    With `base`, the words change only what they name ("setting one parameter keeps the
    others"): each value written replaces that value, optional values left out keep the base's
    (`delay 50ms` keeps the jitter), a `loss ...` replaces the whole loss model, and a preset,
    `none` or `clear` starts from scratch.
    """
    frag = _parse_fragment(text, source)
    start = {} if frag.reset or base is None else base._fields()
    merged = _merge_fields(start, frag.fields)
    if "distribution" in frag.explicit and not merged.get("jitter_us"):
        raise ConfigError(
            "distribution needs a jitter: write 'delay TIME JITTER distribution "
            f"{frag.fields['distribution']}' (tc refuses a distribution without jitter)",
            source=source,
            field="distribution",
        )
    if frag.fields.get("reorder_pct") == 0 or (
        "reorder_pct" not in merged and "reorder_gap" in frag.explicit
    ):
        if "reorder_pct" not in merged:
            raise ConfigError(f"gap needs reorder: {SYNTAX['reorder']}", source=source, field="gap")
        merged.pop("reorder_gap", None)
    return _build(merged, source)


# --------------------------------------------------------------------------------------------
# Mininet TCLink options
# --------------------------------------------------------------------------------------------

#: The link options this module reads; every other key belongs to the topology loader.
LINK_OPTION_KEYS = ("delay", "jitter", "loss", "impair")


def from_link_options(
    opts: Mapping[str, Any], *, source: str = "link", base: Impairment | None = None
) -> Impairment:
    """Impairment from Mininet TCLink-style link options.

    `delay='40ms', jitter='5ms'` are tc times (a unit is required unless 0), `loss=0.5` is a
    percentage 0..100 as in Mininet, and `impair='...'` adds tc-netem words. Keys not in
    LINK_OPTION_KEYS (bw, max_queue_size, ...) are left to the topology loader.
    """
    words: list[str] = []
    delay, jitter, loss = opts.get("delay"), opts.get("jitter"), opts.get("loss")

    def as_time(v: Any, name: str) -> str:
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise ConfigError(
                f"{name} must be a time such as '40ms' (units: {_units(TIME_UNITS)}), got {v!r}",
                source=source,
                field=name,
            )
        s = str(v).strip()
        _parse_time_us(s, name, source)  # the better message, with the field name
        return s

    if jitter is not None and delay is None:
        raise ConfigError(
            "jitter needs delay (Mininet TCLink: delay='40ms', jitter='5ms')",
            source=source,
            field="jitter",
        )
    if delay is not None:
        words += ["delay", as_time(delay, "delay")]
        if jitter is not None:
            words.append(as_time(jitter, "jitter"))
    if loss is not None:
        if isinstance(loss, str):
            loss = loss.strip().removesuffix("%")
            try:
                loss = float(loss)
            except ValueError:
                loss = None
        if isinstance(loss, bool) or not isinstance(loss, (int, float)):
            raise ConfigError(
                f"loss must be a percentage {PCT_RANGE} (Mininet TCLink: loss=0.5), "
                f"got {opts.get('loss')!r}",
                source=source,
                field="loss",
            )
        _check_pct(loss, "loss", source)
        words += ["loss", _pct(loss)]
    impair = opts.get("impair")
    if impair is not None:
        if not isinstance(impair, str):
            raise ConfigError(
                f"impair must be a string of tc-netem words, got {impair!r}",
                source=source,
                field="impair",
            )
        words.append(impair)
    return parse_spec(" ".join(words), source=source, base=base)


# --------------------------------------------------------------------------------------------
# Direction-aware specs
# --------------------------------------------------------------------------------------------

DIRECTIONS = ("a2b", "b2a")


@dataclass(frozen=True)
class DirectionalImpairment:
    """The two directions of a link: a2b is what node a sends towards b (a = the first node of
    addLink(a, b)). Symmetric unless the spec says otherwise."""

    a2b: Impairment = dataclasses.field(default_factory=Impairment)
    b2a: Impairment = dataclasses.field(default_factory=Impairment)

    @classmethod
    def symmetric(cls, imp: Impairment) -> DirectionalImpairment:
        return cls(imp, imp)

    def is_symmetric(self) -> bool:
        return self.a2b == self.b2a

    def is_empty(self) -> bool:
        return self.a2b.is_empty() and self.b2a.is_empty()

    def direction(self, name: str) -> Impairment:
        if name not in DIRECTIONS:
            raise ConfigError(f"direction must be one of {', '.join(DIRECTIONS)}, got {name!r}",
                              field="direction")  # fmt: skip
        return getattr(self, name)

    def to_json(self) -> dict:
        return {"a2b": self.a2b.to_json(), "b2a": self.b2a.to_json()}

    @classmethod
    def from_json(cls, d: Mapping[str, Any], *, source: str = "impairment JSON"):
        if not isinstance(d, Mapping) or set(d) - set(DIRECTIONS):
            raise ConfigError(
                f"directional impairment must be an object with keys {', '.join(DIRECTIONS)}, "
                f"got {d!r}",
                source=source,
            )
        return cls(*(Impairment.from_json(d.get(k, {}), source=f"{source}: {k}")
                     for k in DIRECTIONS))  # fmt: skip

    def __str__(self) -> str:
        if self.is_symmetric():
            return str(self.a2b)
        return f"a2b: {self.a2b}; b2a: {self.b2a}"

    def merge(self, other: DirectionalImpairment | str, *, source: str = "--impair"):
        if isinstance(other, str):
            return parse_directional(other, source=source, base=self)
        return DirectionalImpairment(self.a2b.merge(other.a2b, source=source),
                                     self.b2a.merge(other.b2a, source=source))  # fmt: skip


_LABEL = re.compile(r"^\s*([A-Za-z0-9_.\-]+?(?:->[A-Za-z0-9_.\-]+)?)\s*:(.*)$", re.DOTALL)


def parse_directional(
    text: str,
    *,
    source: str = "--impair",
    a: str | None = None,
    b: str | None = None,
    base: DirectionalImpairment | None = None,
) -> DirectionalImpairment:
    """Parse `[both:] WORDS; a2b: WORDS; b2a: WORDS` (segments separated by ';').

    An unlabelled or `both:` segment applies to both directions and is applied first; `a2b:`
    and `b2a:` segments are merged on top of it. With node names `a`/`b`, `A->B:` and `B->A:`
    are accepted too. Without any label the spec is symmetric.
    """
    labels = {"both": "both", "a2b": "a2b", "b2a": "b2a", "a->b": "a2b", "b->a": "b2a"}
    if a and b:
        labels[f"{a}->{b}"] = "a2b"
        labels[f"{b}->{a}"] = "b2a"
    segs: dict[str, str] = {}
    for raw in text.split(";"):
        if not raw.strip():
            continue
        m = _LABEL.match(raw)
        label, words = ("both", raw) if not m else (m[1], m[2])
        if label not in labels:
            raise ConfigError(
                f"unknown direction {label!r}; valid: {', '.join(labels)}",
                source=source,
                field="direction",
            )
        d = labels[label]
        if d in segs:
            raise ConfigError(
                f"direction {d} given twice; give each of both, a2b, b2a at most once",
                source=source,
                field="direction",
            )
        segs[d] = words
    base = base or DirectionalImpairment()
    out = {}
    for d in DIRECTIONS:
        cur = base.direction(d)
        if "both" in segs:
            cur = parse_spec(segs["both"], source=source, base=cur)
        if d in segs:
            cur = parse_spec(segs[d], source=f"{source} ({d})", base=cur)
        out[d] = cur
    return DirectionalImpairment(**out)


def describe_fields() -> Iterable[str]:
    """The JSON field names, in docs/impairment-spec.md order."""
    return [f.name for f in dataclasses.fields(Impairment)]
