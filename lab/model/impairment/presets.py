"""Named impairments, impairment placements and the sweeps of the reference studies, as data.

Presets are tc-netem words so that `lab impair show` and the docs print exactly what a preset
means; a spec may start with one and override parts of it (`network1 loss 2%`).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from lab.core.errors import ConfigError
from lab.model.impairment.model import Impairment, build, merge_fields
from lab.model.impairment.vocab import fmt_num
from lab.model.impairment.words import (
    PRESETS,
    parse_fragment,
)  # PRESETS is defined next to the parser that reads it


def preset(name: str, *, source: str = "preset") -> Impairment:
    if name not in PRESETS:
        raise ConfigError(
            f"unknown preset {name!r}; presets: {', '.join(PRESETS)}", source=source, field="preset"
        )
    return build(parse_fragment(PRESETS[name], f"preset {name}").fields, source)


# --------------------------------------------------------------------------------------------
# Placement: where the impairment is applied
# --------------------------------------------------------------------------------------------

#: Placement -> what it means. Study A used `egress` on both hosts (so both directions are
#: impaired) and `ingress` (via ifb) as an option; its conclusions ask for `middlebox`.
PLACEMENTS: dict[str, str] = {
    "egress": "netem on each endpoint's egress (root qdisc of its link interface); "
    "netem drops are reported to the local stack, which hides loss from TCP",
    "ingress": "netem on each endpoint's ingress, via an ifb device the ingress traffic is "
    "redirected to; drops look like real network loss",
    "middlebox": "netem (or the userspace engine) on a router between the endpoints, one "
    "instance per direction; the endpoints' stacks are untouched",
}


def parse_placement(text: str, *, source: str = "--placement") -> str:
    if text not in PLACEMENTS:
        raise ConfigError(
            f"placement must be one of {', '.join(PLACEMENTS)}, got {text!r}",
            source=source,
            field="placement",
        )
    return text


# --------------------------------------------------------------------------------------------
# Sweeps
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepPoint:
    """One point of a sweep: `name` is stable and file-name safe (e.g. 'delay-40ms')."""

    name: str
    parameter: str
    value: float | str
    impairment: Impairment


#: Sweepable parameter -> (unit in point names, how a value becomes tc words)
SWEEP_PARAMETERS: dict[str, str] = {
    "delay": "ms",
    "jitter": "ms",
    "loss": "pct",
    "duplicate": "pct",
    "corrupt": "pct",
    "reorder": "pct",
    "rate": "mbit",
}


def _point_fields(parameter: str, value: Decimal, base: dict[str, Any], source: str) -> dict:
    v = fmt_num(float(value))
    if parameter == "delay":
        words = f"delay {v}ms"
    elif parameter == "jitter":
        delay_us = base.get("delay_us")
        if not delay_us:
            raise ConfigError(
                "a jitter sweep needs a base with a delay, e.g. base='delay 20ms "
                "distribution normal'",
                source=source,
                field="base",
            )
        words = f"delay {delay_us}us {v}ms"
    elif parameter == "loss":
        words = f"loss {v}%"
    elif parameter in ("duplicate", "corrupt", "reorder"):
        words = f"{parameter} {v}%"
    else:  # rate
        if value <= 0:
            return {"rate_bps": None}
        words = f"rate {v}mbit"
    return parse_fragment(words, source).fields


def sweep(
    parameter: str,
    start: float,
    stop: float,
    step: float,
    *,
    base: Impairment | str | None = None,
    prefix: str | None = None,
    source: str = "sweep",
) -> list[SweepPoint]:
    """Points start, start+step, ..., stop (inclusive) of one parameter over `base`.

    Units: delay and jitter in ms, loss/duplicate/corrupt/reorder in percent, rate in Mbit/s
    (rate 0 means no rate limit). Give `base` as words to keep a distribution at the jitter-0
    point of a jitter sweep (an Impairment without jitter cannot hold one).
    """
    if parameter not in SWEEP_PARAMETERS:
        raise ConfigError(
            f"sweep parameter must be one of {', '.join(SWEEP_PARAMETERS)}, got {parameter!r}",
            source=source,
            field="parameter",
        )
    d_start, d_stop, d_step = (Decimal(repr(float(x))) for x in (start, stop, step))
    if d_step <= 0 or d_stop < d_start:
        raise ConfigError(
            f"sweep needs step > 0 and stop >= start, got {start}..{stop} step {step}",
            source=source,
            field="step",
        )
    if isinstance(base, str):
        base_fields = parse_fragment(base, source).fields
    elif base is not None:
        base_fields = base._fields()
    else:
        base_fields = {}
    unit = SWEEP_PARAMETERS[parameter]
    points = []
    n = int((d_stop - d_start) / d_step)
    for i in range(n + 1):
        value = d_start + i * d_step
        fields = merge_fields(base_fields, _point_fields(parameter, value, base_fields, source))
        label = fmt_num(float(value))
        points.append(
            SweepPoint(
                name=f"{prefix or parameter}-{label}{unit}",
                parameter=parameter,
                value=float(value),
                impairment=build(fields, source),
            )
        )
    return points


def study_a_sweeps() -> dict[str, list[SweepPoint]]:
    """Study A's impairment points (docs/studies.md, study A "Impairment"), by sweep name.

    delay 0..100 ms step 10; jitter 0..10 ms step 1 at delay 20 ms, normal distribution;
    loss 0..5 % step 0.5; the combined conditions network1/2/3.
    """
    return {
        "delay": sweep("delay", 0, 100, 10),
        "jitter": sweep("jitter", 0, 10, 1, base="delay 20ms distribution normal"),
        "loss": sweep("loss", 0, 5, 0.5),
        "network": [
            SweepPoint(name, "preset", name, preset(name))
            for name in ("network1", "network2", "network3")
        ],
    }
