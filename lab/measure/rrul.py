"""rrul: latency under load, after flent's RRUL (Realtime Response Under Load): `flows` TCP flows
each way at once through the tunnel while ping measures the round trip, against the same ping
on the idle tunnel just before.

Phase 1, idle: ping every `ping_interval_s` for `idle_s`. Phase 2, loaded: one
``iperf3 --bidir -P flows`` for `duration_s` (`flows` client-to-server plus `flows`
server-to-client, each with its own figures) and, once every flow's connection is established
on the server, the same ping until shortly before the flows end.

Reported: each flow's and each direction's throughput (the receiver's rate), their total, RTT
p50/p90/p99 idle and loaded, the latency inflation (loaded p50 - idle p50) and the
responsiveness in round trips per minute, 60 000 / loaded p50 (ms). That is the RTT-based form
of the figure: the IETF responsiveness draft (draft-ietf-ippm-responsiveness) measures it from
HTTP/2 transactions and TCP/TLS handshakes on fresh and load-bearing connections, which this
test does not; read it as "ping round trips a minute under load".

Where the traffic runs between the tunnel's own ends, a second ping to the server's underlay
address (outside the tunnel, over the same link) runs beside the first in both phases: its
inflation is the link's queueing (the router's and the impairment's queues, which the tunnel's
packets cross too), and the tunnel's inflation less the link's is the VPN's own queueing (its
TUN device, its daemons' sockets and backlog): `link_inflation_ms`, `vpn_inflation_ms`.

The round-trip probe is ICMP echo (ping) only: flent's RRUL adds UDP round-trip probes with
irtt, which the lab's nodes do not have (not in setup.sh's package list), so there is no UDP
probe and the record says so (`probes`).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from lab.core.errors import ConfigError
from lab.core.tools import PING, SS
from lab.measure.base import (
    Context,
    MeasurementFailed,
    Metric,
    Primary,
    Record,
    Test,
    describe_failure,
    invoke,
)
from lab.measure.iperf3 import (
    DEFAULT_PORT,
    IPERF3,
    client_call,
    flow_start,
    iperf3_server,
    run_client,
)
from lab.measure.iperf3json import parse_iperf3_tcp, records_of
from lab.measure.ping import parse_ping, ping_argv
from lab.model.params import Param

#: what the record's `probes` says about the round-trip probes it ran
PROBES = "ping (ICMP echo); no UDP probe: irtt is not among the lab's tools"
#: the loaded ping stops this long before the flows' planned end, so every echo meets load
LOADED_MARGIN_S = 0.25
#: fewest echoes a phase may plan: fewer and p90/p99 are the maximum under another name
MIN_ECHOES = 5
#: percentiles reported per phase
PERCENTILES = (50, 90, 99)
DIRECTIONS = ("client-to-server", "server-to-client")


# --------------------------------------------------------------------- the pure part


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) of `values` by linear interpolation between the closest
    ranks (numpy's default, Hyndman and Fan's type 7); None for no values."""
    xs = sorted(values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def responsiveness_rpm(loaded_p50_ms: float | None) -> float | None:
    """Round trips per minute at the loaded median RTT: 60 000 / p50 (ms). None without one or
    at 0 ms (ping's resolution on a fast local path)."""
    if not loaded_p50_ms or loaded_p50_ms <= 0:
        return None
    return 60_000.0 / loaded_p50_ms


def rtt_summary(idle_ms: Sequence[float], loaded_ms: Sequence[float]) -> dict[str, Any]:
    """The RTT columns from the two phases' samples (ms): rtt_{idle,loaded}_p{50,90,99}_ms,
    latency_inflation_ms (loaded p50 - idle p50) and responsiveness_rpm."""
    out: dict[str, Any] = {}
    for phase, xs in (("idle", idle_ms), ("loaded", loaded_ms)):
        for q in PERCENTILES:
            out[f"rtt_{phase}_p{q}_ms"] = percentile(xs, q)
    idle, loaded = out["rtt_idle_p50_ms"], out["rtt_loaded_p50_ms"]
    out["latency_inflation_ms"] = loaded - idle if idle is not None and loaded is not None else None
    out["responsiveness_rpm"] = responsiveness_rpm(loaded)
    return out


def queueing_split(
    summary: Mapping[str, Any], link_idle_ms: Sequence[float], link_loaded_ms: Sequence[float]
) -> dict[str, Any]:
    """The link's share of the latency under load and the VPN's own, from the underlay ping's
    samples (ms) beside the tunnel's summary (rtt_summary): link_rtt_{idle,loaded}_p50_ms,
    link_inflation_ms (the link's queueing) and vpn_inflation_ms = latency_inflation_ms -
    link_inflation_ms (what the tunnel's own queues add on top)."""
    idle, loaded = percentile(link_idle_ms, 50), percentile(link_loaded_ms, 50)
    link = loaded - idle if idle is not None and loaded is not None else None
    tunnel = summary.get("latency_inflation_ms")
    return {
        "link_rtt_idle_p50_ms": idle,
        "link_rtt_loaded_p50_ms": loaded,
        "link_inflation_ms": link,
        "vpn_inflation_ms": tunnel - link if tunnel is not None and link is not None else None,
    }


def flow_series(doc: Mapping[str, Any]) -> dict[int, list[dict[str, Any]]]:
    """Each stream's per-interval rate from an iperf3 client document (`intervals[].streams`),
    by socket: [{start, end, bps, omitted}]. The client's view: what it sent on a flow it sends
    (client-to-server), what it received on one the server sends."""
    out: dict[int, list[dict[str, Any]]] = {}
    for iv in doc.get("intervals", []):
        for s in iv.get("streams", []):
            out.setdefault(s["socket"], []).append(
                {
                    "start": s["start"],
                    "end": s["end"],
                    "bps": s["bits_per_second"],
                    "omitted": bool(s.get("omitted", False)),
                }
            )
    return out


def flows_of(json_text: str) -> dict[str, Any]:
    """Per-flow and per-direction throughput of an ``iperf3 --bidir`` TCP document.

    flows: one entry per stream: direction, socket, sender/receiver bytes and bps, the
    sender's retransmits and its interval series. {c2s,s2c,total}_bps: the receivers' rates
    (end.sum_received, end.sum_received_bidir_reverse) and their sum. MeasurementFailed on an
    error document or one that measured a single direction.
    """
    parts = records_of(parse_iperf3_tcp(json_text))
    if len(parts) != 2:
        raise MeasurementFailed("iperf3 measured one direction; rrul needs --bidir (iperf3 >= 3.7)")
    series = flow_series(json.loads(json_text))
    flows = []
    by_dir: dict[str, float | None] = {}
    retransmits = []
    for part in parts:
        d = part["direction"]
        by_dir[d] = part["receiver_bps"]
        retransmits.append(part["retransmits"])
        for s in part["per_stream"]:
            flows.append({"direction": d, **s, "intervals": series.get(s["socket"], [])})
    c2s, s2c = by_dir.get(DIRECTIONS[0]), by_dir.get(DIRECTIONS[1])
    known = [r for r in retransmits if r is not None]
    return {
        "flows": flows,
        "rrul_c2s_bps": c2s,
        "rrul_s2c_bps": s2c,
        "rrul_total_bps": c2s + s2c if c2s is not None and s2c is not None else None,
        "retransmits": sum(known) if known else None,
        "iperf3_version": parts[0].get("iperf3_version"),
    }


def echoes(seconds: float, interval_s: float) -> int:
    """Echoes ping sends in `seconds` at `interval_s` (the first at once)."""
    return max(1, math.floor(seconds / interval_s + 1e-9))


def ping_timeout_s(ctx: Context, count: int, interval_s: float) -> float:
    """How long one phase's ping may run before it counts as timed out: its `count` echoes
    `interval_s` apart, plus the context's timeout_s."""
    return count * interval_s + ctx.timeout_s


# --------------------------------------------------------------------- the test


class RrulTest(Test):
    name = "rrul"
    plots = ("load-latency",)
    client_tools = ("iperf3", "ping")
    server_tools = ("iperf3", "ss")
    requires = (IPERF3, PING, SS)
    #: its pings on the boards' NICs' side path, its flows not (docs/cpu.md "The side path")
    nic_side_path = "icmp"
    schema: ClassVar[dict[str, Param]] = {
        "flows": Param(
            int, 4, min=1, max=64, doc="TCP flows each way (iperf3 --bidir -P): 4 = RRUL's 4 + 4"
        ),
        "duration_s": Param(float, 10.0, min=2, max=3600, doc="the loaded phase, iperf3 -t"),
        "idle_s": Param(float, 3.0, min=0.5, max=600, doc="ping on the idle tunnel first"),
        "ping_interval_s": Param(
            float, 0.2, min=0.01, max=10, doc="ping -i in both phases (0.2 s: 5 echoes/s)"
        ),
        "port": Param(int, DEFAULT_PORT, min=1, max=65535),
    }
    metrics = (
        Metric(
            "rrul_c2s_bps",
            unit="bit/s",
            description="client-to-server: the receiver's rate summed over the flows",
        ),
        Metric(
            "rrul_s2c_bps",
            unit="bit/s",
            description="server-to-client: the receiver's rate summed over the flows",
        ),
        Metric("rrul_total_bps", unit="bit/s", description="rrul_c2s_bps + rrul_s2c_bps"),
        Metric("rtt_idle_p50_ms", unit="ms", description="median ping RTT on the idle tunnel"),
        Metric("rtt_idle_p90_ms", unit="ms", description="90th percentile idle ping RTT"),
        Metric("rtt_idle_p99_ms", unit="ms", description="99th percentile idle ping RTT"),
        Metric(
            "rtt_loaded_p50_ms",
            unit="ms",
            description="median ping RTT while the flows run both ways",
        ),
        Metric("rtt_loaded_p90_ms", unit="ms", description="90th percentile loaded ping RTT"),
        Metric("rtt_loaded_p99_ms", unit="ms", description="99th percentile loaded ping RTT"),
        Metric(
            "rtt_loaded_loss_pct", unit="%", description="share of the loaded echoes unanswered"
        ),
        Metric(
            "latency_inflation_ms",
            unit="ms",
            description="rtt_loaded_p50_ms - rtt_idle_p50_ms",
        ),
        Metric(
            "responsiveness_rpm",
            unit="RPM",
            description="60000 / rtt_loaded_p50_ms: ping round trips a minute under load "
            "(the RTT-based form, not the IETF draft's HTTP/2 method)",
        ),
        Metric("retransmits", unit="segments", description="TCP retransmits of the senders"),
        Metric(
            "link_rtt_idle_p50_ms",
            unit="ms",
            description="median ping RTT to the server's underlay address, tunnel idle",
        ),
        Metric(
            "link_rtt_loaded_p50_ms",
            unit="ms",
            description="median ping RTT to the server's underlay address under the flows",
        ),
        Metric(
            "link_inflation_ms",
            unit="ms",
            description="the link's queueing: link_rtt_loaded_p50_ms - link_rtt_idle_p50_ms",
        ),
        Metric(
            "vpn_inflation_ms",
            unit="ms",
            description="the VPN's own queueing: latency_inflation_ms - link_inflation_ms",
        ),
    )
    primary = Primary("responsiveness_rpm", "RPM", 1.0, True)

    def validate(self, params: Mapping[str, Any] | None, *, source: str) -> dict[str, Any]:
        out = super().validate(params, source=source)
        every = out["ping_interval_s"]
        for fld, seconds in (
            ("idle_s", out["idle_s"]),
            ("duration_s", out["duration_s"] - LOADED_MARGIN_S),
        ):
            if echoes(seconds, every) < MIN_ECHOES:
                raise ConfigError(
                    f"test 'rrul': {fld} = {out[fld]:g} at ping_interval_s = {every:g} plans "
                    f"{echoes(seconds, every)} echoes, fewer than {MIN_ECHOES} (p90/p99 would be "
                    f"the maximum); accepted: ping_interval_s <= "
                    f"{seconds / MIN_ECHOES:.3g} or a longer {fld}",
                    source=source,
                    field=fld,
                )
        return out

    def estimate_s(self, params: Mapping[str, Any]) -> float:
        return params["idle_s"] + params["duration_s"] + 1.0

    def run(self, ctx: Context, params: Mapping[str, Any]) -> list[Record]:
        files: list[Path] = []
        base: dict[str, Any] = {"flows_each_way": params["flows"], "probes": PROBES}
        every = params["ping_interval_s"]
        link: dict[str, Any] = {}
        base["link_probe"] = (
            f"ping {ctx.link_addr} (the server's underlay address) beside the tunnel's"
            if ctx.link_addr
            else "none: no tunnel, or the traffic nodes are not the tunnel's ends"
        )
        try:
            idle = self._phase(
                ctx, echoes(params["idle_s"], every), every, "ping-idle", files, link
            )
            base["rtts_idle"] = idle["rtts"]
            loaded, flows = self._loaded(ctx, params, files, link)
            base["rtts_loaded"] = loaded["rtts"]
        except MeasurementFailed as e:
            return [self.record(ok=False, error=str(e), raw_files=files, **base)]
        summary = rtt_summary(
            [r["rtt_ms"] for r in idle["rtts"]], [r["rtt_ms"] for r in loaded["rtts"]]
        )
        if "ping-idle" in link and "ping-loaded" in link:
            summary.update(
                queueing_split(
                    summary,
                    [r["rtt_ms"] for r in link["ping-idle"]["rtts"]],
                    [r["rtt_ms"] for r in link["ping-loaded"]["rtts"]],
                )
            )
            base["link_rtts_idle"] = link["ping-idle"]["rtts"]
            base["link_rtts_loaded"] = link["ping-loaded"]["rtts"]
        elif link.get("error"):
            base["link_probe"] += f"; failed: {link['error']}"
        sent = loaded["transmitted"]
        loss = 100.0 * (sent - loaded["received"]) / sent if sent else None
        return [
            self.record(
                raw_files=files,
                **base,
                **flows,
                **summary,
                rtt_loaded_loss_pct=loss,
                ping_idle={k: v for k, v in idle.items() if k != "rtts"},
                ping_loaded={k: v for k, v in loaded.items() if k != "rtts"},
            )
        ]

    def _phase(
        self,
        ctx: Context,
        count: int,
        every: float,
        label: str,
        files: list[Path],
        link: dict[str, Any],
    ) -> dict[str, Any]:
        """One phase's tunnel ping (its parse_ping()) and, beside it where ctx.link_addr is
        set, the same ping to the server's underlay address into link[label] (its failure
        into link["error"]: the link probe is an addition, the test does not fail for it)."""
        if not ctx.link_addr:
            return self._ping(ctx, count, every, label, files)

        def underlay() -> None:
            try:
                link[label] = self._ping(
                    ctx, count, every, f"link-{label}", files, addr=ctx.link_addr
                )
            except MeasurementFailed as e:
                link["error"] = str(e)

        beside = threading.Thread(target=underlay, name=f"rrul-link-{label}", daemon=True)
        beside.start()
        try:
            return self._ping(ctx, count, every, label, files)
        finally:
            beside.join(ping_timeout_s(ctx, count, every) + 5)

    def _ping(
        self,
        ctx: Context,
        count: int,
        every: float,
        label: str,
        files: list[Path],
        *,
        addr: str | None = None,
    ) -> dict[str, Any]:
        """One ping phase's parse_ping(); MeasurementFailed when it timed out, printed no
        summary or got no reply."""
        argv = ping_argv(addr or ctx.server_addr, count=count, interval_s=every)
        inv = invoke(ctx, ctx.client, argv, label=label, timeout=ping_timeout_s(ctx, count, every))
        files += inv.raw_files
        if inv.timed_out:
            raise MeasurementFailed(f"{label}: {describe_failure(inv, 'ping')}")
        try:
            out = parse_ping(inv.stdout)
        except MeasurementFailed as e:
            raise MeasurementFailed(f"{label}: {e}; {describe_failure(inv, 'ping')}") from None
        if not out["received"]:
            raise MeasurementFailed(f"{label}: no echo reply ({out['transmitted']} sent)")
        return out

    def _loaded(
        self, ctx: Context, params: Mapping[str, Any], files: list[Path], link: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The flows and, meanwhile, the loaded ping: (its parse_ping(), flows_of())."""
        port, duration, n = params["port"], params["duration_s"], params["flows"]
        call = client_call(ctx.server_addr, port, duration=duration, streams=n, bidir=True)
        got: dict[str, Any] = {}

        def client() -> None:
            try:
                got["text"] = run_client(
                    ctx, call, label="iperf3-rrul", files=files, expected_s=duration
                )
            except MeasurementFailed as e:
                got["error"] = e

        with iperf3_server(ctx, port) as log:
            files.append(log)
            load = threading.Thread(target=client, name="rrul-iperf3", daemon=True)
            load.start()
            # every flow established (the control connection and n each way): the load is on
            t0 = flow_start(
                ctx,
                port,
                until=time.monotonic() + ctx.timeout_s,
                connections=1 + 2 * n,
                running=load.is_alive,
            )
            left = duration - (time.monotonic() - t0) - LOADED_MARGIN_S
            every = params["ping_interval_s"]
            ping_error = None
            try:
                loaded = self._phase(ctx, echoes(left, every), every, "ping-loaded", files, link)
            except MeasurementFailed as e:
                ping_error = e
            load.join(duration + ctx.timeout_s + 5)
        if "error" in got:
            raise got["error"]
        if "text" not in got:
            raise MeasurementFailed("iperf3 did not finish")
        if ping_error is not None:
            raise ping_error
        return loaded, flows_of(got["text"])
