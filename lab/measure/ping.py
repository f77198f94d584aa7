"""ping: ICMP echo RTT (min/avg/max/mdev), loss and the per-echo RTT series (iputils ping)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, ClassVar

from lab.model.stoprule import loss_decision
from lab.measure.adaptive import (
    ADAPTIVE_METRICS,
    ADAPTIVE_SCHEMA,
    columns,
    ping_info,
    rule_of,
    watch,
)
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

_REPLY = re.compile(
    r"^\d+ bytes from (?P<src>\S+?):? icmp_seq=(?P<seq>\d+)(?: ttl=(?P<ttl>\d+))?"
    r" time[=<](?P<rtt>[\d.]+) ?ms(?P<dup> \(DUP!\))?"
)
_STATS = re.compile(r"^(?P<tx>\d+) packets transmitted, (?P<rx>\d+) (?:packets )?received")
_LOSS = re.compile(r"(?P<loss>[\d.]+)% packet loss")
_EXTRA = re.compile(r"\+(?P<n>\d+) (?P<what>duplicates|errors|corrupted)")
_RTT = re.compile(
    r"^(?:rtt|round-trip) min/avg/max(?:/(?:mdev|stddev))? = "
    r"(?P<min>[\d.]+)/(?P<avg>[\d.]+)/(?P<max>[\d.]+)(?:/(?P<mdev>[\d.]+))? ?ms"
)
# "local error: message too long, mtu=1420" (v4), "mtu: 1420" (v6); ICMP from a hop:
# "Frag needed and DF set (mtu = 1400)", "Packet too big: mtu=1280"
_MTU_HINT = re.compile(r"mtu ?[=:] ?(?P<mtu>\d+)")
_LOCAL_ERROR = re.compile(r"^ping: local error: (?P<msg>.*)$")


def parse_ping(text: str) -> dict[str, Any]:
    """Metrics of one iputils (or busybox) ping run; raises MeasurementFailed without a summary.

    ``rtts`` is the per-echo series (duplicates excluded); min/avg/max/mdev come from ping's own
    summary line and are None when nothing came back.
    """
    series: list[dict[str, Any]] = []
    out: dict[str, Any] = {
        "transmitted": None,
        "received": None,
        "duplicates": 0,
        "errors": 0,
        "loss_pct": None,
        "rtt_min_ms": None,
        "rtt_avg_ms": None,
        "rtt_max_ms": None,
        "rtt_mdev_ms": None,
        "mtu_hint": None,
        "local_error": None,
    }
    for raw in text.splitlines():
        line = raw.strip()
        if m := _REPLY.match(line):
            if not m["dup"]:
                series.append({"seq": int(m["seq"]), "rtt_ms": float(m["rtt"])})
            continue
        if m := _STATS.match(line):
            out["transmitted"], out["received"] = int(m["tx"]), int(m["rx"])
            if lm := _LOSS.search(line):
                out["loss_pct"] = float(lm["loss"])
            for em in _EXTRA.finditer(line):
                key = "duplicates" if em["what"] == "duplicates" else "errors"
                out[key] += int(em["n"])
            continue
        if m := _RTT.match(line):
            for k in ("min", "avg", "max", "mdev"):
                out[f"rtt_{k}_ms"] = float(m[k]) if m[k] is not None else None
            continue
        if m := _LOCAL_ERROR.match(line):
            out["local_error"] = m["msg"]
        if (m := _MTU_HINT.search(line)) and out["mtu_hint"] is None:
            out["mtu_hint"] = int(m["mtu"])
    if out["transmitted"] is None:
        raise MeasurementFailed("ping printed no statistics line")
    if out["loss_pct"] is None and out["transmitted"]:
        out["loss_pct"] = 100.0 * (out["transmitted"] - out["received"]) / out["transmitted"]
    out["rtts"] = series
    return out


def parse_ping_replies(text: str) -> list[dict[str, Any]]:
    """The reply lines so far ({seq, rtt_ms}, duplicates excluded): ping's output as it streams."""
    out = []
    for raw in text.splitlines():
        if (m := _REPLY.match(raw.strip())) and not m["dup"]:
            out.append({"seq": int(m["seq"]), "rtt_ms": float(m["rtt"])})
    return out


def _unresolved(metrics: dict[str, Any], params: Mapping[str, Any]) -> None:
    """After SIGINT, echoes sent within the last reply_timeout_s without a reply are
    unresolved, not lost (their reply window never closed): take them out of the counts."""
    tx = metrics["transmitted"] or 0
    window = math.ceil(params["reply_timeout_s"] / params["interval_s"])
    replied = {r["seq"] for r in metrics["rtts"]}
    # icmp_seq counts from 1 (iputils)
    n = sum(1 for seq in range(max(1, tx - window + 1), tx + 1) if seq not in replied)
    metrics["unresolved"] = n
    if n:
        metrics["transmitted"] = tx - n
        sent = metrics["transmitted"]
        metrics["loss_pct"] = 100.0 * (sent - metrics["received"]) / sent if sent else None


def ping_argv(
    addr: str,
    *,
    count: int,
    interval_s: float,
    size: int = 56,
    reply_timeout_s: float = 2,
    family: int | None = None,
    dont_fragment: bool = False,
) -> list[str]:
    fam = family or family_of(addr)
    argv = ["ping", "-n"]
    if fam:
        argv.append(f"-{fam}")
    if dont_fragment:
        argv += ["-M", "do"]
    argv += ["-c", str(count), "-i", f"{interval_s:g}", "-s", str(size)]
    argv += ["-W", f"{reply_timeout_s:g}", addr.strip("[]")]
    return argv


class PingTest(Test):
    name = "ping"
    nic_side_path = "all"  # the boards' NICs on their side path (docs/cpu.md)
    plots = ("rtt",)
    ranks = "rtt"
    client_tools = ("ping",)
    requires = (PING,)
    schema: ClassVar[dict[str, Param]] = {
        "count": Param(int, 500, min=1, max=1_000_000),
        # iputils lets unprivileged users go down to 2 ms (older releases: 200 ms); the lab's
        # nodes run as root, which may go lower, but below 2 ms it is a flood, not a latency test.
        "interval_s": Param(float, 0.2, min=0.002, max=60),
        "size": Param(int, 56, min=0, max=65507, doc="ICMP payload bytes, ping -s"),
        "reply_timeout_s": Param(float, 2.0, min=0.1, max=60, doc="ping -W"),
        "family": Param(int, None, optional=True, choices=(4, 6), doc="None: from the address"),
        **ADAPTIVE_SCHEMA,
    }
    metrics = (
        Metric("loss_pct", unit="%", description="lost share"),
        Metric("rtt_min_ms", unit="ms", description="minimum RTT"),
        Metric("rtt_avg_ms", unit="ms", description="mean RTT"),
        Metric("rtt_max_ms", unit="ms", description="maximum RTT"),
        Metric("rtt_mdev_ms", unit="ms", description="RTT mean deviation"),
        *ADAPTIVE_METRICS,
    )
    primary = Primary("rtt_avg_ms", "ms RTT", 1.0, False)

    def estimate_s(self, params: Mapping[str, Any]) -> float:
        return params["count"] * params["interval_s"] + 0.3

    def run(self, ctx: Context, params: Mapping[str, Any]) -> list[Record]:
        argv = ping_argv(
            ctx.server_addr,
            count=params["count"],
            interval_s=params["interval_s"],
            size=params["size"],
            reply_timeout_s=params["reply_timeout_s"],
            family=params["family"],
        )
        expected = params["count"] * params["interval_s"] + params["reply_timeout_s"]
        stopped = False
        if params["adaptive"]:
            # loss is recorded with its interval, not a stop criterion: ping's primary is RTT
            rule = rule_of(params, loss_abs=None)

            def enough(text: str) -> bool:
                rtts = [m["rtt_ms"] for m in parse_ping_replies(text)]
                d = ping_info(
                    rtts, True, rule, interval_s=params["interval_s"], count=params["count"]
                )
                return d["reason"] == "ci"

            inv, stopped = watch(
                ctx, ctx.client, argv, label="ping", timeout=expected + ctx.timeout_s, enough=enough
            )
        else:
            inv = invoke(ctx, ctx.client, argv, label="ping", timeout=expected + ctx.timeout_s)
        base = {"count": params["count"], "interval_s": params["interval_s"]}
        base["family"] = params["family"] or family_of(ctx.server_addr)
        if inv.timed_out:
            return [
                self.record(
                    ok=False, error=describe_failure(inv, "ping"), raw_files=inv.raw_files, **base
                )
            ]
        try:
            metrics = parse_ping(inv.stdout)
        except MeasurementFailed as e:
            err = f"{e}; {describe_failure(inv, 'ping')}"
            return [self.record(ok=False, error=err, raw_files=inv.raw_files, **base)]
        ok = bool(metrics["received"])
        error = None if ok else f"no echo reply ({metrics['transmitted']} sent)"
        if params["adaptive"]:
            if stopped:
                _unresolved(metrics, params)
            rtts = [r["rtt_ms"] for r in metrics["rtts"]]
            info = ping_info(
                rtts, stopped, rule, interval_s=params["interval_s"], count=params["count"]
            )
            if metrics["transmitted"]:
                lost = metrics["transmitted"] - metrics["received"]
                info["loss"] = loss_decision(max(lost, 0), metrics["transmitted"], rule)[2]
            base.update(adaptive=info, **columns(info))
        return [self.record(ok=ok, error=error, raw_files=inv.raw_files, **{**base, **metrics})]
