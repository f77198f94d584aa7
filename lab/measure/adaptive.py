"""Adaptive test length (issue 17): lab.model.stoprule applied while an iperf3 or ping test runs,
and what its record keeps of it.

**iperf3 runs in segments bounded by -t.** Debian 12's iperf3 3.12 has no ``--json-stream``
(3.17 added it), ``-J`` prints nothing before the end, and a client stopped with SIGINT
reports no receiver totals (its ``end.sum_received`` is all zero: measured with 3.12). So an
adaptive tcp/udp test runs a first segment of ``adaptive_min_s`` + 5 s (room for MSER-5 to
drop a warm-up), applies the rule to its per-second intervals, and when the interval is still
too wide runs one more segment as long as the rule estimates it needs (the t interval's
current spread, plus the warm-up again, since each segment is a new connection), until the
rule is met or the plan's duration (the cap) is spent. (A tcp test now stops as it streams,
lab/measure/tcpstream.py; it runs segments only where the receiving node has no ss.) For udp
only: a new TCP
connection starts faster than a loss-bound stream runs, so a tcp test whose first segment is
not settled runs once more as one connection for the plan's full duration, which alone counts
(the fixed-length test; `fixed_after_s` in its record says how long the first try took). Each segment's JSON is complete, so the
record's figures are exact sums over segments (bytes, packets, losses; rates weighted by
their seconds), defined as a fixed run's are. The per-second rates the rule reads are the
receiver's: with -R the client's own intervals, else the server's, which an adaptive test
gets by running the server with -J and the client with --get-server-output (the sender's
rate of a UDP flow is its target, whatever arrives); udp adds the loss criterion on the
receiver's counts (lab.model.stoprule.loss_decision). A fixed-length test runs exactly as before.
A --bidir test (tcp/udp `bidir = true`) has two receivers and is refused with adaptive = true
(lab.measure.iperf3.check_bidir): it runs at its fixed length.

**ping streams.** Its reply lines are read as they arrive; when the RTT interval is met the
process gets SIGINT, on which iputils ping prints its usual statistics (parsed as always).
"""

from __future__ import annotations

import math
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from lab.core.node import Node
from lab.model.stoprule import Decision, Rule, evaluate, loss_decision, mser5
from lab.measure.base import Context, Invocation, Metric, collected
from lab.model.params import Param

#: the parameters every adaptive test takes (a plan's `adaptive = true` sets the first)
ADAPTIVE_SCHEMA: dict[str, Param] = {
    "adaptive": Param(
        bool,
        False,
        doc="stop when the interval of the mean is narrow enough (lab.model.stoprule); "
        "duration_s / count is then the cap",
    ),
    "adaptive_rel_pct": Param(
        float, 5.0, min=0.1, max=50, doc="target half-width of the 95 % interval, % of the mean"
    ),
    "adaptive_min_s": Param(
        float, 10.0, min=1, max=3600, doc="measured seconds before the rule may stop a test"
    ),
}

#: results.csv columns of an adaptive record (empty for a fixed-length one)
ADAPTIVE_METRICS = (
    Metric("stop_reason", "string", description="why an adaptive test stopped: ci or cap"),
    Metric("measured_s", unit="s", description="seconds an adaptive test measured"),
    Metric(
        "ci_rel_pct",
        unit="%",
        description="half-width of the 95 % interval reached, % of the mean",
        summarised=False,
    ),
)

#: first segment beyond adaptive_min_s: room for MSER-5 to drop one batch of 5 s
FIRST_EXTRA_S = 5.0
MAX_SEGMENTS = 20


def rule_of(params: Mapping[str, Any], *, loss_abs: float | None = 0.001) -> Rule:
    return Rule(
        rel_half_width=params["adaptive_rel_pct"] / 100,
        min_s=params["adaptive_min_s"],
        loss_abs=loss_abs,
    )


def columns(info: dict) -> dict[str, Any]:
    """The results.csv cells of an adaptive record's `adaptive` block."""
    rel = (info.get("interval") or {}).get("rel")
    return {
        "stop_reason": info["reason"],
        "measured_s": info["measured_s"],
        "ci_rel_pct": None if rel is None else 100 * rel,
    }


def _seconds(part: dict) -> float:
    return sum(iv["end"] - iv["start"] for iv in part["intervals"] if not iv["omitted"])


def receiver_rates(part: dict) -> list[float]:
    """The receiver's per-second rates of a segment: the server's (--get-server-output) when
    the client sent, the client's own with -R."""
    ivs = part["intervals"]
    if part.get("direction") != "server-to-client" and part.get("server_intervals"):
        ivs = part["server_intervals"]
    return [iv["bps"] for iv in ivs if not iv["omitted"]]


def combine(parts: list[dict]) -> dict:
    """One record's metrics from the parsed segments: counts summed, rates weighted by the
    seconds each segment measured, intervals concatenated with their segment number."""
    out = dict(parts[0])
    secs = [_seconds(p) for p in parts]
    total = sum(secs) or 1.0

    def weighted(key: str, weights: list[float], tot: float) -> float | None:
        vals = [p.get(key) for p in parts]
        if any(v is None for v in vals):
            return None
        return sum(v * w for v, w in zip(vals, weights, strict=True)) / (tot or 1.0)

    for key in ("sender_bps", "receiver_bps", "cpu_client_pct", "cpu_server_pct"):
        out[key] = weighted(key, secs, total)
    for key in ("sender_bytes", "receiver_bytes", "retransmits", "out_of_order"):
        if key in out:
            vals = [p.get(key) for p in parts]
            out[key] = None if any(v is None for v in vals) else sum(vals)
    if "packets_sent" in out:
        sent = sum(p["packets_sent"] for p in parts)
        lost = sum(p["packets_lost"] for p in parts)
        got = [p["packets_received"] for p in parts]
        out.update(packets_sent=sent, packets_lost=lost, packets_received=sum(got))
        out["loss_pct"] = 100.0 * lost / sent if sent else None
        out["jitter_ms"] = weighted("jitter_ms", [float(g) for g in got], float(sum(got)))
        for key, n in (("sent_pps", sent), ("received_pps", sum(got))):
            out[key] = n / total if all(p.get(key) for p in parts) else None
    out["duration_s"] = sum(p.get("duration_s") or 0 for p in parts)
    if "per_stream" in out:  # each segment's own connections
        out["per_stream"] = [
            {**s, "segment": k} for k, p in enumerate(parts) for s in p.get("per_stream") or []
        ]
    for key in ("intervals", "server_intervals"):
        ivs, offset = [], 0.0
        for k, p in enumerate(parts):
            for iv in p.get(key) or []:
                ivs.append(
                    {**iv, "start": iv["start"] + offset, "end": iv["end"] + offset, "segment": k}
                )
            offset = ivs[-1]["end"] if ivs else offset
        if key in out:
            out[key] = ivs
    return out


def run_segments(
    run_one: Callable[[float], dict],
    rule: Rule,
    *,
    cap_s: float,
    omit_s: float = 0.0,
    udp: bool = False,
) -> tuple[dict, dict]:
    """Run iperf3 segments (run_one(seconds) -> parsed metrics; MeasurementFailed propagates)
    until the rule is met or `cap_s` seconds of -t are spent. Returns (metrics, adaptive)."""
    parts: list[dict] = []
    kept: list[float] = []
    drop: int | None = None
    elapsed = 0.0
    seg = min(cap_s, rule.min_s + (0.0 if omit_s else FIRST_EXTRA_S))
    flat = replace(rule, warmup_s=0.0)
    loss: dict | None = None
    while True:
        part = run_one(seg)
        parts.append(part)
        elapsed += seg
        samples = receiver_rates(part)
        if drop is None:  # iperf3's -O dropped the warm-up already, else MSER-5 picks it
            drop = 0 if omit_s else mser5(samples)
        kept += samples[drop:]
        d = evaluate(kept, flat, elapsed_s=elapsed, cap_s=cap_s)
        more = d.more_s
        loss_met = True
        if udp:
            sent = sum(p["packets_sent"] for p in parts)
            lost = sum(p["packets_lost"] for p in parts)
            loss_met, need, loss = loss_decision(lost, sent, rule)
            if not loss_met:
                pps = sent / sum(_seconds(p) for p in parts) if sent else 0.0
                more = max(more, need / pps if pps else cap_s)
        done = (d.stop and (loss_met or d.reason == "cap")) or len(parts) >= MAX_SEGMENTS
        if not done and cap_s - elapsed < 1:
            d = replace(d, stop=True, reason="cap")
            done = True
        if done:
            reason = "ci" if d.reason == "ci" and loss_met else "cap"
            break
        if not udp:
            # TCP: every further segment is a new connection, which starts above a loss- or
            # delay-bound rate (slow start); their sum is biased high (bench/adaptive.py:
            # WireGuard at 40 ms and 0.5 % loss, 3.3 against a fixed run's 2.7 Mbit/s). So a
            # stream the first segment did not settle runs once more as one connection for
            # the full fixed length, and only that run counts: exactly the fixed-length test.
            wasted = elapsed
            full = run_one(cap_s)
            d = evaluate(receiver_rates(full)[drop:], flat, elapsed_s=cap_s, cap_s=cap_s)
            info = adaptive_block("cap", d, rule, measured_s=cap_s, cap_s=cap_s, unit="bit/s")
            info.update(segments=1, fixed_after_s=wasted, warmup_s_per_segment=drop)
            return combine([full]), info
        seg = min(cap_s - elapsed, max(math.ceil(more), 2) + drop)
    info = adaptive_block(reason, d, rule, measured_s=elapsed, cap_s=cap_s, unit="bit/s")
    info.update(segments=len(parts), warmup_s_per_segment=drop if not omit_s else omit_s)
    if loss is not None:
        info["loss"] = loss
    return combine(parts), info


def adaptive_block(reason: str, d: Decision, rule: Rule, *, measured_s, cap_s, unit: str) -> dict:
    """A record's `adaptive` block: why it stopped, what it measured, the interval, the rule."""
    return {
        "reason": reason,
        "measured_s": measured_s,
        "cap_s": cap_s,
        "batches": d.batches,
        "warmup_samples": d.warmup_samples,
        "interval": {**d.interval.to_json(), "unit": unit} if d.interval else None,
        "rule": {
            "rel_half_width": rule.rel_half_width,
            "confidence": rule.confidence,
            "min_s": rule.min_s,
            "batch_s": rule.batch_s,
            "warmup": "mser5" if rule.warmup_s is None else rule.warmup_s,
        },
    }


def ping_info(rtts: list[float], stopped: bool, rule: Rule, *, interval_s: float, count: int):
    """The adaptive block of a ping record from its RTT series."""
    cap_s = count * interval_s
    d = evaluate(rtts, rule, sample_s=interval_s, cap_s=cap_s)
    reason = "ci" if stopped and d.reason == "ci" else "cap"
    return adaptive_block(
        reason, d, rule, measured_s=len(rtts) * interval_s, cap_s=cap_s, unit="ms"
    )


def watch(
    ctx: Context,
    node: Node,
    argv: list[str],
    *,
    label: str,
    timeout: float,
    enough: Callable[[str], bool],
    poll_s: float = 0.1,
) -> tuple[Invocation, bool]:
    """Run argv like base.invoke, reading its stdout as it streams; SIGINT it once
    `enough(text so far)` says so. Returns (the invocation, whether it was stopped)."""
    out_path = ctx.next_raw(label)
    err_path = out_path.with_suffix(out_path.suffix + ".stderr")
    stopped = timed_out = False
    t0 = time.monotonic()
    with open(out_path, "w") as out, open(err_path, "w") as err:
        p = node.popen(argv, stdout=out, stderr=err)
        try:
            while p.poll() is None:
                if time.monotonic() - t0 > timeout:
                    timed_out = True
                    p.kill()
                    break
                if not stopped and enough(out_path.read_text(errors="replace")):
                    stopped = True
                    p.send_signal(signal.SIGINT)  # ping prints its statistics and exits
                    try:
                        p.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        timed_out = True
                        p.kill()
                    break
                time.sleep(poll_s)
        finally:
            if p.poll() is None:
                p.kill()
            p.wait()
    inv = collected(argv, p.returncode, out_path, err_path, timed_out, time.monotonic() - t0)
    return inv, stopped
