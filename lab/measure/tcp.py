"""tcp: iperf3 TCP bulk transfer in either direction or both at once (--bidir: one record per
direction), over one or more streams, with optional MSS for small packets."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from lab.measure.adaptive import ADAPTIVE_METRICS, ADAPTIVE_SCHEMA, columns, rule_of, run_segments
from lab.measure.tcpstream import run_streaming, streams_here
from lab.measure.base import Context, MeasurementFailed, Metric, Primary, Record, Test, family_of
from lab.model.params import Param
from lab.core.node import Node
from lab.core.tools import SS
from lab.measure.iperf3 import (
    BIDIR_PARAM,
    IPERF3,
    DEFAULT_PORT,
    IPERF3_METRICS,
    check_bidir,
    ClientCall,
    client_call,
    iperf3_server,
    run_client,
)
from lab.measure.iperf3json import parse_iperf3_tcp, records_of

DIRECTIONS = ("client-to-server", "server-to-client")

#: TCP timestamp option bytes per segment (Linux default net.ipv4.tcp_timestamps=1)
TCP_TIMESTAMPS = 12
ETHERNET_HEADER = 14
IP_HEADER = {4: 20, 6: 40}
TCP_HEADER = 20


def packet_rate(
    bps: float | None, tcp_mss: int | None, *, mss_set: bool, family: int | None
) -> dict[str, Any]:
    """Packets/s from goodput, and the on-wire rate under a stated header assumption.

    iperf3 reports the socket's TCP_MAXSEG: unset, that is the payload per segment already
    (Linux returns mss_cache, e.g. 1448 on a 1500 MTU); set with -M, it is the value requested,
    from which the kernel still subtracts the 12 timestamp bytes (-M 88 -> 76 B payload).
    """
    if not bps or not tcp_mss:
        return {"packets_per_s": None}
    payload = tcp_mss - TCP_TIMESTAMPS if mss_set else tcp_mss
    fam = family or 4
    overhead = ETHERNET_HEADER + IP_HEADER[fam] + TCP_HEADER + TCP_TIMESTAMPS
    pps = bps / 8 / payload
    return {
        "payload_bytes_per_packet": payload,
        "packets_per_s": pps,
        "header_bytes_per_packet": overhead,
        "wire_bps": pps * (payload + overhead) * 8,
        "pps_assumption": (
            f"full-size segments of {payload} B payload; per packet {overhead} B of headers = "
            f"Ethernet {ETHERNET_HEADER} + IPv{fam} {IP_HEADER[fam]} + TCP {TCP_HEADER} + "
            f"timestamps {TCP_TIMESTAMPS} (no FCS/preamble, no tunnel encapsulation)"
        ),
    }


class TcpTest(Test):
    name = "tcp"
    plots = ("throughput", "throughput-time")
    ranks = "throughput"
    client_tools = ("iperf3",)
    server_tools = ("iperf3", "ss")
    requires = (IPERF3, SS)
    schema: ClassVar[dict[str, Param]] = {
        "direction": Param(
            str,
            "client-to-server",
            choices=DIRECTIONS,
            doc="server-to-client runs iperf3 -R (study B's IN)",
        ),
        "duration_s": Param(float, 10.0, min=1, max=36000, doc="iperf3 -t"),
        "omit_s": Param(float, 0.0, min=0, max=600, doc="warm-up seconds discarded, iperf3 -O"),
        "streams": Param(int, 1, min=1, max=128, doc="parallel streams, iperf3 -P (each way)"),
        "bidir": BIDIR_PARAM,
        "mss": Param(
            int,
            None,
            optional=True,
            min=88,
            max=9000,
            doc="TCP_MAXSEG, iperf3 -M (88 = Linux minimum, 76 B payload)",
        ),
        "port": Param(int, DEFAULT_PORT, min=1, max=65535),
        **ADAPTIVE_SCHEMA,
    }
    metrics = (
        *IPERF3_METRICS,
        Metric("retransmits", unit="segments", description="TCP retransmits of the sender"),
        Metric("tcp_mss", unit="bytes", description="TCP_MAXSEG as iperf3 reports it"),
        Metric(
            "packets_per_s",
            unit="packets/s",
            description="packets/s from goodput and payload per segment",
        ),
        *ADAPTIVE_METRICS,
    )
    primary = Primary("throughput_bps", "Mbit/s", 1e-6, True)
    since_plans: ClassVar[dict[str, Any]] = {"bidir": False}

    def validate(self, params: Mapping[str, Any] | None, *, source: str) -> dict[str, Any]:
        return check_bidir(super().validate(params, source=source), source=source)

    def estimate_s(self, params: Mapping[str, Any]) -> float:
        return params["duration_s"] + params["omit_s"] + 0.5

    def run(self, ctx: Context, params: Mapping[str, Any]) -> list[Record]:
        def call_of(duration: float) -> ClientCall:
            return client_call(
                ctx.server_addr,
                params["port"],
                duration=duration,
                omit=params["omit_s"],
                streams=params["streams"],
                reverse=params["direction"] == "server-to-client",
                mss=params["mss"],
                server_output=params["adaptive"],
                bidir=params["bidir"],
            )

        def run_one(duration: float) -> dict[str, Any]:
            text = run_client(
                ctx,
                call_of(duration),
                label="iperf3-tcp",
                files=files,
                expected_s=duration + params["omit_s"],
            )
            return parse_iperf3_tcp(text)

        base: dict[str, Any] = {"direction": params["direction"], "mss": params["mss"]}
        if params["bidir"]:
            base["bidir"] = True
        files: list[Path] = []
        try:
            with iperf3_server(ctx, params["port"], json=params["adaptive"]) as server_log:
                files.append(server_log)
                reverse = params["direction"] == "server-to-client"
                if params["adaptive"] and streams_here(ctx.client if reverse else ctx.server):
                    # one connection, stopped as it streams (lab/measure/tcpstream.py)
                    metrics, info = run_streaming(
                        ctx,
                        call_of(params["duration_s"]),
                        rule=rule_of(params),
                        cap_s=params["duration_s"],
                        omit_s=params["omit_s"],
                        read_server_log=lambda: _read(ctx.server, server_log),
                        files=files,
                    )
                    base.update(adaptive=info, **columns(info))
                elif params["adaptive"]:  # segments bounded by -t (lab/measure/adaptive.py)
                    metrics, info = run_segments(
                        run_one,
                        rule_of(params),
                        cap_s=params["duration_s"],
                        omit_s=params["omit_s"],
                    )
                    info["mechanism"] = "segments"  # no ss on the receiving node
                    base.update(adaptive=info, **columns(info))
                else:
                    metrics = run_one(params["duration_s"])
        except MeasurementFailed as e:
            return [
                self.record(ok=False, error=str(e), raw_files=files, **{**base, "direction": d})
                for d in (DIRECTIONS if params["bidir"] else (params["direction"],))
            ]
        out = []
        for m in records_of(metrics):
            m.update(
                packet_rate(
                    m["receiver_bps"],
                    m["tcp_mss"],
                    mss_set=m["tcp_mss_set"],
                    family=family_of(ctx.server_addr),
                )
            )
            out.append(self.record(raw_files=files, **{**base, **m}))
        return out


def _read(node: Node, path: Path) -> str:
    """A log the node's process writes (on a board: the board's file of that path)."""
    cp = node.run(["cat", str(path)], check=False, timeout=30)
    return cp.stdout if cp.returncode == 0 else ""
