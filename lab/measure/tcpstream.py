"""An adaptive TCP test that stops as it streams (issue 33 item 5): one iperf3 connection, the
stop rule (lab.model.stoprule) applied each second to the receiver's bytes while it runs, and
SIGINT to the client once the rule holds.

**Why this source.** iperf3 3.12 (Debian 12; the boards' Debian 11 has 3.9) prints its ``-J``
document only when a test ends; ``--json-stream`` (one JSON object per interval) came with 3.17,
which no Debian package this lab installs from ships, and no other source is reachable from
the machines the project runs on. iperf3's text output streams, but rounds every figure to
three digits. ``ss -tinH`` on the receiving node gives the kernel's exact
``bytes_received`` (tcp_info, Linux >= 4.1) of each of the test's sockets, with any iperf3,
on a namespace and over a board's agent alike (``ss`` is already one of the tcp test's
tools). So the *decision* reads ``ss`` once a second; the *figures* still come from iperf3's
JSON: a client stopped with SIGINT prints its document (its own per-second intervals, an
``error`` of "interrupt - the client has terminated", and no receiver totals), and the
server, told by the client that it terminated, prints its own (its per-second intervals and
sums, with 3.12's last interval listed twice). The record's rates are the receiver's and
sender's complete per-second intervals after the warm-up MSER-5 picks on them (as -O would
drop it) summed, bytes over seconds: a fixed run's end totals are bytes over seconds too, and
its own start weighs 1/300 of the study's 300 s, where it would weigh 1/15 of a 15-s stop.

**Whole congestion cycles.** A loss-based sender (cubic, the boards' default, or reno) moves
in a sawtooth: its window grows until a loss, is cut, grows again; its long-run rate is the
mean over whole cycles (Mathis, Semke, Mahdavi & Ott, CCR 27(3), 1997; Padhye et al., SIGCOMM
1998), and at a long round trip one cycle lasts many seconds (cubic's time back to the window
of the last loss, K = cbrt(W x 0.3 / 0.4) s for a window of W segments: ~8 s at 600). Per-second
rates inside one cycle are correlated beyond any 2-s batch, so an interval over a part of a
cycle looks narrow and says little (the openvpn case at 60 ms each way stopped at 15 s, 30 %
above a 60-s run: its window was still opening). So the sender's socket is read too (``ss``
on the sending node: congestion control, cwnd, ssthresh), and a stop also needs the kept
seconds to hold MIN_EPOCHS congestion events (ssthresh set anew), or none while the receive
window or the send buffer limited the sender (tcp_info's rwnd_limited + sndbuf_limited at
least LIMITED_SHARE of its busy time over the kept seconds: cubic opens an unused window too,
and the baseline at 80 ms, flat at 189 Mbit/s from its third second, waited 45 s for its
window to stop growing). A window growing or steady while the flow is not so limited still
holds it: a queue filling at the bottleneck, rate flat until the loss, or cubic's own plateau
(its window stays within a few % of the last loss's for seconds around K: WireGuard at 40 ms
each way stopped there 20 s in, 13 % above its 300-s run, s16). A window that did not grow
settles alone only where it cannot be that plateau (Cycles.past_plateau: no loss in the run,
2 K after the last, not cubic) or where ss prints no such limits (older iproute2).
Where the kept seconds hold events, the interval over whole cycles (the regenerative
method, lab.model.stoprule.regenerative_interval, at least MIN_CYCLES cycles counted from the
run's second event) must hold the target too, and the kept seconds then start at the first
whole cycle: 2-s batches inside one long ramp agree and say little about the next cycle.
BBR does not cycle on losses and is not held; without a sender reading the rule decides alone
(the record says which). And a stop comes at a cycle's end (the reading that saw an event or
the next, CYCLE_END_S): the seconds after the last event are the start of a cycle, its lowest
rates where the window was cut, or a window still opening (the ipsec case at 20 ms stopped
6 s into a cycle, its rate climbing, 7 % above a 60-s run; openvpn at 60 ms 6 s after a cut,
its rate at the bottom, 12 % below its 60-s run's interval).

**Retransmission timeouts.** A timeout stalls a stream for a fraction of a second or more
(RFC 6298: at least 200 ms here, doubled per backoff); where they are few, a window that holds
one or two of them does not know how often they come. The sender's namespace counts them
(TcpExt TCPTimeouts in /proc/net/netstat, per network namespace), read each second with the
socket; a stop waits while the seconds with a timeout in the kept window cost the mean more than
their count can pin down: the deficit of those seconds (and the one before each) below the kept
median, as a share f of the kept bytes, counted k times, is known to about z x f / sqrt(k)
(a Poisson count's relative error 1 / sqrt(k)), and that must be within the rule's half-width.
No timeout in the kept window holds nothing: a rate of rare events the window never saw cannot
be judged from it (the record says how many there were).

**The record is the rule's seconds.** After a stop the figures are iperf3's whole seconds from
the first one the live rule kept (its warm-up, mapped to iperf3's clock by the first live
reading's offset from the client's start), not a warm-up MSER-5 picks again on iperf3's own
rates: the two picks differed (0 against 10 s for wireguard at 40 ms) and the record then
showed a mean and an interval (+-5.4 %) the rule had not judged.

A test the rule does not settle runs to the cap as one connection and is parsed as ever.
Where ``ss`` is missing on the receiving node, lab.measure.adaptive.run_segments runs instead
(its record says `mechanism`: "segments").
"""

from __future__ import annotations

import bisect
import json
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from lab.core.errors import LabError
from lab.core.node import Node
from lab.measure.adaptive import adaptive_block, receiver_rates
from lab.measure.base import Context, MeasurementFailed, collected, describe_failure
from lab.measure.iperf3 import ClientCall
from lab.measure.iperf3json import common_fields, parse_iperf3_tcp
from lab.measure.tcpsender import (
    Cycles,
    Timeouts,
    sender_argv,
    sender_state,
    tcp_timeouts,
    timeouts_settled,
)
from lab.model.stoprule import Decision, Rule, evaluate

#: seconds between two ss samples: iperf3's -i 1, so one live rate per reported interval
SAMPLE_S = 1.0
#: how long the server may take to print its document after the client stopped
SERVER_REPORT_S = 10.0
#: the error iperf3's client puts in its document when it is stopped with SIGINT
CLIENT_INTERRUPTED = "interrupt - the client has terminated"

_BYTES_RECEIVED = re.compile(r"\bbytes_received:(\d+)")

T = TypeVar("T")


def ss_argv(port: int, *, local: bool) -> list[str]:
    """ss listing the established TCP sockets of the test on one node, with tcp_info, no
    header: `local` (the server's end, sport = port) or the client's end (dport = port)."""
    side = "sport" if local else "dport"
    return ["ss", "-tinH", "state", "established", side, "=", f":{port}"]


def bytes_received(ss_text: str) -> int | None:
    """The sum of `bytes_received` over the sockets ss listed (the control connection's few
    hundred bytes stay constant after the start), None when no socket reported any."""
    found = [int(m) for m in _BYTES_RECEIVED.findall(ss_text)]
    return sum(found) if found else None


def socket_reader(node: Node, argv: list[str], parse: Callable[[str], T]) -> Callable[[], T]:
    """A reading of a test's TCP socket on `node`, to call once a second: `argv` (ss_argv, or
    tcpsender.sender_argv around it) run there and its output parsed (bytes_received,
    sender_state, ...). A reading that cannot be taken (the command cannot run on the node, a
    lost session, a time-out, or it exits non-zero) parses as no output, `parse("")`: None for
    bytes_received, "" for the text itself, so the caller falls back as it does without ss."""

    def read() -> T:
        try:
            cp = node.run(argv, check=False, timeout=10)
        except LabError:
            return parse("")
        return parse(cp.stdout if cp.returncode == 0 else "")

    return read


@dataclass
class LiveSeries:
    """The receiver's per-second rates (bit/s) from cumulative byte counts sampled while the
    test runs: rate = delta bytes x 8 / delta t. Samples before the first count, and those in
    iperf3's omit (-O) seconds (an interval starting in them), make no rate."""

    omit_s: float = 0.0
    rates: list[float] = field(default_factory=list)
    #: when each rate's second began (the same clock as add's t)
    starts: list[float] = field(default_factory=list)
    _t0: float | None = None
    _last: tuple[float, int] | None = None

    def add(self, t: float, total: int | None) -> None:
        if total is None:
            return
        if self._t0 is None:
            self._t0 = t
        if self._last is not None:
            t1, b1 = self._last
            if t > t1 and t1 - self._t0 >= self.omit_s:
                self.rates.append((total - b1) * 8 / (t - t1))
                self.starts.append(t1)
        self._last = (t, total)

    @property
    def seconds(self) -> float:
        return len(self.rates) * SAMPLE_S

    def index(self, t: float) -> int:
        """The rate whose second ended at (or held) the reading time t (-1 before the first)."""
        return bisect.bisect_left(self.starts, t) - 1


def live_decision(series: LiveSeries, rule: Rule, cap_s: float) -> Decision:
    """The rule over the live rates (MSER-5 picks the warm-up, as for every adaptive test)."""
    return evaluate(series.rates, rule, elapsed_s=series.seconds, cap_s=cap_s)


# ---------------------------------------------------------------- the documents after a stop


def split_documents(text: str) -> list[dict[str, Any]]:
    """The JSON documents of a log holding one or more, one after another (an iperf3 -s -J
    prints one per test); trailing text that is not (yet) a whole document is ignored."""
    dec = json.JSONDecoder()
    docs, i = [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return docs
        try:
            doc, i = dec.raw_decode(text, i)
        except ValueError:
            return docs
        if isinstance(doc, dict):
            docs.append(doc)


def _full_intervals(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """A document's `intervals[].sum` once each (3.12's server repeats its last one when the
    client terminates), without a trailing part-second the stop cut short."""
    seen, out = set(), []
    for iv in doc.get("intervals", []):
        s = iv.get("sum") or {}
        key = (s.get("start"), s.get("end"))
        if None in key or key in seen:
            continue
        seen.add(key)
        out.append(s)
    if out and (out[-1]["end"] - out[-1]["start"]) < 0.9 * SAMPLE_S:
        out.pop()
    return out


def _rate(ivs: list[dict[str, Any]]) -> tuple[float | None, int, float]:
    """(bit/s, bytes, seconds) over the intervals iperf3 did not omit."""
    kept = [s for s in ivs if not s.get("omitted")]
    secs = sum(s["end"] - s["start"] for s in kept)
    nbytes = sum(s["bytes"] for s in kept)
    return (nbytes * 8 / secs if secs else None), nbytes, secs


def _rows(ivs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Whole intervals as the record's `intervals` rows (lab.measure.iperf3json._intervals)."""
    out = []
    for s in ivs:
        row = {"start": s["start"], "end": s["end"], "bps": s["bits_per_second"]}
        row["omitted"] = bool(s.get("omitted", False))
        if "retransmits" in s:
            row["retransmits"] = s["retransmits"]
        out.append(row)
    return out


def stopped_metrics(
    client: dict[str, Any], server: dict[str, Any], *, warmup: int = 0
) -> dict[str, Any]:
    """The tcp metrics of a test stopped early, from the client's document (SIGINT) and the
    server's: each side's complete per-second intervals after the first `warmup` (the seconds
    the rule dropped, as iperf3's -O would); the receiver is the server unless the client ran
    -R. Raises MeasurementFailed when a document is not the stopped test's."""
    for who, doc in (("client", client), ("server", server)):
        if "start" not in doc or not doc.get("intervals"):
            err = doc.get("error") or "no intervals"
            raise MeasurementFailed(f"iperf3 {who} after the stop: {err}")
    common = common_fields(client)
    reverse = common["direction"] == "server-to-client"
    sender, receiver = (server, client) if reverse else (client, server)
    snd_ivs, rcv_ivs = _full_intervals(sender)[warmup:], _full_intervals(receiver)[warmup:]
    snd_bps, snd_bytes, _ = _rate(snd_ivs)
    rcv_bps, rcv_bytes, rcv_s = _rate(rcv_ivs)
    retr = [s.get("retransmits") for s in snd_ivs if not s.get("omitted")]
    start = client["start"]
    mss_set = bool(start.get("tcp_mss"))
    cpu_c = (client.get("end") or {}).get("cpu_utilization_percent", {})
    cpu_s = (server.get("end") or {}).get("cpu_utilization_percent", {})
    return {
        **common,
        # each end's whole seconds, the warm-up included (marked omitted, as -O marks them)
        "server_intervals": _marked(server, warmup),
        "streams": start.get("test_start", {}).get("num_streams"),
        # the client's end.streams after SIGINT hold no receiver figures: none rather than zeros
        "per_stream": [],
        "sender_bps": snd_bps,
        "receiver_bps": rcv_bps,
        "sender_bytes": snd_bytes,
        "receiver_bytes": rcv_bytes,
        "retransmits": None if any(r is None for r in retr) or not retr else sum(retr),
        "tcp_mss": start.get("tcp_mss") if mss_set else start.get("tcp_mss_default"),
        "tcp_mss_set": mss_set,
        "congestion": (client.get("end") or {}).get("sender_tcp_congestion"),
        "duration_s": rcv_s,
        "cpu_client_pct": cpu_c.get("host_total"),
        "cpu_server_pct": cpu_s.get("host_total"),
        "intervals": _marked(client, warmup),
        "warmup_s": sum(r["end"] - r["start"] for r in _rows(_full_intervals(receiver)[:warmup])),
    }


def _marked(doc: dict[str, Any], warmup: int) -> list[dict[str, Any]]:
    rows = _rows(_full_intervals(doc))
    for r in rows[:warmup]:
        r["omitted"] = True
    return rows


def server_document(read_log: Callable[[], str], *, wait_s: float = SERVER_REPORT_S) -> dict:
    """The server's last document in its log, polled until it has one naming the client's
    termination (or any error document) or `wait_s` passed."""
    deadline = time.monotonic() + wait_s
    while True:
        docs = split_documents(read_log())
        if docs and docs[-1].get("error"):
            return docs[-1]
        if time.monotonic() > deadline:
            return docs[-1] if docs else {"error": f"no server document within {wait_s:g} s"}
        time.sleep(0.2)


# ---------------------------------------------------------------- the run


def streams_here(receiver: Node) -> bool:
    """Whether the receiving node can report its sockets' bytes (ss)."""
    return not receiver.missing_tools(["ss"])


def run_streaming(
    ctx: Context,
    call: ClientCall,
    *,
    rule: Rule,
    cap_s: float,
    omit_s: float,
    read_server_log: Callable[[], str],
    files: list,
    label: str = "iperf3-tcp",
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the client (call's argv asks -t cap_s), sampling the receiver's bytes at call's port
    every second; SIGINT it when the rule holds. Returns (metrics, adaptive) like
    run_segments."""
    argv, port, reverse = call.argv, call.port, call.reverse
    receiver, sender = (ctx.client, ctx.server) if reverse else (ctx.server, ctx.client)
    # a reading that cannot be taken (a board's lost session, ss failing) is no sample
    read_received = socket_reader(receiver, ss_argv(port, local=not reverse), bytes_received)
    read_sender = socket_reader(sender, sender_argv(ss_argv(port, local=reverse)), str)
    series = LiveSeries(omit_s=omit_s)
    cycles = Cycles()
    timeouts = Timeouts()
    held_s, cycle_why = 0.0, "the interval never held"
    rto_why = "the interval never held"
    mser = replace(rule, warmup_s=None)  # MSER-5 picks the warm-up, as for every adaptive test
    decision: Decision | None = None
    stopped = timed_out = False
    out_path = ctx.next_raw(label, ".json")
    err_path = out_path.with_suffix(out_path.suffix + ".stderr")
    t0 = time.monotonic()
    limit = cap_s + omit_s + ctx.timeout_s
    with open(out_path, "w") as out, open(err_path, "w") as err:
        p = ctx.client.popen(argv, stdout=out, stderr=err)
        try:
            tick = t0
            while p.poll() is None:
                if time.monotonic() - t0 > limit:
                    timed_out = True
                    break
                tick += SAMPLE_S
                time.sleep(max(0.0, tick - time.monotonic()))
                received, sent = read_received(), read_sender()
                if p.poll() is not None:
                    break  # the run ended meanwhile: its JSON is complete
                now = time.monotonic()
                series.add(now, received)
                cycles.add(now, sender_state(sent))
                timeouts.add(now, tcp_timeouts(sent))
                decision = live_decision(series, mser, cap_s)
                if decision.stop and decision.reason == "ci":
                    w = decision.warmup_samples
                    settled, cycle_why = cycles.settled(series.starts[w])
                    rto_at = [series.index(t) - w for t in timeouts.times(series.starts[w])]
                    rto_ok, rto_why = timeouts_settled(
                        series.rates[w:], [i for i in rto_at if i >= 0], rule=rule
                    )
                    if not (settled and rto_ok):
                        held_s += SAMPLE_S
                        continue
                    whole = cycles.whole_cycles(series.rates, series.starts, w, rule)
                    if whole is not None:
                        ok, first, cycle_why, _ = whole
                        if not ok:
                            held_s += SAMPLE_S
                            continue
                        # the kept seconds start where the first whole cycle did
                        decision = replace(decision, warmup_samples=first)
                    stopped = True
                    p.send_signal(signal.SIGINT)  # iperf3 prints its document and exits
                    try:
                        p.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        timed_out = True
                    break
        finally:
            if p.poll() is None:
                p.kill()
            p.wait()
    inv = collected(argv, p.returncode, out_path, err_path, timed_out, time.monotonic() - t0)
    files += inv.raw_files
    if inv.timed_out:
        raise MeasurementFailed(describe_failure(inv, "iperf3"))
    if not stopped:
        metrics = parse_iperf3_tcp(inv.stdout)
        rates = receiver_rates(metrics)
        d = replace(evaluate(rates, mser, elapsed_s=len(rates), cap_s=cap_s), reason="cap")
        info = adaptive_block("cap", d, rule, measured_s=cap_s, cap_s=cap_s, unit="bit/s")
        info.update(mechanism="stream", stopped_early=False, segments=1)
        info["cycles"] = {
            "held_s": held_s,
            "last": cycle_why,
            "timeouts": rto_why,
            "timeouts_in_run": timeouts.total(),
            "events_at_s": [round(t - t0, 1) for t in cycles.event_times()],
            "timeouts_at_s": [round(t - t0, 1) for t in timeouts.times(t0)],
            "sender_readings": cycles.record(t0),
        }
        return metrics, info
    try:
        client_doc = json.loads(inv.stdout)
    except ValueError:
        raise MeasurementFailed(describe_failure(inv, "iperf3") + " (no JSON output)") from None
    server_doc = server_document(read_server_log)
    whole = receiver_rates(stopped_metrics(client_doc, server_doc))
    # the seconds the rule kept: its warm-up, after the iperf3 seconds (omitted ones included)
    # before the first live rate, whose reading was only the origin of the byte count
    lead = max(0, round(series.starts[0] - t0)) if series.starts else 0
    drop = max(0, min(len(whole) - 1, lead + (decision.warmup_samples if decision else 0)))
    metrics = stopped_metrics(client_doc, server_doc, warmup=drop)
    kept = receiver_rates(metrics)
    d = evaluate(kept, replace(rule, warmup_s=0.0), elapsed_s=len(whole), cap_s=cap_s)
    d = replace(d, warmup_samples=drop)
    if not metrics["duration_s"]:
        raise MeasurementFailed("iperf3 was stopped before it reported a whole second")
    ran = metrics["duration_s"] + metrics["warmup_s"]
    info = adaptive_block("ci", d, rule, measured_s=ran, cap_s=cap_s, unit="bit/s")
    live = decision.interval if decision is not None else None
    info.update(
        mechanism="stream",
        segments=1,
        stopped_early=True,
        stopped_early_because={
            "criterion": (
                f"{100 * rule.confidence:g} % interval of the mean within "
                f"+-{100 * rule.rel_half_width:g} % after >= {rule.min_s:g} s (batch means of "
                f"{rule.batch_s:g} s, MSER-5 warm-up)"
            ),
            "source": "ss bytes_received on the receiving node, every 1 s",
            "cycles": cycle_why,
            "timeouts": rto_why,
            "timeouts_in_run": timeouts.total(),
            # when the sender's congestion events and timeouts were read (s from the start)
            "events_at_s": [round(t - t0, 1) for t in cycles.event_times()],
            "timeouts_at_s": [round(t - t0, 1) for t in timeouts.times(t0)],
            "sender_readings": cycles.record(t0),
            "held_by_cycles_s": held_s,
            "requested_s": cap_s,
            "ran_s": ran,
            "live_seconds": series.seconds,
            "live_interval": live.to_json() if live is not None else None,
            "warmup_samples": decision.warmup_samples if decision else None,
            # iperf3 seconds before the first live rate: the record drops these + the warm-up
            "lead_seconds": lead,
        },
    )
    return metrics, info
