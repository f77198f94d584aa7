"""Mininet TCLink link options (delay=, jitter=, loss=, impair=) -> Impairment."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lab.core.errors import ConfigError
from lab.model.impairment.model import Impairment, parse_spec
from lab.model.impairment.vocab import (
    PCT_RANGE,
    TIME_UNITS,
    check_pct,
    fmt_pct,
    parse_time_us,
    units_list,
)


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
                f"{name} must be a time such as '40ms' (units: {units_list(TIME_UNITS)}), got {v!r}",
                source=source,
                field=name,
            )
        s = str(v).strip()
        parse_time_us(s, name, source)  # the better message, with the field name
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
        check_pct(loss, "loss", source)
        words += ["loss", fmt_pct(loss)]
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
