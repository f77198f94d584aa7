"""udp and udp-sweep: iperf3 UDP at a target rate (one point, or a sweep of rates). udp also runs
both directions at once (--bidir: one record per direction) and over several streams.

The sweep sends the same datagram size at rising target rates through one iperf3 server and
reports sent vs received packets/s per step, which tells a sender-bound implementation (sent
falls short of the target) from a receiver-bound one (sent keeps up, received does not).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from lab.core.errors import ConfigError
from lab.measure.adaptive import ADAPTIVE_METRICS, ADAPTIVE_SCHEMA, columns, rule_of, run_segments
from lab.measure.base import Context, MeasurementFailed, Metric, Primary, Record, Test
from lab.model.params import Param
from lab.core.tools import SS
from lab.measure.iperf3 import (
    BIDIR_PARAM,
    IPERF3,
    DEFAULT_PORT,
    IPERF3_METRICS,
    check_bidir,
    client_call,
    iperf3_server,
    run_client,
)
from lab.measure.iperf3json import parse_iperf3_udp, records_of
from lab.measure.tcp import DIRECTIONS

MBIT = 1_000_000

#: results.csv columns of udp and udp-sweep records (rate and size are the parameters, echoed)
UDP_METRICS = (
    *IPERF3_METRICS,
    Metric("rate_mbit", unit="Mbit/s", description="target rate", summarised=False),
    Metric("size", unit="bytes", description="datagram payload bytes", summarised=False),
    Metric("target_pps", unit="packets/s", description="packets/s the target rate asks for"),
    Metric("sent_pps", unit="packets/s", description="packets/s sent"),
    Metric("received_pps", unit="packets/s", description="packets/s received"),
    Metric("jitter_ms", unit="ms", description="jitter"),
    Metric("loss_pct", unit="%", description="lost share"),
    Metric("packets_sent", unit="packets", description="datagrams sent"),
    Metric("packets_lost", unit="packets", description="datagrams lost"),
    Metric(
        "setup_retries",
        unit="attempts",
        description="iperf3 connections tried again because their UDP stream set-up datagram "
        "or its reply was lost (lab.measure.iperf3loss.setup_lost)",
        summarised=False,
    ),
)
THROUGHPUT = Primary("throughput_bps", "Mbit/s", 1e-6, True)


def _common_schema(duration: float) -> dict[str, Param]:
    return {
        "direction": Param(str, "client-to-server", choices=DIRECTIONS, doc="-R for IN"),
        "size": Param(int, 1300, min=16, max=65507, doc="datagram payload bytes, iperf3 -l"),
        "duration_s": Param(float, duration, min=1, max=36000, doc="iperf3 -t (per step)"),
        "port": Param(int, DEFAULT_PORT, min=1, max=65535),
    }


def _one(
    test: Test,
    ctx: Context,
    params: Mapping[str, Any],
    rate_mbit: float,
    label: str,
    server_log: Path,
) -> list[Record]:
    """One record, or with bidir one per direction."""
    streams, bidir = params.get("streams", 1), bool(params.get("bidir"))

    def run_one(duration: float) -> dict[str, Any]:
        call = client_call(
            ctx.server_addr,
            params["port"],
            duration=duration,
            streams=streams,
            reverse=params["direction"] == "server-to-client",
            udp=True,
            # iperf3's -b is per stream: rate_mbit is the target of all of them (each way)
            rate_bps=rate_mbit * MBIT / streams,
            length=params["size"],
            server_output=bool(params.get("adaptive")),
            bidir=bidir,
        )
        text = run_client(
            ctx,
            call,
            label=label,
            files=files,
            expected_s=duration,
            lost_setups=lost,
        )
        return parse_iperf3_udp(text)

    base = {"direction": params["direction"], "rate_mbit": rate_mbit, "size": params["size"]}
    if bidir:
        base["bidir"] = True
    files: list[Path] = [server_log]
    lost: list[Path] = []  # each connection tried again after a lost set-up (all segments)
    try:
        if params.get("adaptive"):  # udp only; segments bounded by -t (measure/adaptive.py)
            rule = rule_of(params)
            metrics, info = run_segments(run_one, rule, cap_s=params["duration_s"], udp=True)
            base.update(adaptive=info, **columns(info))
        else:
            metrics = run_one(params["duration_s"])
    except MeasurementFailed as e:
        base["setup_retries"] = len(lost)
        return [
            test.record(ok=False, error=str(e), raw_files=files, **{**base, "direction": d})
            for d in (DIRECTIONS if bidir else (params["direction"],))
        ]
    target_pps = rate_mbit * MBIT / 8 / params["size"]
    base["setup_retries"] = len(lost)
    return [
        test.record(raw_files=files, **{**base, **m, "target_pps": target_pps})
        for m in records_of(metrics)
    ]


class UdpTest(Test):
    name = "udp"
    plots = ("throughput", "rate-target", "throughput-time")
    ranks = "throughput"
    client_tools = ("iperf3",)
    server_tools = ("iperf3", "ss")
    requires = (IPERF3, SS)
    schema: ClassVar[dict[str, Param]] = {
        "rate_mbit": Param(
            float,
            1.0,
            min=0.001,
            max=100_000,
            doc="target rate (each way), iperf3 -b rate_mbit / streams per stream",
        ),
        **_common_schema(10.0),
        "streams": Param(int, 1, min=1, max=128, doc="parallel streams, iperf3 -P (each way)"),
        "bidir": BIDIR_PARAM,
        **ADAPTIVE_SCHEMA,
    }
    metrics = (*UDP_METRICS, *ADAPTIVE_METRICS)
    primary = THROUGHPUT
    since_plans: ClassVar[dict[str, Any]] = {"bidir": False, "streams": 1}

    def validate(self, params: Mapping[str, Any] | None, *, source: str) -> dict[str, Any]:
        return check_bidir(super().validate(params, source=source), source=source)

    def estimate_s(self, params: Mapping[str, Any]) -> float:
        return params["duration_s"] + 0.5

    def run(self, ctx: Context, params: Mapping[str, Any]) -> list[Record]:
        with iperf3_server(ctx, params["port"], json=params["adaptive"]) as log:
            return _one(self, ctx, params, params["rate_mbit"], "iperf3-udp", log)


def _positive_rates(rates: list) -> str | None:
    if not rates:
        return "empty list"
    if not all(isinstance(r, int | float) and not isinstance(r, bool) and r > 0 for r in rates):
        return "every rate must be a number > 0"
    return None


class UdpSweepTest(Test):
    name = "udp-sweep"
    plots = ("rate-sweep",)
    client_tools = ("iperf3",)
    server_tools = ("iperf3", "ss")
    requires = (IPERF3, SS)
    schema: ClassVar[dict[str, Param]] = {
        "start_mbit": Param(float, 25.0, min=0.001, max=100_000),
        "stop_mbit": Param(float, 400.0, min=0.001, max=100_000, doc="inclusive"),
        "step_mbit": Param(float, 25.0, min=0.001, max=100_000),
        "rates_mbit": Param(
            list, None, optional=True, check=_positive_rates, doc="explicit rates; overrides range"
        ),
        **_common_schema(10.0),
    }
    metrics = UDP_METRICS
    primary = THROUGHPUT

    def validate(self, params: Mapping[str, Any] | None, *, source: str) -> dict[str, Any]:
        out = super().validate(params, source=source)
        if out["rates_mbit"] is None and out["stop_mbit"] < out["start_mbit"]:
            raise ConfigError(
                f"stop_mbit {out['stop_mbit']} is below start_mbit {out['start_mbit']}; "
                "accepted: stop_mbit >= start_mbit",
                source=source,
                field="stop_mbit",
            )
        return out

    @staticmethod
    def rates(params: Mapping[str, Any]) -> list[float]:
        if params["rates_mbit"] is not None:
            return [float(r) for r in params["rates_mbit"]]
        start, stop, step = params["start_mbit"], params["stop_mbit"], params["step_mbit"]
        n = int((stop - start) / step + 1e-9)
        return [round(start + i * step, 6) for i in range(n + 1)]

    def estimate_s(self, params: Mapping[str, Any]) -> float:
        return len(self.rates(params)) * (params["duration_s"] + 0.3) + 0.5

    def run(self, ctx: Context, params: Mapping[str, Any]) -> list[Record]:
        records = []
        with iperf3_server(ctx, params["port"]) as log:
            for i, rate in enumerate(self.rates(params)):
                for rec in _one(self, ctx, params, rate, f"iperf3-udp-sweep-{rate:g}M", log):
                    rec["step"] = i
                    records.append(rec)
        return records
