"""rr: request/response transactions per second over TCP or UDP (study C's TCP_RR/UDP_RR).

Runs the lab's own tools/rr/rr.py (sockperf's ping-pong echoes the request, so it cannot answer
a 516-byte request with 4 bytes): a server in the server node, the client in the client node.
"""

from __future__ import annotations

from lab import REPO
import json
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
    invoke,
    wait_listening,
)
from lab.model.params import Param
from lab.core.tools import SS, Tool

RR_PROGRAM = REPO / "tools" / "rr" / "rr.py"
PYTHON = "python3"


def parse_rr(json_text: str) -> dict[str, Any]:
    """Metrics from rr.py's client JSON, latency flattened to latency_<stat>_us."""
    try:
        doc = json.loads(json_text)
    except ValueError as e:
        raise MeasurementFailed(f"rr output is not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("tool") != "lab-rr":
        raise MeasurementFailed("not the output of tools/rr/rr.py")
    out = {
        "proto": doc["proto"],
        "request_bytes": doc["request_bytes"],
        "response_bytes": doc["response_bytes"],
        "transactions": doc["transactions"],
        "transactions_per_s": doc["tps"],
        "elapsed_s": doc["elapsed_s"],
        "timeouts": doc["timeouts"],
    }
    for k, v in (doc.get("latency_us") or {}).items():
        out[f"latency_{k}_us"] = v
    return out


def rr_argv(role: str, params: Mapping[str, Any], addr: str) -> list[str]:
    argv = [PYTHON, str(RR_PROGRAM), role, "--proto", params["proto"]]
    argv += ["--bind" if role == "server" else "--host", addr.strip("[]")]
    argv += ["--port", str(params["port"]), "--request", str(params["request"])]
    argv += ["--response", str(params["response"])]
    if role == "client":
        argv += ["--duration", f"{params['duration_s']:g}"]
        argv += ["--udp-timeout-ms", f"{params['udp_timeout_ms']:g}"]
    return argv


class RrTest(Test):
    name = "rr"
    nic_side_path = "all"  # the boards' NICs on their side path (docs/cpu.md)
    client_tools = (PYTHON,)
    server_tools = (PYTHON, "ss")
    requires = (Tool(PYTHON, "python3", (PYTHON, "--version"), label="python"), SS)
    schema: ClassVar[dict[str, Param]] = {
        "proto": Param(str, "tcp", choices=("tcp", "udp")),
        "request": Param(int, 1, min=1, max=65507, doc="request bytes"),
        "response": Param(int, 1, min=1, max=65507, doc="response bytes"),
        "duration_s": Param(float, 10.0, min=0.1, max=36000),
        "port": Param(int, 7100, min=1, max=65535),
        "udp_timeout_ms": Param(
            float, 200.0, min=1, max=60000, doc="UDP answer not back by then counts as a timeout"
        ),
    }
    metrics = (
        Metric("transactions_per_s", unit="1/s", description="transactions per second"),
        Metric("latency_p50_us", unit="us", description="median transaction latency"),
        Metric("latency_p99_us", unit="us", description="99th percentile transaction latency"),
    )
    primary = Primary("transactions_per_s", "transactions/s", 1.0, True)

    def estimate_s(self, params: Mapping[str, Any]) -> float:
        return params["duration_s"] + 0.5

    def run(self, ctx: Context, params: Mapping[str, Any]) -> list[Record]:
        base = {
            "proto": params["proto"],
            "request": params["request"],
            "response": params["response"],
        }
        log = ctx.next_raw("rr-server", ".log")
        daemon = ctx.server.spawn(
            f"rr-server-{params['proto']}-{params['port']}",
            rr_argv("server", params, ctx.server_addr),
            log=log,
        )
        try:
            wait_listening(ctx.server, daemon, proto=params["proto"], port=params["port"])
            inv = invoke(
                ctx,
                ctx.client,
                rr_argv("client", params, ctx.server_addr),
                label=f"rr-{params['proto']}",
                suffix=".json",
                timeout=params["duration_s"] + ctx.timeout_s,
            )
        finally:
            ctx.server.stop(daemon)
        files = [log, *inv.raw_files]
        if inv.timed_out or inv.returncode != 0:
            return [
                self.record(ok=False, error=describe_failure(inv, "rr"), raw_files=files, **base)
            ]
        try:
            metrics = parse_rr(inv.stdout)
        except MeasurementFailed as e:
            return [self.record(ok=False, error=str(e), raw_files=files, **base)]
        ok = metrics["transactions"] > 0
        return [
            self.record(
                ok=ok,
                error=None if ok else "no transaction completed",
                raw_files=files,
                **{**base, **metrics},
            )
        ]
