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
``WINDOW_S`` seconds and its average since it started; the copy is stopped when even at
``MARGIN`` (2) times that rate the bytes still to send would arrive after the time-out:
``elapsed + remaining / (2 x rate) > timeout``. Why that cannot stop a copy that would finish:

- TCP's slow start is over long before 20 s: from 10 segments it doubles each RTT, so it reaches
  a 1 Gbit/s x 200 ms window in ~12 RTTs (2.4 s). After it, under an impairment that does not
  change during a case (the runner changes it only between cases), the rate is bound by loss and
  delay (Mathis et al. 1997: MSS / (RTT x sqrt(p))) or by a CPU cap, neither of which grows with
  time. A copy would have to *double* its best measured rate and hold it to the end.
- The best of the window and the whole-copy average is used, so a stall of a few seconds (a
  retransmission time-out, this shared machine's load: figures move 10-30 % within one run
  here, docs/scale.md) lowers neither enough to matter; the average also includes the
  handshake and slow start, both of which only lower it, i.e. towards not stopping.
- Without progress (nothing counted yet) nothing is projected and the copy is left to its
  time-out, as before.
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ..node import Node
from .base import Context, Invocation, collected

MIB = 1024 * 1024
#: no decision before max(MIN_S, MIN_SHARE x time-out) seconds of the copy
MIN_S = 20.0
MIN_SHARE = 0.10
#: the window of the recent rate
WINDOW_S = 10.0
#: the copy is stopped only when even this many times its best measured rate is too slow
MARGIN = 2.0
#: seconds between two readings of the counter
POLL_S = 2.0
#: seconds a stopped copy gets to end on SIGTERM (scp then ends its ssh child) before SIGKILL
TERM_GRACE_S = 5.0


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
    window_bytes: int,
    window_s: float,
) -> Verdict:
    """Stop a copy of `size` bytes that has sent `sent` after `elapsed_s` (of which
    `window_bytes` in the last `window_s`)? Pure: see the module's docstring for the rule."""
    if elapsed_s < min_watch_s(timeout_s) or elapsed_s <= 0:
        return Verdict(False)
    rate = max(sent / elapsed_s, window_bytes / window_s if window_s > 0 else 0.0)
    remaining = size - sent
    if remaining <= 0 or rate <= 0:
        return Verdict(False, rate or None)
    need = remaining / rate
    projected = elapsed_s + need
    if elapsed_s + need / MARGIN <= timeout_s:
        return Verdict(False, rate, projected)
    why = (
        f"stopped after {elapsed_s:.0f} s: at {rate * 8 / 1e6:.3g} Mbit/s the remaining "
        f"{remaining / MIB:.3g} MiB need {need:.0f} s (at {MARGIN:g}x that rate "
        f"{need / MARGIN:.0f} s), past the {timeout_s:.0f} s timeout"
    )
    return Verdict(True, rate, projected, why)


class Unwatchable(Exception):
    """The copy's progress cannot be read on this node (the copy then runs to its time-out)."""


def copy_device(node: Node, addr: str) -> str:
    """The interface the node sends to `addr` by (`ip -j route get`)."""
    cp = node.run(["ip", "-j", "route", "get", addr.strip("[]")], check=False, timeout=30)
    try:
        return json.loads(cp.stdout)[0]["dev"]
    except (ValueError, LookupError, TypeError):
        tail = (cp.stderr or cp.stdout).strip()[-200:]
        raise Unwatchable(f"ip -j route get {addr} gave no device: {tail}") from None


def tx_bytes(node: Node, dev: str) -> int:
    path = f"/sys/class/net/{dev}/statistics/tx_bytes"
    cp = node.run(["cat", path], check=False, timeout=30)
    try:
        return int(cp.stdout.strip())
    except ValueError:
        raise Unwatchable(f"{path}: {(cp.stderr or cp.stdout).strip()[-200:]}") from None


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
) -> tuple[Invocation, Watch]:
    """Run argv like base.invoke (stdout and stderr into raw files, killed and reaped at
    `timeout`); with `enabled`, read the copy's byte counter every `poll_s` seconds into a raw
    ``<label>-progress`` file (seconds, bytes sent) and end the process when `decide` says the
    copy cannot finish."""
    argv = [str(a) for a in argv]
    watch = Watch(dev=None)
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
                # the newest sample at least WINDOW_S old opens the window
                old = [s for s in samples if s[0] <= now - WINDOW_S] or samples[:1]
                v = decide(
                    elapsed_s=now,
                    sent=sent,
                    size=size,
                    timeout_s=timeout,
                    window_bytes=sent - old[-1][1],
                    window_s=now - old[-1][0],
                )
                if v.stop:
                    watch.stopped = v
                    break
        finally:
            # only the process this call started (its Popen), ended and reaped: nothing of the
            # copy outlives the test
            _end(p)
    if watch.stopped is not None and p.returncode == 0:
        watch.stopped = None  # it finished between the last reading and the signal
    files_inv = collected(argv, p.returncode, out_path, err_path, timed_out, time.monotonic() - t0)
    if prog_path is not None and prog_path.exists():
        files_inv.raw_files.append(prog_path)
    return files_inv, watch
