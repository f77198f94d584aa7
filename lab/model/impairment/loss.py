"""Netem loss models (random, 4-state Markov, Gilbert-Elliott) and their JSON form."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from lab.core.errors import ConfigError
from lab.model.impairment.vocab import check_pct, fmt_pct


@dataclass(frozen=True)
class RandomLoss:
    """Independent loss with probability p_pct (tc: `loss [random] P [CORR]`)."""

    p_pct: float
    corr_pct: float = 0.0
    model: ClassVar[str] = "random"

    def __post_init__(self):
        object.__setattr__(self, "p_pct", check_pct(self.p_pct, "loss", "impairment"))
        object.__setattr__(
            self, "corr_pct", check_pct(self.corr_pct, "loss correlation", "impairment")
        )

    def to_json(self) -> dict:
        return {"model": "random", "p_pct": self.p_pct, "corr_pct": self.corr_pct}

    def words(self) -> list[str]:
        w = ["loss", fmt_pct(self.p_pct)]
        return w + [fmt_pct(self.corr_pct)] if self.corr_pct else w


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
            v = check_pct(getattr(self, p), f"loss state {p}", "impairment")
            object.__setattr__(self, p, v)

    def to_json(self) -> dict:
        return {"model": "state", **{p: getattr(self, p) for p in self.PARAMS}}

    def words(self) -> list[str]:
        return ["loss", "state", *(fmt_pct(getattr(self, p)) for p in self.PARAMS)]


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
            v = check_pct(getattr(self, p), f"loss gemodel {self.NAMES[p]}", "impairment")
            object.__setattr__(self, p, v)

    def to_json(self) -> dict:
        return {"model": "gemodel", **{p: getattr(self, p) for p in self.PARAMS}}

    def words(self) -> list[str]:
        return ["loss", "gemodel", *(fmt_pct(getattr(self, p)) for p in self.PARAMS)]


Loss = RandomLoss | StateLoss | GELoss


LOSS_MODELS = ("random", "state", "gemodel")


def loss_from_json(d: Any, source: str) -> Loss:
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
    vals = {k: check_pct(d[k], f"loss.{k}", source) for k in keys[model] if k in d}
    if model == "random":
        return RandomLoss(**vals)
    if model == "state":
        vals.setdefault("p31", 100.0 - vals["p13"])
        return StateLoss(**vals)
    vals.setdefault("r", 100.0 - vals["p"])
    return GELoss(**vals)
