"""Impairment points (`ImpairmentPoint`): a plan's `impairments` list -> its points: 'none', presets, tc-netem specs (one
direction or both) and sweeps of one parameter, each point named file-name safe (`slug`)."""

from __future__ import annotations

import re

from dataclasses import dataclass

from lab.core.errors import ConfigError
from lab.model.impairment.directional import DirectionalImpairment, parse_directional
from lab.model.impairment.presets import SWEEP_PARAMETERS, preset, sweep
from lab.model.impairment.words import PRESETS

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}\Z")  # names become file names


@dataclass(frozen=True)
class ImpairmentPoint:
    """One network condition: `name` (file-name safe) and its parsed `impairment`, which the
    runner hands to lab.impair.runtime.set_point as it is; `spec` is its canonical text, for
    names, records and manifests."""

    name: str
    impairment: DirectionalImpairment  # empty = none
    group: str  # the plan entry it came from: "none", a preset, a sweep name
    parameter: str | None = None  # the swept parameter, e.g. "delay"
    value: float | None = None  # its value at this point (ms, %, Mbit/s)

    @property
    def spec(self) -> str:
        """Canonical tc-netem words ("" = none); directional as 'a2b: ...; b2a: ...'."""
        return "" if self.impairment.is_empty() else str(self.impairment)

    @property
    def impaired(self) -> bool:
        return not self.impairment.is_empty()

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "spec": self.spec,
            "group": self.group,
            "parameter": self.parameter,
            "value": self.value,
        }

    @classmethod
    def from_json(cls, d: dict, *, source: str = "impairment point") -> ImpairmentPoint:
        """The point to_json wrote (a shard's or a run's plan): its canonical spec parsed."""
        return cls(
            d["name"],
            parse_directional(d["spec"], source=source),
            d["group"],
            d.get("parameter"),
            d.get("value"),
        )


SWEEP_KEYS = {"sweep", "from", "to", "step", "base", "name"}


def slug(text: str) -> str:
    s = re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")
    return s or "none"


def _inner(e: ConfigError) -> str:
    """The message of an error raised with this point's source and field as its source: its own
    field and message, without the prefix that _bad adds again."""
    return f"{e.field}: {e.message}" if e.field else e.message


def _bad(msg: str, source: str, fld: str) -> ConfigError:
    return ConfigError(msg, source=source, field=fld)


def _num(v, key: str, source: str, lo: float, hi: float) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
        raise _bad(f"got {v!r}; accepted: a number {lo:g}..{hi:g}", source, key)
    return float(v)


def impairment_points(raw: dict, source: str) -> list[ImpairmentPoint]:
    """The `impairments` list of plan table `raw` (from file `source`) as validated points."""
    items = raw.get("impairments", ["none"])
    if not isinstance(items, list) or not items:
        raise _bad(
            "accepted: a non-empty list ('none', presets, specs, sweeps)", source, "impairments"
        )
    points: list[ImpairmentPoint] = []
    for i, item in enumerate(items):
        fld = f"impairments[{i}]"
        if isinstance(item, str):
            item = {"spec": item}
        if not isinstance(item, dict):
            raise _bad(f"got {item!r}; accepted: a string or a table", source, fld)
        if "sweep" in item:
            unknown = sorted(set(item) - SWEEP_KEYS)
            if unknown:
                raise _bad(
                    f"unknown key in a sweep; accepted: {', '.join(sorted(SWEEP_KEYS))}",
                    source,
                    f"{fld}.{unknown[0]}",
                )
            par = item["sweep"]
            if par not in SWEEP_PARAMETERS:
                raise _bad(
                    f"got {par!r}; accepted: {', '.join(SWEEP_PARAMETERS)}", source, f"{fld}.sweep"
                )
            missing = [k for k in ("from", "to", "step") if k not in item]
            if missing:
                raise _bad("a sweep needs from, to and step", source, f"{fld}.{missing[0]}")
            nums = {k: _num(item[k], f"{fld}.{k}", source, 0, 1e6) for k in ("from", "to", "step")}
            base = item.get("base")
            if base is not None and not isinstance(base, str):
                raise _bad("accepted: tc-netem words", source, f"{fld}.base")
            prefix = item.get("name")
            try:
                pts = sweep(
                    par,
                    nums["from"],
                    nums["to"],
                    nums["step"],
                    base=base,
                    prefix=prefix,
                    source=f"{source}: {fld}",
                )
            except ConfigError as e:
                raise _bad(_inner(e), source, fld) from None
            group = prefix or par
            points += [
                ImpairmentPoint(
                    p.name, DirectionalImpairment.symmetric(p.impairment), group, par, p.value
                )
                for p in pts
            ]
            continue
        unknown = sorted(set(item) - {"spec", "name"})
        if unknown:
            raise _bad(
                "unknown key; accepted: spec, name (or a sweep: sweep, from, to, step, base, name)",
                source,
                f"{fld}.{unknown[0]}",
            )
        text = item.get("spec")
        if isinstance(text, str) and not text.strip():
            raise _bad("empty; accepted: 'none', a preset or tc-netem words", source, fld)
        if not isinstance(text, str):
            raise _bad(
                "missing spec; accepted: 'none', a preset "
                f"({', '.join(PRESETS)}) or tc-netem words",
                source,
                fld,
            )
        words = text.strip()
        try:
            if words in PRESETS:
                imp = DirectionalImpairment.symmetric(preset(words, source=f"{source}: {fld}"))
            else:
                imp = parse_directional(words, source=f"{source}: {fld}")
        except ConfigError as e:
            msg = _inner(e)
            if "presets:" not in msg:
                msg += f"; presets: {', '.join(PRESETS)}"
            raise _bad(msg, source, fld) from None
        name = item.get("name") or (words if words in PRESETS else slug(words))
        if imp.is_empty():
            name = item.get("name") or "none"
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise _bad(
                f"name {name!r}: accepted letters, digits, '-', '_', '.'", source, f"{fld}.name"
            )
        points.append(ImpairmentPoint(name, imp, "none" if imp.is_empty() else name))
    names = [p.name for p in points]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise _bad(
            f"impairment point {dup[0]!r} appears twice (give one a name=)", source, "impairments"
        )
    return points
