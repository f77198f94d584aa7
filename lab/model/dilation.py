"""Time dilation (issue 16): the whole experiment run D times slower, results scaled back.

Where this machine cannot give every profile node all its board cores at once, the lab can run
the experiment in slow motion instead of taking cores away: every CPU quota is divided by D (so
a board core is emulated by core_share / D host cores), link rates and impairment rates are
divided by D, delays, jitter, test durations, intervals, timeouts and warm-ups multiplied by D,
offered UDP rates divided by D; the measured figures are then scaled back (throughput x D,
times / D; loss shares, packet counts and sizes unchanged). docs/cpu.md "Time dilation" states
the decision and what does not dilate (kernel timers, uncapped packet-path work).

This module is the arithmetic only (pure data, no I/O): the factor's validation and its "auto"
value, the impairment and test parameters dilated, and the one place results are scaled back.
lab.substrate.local.cpuplan, lab.substrate.local.lab (link shaping), lab.impair.runtime (every impairment sent) and lab.campaign.runner
(test parameters, records) call it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from lab.core.errors import ConfigError
from lab.model.impairment.model import Impairment

#: the factor "auto" picks is rounded up to a multiple of this (a run's length stays readable)
AUTO_STEP = 0.5
#: a larger factor makes a 10 s test run for over 10 minutes: refused as a likely typo
MAX_DILATION = 64.0
ACCEPTED = f'a number from 1 to {MAX_DILATION:g} (e.g. 2) or "auto"'

#: how a metric is scaled back, by its unit (lab.measure Metric.unit): multiplied by D for
#: rates (the experiment ran D times slower), divided by D for times; any other unit (%,
#: bytes, packets, segments, words) is a share or a count and stays as measured
RATE_UNITS = ("bit/s", "Mbit/s", "packets/s", "1/s")
TIME_UNITS = ("s", "ms", "us")


def parse_dilation(value: Any, *, source: str, field: str = "dilation") -> float | str:
    """A requested factor: a float >= 1 or the string "auto"; anything else is refused naming
    `source`, `field` and the accepted values."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "auto":
            return "auto"
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(f"got {value!r}; accepted: {ACCEPTED}", source=source, field=field)
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ConfigError(f"got {value!r}; accepted: {ACCEPTED}", source=source, field=field)
    if not 1.0 <= float(value) <= MAX_DILATION:
        raise ConfigError(
            f"got {value!r} (a factor below 1 would run the experiment faster than real time); "
            f"accepted: {ACCEPTED}",
            source=source,
            field=field,
        )
    return float(value)


def auto_factor(want_cores: float, room_cores: float, step: float = AUTO_STEP) -> float:
    """The smallest factor (a multiple of `step`, at least 1) at which `want_cores` host cores
    of full-speed quotas fit into `room_cores`: 1.0 when they already fit."""
    if want_cores <= room_cores:
        return 1.0
    if room_cores <= 0:
        raise ValueError("no room for capped nodes at any dilation")
    need = want_cores / room_cores
    d = math.ceil(need / step - 1e-9) * step
    return min(max(1.0, d), MAX_DILATION)


#: the kernel's largest CFS period (kernel/sched/core.c max_cfs_quota_period: 1 s)
MAX_CFS_PERIOD_US = 1_000_000


#: the CFS period a capped node's quotas are handed out in, undilated (docs/cpu.md "The CFS
#: period"). A board core runs all the time at its own speed; a capped group runs at this host's
#: speed for share x period, then waits the rest. At 10 ms one Pi core (share ~0.23) waits at most
#: ~7.7 ms, a few hundred packets at these rates, within a TUN queue and socket buffers; at the
#: kernel's default 100 ms it waited ~77 ms, which overflowed them and showed in ping RTT under
#: load (OpenVPN: p90 65 against 17-25 ms) and in per-second TCP rates
BASE_CFS_PERIOD_US = 10_000
#: no group gets less than this quota per period (the kernel's minimum is 1 ms, and a quota near
#: it runs in slivers): a group with a smaller share gets a longer period
MIN_QUOTA_US = 2_000


def cfs_period_us(
    d: float, base_us: int = BASE_CFS_PERIOD_US, *, min_share: float | None = None
) -> int:
    """The CFS period of a capped node's quotas: BASE_CFS_PERIOD_US x d, so that a dilated node
    runs and is throttled in the same pattern in dilated time as undilated in real time (a
    quota is handed out per period: a thread at its cap runs share x period, then waits);
    long enough that `min_share` (the node's smallest group, host cores) gets MIN_QUOTA_US per
    period; at most the kernel's 1 s."""
    period = base_us * d
    if min_share:
        period = max(period, MIN_QUOTA_US / min_share)
    return min(MAX_CFS_PERIOD_US, round(period))


def factor(value: float | str | None) -> float:
    """A resolved factor from a lab or spec record (None, "auto" before resolution: 1.0)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 1.0


# ----------------------------------------------------------------------------- dilating


def rate(x: float | None, d: float) -> float | None:
    """A rate (link bw in Mbit/s, an offered rate) in the dilated experiment."""
    return None if x is None else x / d


def impairment(imp: Impairment, d: float) -> Impairment:
    """`imp` in the dilated experiment: delay and jitter x d, rate / d; probabilities (loss,
    duplicate, corrupt, reorder and their correlations), the reorder gap, the queue limit in
    packets (rate / d x delay x d holds the same packets) and the seed unchanged. netem's slot
    is not in the language (lab.model.impairment.vocab UNSUPPORTED)."""
    if d == 1.0 or imp.is_empty():
        return imp
    if imp.trace is not None:
        # its opportunities are whole milliseconds: stretched by d they would no longer be the
        # file's, and the records name the file
        raise ConfigError(
            f"trace {imp.trace.path} in a time-dilated lab (x{d:g}) is not supported; run "
            "the trace with dilation off (-p dilation=1)",
            source="impairment",
            field="trace",
        )
    changes: dict[str, Any] = {}
    for f in ("delay_us", "jitter_us"):
        v = getattr(imp, f)
        if v is not None:
            changes[f] = round(v * d)
    if imp.rate_bps is not None:
        changes["rate_bps"] = max(1, round(imp.rate_bps / d))
    return replace(imp, **changes)


def _scaled_param(key: str, value: Any, d: float) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if key.endswith(("_s", "_ms", "_us")) and isinstance(value, int | float):
        return value * d
    if key.endswith("_mbit"):
        if isinstance(value, int | float):
            return value / d
        if isinstance(value, list):
            return [v / d for v in value]
    return value


def dilate_params(params: Mapping[str, Any], d: float) -> dict[str, Any]:
    """A test's validated parameters in the dilated experiment, by the schema's naming rule
    (lab.model.params): every time (`*_s`, `*_ms`, `*_us`: durations, warm-ups, intervals, timeouts,
    adaptive minimums) x d, every offered rate (`*_mbit`) / d; counts, sizes, ports and
    percentages unchanged. A wrapped test's parameters (contention's `params`) likewise."""
    out = {}
    for k, v in params.items():
        out[k] = dilate_params(v, d) if isinstance(v, Mapping) else _scaled_param(k, v, d)
    return out


# ----------------------------------------------------------------------------- scaling back


def scale_back(record: dict, metrics: Iterable, d: float) -> dict:
    """The one place dilated results become real-time figures: each declared metric of the test
    (lab.measure Metric: key and unit) x d for rates, / d for times, as measured otherwise.
    The raw (dilated) values are kept in `record["dilated"]`, with `dilation` = d; series and
    tool output stay as measured (dilated)."""
    if d == 1.0:
        return record
    out = dict(record)
    raw = {}
    for m in metrics:
        key = m.key
        if key in raw:  # two columns may read one key (throughput_bps <- receiver_bps): once
            continue
        v = out.get(key)
        if isinstance(v, bool) or not isinstance(v, int | float):
            continue
        if m.unit in RATE_UNITS:
            out[key] = v * d
        elif m.unit in TIME_UNITS:
            out[key] = v / d
        else:
            continue
        raw[key] = v
    out["dilation"] = d
    out["dilated"] = raw
    return out


def report_line(d: float, host_cores: int | None = None) -> str:
    """The report header's line for a dilated run."""
    where = f" on {host_cores} host cores" if host_cores else ""
    return (
        f"time-dilated x{d:g}: the experiment ran {d:g} times slower{where} (CPU quotas, link "
        f"and impairment rates / {d:g}; delays, durations, intervals x {d:g}); throughput and "
        f"times are scaled back to real time, raw figures in results.jsonl (`dilated`). Kernel "
        "timers (TCP's 200 ms minimum RTO, 40 ms delayed ACK) and uncapped kernel packet work "
        'do not dilate (docs/cpu.md "Time dilation")'
    )
