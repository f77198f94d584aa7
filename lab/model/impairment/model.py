"""`Impairment`: one direction's validated, canonical impairment, its JSON and tc forms, and
`parse_spec`, which turns tc-netem words (lab.model.impairment.words) into one. No I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from lab.core.errors import ConfigError
from lab.model.impairment.loss import GELoss, Loss, loss_from_json, RandomLoss, StateLoss
from lab.model.impairment.vocab import (
    check_pct,
    DISTRIBUTIONS,
    MAX_TIME_US,
    OVERHEAD_MAX,
    OVERHEAD_MIN,
    fmt_pct,
    fmt_rate,
    SYNTAX,
    fmt_time,
    U32_MAX,
    U64_MAX,
)
from lab.model.impairment.trace import Trace
from lab.model.impairment.words import parse_fragment


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
    "trace": "trace",
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
    #: a trace-driven link (lab.model.impairment.trace): packets leave at its opportunities
    trace: Trace | None = None

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
            out[name] = value.to_json() if name in ("loss", "trace") else value
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
            fields["loss"] = loss_from_json(fields["loss"], source)
        if "trace" in fields:
            fields["trace"] = Trace.from_json(fields["trace"], source=source)
        return cls(**_normalize(fields, source))

    def to_netem_words(self) -> list[str]:
        """Canonical tc-netem words (always with units, so every iproute2 reads them alike)."""
        w: list[str] = []
        if self.delay_us is not None or self.jitter_us is not None:
            w += ["delay", fmt_time(self.delay_us or 0)]
            if self.jitter_us:
                w.append(fmt_time(self.jitter_us))
                if self.delay_corr_pct:
                    w.append(fmt_pct(self.delay_corr_pct))
                if self.distribution:
                    w += ["distribution", self.distribution]
        if self.loss is not None:
            w += self.loss.words()
        for kw in ("duplicate", "corrupt", "reorder"):
            p = getattr(self, f"{kw}_pct")
            if p is not None:
                w += [kw, fmt_pct(p)]
                c = getattr(self, f"{kw}_corr_pct")
                if c:
                    w.append(fmt_pct(c))
        if self.reorder_gap is not None:
            w += ["gap", str(self.reorder_gap)]
        if self.rate_bps is not None:
            w += ["rate", fmt_rate(self.rate_bps)]
            if self.rate_packet_overhead:
                w.append(str(self.rate_packet_overhead))  # positional: tc has no keyword for it
        if self.limit is not None:
            w += ["limit", str(self.limit)]
        if self.seed is not None:
            w += ["seed", str(self.seed)]
        if self.trace is not None:
            w += ["trace", self.trace.path]  # not netem's: the kernel backend refuses it
        return w

    def __str__(self) -> str:
        return " ".join(self.to_netem_words()) or "none"

    def merge(self, other: Impairment, *, source: str = "--impair") -> Impairment:
        """Setting one parameter keeps the others: each field that is on in `other` replaces the
        same field here (the loss model as a whole). Words over a base are parse_spec(text,
        base=self), whose presets and `none` start from scratch.
        """
        merged = merge_fields(self._fields(), other._fields())
        return build(merged, source)

    def warnings(self) -> list[str]:
        """Legal but probably surprising settings, for the CLI to show (netem allows them)."""
        out = []
        if self.jitter_us and self.jitter_us > (self.delay_us or 0):
            out.append(
                f"jitter {fmt_time(self.jitter_us)} exceeds delay {fmt_time(self.delay_us or 0)}: netem "
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
            f[name] = check_pct(f[name], word, source)
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
    if "trace" in f and not isinstance(f["trace"], Trace):
        err(f"trace must be a Trace (lab.model.impairment.trace), got {f['trace']!r}", "trace")
    if "trace" in f and "rate_bps" in f:
        err(
            "trace and rate both set the link's capacity; give one (the trace's mean is "
            f"{f['trace'].mean_bps / 1e6:.3g} Mbit/s)",
            "trace",
        )

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
    if "reorder_pct" in f and "trace" in f:
        err(
            "reorder with trace: on a trace-driven link a packet leaves only at a delivery "
            "opportunity, in order; drop one of them",
            "reorder_pct",
        )
    if "reorder_pct" in f and "delay_us" not in f:
        err(
            "reorder needs a delay: netem sends the reordered packets at once and the others "
            "after the delay (e.g. 'delay 10ms reorder 25%')",
            "reorder_pct",
        )
    return f


def merge_fields(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    out.update(over)
    return out


def build(fields: Mapping[str, Any], source: str) -> Impairment:
    return Impairment(**_normalize(fields, source))


def parse_spec(
    text: str, *, source: str = "--impair", base: Impairment | None = None
) -> Impairment:
    """Parse tc-netem words (optionally starting with a preset) into a validated Impairment.

    With `base`, the words change only what they name ("setting one parameter keeps the
    others"): each value written replaces that value, optional values left out keep the base's
    (`delay 50ms` keeps the jitter), a `loss ...` replaces the whole loss model, and a preset,
    `none` or `clear` starts from scratch.
    """
    frag = parse_fragment(text, source)
    start = {} if frag.reset or base is None else base._fields()
    merged = merge_fields(start, frag.fields)
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
    return build(merged, source)


def describe_fields() -> Iterable[str]:
    """The JSON field names, in docs/impairment-spec.md order."""
    return [f.name for f in dataclasses.fields(Impairment)]
