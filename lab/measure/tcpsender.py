"""The sender's side of a streaming TCP test (lab.measure.tcpstream): what `ss -tinH` says of
the sending socket each second (congestion control, cwnd, ssthresh, what limited it), the
sending namespace's retransmission timeouts (TcpExt TCPTimeouts), and the rules a stop must
also pass on them: whole congestion cycles (`Cycles`) and a settled timeout cost
(`timeouts_settled`). docs/measurements.md "Whole congestion cycles"."""

from __future__ import annotations

import bisect
import math
import re
import shlex
import statistics
from dataclasses import dataclass, field

from lab.model.stoprule import MIN_CYCLES, Interval, Rule, regenerative_interval

#: congestion events (ssthresh set anew) a stop needs in its kept seconds: two bound one whole
#: sawtooth cycle of a loss-based sender
MIN_EPOCHS = 2
#: a kept window without congestion events settles only if cwnd grew by at most this factor
STEADY_CWND_GROWTH = 1.05
#: seconds after a congestion event in which a stop may come: the kept seconds then end with a
#: whole cycle (the reading that saw the event, or the next, where the interval holds a
#: reading later)
CYCLE_END_S = 1.0
#: a window that grew without congestion events settles when the receive window or the send
#: buffer limited the sender at least this share of its busy time (the cwnd did not bind)
LIMITED_SHARE = 0.9
#: cubic's multiplicative decrease and scaling constant (RFC 9438 section 4.6/4.7, Linux's
#: tcp_cubic beta 717/1024 ~ 0.7, C 0.4 segments/s^3)
CUBIC_BETA = 0.7
CUBIC_C = 0.4
#: congestion controls that do not cycle on losses (their rate is not a sawtooth)
MODEL_BASED_CC = frozenset({"bbr", "bbr2", "bbr3"})

#: the sending node's TCP counters: TcpExt TCPTimeouts, retransmission timeouts (per namespace)
NETSTAT_ARGV = ["cat", "/proc/net/netstat"]


def sender_argv(ss: list[str]) -> list[str]:
    """One command a second on the sending node (one SSH round trip on a board): its socket's
    `ss` listing, then its namespace's counters; sender_state and tcp_timeouts each read their
    own lines of the output."""
    return ["sh", "-c", f"{shlex.join(ss)}; {shlex.join(NETSTAT_ARGV)}"]


#: words ss -i prints before the congestion control's name
_SS_FLAGS = frozenset({"ts", "sack", "ecn", "ecnseen", "fastopen"})
_SENDER_FIELD = re.compile(r"\b(cwnd|ssthresh|bytes_acked):(\d+)")
_BUSY_FIELD = re.compile(r"\b(busy|rwnd_limited|sndbuf_limited):(\d+)ms")


@dataclass(frozen=True)
class SenderState:
    """The sending socket's congestion state at one reading."""

    cc: str | None
    cwnd: int
    ssthresh: int | None  # None until the first congestion event
    #: tcp_info's busy time and the part of it the receive window or send buffer limited (ms,
    #: cumulative; None where ss does not print them)
    busy_ms: int | None = None
    limited_ms: int | None = None


def sender_state(ss_text: str) -> SenderState | None:
    """The data connection's state from `ss -tinH` on the sending node: of the test's sockets,
    the one that had the most bytes acknowledged (the control connection sends a few hundred);
    None when no socket reported a cwnd."""
    best: tuple[int, SenderState] | None = None
    for line in ss_text.splitlines():
        fields = dict(_SENDER_FIELD.findall(line))
        if "cwnd" not in fields:
            continue
        # ss prints the socket's flags (ts, sack, ecn, ...) before the congestion control
        words = [w for w in line.split() if ":" not in w and w not in _SS_FLAGS]
        cc = words[0] if words else None
        busy = dict(_BUSY_FIELD.findall(line))
        st = SenderState(
            cc,
            int(fields["cwnd"]),
            int(fields["ssthresh"]) if "ssthresh" in fields else None,
            int(busy["busy"]) if "busy" in busy else None,
            sum(int(busy.get(k, 0)) for k in ("rwnd_limited", "sndbuf_limited"))
            if "busy" in busy
            else None,
        )
        acked = int(fields.get("bytes_acked", 0))
        if best is None or acked > best[0]:
            best = (acked, st)
    return best[1] if best else None


def tcp_timeouts(netstat_text: str) -> int | None:
    """TcpExt TCPTimeouts from /proc/net/netstat's text (a header line of names, then one of
    values), None when the text has no such counter."""
    rows = [line.split() for line in netstat_text.splitlines() if line.startswith("TcpExt:")]
    if len(rows) < 2 or "TCPTimeouts" not in rows[0]:
        return None
    try:
        return int(rows[1][rows[0].index("TCPTimeouts")])
    except (IndexError, ValueError):
        return None


@dataclass
class Timeouts:
    """The sending namespace's timeout counter, one reading a second."""

    readings: list[tuple[float, int]] = field(default_factory=list)

    def add(self, t: float, count: int | None) -> None:
        if count is not None:
            self.readings.append((t, count))

    def total(self) -> int | None:
        """Timeouts over the readings (None without any)."""
        return self.readings[-1][1] - self.readings[0][1] if self.readings else None

    def times(self, t0: float) -> list[float]:
        """Readings from t0 on at which the counter had risen since the one before."""
        return [
            t
            for (_, a), (t, b) in zip(self.readings, self.readings[1:], strict=False)
            if t >= t0 and b > a
        ]


def timeouts_settled(rates: list[float], seconds: list[int], *, rule: Rule) -> tuple[bool, str]:
    """Whether the kept per-second `rates` know what their retransmission timeouts cost: the
    `seconds` (indices into rates) in which one fired, each with the second before it (the
    stall precedes the timer), fall below the median by a share f of the kept bytes; k such
    seconds pin it down to z x f / sqrt(k), which must be within the rule's half-width."""
    k = len(seconds)
    if not k:
        return True, "no retransmission timeout in the kept seconds"
    med = statistics.median(rates)
    slump = {j for i in seconds for j in (i - 1, i) if 0 <= j < len(rates)}
    share = sum(max(0.0, med - rates[j]) for j in slump) / (sum(rates) or 1.0)
    z = statistics.NormalDist().inv_cdf(1 - (1 - rule.confidence) / 2)
    err = z * share / math.sqrt(k)
    cost = f"{k} retransmission timeouts cost {100 * share:.1f} % of the mean (+-{100 * err:.1f} %"
    if err <= rule.rel_half_width:
        return True, f"{cost})"
    return (
        False,
        f"{cost}, more than +-{100 * rule.rel_half_width:g} %: too few to know their rate)",
    )


@dataclass
class Cycles:
    """The sender's readings over the test, one per second: where its congestion events were."""

    readings: list[tuple[float, SenderState]] = field(default_factory=list)

    def add(self, t: float, state: SenderState | None) -> None:
        if state is not None:
            self.readings.append((t, state))

    def since(self, t0: float) -> tuple[int, float | None]:
        """(congestion events, cwnd growth factor) over the readings from time t0 on."""
        events = sum(1 for t in self.event_times() if t >= t0)
        kept = [st.cwnd for t, st in self.readings if t >= t0]
        return events, (kept[-1] / kept[0] if kept and kept[0] else None)

    def event_times(self) -> list[float]:
        """When each congestion event was read: a reading whose ssthresh differs from the one
        before (the first set counts)."""
        out, prev = [], None
        for i, (t, st) in enumerate(self.readings):
            if i and st.ssthresh is not None and st.ssthresh != prev:
                out.append(t)
            prev = st.ssthresh
        return out

    def record(self, t0: float) -> list[list]:
        """The readings for a record: [s from t0, cwnd, ssthresh, busy ms, limited ms] each
        (what `settled` reads, so a replay can apply the same rule: bench/adaptive_spread.py)."""
        return [
            [round(t - t0, 1), st.cwnd, st.ssthresh, st.busy_ms, st.limited_ms]
            for t, st in self.readings
        ]

    @classmethod
    def from_record(cls, rows: list[list]) -> Cycles:
        """The readings `record` wrote, times from its t0 (congestion control unknown)."""
        out = cls()
        for t, cwnd, ssthresh, busy, limited in rows:
            out.add(t, SenderState(None, cwnd, ssthresh, busy, limited))
        return out

    def limited_share(self, t0: float) -> float | None:
        """The share of the sender's busy time from t0 on that the receive window or the send
        buffer limited (tcp_info's busy/rwnd_limited/sndbuf_limited, as ss prints them);
        None without those counters or busy time."""
        kept = [st for t, st in self.readings if t >= t0 and st.busy_ms is not None]
        if len(kept) < 2 or kept[-1].busy_ms <= kept[0].busy_ms:
            return None
        return (kept[-1].limited_ms - kept[0].limited_ms) / (kept[-1].busy_ms - kept[0].busy_ms)

    def whole_cycles(
        self, rates: list[float], starts: list[float], w: int, rule: Rule
    ) -> tuple[bool, int, str, Interval | None] | None:
        """Where the kept seconds (rates[w:], `starts` when each began) hold congestion events:
        (the regenerative interval over their whole cycles meets the rule, the index of the
        first whole cycle's first second, why, that interval). None for a flow with fewer than
        MIN_EPOCHS events there (the other conditions of `settled` decide it)."""
        if not starts or w >= len(starts):
            return None
        if len([t for t in self.event_times() if t >= starts[w]]) < MIN_EPOCHS:
            return None
        # the run's first event ends slow start and the cycle it opens recovers from slow
        # start's overshoot (its window cut to a fraction of the path's): cycles count from
        # the second event on
        times = [t for t in self.event_times()[1:] if t >= starts[w]]
        # the second that held each reading (its rate began before the reading)
        cuts = [bisect.bisect_left(starts, t) - 1 for t in times]
        iv = regenerative_interval(rates, cuts, rule.confidence)
        n = len(set(cuts)) - 1
        if iv is None:
            return False, w, f"{n} whole congestion cycles of {MIN_CYCLES}", None
        first = min(cuts) + 1
        reached = f"{iv.n} whole congestion cycles, +-{100 * iv.rel:.1f} % over cycles"
        if iv.rel > rule.rel_half_width:
            return False, first, f"{reached} (more than +-{100 * rule.rel_half_width:g} %)", iv
        return True, first, f"{reached}; kept from the first cycle's start", iv

    def past_plateau(self) -> bool:
        """Whether a steady window now can be a cycle's middle: cubic's window stays within a
        few % of the window at its last loss (W) for seconds around K = cbrt(W x (1 - 0.7) /
        0.4) s after it (RFC 9438's beta and C; WireGuard at 40 ms: W ~2750 segments, K ~13 s,
        within 3 % for 10 s). True without a congestion event in the run (slow start held by
        the receive window or buffers never lost a packet), for a non-cubic sender, or once
        2 K has passed since the last event (cubic's window then grows again, convex)."""
        times = self.event_times()
        if not times or not self.readings:
            return True
        cc = self.readings[-1][1].cc
        if cc is not None and cc != "cubic":
            return True
        before = [st.cwnd for t, st in self.readings if t < times[-1]]
        w_max = before[-1] if before else self.readings[0][1].cwnd
        k = (w_max * (1 - CUBIC_BETA) / CUBIC_C) ** (1 / 3)
        return self.readings[-1][0] - times[-1] > 2 * k

    def settled(self, t0: float) -> tuple[bool, str]:
        """Whether the seconds from t0 on hold whole congestion cycles (see the module text)."""
        if not self.readings:
            return True, "no sender reading (ss): the interval alone"
        cc = self.readings[-1][1].cc
        if cc in MODEL_BASED_CC:
            return True, f"{cc} does not cycle on losses"
        events, growth = self.since(t0)
        if events >= MIN_EPOCHS:
            open_s = self.readings[-1][0] - self.event_times()[-1]
            if open_s > CYCLE_END_S + 1e-6:
                return False, (
                    f"{events} congestion events, but {open_s:.0f} s into an open cycle (a stop "
                    "comes at a cycle's end)"
                )
            return True, f"{events} congestion events in the kept seconds"
        share = self.limited_share(t0)
        steady = events == 0 and growth is not None and growth <= STEADY_CWND_GROWTH
        if steady and (share is None or self.past_plateau()):
            return True, "no congestion event and a steady window (receive-window or buffer bound)"
        if events == 0 and growth is not None and share is not None and share >= LIMITED_SHARE:
            # the window grew, but the receiver's window or the send buffer held the flow: an
            # unused congestion window opens without filling a queue (cubic grows it anyway)
            return True, (
                f"no congestion event; cwnd x{growth:.2f}, but receive-window or send-buffer "
                f"limited {100 * share:.0f} % of the kept seconds' busy time"
            )
        grew = f", cwnd x{growth:.2f}" if growth is not None else ""
        return False, f"{events} congestion events of {MIN_EPOCHS}{grew}"
