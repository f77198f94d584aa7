"""A file copy watched while it runs, and stopped once it cannot finish before its time-out
(issue 17: scp's stop-early rule; docs/measurements.md, "scp stops early").

**What is watched.** The byte counter of the interface that carries the copy on the client
node: ``ip -j route get <server>`` names the device, ``/sys/class/net/<dev>/statistics/tx_bytes``
is read with ``node.run(["cat", ...])`` every ``POLL_S`` seconds. Both are commands the node
runs, so this works on namespaces here, in the VM and on boards over SSH (where the Popen the
lab holds is the agent's stream and the remote PID is not ours to read). The counter counts
every byte the device sent: TCP/IP and SSH framing, the handshake and anything else leaving by
that device (through an IPsec policy tunnel the route is the physical device, so ESP's overhead
too). All of it makes the copy look further along than it is, which errs towards *not*
stopping.

**The rule** (`decide`, pure arithmetic). Nothing is decided before ``min_watch_s(timeout)`` =
max(20 s, 10 % of the time-out). Then the copy's rate is the higher of the rate over the last
``WINDOW_S`` (10) seconds and its average since it started, and the copy is stopped when both

1. even at ``MARGIN`` (2) times that rate the bytes still to send would arrive after the
   time-out: ``elapsed + remaining / (2 x rate) > timeout``, and
2. its rate is not rising: the last 10 s's rate is at most ``RISE`` (1.1) times the 10 s
   before (a copy that only has 10 s behind it has no earlier window and goes on).

Why a copy that would finish is not stopped (assumptions; bench/scp_early.py measures them):

- TCP's rate can still grow long after slow start: under reordering (netem jitter) Linux
  raises its reordering threshold as it goes, and after an early loss CUBIC's convex probing
  starts slowly and then accelerates. bench/scp_early.py saw an OpenVPN copy at 200 ms RTT
  (Pi 4 caps) go from 6-9 Mbit/s in its first 30 s to 34 Mbit/s after, a speed-up of 2.9 over
  what its best rate at 28-30 s projected: more than the margin. Before that jump its rate had
  risen by 19-44 % per 10 s, which condition 2 refuses to stop on; a steady copy at jitter
  9 ms (3 Mbit/s) rose by more than 10 % at 17 of 104 checks, so condition 2 delays its stop
  by a check or two. Not covered: a condition that changes by more than 2x with no rise before
  it (this shared machine's other work ending abruptly; within one run figures move 10-30 %
  here, docs/scale.md).
- The best of the window and the whole-copy average is used, so a stall of a few seconds (a
  retransmission time-out) lowers neither enough to matter; an early burst (slow start before
  the first losses) keeps the average high for long, towards not stopping.
- Without progress (nothing counted yet) nothing is projected and the copy is left to its
  time-out, as before.
"""

from __future__ import annotations

import bisect
import json
import math
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from lab.core.errors import LabError
from lab.core.node import Node
from lab.measure.base import Context, Invocation, collected
from lab.measure.tcpsender import Cycles, Timeouts, sender_state, tcp_timeouts, timeouts_settled
from lab.model.stoprule import Decision, Rule, evaluate

MIB = 1024 * 1024
#: no decision before max(MIN_S, MIN_SHARE x time-out) seconds of the copy
MIN_S = 20.0
MIN_SHARE = 0.10
#: the window of the recent rate
WINDOW_S = 10.0
#: the copy is stopped only when even this many times its best measured rate is too slow
MARGIN = 2.0
#: ... and its last window's rate is at most this many times the window's before
RISE = 1.1
#: seconds between two readings of the counter
POLL_S = 2.0
#: seconds a stopped copy gets to end on SIGTERM (scp then ends its ssh child) before SIGKILL
TERM_GRACE_S = 5.0
#: a copy that stops as it streams (`Stream`) reads the received file's size this often
STREAM_POLL_S = 1.0
#: ... and stops only while its rate stays below this share of the card's write rate
CARD_SHARE = 0.8


def min_watch_s(timeout_s: float) -> float:
    """Seconds of a copy before the rule may stop it."""
    return max(MIN_S, MIN_SHARE * timeout_s)


@dataclass(frozen=True)
class Verdict:
    stop: bool
    #: bytes/s the projection used (the best of window and average), None before a projection
    rate: float | None = None
    #: elapsed + remaining / rate: when the copy would end at that rate
    projected_s: float | None = None
    #: why the copy was stopped (empty when it goes on)
    why: str = ""


def decide(
    *,
    elapsed_s: float,
    sent: int,
    size: int,
    timeout_s: float,
    window_rate: float,
    prev_rate: float | None,
) -> Verdict:
    """Stop a copy of `size` bytes that has sent `sent` after `elapsed_s`, at `window_rate`
    bytes/s over the last WINDOW_S and `prev_rate` over the WINDOW_S before (None: no such
    window yet)? Pure: see the module's docstring for the rule."""
    if elapsed_s < min_watch_s(timeout_s) or elapsed_s <= 0:
        return Verdict(False)
    rate = max(sent / elapsed_s, window_rate)
    remaining = size - sent
    if remaining <= 0 or rate <= 0:
        return Verdict(False, rate or None)
    need = remaining / rate
    projected = elapsed_s + need
    if elapsed_s + need / MARGIN <= timeout_s:
        return Verdict(False, rate, projected)
    if prev_rate is None or window_rate > RISE * prev_rate:
        return Verdict(False, rate, projected)  # still speeding up: wait
    why = (
        f"stopped after {elapsed_s:.0f} s: at {rate * 8 / 1e6:.3g} Mbit/s, not rising, the "
        f"remaining {remaining / MIB:.3g} MiB need {need:.0f} s (at {MARGIN:g}x that rate "
        f"{need / MARGIN:.0f} s), past the {timeout_s:.0f} s timeout"
    )
    return Verdict(True, rate, projected, why)


def window_rates(samples: list[tuple[float, int]]) -> tuple[float, float | None]:
    """(rate over the last WINDOW_S, rate over the WINDOW_S before it or None) in bytes/s, from
    (seconds, bytes) readings in time order starting at (0, 0), the last being now. A window
    runs from the newest reading at least WINDOW_S older than its end."""
    t, sent = samples[-1]

    def start(before: float) -> tuple[float, int] | None:
        old = [x for x in samples if x[0] <= before - WINDOW_S]
        return old[-1] if old else None

    a = start(t) or samples[0]
    window = (sent - a[1]) / (t - a[0]) if t > a[0] else 0.0
    b = start(a[0])
    if b is None or a[0] <= b[0]:
        return window, None
    return window, (a[1] - b[1]) / (a[0] - b[0])


class Unwatchable(Exception):
    """The copy's progress cannot be read on this node (the copy then runs to its time-out)."""


def _ask(node: Node, argv: list[str]) -> subprocess.CompletedProcess:
    try:
        return node.run(argv, check=False, timeout=30)
    except LabError as e:  # the tool missing, a hung or lost session: no decisions, no stop
        raise Unwatchable(f"{' '.join(argv)}: {e}") from None


def copy_device(node: Node, addr: str) -> str:
    """The interface the node sends to `addr` by (`ip -j route get`)."""
    cp = _ask(node, ["ip", "-j", "route", "get", addr.strip("[]")])
    try:
        return json.loads(cp.stdout)[0]["dev"]
    except (ValueError, LookupError, TypeError):
        tail = (cp.stderr or cp.stdout).strip()[-200:]
        raise Unwatchable(f"ip -j route get {addr} gave no device: {tail}") from None


def tx_bytes(node: Node, dev: str) -> int:
    path = f"/sys/class/net/{dev}/statistics/tx_bytes"
    cp = _ask(node, ["cat", path])
    try:
        return int(cp.stdout.strip())
    except ValueError:
        raise Unwatchable(f"{path}: {(cp.stderr or cp.stdout).strip()[-200:]}") from None


def file_bytes(node: Node, path: str) -> int:
    """The size of `path` on `node` (0 while it does not exist yet)."""
    cp = _ask(node, ["stat", "-c", "%s", path])
    if cp.returncode != 0:
        if "No such file" in (cp.stderr or ""):
            return 0
        raise Unwatchable(f"stat {path}: {(cp.stderr or cp.stdout).strip()[-200:]}")
    try:
        return int(cp.stdout.strip())
    except ValueError:
        raise Unwatchable(f"stat {path}: {cp.stdout.strip()[-200:]!r}") from None


@dataclass
class Stream:
    """A copy that stops as it streams (a test's `adaptive = true`; docs/measurements.md "scp
    that stops as it streams"): the received file's size read each second on the receiving
    node, lab.model.stoprule over its per-second rates (MSER-5 warm-up, batch means, the
    interval's target), as tcp's rule over its receiver's rates. Stopped, the copy's time is
    projected: the seconds it ran plus the bytes still to come at the interval's mean rate.

    Two conditions beyond the rule:
    - a file that lands on a board's card (`card_Bps`, the card's write rate) is stopped only
      while its rate stays below CARD_SHARE of the card's. A faster copy fills the board's page
      cache first and then waits for the card (docs/cpu.md "Storage"): its rate falls later, so
      its first part says nothing of the rest. Below the card's rate the card keeps up, the
      writer never waits, and the rate is the network's;
    - with `sender` (the copy's sending socket and its namespace's counters, read each second:
      lab.measure.tcpsender.sender_argv), the kept seconds must hold whole congestion cycles and
      know what their retransmission timeouts cost, as tcp's streaming stop requires
      (lab.measure.tcpstream: a window still opening, a part of a sawtooth, reads narrow)."""

    rule: Rule
    #: the file's whole size in bytes
    size: int
    #: bytes of the received file now (raises Unwatchable when it cannot be read)
    size_of: Callable[[], int]
    card_Bps: float | None = None
    samples: list[tuple[float, int]] = field(default_factory=lambda: [(0.0, 0)])
    #: the rule's verdict that stopped the copy (None: it ran to its end)
    decision: Decision | None = None
    #: readings at which the rule was met but the card's condition held the copy
    held_by_card: int = 0
    #: the sending node's socket and counters now (tcpsender.sender_argv's output), or None
    sender: Callable[[], str] | None = None
    cycles: Cycles = field(default_factory=Cycles)
    timeouts: Timeouts = field(default_factory=Timeouts)
    #: readings at which the rule was met but the congestion cycles or timeouts held the copy
    held_by_cycles: int = 0
    #: the cycles' and the timeouts' last word (tcpsender)
    why: dict = field(default_factory=dict)
    #: the receiving socket's bytes now (the sshd's tcp_info bytes_received), or None: a finer
    #: reading than the file's size, which moves a whole sftp write at a time (up to 255 KiB:
    #: 5 s at study A's slowest points); its rates are the rule's while every reading has one
    #: (SSH's framing adds ~0.2 % to the file's bytes)
    received: Callable[[], int | None] | None = None
    wire: list[tuple[float, int]] | None = field(default_factory=lambda: [(0.0, 0)])

    @property
    def source(self) -> str:
        if self.received is not None and self.wire is not None:
            return "the receiving socket's bytes (ss bytes_received on the server), every 1 s"
        return "the received file's size on the server, every 1 s"

    def rates(self) -> list[float]:
        """Bytes/s between consecutive readings (the socket's while it has every one)."""
        s = self.samples
        if self.received is not None and self.wire is not None:
            s = self.wire
        return [
            (b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(s, s[1:], strict=False) if b[0] > a[0]
        ]

    def evaluate(self) -> Decision:
        return evaluate(self.rates(), self.rule, sample_s=STREAM_POLL_S, cap_s=math.inf)

    def read(self, now: float) -> bool:
        """Take a reading at `now` (seconds since the copy started); True: stop the copy."""
        self.samples.append((now, self.size_of()))
        if self.received is not None and self.wire is not None:
            got = self.received()
            if got is None:  # the socket could not be read: the file's size from now on
                self.wire = None
            else:
                self.wire.append((now, got))
        if self.sender is not None:
            out = self.sender()
            self.cycles.add(now, sender_state(out))
            self.timeouts.add(now, tcp_timeouts(out))
        d = self.evaluate()
        if not d.stop or d.interval is None:
            return False
        if self.card_Bps and d.interval.mean >= CARD_SHARE * self.card_Bps:
            self.held_by_card += 1
            return False
        if not self._settled(d.warmup_samples):
            self.held_by_cycles += 1
            return False
        if self.sender is not None:
            rates = self.rates()
            starts = [t for t, _ in self.samples[: len(rates)]]
            whole = self.cycles.whole_cycles(rates, starts, d.warmup_samples, self.rule)
            if whole is not None:
                ok, first, self.why["cycles"], iv = whole
                if not ok:
                    self.held_by_cycles += 1
                    return False
                # whole cycles' rate (the regenerative interval: tcpstream's rule)
                d = replace(d, warmup_samples=first, interval=iv)
        self.decision = d
        return True

    def _settled(self, w: int) -> bool:
        """The kept rates (from the w-th on) hold whole cycles and their timeouts' cost."""
        if self.sender is None:
            return True
        t_w = self.samples[w][0]  # the first kept rate's start
        cycles_ok, self.why["cycles"] = self.cycles.settled(t_w)
        starts = [t for t, _ in self.samples]
        # a timeout read at t fell in the rate whose interval ends at or after t
        at = [bisect.bisect_left(starts, t) - 1 - w for t in self.timeouts.times(t_w)]
        rto_ok, self.why["timeouts"] = timeouts_settled(
            self.rates()[w:], [i for i in at if i >= 0], rule=self.rule
        )
        self.why["timeouts_in_run"] = self.timeouts.total()
        return cycles_ok and rto_ok

    def at_cap(self) -> None:
        """The copy reached its time-out before the rule held: its decision is the interval
        reached so far (reason cap, `stop` false), when the rule has one and a rate."""
        d = self.evaluate()
        if d.interval is not None and d.interval.mean > 0:
            self.decision = d

    def projected_s(self) -> float:
        """The whole copy's seconds: those it ran plus the rest at the interval's mean rate."""
        assert self.decision is not None and self.decision.interval is not None
        now, got = self.samples[-1]
        return now + max(self.size - got, 0) / self.decision.interval.mean


@dataclass
class Watch:
    """What watching a copy gave: the device, the checks made and, when stopped, the verdict."""

    dev: str | None
    checks: int = 0
    stopped: Verdict | None = None
    #: bytes the device sent from the copy's start to the last reading
    sent: int = 0
    elapsed_s: float = 0.0
    #: why the copy could not be watched (it then ran to its end or its time-out)
    unwatchable: str | None = None
    #: the streaming stop (adaptive), when asked for
    stream: Stream | None = None
    #: why the received file could not be read (the copy then ran to its end)
    unstreamable: str | None = None

    def info(self, timeout_s: float) -> dict:
        """The record's `early_stop` block."""
        return {
            "dev": self.dev,
            "checks": self.checks,
            "unwatchable": self.unwatchable,
            "rule": {
                "min_s": min_watch_s(timeout_s),
                "window_s": WINDOW_S,
                "margin": MARGIN,
                "rise": RISE,
                "poll_s": POLL_S,
                "timeout_s": timeout_s,
            },
        }


def _end(p: subprocess.Popen) -> None:
    """SIGTERM (scp ends its ssh child on it), then SIGKILL; always reaped."""
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            p.kill()
    p.wait()


def watch_copy(
    ctx: Context,
    node: Node,
    argv: list[str],
    *,
    label: str,
    timeout: float,
    size: int,
    addr: str,
    enabled: bool = True,
    poll_s: float = POLL_S,
    stream: Stream | None = None,
) -> tuple[Invocation, Watch]:
    """Run argv like base.invoke (stdout and stderr into raw files, killed and reaped at
    `timeout`); with `enabled`, read the copy's byte counter every `poll_s` seconds into a raw
    ``<label>-progress`` file (seconds, bytes sent) and end the process when `decide` says the
    copy cannot finish; with `stream`, read the received file every STREAM_POLL_S seconds
    and end the process when its rule is met (the file's readings go into a raw
    ``<label>-stream`` file)."""
    argv = [str(a) for a in argv]
    watch = Watch(dev=None, stream=stream)
    if stream is not None:
        poll_s = min(poll_s, STREAM_POLL_S)
    base = 0
    if enabled:
        try:
            watch.dev = copy_device(node, addr)
            base = tx_bytes(node, watch.dev)
        except Unwatchable as e:
            watch.unwatchable = str(e)
    out_path = ctx.next_raw(label)
    err_path = out_path.with_suffix(out_path.suffix + ".stderr")
    prog_path: Path | None = ctx.next_raw(f"{label}-progress") if watch.dev else None
    stream_path: Path | None = ctx.next_raw(f"{label}-stream") if stream else None
    samples: list[tuple[float, int]] = [(0.0, 0)]
    timed_out = False
    t0 = time.monotonic()
    with open(out_path, "w") as out, open(err_path, "w") as err:
        p = node.popen(argv, stdout=out, stderr=err)
        try:
            next_at = poll_s
            while True:
                left = min(next_at, timeout) - (time.monotonic() - t0)
                try:
                    p.wait(timeout=max(left, 0.0))
                    break
                except subprocess.TimeoutExpired:
                    pass
                now = time.monotonic() - t0
                if now >= timeout:
                    timed_out = True
                    break
                next_at = math.floor(now / poll_s + 1) * poll_s
                if watch.stream is not None and _streamed(watch, now, stream_path):
                    break
                if watch.dev is None:
                    continue
                try:
                    sent = tx_bytes(node, watch.dev) - base
                except Unwatchable as e:  # the device went away: no more decisions
                    watch.dev, watch.unwatchable = None, str(e)
                    continue
                now = time.monotonic() - t0
                samples.append((now, sent))
                assert prog_path is not None
                with open(prog_path, "a") as f:
                    f.write(f"{now:.3f} {sent}\n")
                watch.checks += 1
                watch.sent, watch.elapsed_s = sent, now
                window, prev = window_rates(samples)
                v = decide(
                    elapsed_s=now,
                    sent=sent,
                    size=size,
                    timeout_s=timeout,
                    window_rate=window,
                    prev_rate=prev,
                )
                if v.stop and watch.stream is None:  # a streamed copy has its cap instead
                    watch.stopped = v
                    break
        finally:
            # only the process this call started (its Popen), ended and reaped: nothing of the
            # copy outlives the test
            _end(p)
    if watch.stopped is not None and p.returncode == 0:
        watch.stopped = None  # it finished between the last reading and the signal
    files_inv = collected(argv, p.returncode, out_path, err_path, timed_out, time.monotonic() - t0)
    for path in (prog_path, stream_path):
        if path is not None and path.exists():
            files_inv.raw_files.append(path)
    return files_inv, watch


def _streamed(watch: Watch, now: float, path: Path | None) -> bool:
    """A reading of the received file; True when the streaming stop ends the copy. A file
    that cannot be read ends the streaming (recorded), not the copy."""
    assert watch.stream is not None and path is not None
    try:
        stop = watch.stream.read(now)
    except Unwatchable as e:
        watch.stream, watch.unstreamable = None, str(e)
        return False
    t, got = watch.stream.samples[-1]
    with open(path, "a") as f:
        f.write(f"{t:.3f} {got}\n")
    return stop
