"""ping-flood: iputils ``ping -f`` between the traffic endpoints: echoes sent and answered, loss,
RTT under a flood, and how long the flood took.

``ping -f`` sends the next request as soon as a reply comes back, and at least 100 per second
when none does, so it measures round trips back to back: the per-packet cost of both directions
of the tunnel, with no idle time between packets. It needs root (the lab's nodes run as root);
``-q`` keeps the output to ping's summary.

Primary metric: ``rtt_avg_ms``, lower is better. The flood is self-clocked, so on a path without
configured loss it loses next to nothing whichever VPN carries it (loss cannot rank profiles),
and under an impairment the loss is mostly the loss the impairment asked for; the mean round
trip of back-to-back echoes is what differs between implementations.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

from lab.measure.base import (
    Context,
    MeasurementFailed,
    Metric,
    Primary,
    Record,
    Test,
    describe_failure,
    family_of,
    invoke,
)
from lab.model.params import Param
from lab.core.tools import PING
from lab.measure.ping import parse_ping

_TIME = re.compile(r"packets transmitted, .*, time (?P<ms>\d+)ms")
_IPG = re.compile(r"ipg/ewma (?P<ipg>[\d.]+)/(?P<ewma>[\d.]+) ?ms")
_PIPE = re.compile(r"^pipe (?P<n>\d+)$")

#: at least 100 requests/s without replies (ping -f's floor); when the neighbour does not
#: resolve, iputils 20221126 was seen sending one request per ~50 ms: allow that before killing
SECONDS_PER_REQUEST_WORST = 0.05


def parse_ping_flood(text: str) -> dict[str, Any]:
    """Metrics of one ``ping -f -q`` run; raises MeasurementFailed without a summary.

    ``time_ms`` is ping's own elapsed time of the run, ``ipg_ms``/``ewma_ms`` its mean gap
    between requests and moving-average RTT (None when nothing came back), ``pipe`` the most
    requests it had in flight (None when ping did not print it).
    """
    base = parse_ping(text)
    out: dict[str, Any] = {
        k: base[k]
        for k in (
            "transmitted",
            "received",
            "duplicates",
            "errors",
            "loss_pct",
            "rtt_min_ms",
            "rtt_avg_ms",
            "rtt_max_ms",
            "rtt_mdev_ms",
            "local_error",
        )
    }
    out.update(time_ms=None, ipg_ms=None, ewma_ms=None, pipe=None)
    for raw in text.splitlines():
        line = raw.strip()
        if m := _TIME.search(line):
            out["time_ms"] = float(m["ms"])
        if m := _IPG.search(line):
            out["ipg_ms"], out["ewma_ms"] = float(m["ipg"]), float(m["ewma"])
        if m := _PIPE.match(line):
            out["pipe"] = int(m["n"])
    return out


def ping_flood_argv(
    addr: str, *, count: int, size: int, reply_timeout_s: float, family: int | None = None
) -> list[str]:
    fam = family or family_of(addr)
    argv = ["ping", "-n", "-q", "-f"]
    if fam:
        argv.append(f"-{fam}")
    argv += ["-c", str(count), "-s", str(size), "-W", f"{reply_timeout_s:g}"]
    return argv + [addr.strip("[]")]


class PingFloodTest(Test):
    name = "ping-flood"
    client_tools = ("ping",)
    requires = (PING,)
    schema: ClassVar[dict[str, Param]] = {
        "count": Param(int, 1000, min=1, max=10_000_000, doc="echo requests, ping -c"),
        "size": Param(int, 56, min=0, max=65507, doc="ICMP payload bytes, ping -s"),
        "reply_timeout_s": Param(
            float, 2.0, min=0.1, max=60, doc="ping -W: how long to wait for the last replies"
        ),
        "family": Param(int, None, optional=True, choices=(4, 6), doc="None: from the address"),
    }
    metrics = (
        Metric(
            "echo_requests", unit="packets", description="echo requests sent", source="transmitted"
        ),
        Metric(
            "echo_replies", unit="packets", description="echo replies received", source="received"
        ),
        Metric("loss_pct", unit="%", description="lost share of the echo requests"),
        Metric("rtt_avg_ms", unit="ms", description="mean RTT under the flood"),
        Metric("rtt_max_ms", unit="ms", description="maximum RTT under the flood"),
        Metric(
            "flood_time_ms",
            unit="ms",
            description="how long the flood took (ping's own 'time')",
            source="time_ms",
        ),
        Metric("size", unit="bytes", description="ICMP payload bytes (ping -s)", summarised=False),
    )
    primary = Primary("rtt_avg_ms", "ms RTT", 1.0, False)

    def estimate_s(self, params: Mapping[str, Any]) -> float:
        # a round trip through a capped tunnel takes about a millisecond; a lossy or delayed
        # path is slower (at worst 100 requests/s)
        return 0.3 + params["count"] / 1000

    def run(self, ctx: Context, params: Mapping[str, Any]) -> list[Record]:
        argv = ping_flood_argv(
            ctx.server_addr,
            count=params["count"],
            size=params["size"],
            reply_timeout_s=params["reply_timeout_s"],
            family=params["family"],
        )
        worst = params["count"] * SECONDS_PER_REQUEST_WORST + params["reply_timeout_s"]
        inv = invoke(ctx, ctx.client, argv, label="ping-flood", timeout=worst + ctx.timeout_s)
        base = {
            "count": params["count"],
            "size": params["size"],
            "family": params["family"] or family_of(ctx.server_addr),
            "wall_s": inv.seconds,
        }
        if inv.timed_out:
            err = describe_failure(inv, "ping -f")
            return [self.record(ok=False, error=err, raw_files=inv.raw_files, **base)]
        try:
            metrics = parse_ping_flood(inv.stdout)
        except MeasurementFailed as e:
            err = f"{e}; {describe_failure(inv, 'ping -f')}"
            return [self.record(ok=False, error=err, raw_files=inv.raw_files, **base)]
        ok = bool(metrics["received"])
        error = None if ok else f"no echo reply ({metrics['transmitted']} sent)"
        return [self.record(ok=ok, error=error, raw_files=inv.raw_files, **{**base, **metrics})]
