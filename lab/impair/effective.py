"""What a plan point's impairment becomes on the wire, as pure arithmetic: on top of the link's
own impairment (point_spec), with the lab's default queue limit (with_queue_limit,
limit_warning), the boards' NIC latency (with_nic) and a derived seed (with_seed); base_text
says what every point keeps under its own impairment; effective_point is what
lab.impair.runtime.set_point puts in force (before time dilation). No I/O.
"""

from __future__ import annotations

import math
from dataclasses import replace

from lab.model.impairment.directional import DirectionalImpairment
from lab.model.impairment.model import Impairment
from lab.model.impairment.vocab import NETEM_DEFAULT_LIMIT

#: Queue limits count wire packets (the engine splits GSO super-frames, the kernel path runs with
#: segmentation offloads off: docs/impairment.md "Wire packets"). A delay line must hold what
#: arrives during the delay: at the link's rate, (delay + 4 x jitter) x rate / 1500 bytes. When
#: a spec sets no `limit`, the lab uses twice that (never below netem's default 1000), so the
#: queue of a delay point is never the bottleneck of the condition it models. The rate is the
#: link's `bw`, else the spec's `rate`, else DEFAULT_LINE_RATE_BPS. The limit in force is always
#: written out (`loss 1% limit 1000`), so results and reports show it.
DEFAULT_LINE_RATE_BPS = 1_000_000_000  # 1 GbE: the Raspberry Pi 4's NIC
WIRE_PACKET_BYTES = 1500


def delay_line_packets(imp: Impairment, line_rate_bps: int) -> int:
    """Wire packets that arrive while the first one waits out the delay, at the line rate."""
    rate = min(x for x in (imp.rate_bps, line_rate_bps) if x)
    hold_us = (imp.delay_us or 0) + 4 * (imp.jitter_us or 0)
    return math.ceil(rate * hold_us / 1e6 / (8 * WIRE_PACKET_BYTES))


def with_queue_limit(imp: Impairment, line_rate_bps: int) -> Impairment:
    """`imp` with the lab's default queue limit when it sets none (see WIRE_PACKET_BYTES)."""
    if imp.is_empty() or imp.limit is not None:
        return imp
    limit = max(NETEM_DEFAULT_LIMIT, 2 * delay_line_packets(imp, line_rate_bps))
    return imp.merge(Impairment(limit=limit))


def limit_warning(imp: Impairment, line_rate_bps: int) -> str | None:
    """A warning when an explicit `limit` is smaller than what the delay line holds."""
    need = delay_line_packets(imp, line_rate_bps)
    limit = imp.limit
    if limit is None or limit >= need:
        return None
    hold_ms = ((imp.delay_us or 0) + 4 * (imp.jitter_us or 0)) / 1000
    cap = limit * WIRE_PACKET_BYTES * 8 / (hold_ms / 1000) / 1e6
    return (
        f"limit {limit} packets is below the {need} wire packets that {hold_ms:g} ms hold at "
        f"{line_rate_bps / 1e6:g} Mbit/s: the queue, not the link, caps throughput at about "
        f"{cap:.0f} Mbit/s (omit limit for the lab's default, or raise it)"
    )


def point_spec(imp: DirectionalImpairment, base: Impairment | None = None) -> DirectionalImpairment:
    """A plan point's impairment per direction: `imp` on top of `base` (the topology link's own
    impairment) field by field, and nothing else: no earlier point, no shell setting."""
    return DirectionalImpairment.symmetric(base or Impairment()).merge(imp, source="impairment")


def effective_point(
    imp: DirectionalImpairment,
    line_rate: int = DEFAULT_LINE_RATE_BPS,
    base: Impairment | None = None,
) -> DirectionalImpairment:
    """What set_point puts in force for `imp`: point_spec with the default queue limit."""
    d = point_spec(imp, base)
    return DirectionalImpairment(
        with_queue_limit(d.a2b, line_rate), with_queue_limit(d.b2a, line_rate)
    )


def with_nic(imp: Impairment, us: int) -> Impairment:
    """`imp` with the boards' NIC latency `us` added to its delay (added, not replacing it: a
    `delay 20ms` point on a path of two boards is 20 ms plus the NICs; jitter stays the spec's)."""
    if not us:
        return imp
    return replace(imp, delay_us=(imp.delay_us or 0) + int(us))


#: the fields whose effect is drawn at random (a seed makes them repeatable)
RANDOM_FIELDS = ("jitter_us", "loss", "duplicate_pct", "corrupt_pct", "reorder_pct")


def draws(imp: Impairment) -> bool:
    """Whether `imp` draws random numbers at all (`delay 40ms` or `rate` alone does not)."""
    return any(getattr(imp, f) is not None for f in RANDOM_FIELDS)


def with_seed(imp: Impairment, seed: int) -> Impairment:
    """`imp` with `seed` for its random draws, where it has draws and gives no seed itself."""
    return replace(imp, seed=seed) if draws(imp) and imp.seed is None else imp


def base_text(st: dict) -> dict[str, str]:
    """What each point keeps under every spec: the link's own `impair=` (replaced field by
    field by a point's words) and the boards' NIC latency (added to the point's delay)."""
    base, nic = st.get("base") or {}, st.get("nic_us") or {}
    out = {}
    for p in st["points"]:
        k = f"{p['node']}:{p['ifname']}"
        parts = [str(Impairment.from_json(base[k]))] if base.get(k) else []
        if nic.get(k):
            parts.append(f"+{nic[k]}us delay (the boards' NICs, added to the point's own delay)")
        if parts:
            out[k] = "; ".join(parts)
    return out
