"""handshake: the tunnel's cold establishment time and, on request, what a forced rekey costs a
running TCP flow.

Cold (`cold = true`, each repetition one): the lab's tunnel is stopped on both ends and started
again (the runner's Context.tunnel: lab.vpn.control.TunnelControl); the time is from the
driver's start() -- daemons launched, configs already written -- to the first ping reply
through the tunnel, pinged every `probe_ms`. Nothing within `timeout_s` is a result, not an
error: handshake_status "failed after N s", handshake_completed 0, the reason in `error`; the
tunnel is then brought up again the ordinary way for the cases that follow.

A cold establishment starts from a quiet path: first the test waits, at most `quiet_timeout_s`,
until no TCP connection of an earlier test can still send through the tunnel (on either end or
the traffic endpoints) and the impairment's queues hold nothing (Tunnel.quiesce,
lab.vpn.control.wait_quiet). Without that, iperf3's control connection of a loaded test on a
long lossy path, still closing when the tunnel stopped, is retransmitted into the new tunnel:
the server then starts a handshake of its own across the client's, WireGuard refuses both
responses and both ends retry after REKEY_TIMEOUT (5 s), so a 1.2 s establishment measured 6.4,
11.6 or 17 s. How long it waited and for what: quiet_wait_s, quiet_waited_for, quiet_status
("not quiet after N s: ..." when the bound came first; the establishment is measured anyway).

Rekey (`rekey = true`): an iperf3 TCP flow of `duration_s` with `interval_s` intervals (the
receiver's, from its own JSON via --get-server-output); at its midpoint the driver renews the
keys (Driver.trigger_rekey: strongSwan `swanctl --rekey --child`, OpenVPN SIGUSR1) and waits for
its evidence (new CHILD_SA SPIs, a new TLS session in the log). rekey_effect() then reads the
interval series: the median before the trigger, the dip (the lowest interval right after it
against that median), the retransmits meanwhile and the recovery time (to the first interval
back within 10 % of the median). A rekey whose new keys never come (the driver's StartupError:
none within `timeout_s`, or its daemon gone) is a result too: rekey_status "failed after N s",
the reason in `error`, the tunnel then started again. A profile that cannot be rekeyed on
demand (WireGuard, static keys) is refused when the plan loads (Test.needs ->
lab.campaign.load), before anything is built.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol

from lab.core.errors import ConfigError, LabError, StartupError
from lab.core.tools import SS
from lab.measure.base import (
    Context,
    MeasurementFailed,
    Metric,
    Primary,
    Record,
    Test,
)
from lab.measure.iperf3 import (
    DEFAULT_PORT,
    IPERF3,
    client_call,
    flow_start,
    iperf3_server,
    run_client,
)
from lab.measure.iperf3json import parse_iperf3_tcp
from lab.model.params import Param

#: an interval within this share of the median before the rekey counts as recovered
RECOVERED_WITHIN = 0.10
#: the dip is looked for in the intervals that overlap the trigger .. the new keys + this (s):
#: data in flight and the receiver's view lag the trigger
DIP_MARGIN_S = 1.0


class Tunnel(Protocol):
    """What the test asks of Context.tunnel (lab.vpn.control.TunnelControl)."""

    name: str

    def quiesce(self, *, timeout: float) -> Any:
        """Wait until the path is quiet; .quiet, .waited_s, .waited_for, .still."""

    def establish(self, *, cap_s: float, probe_s: float) -> Any:
        """Stop and start the tunnel; .ok, .ms, .failed_after_s, .error."""

    def rekey(self, *, timeout: float) -> dict:
        """Renew the keys now; the daemon's evidence {"how", "before", "after", "seconds"}."""


# --------------------------------------------------------------------- the pure part


def rekey_effect(
    intervals: Sequence[Mapping[str, Any]],
    trigger_s: float,
    *,
    keys_s: float = 0.0,
    retransmits: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """What a rekey at `trigger_s` (seconds into the flow, the intervals' clock) did to the
    interval series `intervals` ({"start", "end", "bps"}, in order; omitted ones are skipped):

    before_bps    median of the intervals that ended by the trigger
    min_bps       the lowest interval overlapping trigger .. trigger + keys_s + DIP_MARGIN_S
    dip_pct       100 x (1 - min_bps / before_bps), 0 when higher
    recovery_s    from the trigger to the start of the first interval after the lowest one that
                  is within RECOVERED_WITHIN of before_bps; 0 when the lowest already is; None
                  when the flow never got back
    retransmits   the sender's retransmits (`retransmits`: its intervals with "retransmits")
                  in the intervals overlapping trigger .. recovery (or the flow's end)
    noise_pct     the same dip measure over the intervals before the trigger: how deep the
                  flow dips without a rekey
    MeasurementFailed when no whole interval precedes the trigger or none follows it.
    """
    ivs = [iv for iv in intervals if not iv.get("omitted")]
    before = [float(iv["bps"]) for iv in ivs if iv["end"] <= trigger_s]
    after = [iv for iv in ivs if iv["end"] > trigger_s]
    if not before or not after:
        where = "before" if not before else "after"
        raise MeasurementFailed(
            f"no interval {where} the rekey at {trigger_s:.2f} s of the flow: a longer "
            "duration_s or a shorter interval_s"
        )
    base = statistics.median(before)
    floor = (1 - RECOVERED_WITHIN) * base
    horizon = trigger_s + keys_s + DIP_MARGIN_S
    window = [iv for iv in after if iv["start"] < horizon] or after[:1]
    lowest = min(window, key=lambda iv: iv["bps"])
    low = float(lowest["bps"])
    if low >= floor:
        recovered_at: float | None = trigger_s
    else:
        later = [iv for iv in after if iv["start"] >= lowest["end"] and iv["bps"] >= floor]
        recovered_at = later[0]["start"] if later else None
    end = recovered_at if recovered_at is not None else after[-1]["end"]
    lost = [
        iv.get("retransmits")
        for iv in retransmits
        if iv["end"] > trigger_s and iv["start"] < max(end, lowest["end"])
    ]

    def dip(x: float) -> float:
        return max(0.0, 100.0 * (1 - x / base)) if base > 0 else 0.0

    return {
        "before_bps": base,
        "min_bps": low,
        "dip_pct": dip(low),
        "recovery_s": None if recovered_at is None else max(0.0, recovered_at - trigger_s),
        "retransmits": sum(x for x in lost if x is not None)
        if any(x is not None for x in lost)
        else None,
        "noise_pct": dip(min(before)),
    }


def quiet_fields(q: Any) -> dict[str, Any]:
    """The record's fields of a wait for a quiet path (lab.vpn.control.Quiet)."""
    status = "quiet" if q.quiet else f"not quiet after {q.waited_s:.1f} s: " + "; ".join(q.still)
    return {
        "quiet_wait_s": q.waited_s,
        "quiet_status": status,
        "quiet_waited_for": "; ".join(q.waited_for),
    }


def with_interval(argv: list[str], interval_s: float) -> list[str]:
    """iperf3 client argv with its report interval (-i) set to `interval_s`."""
    out = list(argv)
    i = out.index("-i")
    out[i + 1] = f"{interval_s:g}"
    return out


# --------------------------------------------------------------------- the test


class HandshakeTest(Test):
    name = "handshake"
    nic_side_path = "all"  # the boards' NICs on their side path (docs/cpu.md)
    client_tools = ("iperf3",)
    server_tools = ("iperf3", "ss")
    requires = (IPERF3, SS)
    schema: ClassVar[dict[str, Param]] = {
        "cold": Param(
            bool, True, doc="stop the tunnel on both ends and time its start to the first byte"
        ),
        "timeout_s": Param(
            float,
            30.0,
            min=1,
            max=600,
            doc="cap on one establishment (and on a rekey's new keys): past it, 'failed after N s'",
        ),
        "quiet_timeout_s": Param(
            float,
            20.0,
            min=0,
            max=600,
            doc="before a cold establishment, wait at most this long for the path to go quiet "
            "(no earlier test's TCP connection left to close, nothing held in the impairment's "
            "queues); 0: do not wait",
        ),
        "probe_ms": Param(
            float, 5.0, min=1, max=1000, doc="ping interval while waiting for the first reply"
        ),
        "rekey": Param(
            bool,
            False,
            doc="force a rekey at the midpoint of a TCP flow (profiles that can: lab profiles)",
        ),
        "unsupported": Param(
            str,
            "refuse",
            choices=("refuse", "not-applicable"),
            doc="a profile that cannot be rekeyed on demand: refuse the plan when it loads, or "
            "run its cold part and record the rekey as not applicable (one plan, every profile)",
        ),
        "duration_s": Param(float, 10.0, min=2, max=3600, doc="the rekey's TCP flow, iperf3 -t"),
        "interval_s": Param(
            float, 0.5, min=0.1, max=60, doc="the flow's report interval, iperf3 -i"
        ),
        "port": Param(int, DEFAULT_PORT, min=1, max=65535),
    }
    metrics = (
        Metric(
            "handshake_ms",
            unit="ms",
            description="cold establishment: the driver's start (daemons launched) to the first "
            "ping reply through the tunnel",
        ),
        Metric(
            "handshake_completed",
            unit="",
            description="1 when the cold establishment got a reply within timeout_s, else 0 "
            "(its mean: the share that completed)",
        ),
        Metric(
            "handshake_status",
            "string",
            description="established, or 'failed after N s' (the reason in error)",
        ),
        Metric(
            "quiet_wait_s",
            unit="s",
            description="before the cold establishment: how long the path took to go quiet "
            "(an earlier test's connections closed, the impairment's queues drained)",
        ),
        Metric(
            "quiet_status",
            "string",
            description="quiet, or 'not quiet after N s' (then what was still busy); "
            "quiet_waited_for: what was waited for",
        ),
        Metric(
            "key_exchange_ms",
            unit="ms",
            description="a key exchange of the profile's own beside the handshake (Rosenpass's "
            "post-quantum one): its daemons started to its key installed on both ends, within "
            "handshake_ms",
        ),
        Metric(
            "key_exchange_bytes",
            unit="B",
            description="what both ends' underlay interfaces sent during key_exchange_ms (kernel "
            "counters: the exchange's frames with headers and retransmissions)",
        ),
        Metric(
            "key_exchange_packets",
            unit="packets",
            description="the frames those bytes were in",
        ),
        Metric(
            "rekey_before_bps",
            unit="bit/s",
            description="median interval throughput of the flow before the rekey",
        ),
        Metric(
            "rekey_min_bps",
            unit="bit/s",
            description="lowest interval throughput right after the rekey",
        ),
        Metric(
            "rekey_dip_pct",
            unit="%",
            description="100 x (1 - rekey_min_bps / rekey_before_bps)",
        ),
        Metric(
            "rekey_noise_pct",
            unit="%",
            description="the same dip measure over the intervals before the rekey (no rekey)",
        ),
        Metric(
            "rekey_recovery_s",
            unit="s",
            description="rekey to the first interval back within 10 % of rekey_before_bps",
        ),
        Metric(
            "rekey_status",
            "string",
            description="recovered, not recovered (the flow ended below the median), or "
            "'failed after N s' (no new keys within timeout_s: a result, the reason in error)",
        ),
        Metric(
            "rekey_retransmits",
            unit="segments",
            description="TCP retransmits of the sender from the rekey to the recovery",
        ),
        Metric(
            "rekey_keys_s",
            unit="s",
            description="rekey command to the daemon showing the new keys",
        ),
        Metric(
            "rekey_evidence",
            "string",
            description="how the rekey was forced and the daemon's old -> new keys",
        ),
        Metric("retransmits", unit="segments", description="TCP retransmits of the sender"),
    )
    primary = Primary("handshake_ms", "ms", 1.0, False)
    #: the rekey-only entry's (cold = false), which measures no handshake_ms
    rekey_primary = Primary("rekey_recovery_s", "s", 1.0, False)
    plots = ("establishment", "rekey")

    def primary_for(self, params: Mapping[str, Any]) -> Primary | None:
        return self.primary if params.get("cold", True) else self.rekey_primary

    def validate(self, params: Mapping[str, Any] | None, *, source: str) -> dict[str, Any]:
        out = super().validate(params, source=source)
        if not out["cold"] and not out["rekey"]:
            raise ConfigError(
                "test 'handshake' with cold = false and rekey = false measures nothing; "
                "accepted: cold = true, rekey = true or both",
                source=source,
                field="cold",
            )
        return out

    def needs(self, params: Mapping[str, Any]) -> tuple[str, ...]:
        return ("rekey",) if params["rekey"] and params["unsupported"] == "refuse" else ()

    def estimate_s(self, params: Mapping[str, Any]) -> float:
        cold = 3.0 if params["cold"] else 0.0
        return cold + (params["duration_s"] + 2.0 if params["rekey"] else 0.0)

    def run(self, ctx: Context, params: Mapping[str, Any]) -> list[Record]:
        if ctx.tunnel is None:
            return [self.record(ok=False, error="no tunnel control: the runner gave none")]
        out: dict[str, Any] = {}
        files: list[Path] = []
        if params["cold"]:
            if params["quiet_timeout_s"] > 0:
                out.update(quiet_fields(ctx.tunnel.quiesce(timeout=params["quiet_timeout_s"])))
            est = ctx.tunnel.establish(cap_s=params["timeout_s"], probe_s=params["probe_ms"] / 1e3)
            if est.ok:
                out.update(
                    handshake_ms=est.ms, handshake_completed=1, handshake_status="established"
                )
                if est.exchange:  # Driver.key_exchange: the profile's own, e.g. Rosenpass's
                    out.update(
                        key_exchange_ms=est.exchange["ms"],
                        key_exchange_bytes=est.exchange["bytes"],
                        key_exchange_packets=est.exchange["packets"],
                        key_exchange=est.exchange["what"],
                    )
            else:
                status = f"failed after {est.failed_after_s:.1f} s"
                out.update(handshake_completed=0, handshake_status=status)
                why = f"{status}: {est.error}"
                if est.not_restored:  # the runner builds the lab again before the next case
                    why += f"; the tunnel could not be brought up again: {est.not_restored}"
                # a result, not a failed case: the reason goes with it
                return [self.record(error=why, **out)]
        if params["rekey"]:
            support = ctx.tunnel.rekey_support()
            if not support.ok:  # unsupported = "not-applicable": the plan let it through
                why = f"no rekey on demand: {support.how}"
                return [
                    self.not_applicable(why, raw_files=files, rekey_status="not applicable", **out)
                ]
            try:
                out.update(self._rekey(ctx, params, files))
            except (MeasurementFailed, LabError) as e:
                return [self.record(ok=False, error=str(e), raw_files=files, **out)]
        return [self.record(raw_files=files, **out)]

    # ------------------------------------------------------------------ rekey under a flow
    def _rekey(self, ctx: Context, params: Mapping[str, Any], files: list[Path]) -> dict:
        port, duration = params["port"], params["duration_s"]
        call = client_call(ctx.server_addr, port, duration=duration, server_output=True)
        call = replace(call, argv=with_interval(call.argv, params["interval_s"]))
        got: dict[str, Any] = {}

        def client() -> None:
            try:
                got["text"] = run_client(
                    ctx,
                    call,
                    label="iperf3-tcp-rekey",
                    files=files,
                    expected_s=duration,
                )
            except MeasurementFailed as e:
                got["error"] = e

        trigger_error: LabError | None = None
        never: StartupError | None = None  # no new keys within timeout_s, or the daemon gone
        never_after_s = 0.0
        with iperf3_server(ctx, port, json=True, interval_s=params["interval_s"]) as log:
            files.append(log)
            flow = threading.Thread(target=client, name="handshake-iperf3", daemon=True)
            flow.start()
            t0 = flow_start(ctx, port, until=time.monotonic() + ctx.timeout_s)
            time.sleep(max(0.0, t0 + duration / 2 - time.monotonic()))
            t_trigger = time.monotonic()
            try:
                evidence = ctx.tunnel.rekey(timeout=params["timeout_s"])
            except StartupError as e:
                never, never_after_s, evidence = e, time.monotonic() - t_trigger, {}
            except LabError as e:
                trigger_error, evidence = e, {}
            flow.join(duration + ctx.timeout_s + 5)
        if trigger_error is not None:
            raise trigger_error
        if never is not None:
            return self._rekey_failed(ctx, params, never, never_after_s, got, t_trigger - t0)
        if "error" in got:
            raise got["error"]
        if "text" not in got:
            raise MeasurementFailed("iperf3 did not finish")
        fx = flow_effect(got["text"], t_trigger - t0, float(evidence.get("seconds") or 0.0))
        return {
            **fx,
            "rekey_status": "recovered" if fx["rekey_recovery_s"] is not None else "not recovered",
            "rekey_keys_s": evidence.get("seconds"),
            "rekey_evidence": f"{evidence.get('how')}: {evidence.get('before')} -> "
            f"{evidence.get('after')}",
        }

    def _rekey_failed(
        self, ctx: Context, params: Mapping[str, Any], e: StartupError, after_s: float,
        got: dict, at_s: float,
    ) -> dict:  # fmt: skip
        """A rekey that never completed is a result, as a cold establishment that never does
        (docs/measurements.md "Handshake and rekey"): rekey_status "failed after N s" (N from
        the trigger), the reason in `error`, the flow's figures where it ran to its end. The
        tunnel is then started again (Tunnel.establish) for the cases that follow; when even
        that fails, the lab's record stays "starting" and the runner builds the lab again."""
        status = f"failed after {after_s:.1f} s"
        out: dict[str, Any] = {"rekey_status": status, "rekey_at_s": round(at_s, 3)}
        if "text" in got:
            try:
                out.update(flow_effect(got["text"], at_s, after_s))
            except MeasurementFailed:  # the flow says nothing about the rekey: status alone
                pass
        out["rekey_status"] = status
        why = f"rekey {status}: {(str(e).strip().splitlines() or ['no reason given'])[0]}"
        est = ctx.tunnel.establish(cap_s=params["timeout_s"], probe_s=params["probe_ms"] / 1e3)
        if est.not_restored:
            why += f"; the tunnel could not be brought up again: {est.not_restored}"
        else:
            why += "; the tunnel was started again for the cases that follow"
        return {**out, "error": why}


def flow_effect(text: str, at_s: float, keys_s: float) -> dict[str, Any]:
    """The rekey flow's figures: iperf3's JSON `text` parsed and read by rekey_effect() for a
    rekey `at_s` into the flow whose new keys came `keys_s` later."""
    m = parse_iperf3_tcp(text)
    series = m.get("server_intervals") or m["intervals"]
    fx = rekey_effect(series, at_s, keys_s=keys_s, retransmits=m["intervals"])
    return {
        "rekey_before_bps": fx["before_bps"],
        "rekey_min_bps": fx["min_bps"],
        "rekey_dip_pct": fx["dip_pct"],
        "rekey_noise_pct": fx["noise_pct"],
        "rekey_recovery_s": fx["recovery_s"],
        "rekey_retransmits": fx["retransmits"],
        "rekey_at_s": round(at_s, 3),
        "retransmits": m["retransmits"],
        "intervals": series,
        "sender_intervals": m["intervals"],
    }
