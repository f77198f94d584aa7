"""The tc-netem word parser: text (optionally starting with a preset) -> the fields it sets.

`parse_fragment` knows nothing of `Impairment`; lab.model.impairment.model.parse_spec merges and
validates what it returns. `trace FILE` is the one word that reads a file
(lab.model.impairment.trace.load_trace). PRESETS lives here because the parser reads it (lab.model.impairment.presets
re-exports it with the sweeps built on it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lab.core.errors import ConfigError
from lab.model.impairment.loss import GELoss, LOSS_MODELS, RandomLoss, StateLoss
from lab.model.impairment.trace import load_trace
from lab.model.impairment.vocab import (
    ALIASES,
    DISTRIBUTIONS,
    KEYWORDS,
    OVERHEAD_MAX,
    OVERHEAD_MIN,
    parse_int,
    parse_pct,
    parse_rate_bps,
    parse_time_us,
    SYNTAX,
    U32_MAX,
    U64_MAX,
    UNSUPPORTED,
    VALUE_START,
)


#: Preset name -> tc-netem words. Jitter in the network presets uses the normal distribution:
#: study A applied its jitter sweep with `distribution normal`, and its combined "network 1/2/3"
#: conditions were run by the same harness (docs/impairment.md).
PRESETS: dict[str, str] = {
    "network1": "delay 40ms 5ms distribution normal loss 0.5%",
    "network2": "delay 80ms 10ms distribution normal loss 1%",
    "network3": "delay 120ms 15ms distribution normal loss 1.5%",
    "voip-delay": "delay 400ms",  # study D: 400 ms added delay
    "lossy": "loss 1%",  # study D: 1 % loss
    "none": "",
    "clear": "",
}


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
        if tok is not None and tok[0] in VALUE_START:
            return self.take()
        return None


@dataclass
class Fragment:
    """What one piece of text sets: `reset` drops the base (a preset, `none`, `clear`)."""

    fields: dict[str, Any]
    reset: bool = False
    explicit: frozenset[str] = frozenset()


def parse_fragment(text: str, source: str) -> Fragment:
    if not isinstance(text, str):
        raise ConfigError(f"impairment spec must be text, got {text!r}", source=source)
    t = _Tokens(text)
    fields: dict[str, Any] = {}
    reset = False
    if t.peek() == "netem":  # pasted from 'tc qdisc add dev X root netem ...'
        t.take()
    if t.peek() in PRESETS:
        name = t.take()
        reset = True
        fields.update(parse_fragment(PRESETS[name], f"preset {name}").fields)
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
        if tok in PRESETS:
            raise ConfigError(
                f"preset {tok!r} must come first (e.g. '{tok} loss 2%'), and only one preset "
                f"per spec; presets: {', '.join(PRESETS)}",
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
        if tok[0] in VALUE_START and last is not None:
            raise ConfigError(
                f"unexpected value {tok!r} after {last}: {last} takes {SYNTAX[last]}",
                source=source,
                field=last,
            )
        raise ConfigError(
            f"unknown keyword {tok!r}; valid keywords: {', '.join(KEYWORDS)} "
            f"(aliases: {', '.join(ALIASES)}); presets: {', '.join(PRESETS)}",
            source=source,
            field="keyword",
        )
    return Fragment(fields, reset, frozenset(explicit))


def _kw_delay(t: _Tokens, source: str) -> dict:
    out: dict[str, Any] = {"delay_us": parse_time_us(t.value("delay", "a TIME", source),
                                                      "delay", source)}  # fmt: skip
    tok = t.optional()
    if tok is not None:
        out["jitter_us"] = parse_time_us(tok, "jitter", source)
        tok = t.optional()
        if tok is not None:
            out["delay_corr_pct"] = parse_pct(tok, "delay correlation", source)
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


#: `loss state` and `loss gemodel`: the model's class, and the usage said when its first percent
#: is missing
_LOSS_USAGE: dict[str, tuple[type[StateLoss] | type[GELoss], str]] = {
    "state": (StateLoss, "P13 (percent 0..100): loss state P13 [P31 [P32 [P23 [P14]]]]"),
    "gemodel": (GELoss, "P (percent 0..100): loss gemodel P [R [1-H [1-K]]]"),
}


def _kw_loss_model(t: _Tokens, source: str, model: str) -> dict:
    """`loss state ...` or `loss gemodel ...`: the model's first percent, then up to the rest
    of its PARAMS in order; the second defaults to 100 - the first."""
    cls, usage = _LOSS_USAGE[model]
    names = getattr(cls, "NAMES", {})
    first, second = cls.PARAMS[:2]

    def name(p: str) -> str:
        return f"loss {model} {names.get(p, p)}"

    if t.peek() is None or t.peek()[0] not in VALUE_START:
        raise ConfigError(f"loss {model} needs {usage}", source=source, field=name(first))
    vals = {first: parse_pct(t.take(), name(first), source)}
    for p in cls.PARAMS[1:]:
        tok = t.optional()
        if tok is None:
            break
        vals[p] = parse_pct(tok, name(p), source)
    vals.setdefault(second, 100.0 - vals[first])
    return {"loss": cls(**vals)}


def _kw_loss(t: _Tokens, source: str) -> dict:
    tok = t.value("loss", "a model or PERCENT", source)
    if tok == "random" or tok[0] in VALUE_START:
        if tok == "random":
            tok = t.value("loss random", "PERCENT", source)
        p = parse_pct(tok, "loss", source)
        c = t.optional()
        corr = parse_pct(c, "loss correlation", source) if c is not None else 0.0
        return {"loss": RandomLoss(p, corr)}
    if tok in _LOSS_USAGE:
        return _kw_loss_model(t, source, tok)
    raise ConfigError(
        f"loss model must be one of {', '.join(LOSS_MODELS)} or a PERCENT, got {tok!r}; "
        f"{SYNTAX['loss']}",
        source=source,
        field="loss",
    )


def _kw_prob(kw: str):
    def parse(t: _Tokens, source: str) -> dict:
        out = {f"{kw}_pct": parse_pct(t.value(kw, "a PERCENT", source), kw, source)}
        tok = t.optional()
        if tok is not None:
            out[f"{kw}_corr_pct"] = parse_pct(tok, f"{kw} correlation", source)
        if kw == "reorder" and t.peek() == "gap":
            t.take()
            out.update(_kw_gap(t, source))
        return out

    return parse


def _kw_gap(t: _Tokens, source: str) -> dict:
    tok = t.value("gap", "a DISTANCE", source)
    return {"reorder_gap": parse_int(tok, "gap", 1, U32_MAX, "packets", source)}


def _kw_rate(t: _Tokens, source: str) -> dict:
    out: dict[str, Any] = {"rate_bps": parse_rate_bps(t.value("rate", "a RATE", source), source)}
    tok = t.optional()
    if tok is None and t.peek() == "packetoverhead":  # as 'tc qdisc show' prints it
        t.take()
        tok = t.value("rate packetoverhead", "BYTES", source)
    if tok is not None:
        out["rate_packet_overhead"] = parse_int(
            tok, "rate packetoverhead", OVERHEAD_MIN, OVERHEAD_MAX, "bytes", source
        )
        if t.optional() is not None or t.peek() in ("cellsize", "celloverhead"):
            raise ConfigError(
                f"{UNSUPPORTED['cellsize']}; {SYNTAX['rate']}", source=source, field="rate"
            )
    return out


def _kw_limit(t: _Tokens, source: str) -> dict:
    tok = t.value("limit", "PACKETS", source)
    return {"limit": parse_int(tok, "limit", 1, U32_MAX, "packets", source)}


def _kw_seed(t: _Tokens, source: str) -> dict:
    tok = t.value("seed", "a NUMBER", source)
    return {"seed": parse_int(tok, "seed", 0, U64_MAX, "", source)}


def _kw_trace(t: _Tokens, source: str) -> dict:
    word = t.value("trace", "a FILE", source)
    try:
        return {"trace": load_trace(word)}
    except ConfigError as e:
        raise ConfigError(e.message, source=source, field="trace") from None


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
    "trace": _kw_trace,
}
