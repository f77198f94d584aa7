"""scp that stops as it streams (adaptive; lab.measure.progress.Stream), on hand-made readings
and on a fake node whose received file grows at a set rate. The real copy: tests/test_scp_early.py."""

from __future__ import annotations

import random
import time

import pytest

from lab.measure import Context, get_test, progress
from lab.measure.progress import CARD_SHARE, MIB, Stream, Unwatchable, file_bytes
from lab.model.stoprule import Rule
from tests.fakenode import RecordingNode
from tests.test_scp_early import CountingNode

RULE = Rule(rel_half_width=0.05, min_s=10.0)


def _feed(stream: Stream, rate: float, seconds: int, wobble: float = 0.0) -> int | None:
    """Readings once a second of a file growing at `rate` bytes/s (each second's rate
    uniform within +- wobble of it, seeded); the second at which the stream said stop, else
    None."""
    rnd = random.Random(7)
    got = 0.0
    for t in range(1, seconds + 1):
        got += rate * (1 + rnd.uniform(-wobble, wobble))
        stream.size_of = lambda g=got: int(g)
        if stream.read(float(t)):
            return t
    return None


def test_a_steady_copy_stops_after_the_minimum_and_projects_the_rest():
    s = Stream(RULE, 256 * MIB, lambda: 0)
    at = _feed(s, 1e6, 100, wobble=0.02)
    # not before the rule's 10 measured seconds; the interval of a +-2 % series is met at once
    assert at is not None and 10 <= at <= 20
    assert s.decision is not None and s.decision.reason == "ci"
    now, got = s.samples[-1]
    assert s.projected_s() == pytest.approx(now + (256 * MIB - got) / 1e6, rel=0.01)


def test_a_copy_that_never_settles_is_not_stopped():
    s = Stream(RULE, 256 * MIB, lambda: 0)
    assert _feed(s, 1e6, 60, wobble=0.6) is None and s.decision is None


def test_a_copy_faster_than_the_card_runs_on():
    card = 21.3e6  # the pi4 profile's card, bytes/s
    fast = Stream(RULE, 256 * MIB, lambda: 0, card_Bps=card)
    assert _feed(fast, CARD_SHARE * card * 1.05, 40) is None
    assert fast.held_by_card > 0 and fast.decision is None
    slow = Stream(RULE, 256 * MIB, lambda: 0, card_Bps=card)
    assert _feed(slow, CARD_SHARE * card * 0.9, 40) is not None and slow.held_by_card == 0


def test_file_bytes():
    node = RecordingNode(
        {
            ("stat", "-c", "%s", "/d/a"): (0, "1234\n", ""),
            ("stat", "-c", "%s", "/d/b"): (1, "", "stat: cannot stat '/d/b': No such file or directory"),
            ("stat", "-c", "%s", "/d/c"): (1, "", "stat: cannot stat '/d/c': Permission denied"),
        }
    )  # fmt: skip
    assert file_bytes(node, "/d/a") == 1234
    assert file_bytes(node, "/d/b") == 0  # not created yet
    with pytest.raises(Unwatchable, match="Permission denied"):
        file_bytes(node, "/d/c")


class GrowingNode(CountingNode):
    """CountingNode whose received file (stat) grows at `bps` bytes/s too."""

    def __init__(self, bps: float):
        super().__init__(bps)
        start = time.monotonic()
        self.answers[("stat", "-c", "%s")] = lambda argv: (
            0,
            f"{int(bps * (time.monotonic() - start))}\n",
            "",
        )


def test_the_watcher_ends_a_streamed_copy_and_keeps_its_readings(tmp_path, monkeypatch):
    monkeypatch.setattr(progress, "STREAM_POLL_S", 0.1)
    monkeypatch.setattr(progress, "TERM_GRACE_S", 0.5)
    node = GrowingNode(1e6)
    ctx = Context(node, node, "198.18.0.2", tmp_path / "raw")
    rule = Rule(rel_half_width=0.2, min_s=1.0, batch_s=0.2)
    stream = Stream(rule, 256 * MIB, lambda: file_bytes(node, "/f"))
    inv, watch = progress.watch_copy(
        ctx, node, ["sleep", "30"], label="scp", timeout=60.0, size=256 * MIB,
        addr="198.18.0.2", stream=stream,
    )  # fmt: skip
    assert watch.stream is stream and stream.decision is not None
    assert inv.returncode != 0 and not inv.timed_out  # ended by the watcher, well before 30 s
    lines = [f for f in inv.raw_files if f.name.endswith("scp-stream.txt")][0].read_text()
    assert len(lines.splitlines()) == len(stream.samples) - 1


def test_an_unreadable_file_ends_the_streaming_not_the_copy(tmp_path, monkeypatch):
    monkeypatch.setattr(progress, "STREAM_POLL_S", 0.1)
    node = CountingNode(1e6)
    node.answers[("stat",)] = (1, "", "stat: Permission denied")
    ctx = Context(node, node, "198.18.0.2", tmp_path / "raw")
    stream = Stream(RULE, MIB, lambda: file_bytes(node, "/f"))
    inv, watch = progress.watch_copy(
        ctx, node, ["sleep", "0.5"], label="scp", timeout=5.0, size=MIB, addr="198.18.0.2",
        stream=stream,
    )  # fmt: skip
    assert inv.returncode == 0 and watch.stream is None
    assert "Permission denied" in watch.unstreamable


def test_schema_takes_the_plans_adaptive():
    scp = get_test("scp")
    p = scp.validate({}, source="t")
    assert p["adaptive"] is False and p["adaptive_min_s"] == 10.0
    assert scp.validate({"adaptive": True}, source="t")["adaptive"] is True


def _ss(cwnd: int, ssthresh: int | None = None) -> str:
    st = f" ssthresh:{ssthresh}" if ssthresh else ""
    return f"\tcubic wscale:7,7 rto:204 cwnd:{cwnd}{st} bytes_acked:{cwnd * 1000}\n"


def test_a_window_still_opening_holds_the_stop():
    # the file's rate is steady, but the sender's window grows with no congestion event:
    # a part of a cycle, which the interval alone would take
    t = [0]

    def sender():
        t[0] += 1
        return _ss(10 + 5 * t[0])

    s = Stream(RULE, 256 * MIB, lambda: 0, sender=sender)
    assert _feed(s, 1e6, 40, wobble=0.02) is None
    assert s.held_by_cycles > 0 and "congestion events of 2" in s.why["cycles"]


def test_whole_cycles_let_it_stop():
    # a congestion event every 4 s, the last one at the reading before the stop's
    t = [0]

    def sender():
        t[0] += 1
        return _ss(20 + t[0] % 4, ssthresh=100 + t[0] // 4)

    s = Stream(RULE, 256 * MIB, lambda: 0, sender=sender)
    at = _feed(s, 1e6, 60, wobble=0.02)
    assert at is not None and "3 whole congestion cycles" in s.why["cycles"]
    # the figure is whole cycles' rate: the kept rates start after the first cycle's event
    assert s.decision.warmup_samples >= 4
    assert s.why["timeouts_in_run"] is None  # no netstat lines in this sender's output


def test_at_the_cap_the_rate_reached_is_projected():
    s = Stream(RULE, 256 * MIB, lambda: 0)
    assert _feed(s, 1e6, 30, wobble=0.6) is None  # never settles at +-5 %
    s.at_cap()
    assert s.decision is not None and not s.decision.stop and s.decision.interval.rel > 0.05
    now, got = s.samples[-1]
    assert s.projected_s() == pytest.approx(now + (256 * MIB - got) / s.decision.interval.mean)


def test_at_the_cap_without_an_interval_nothing_is_projected():
    s = Stream(RULE, 256 * MIB, lambda: 0)
    _feed(s, 1e6, 2)
    s.at_cap()
    assert s.decision is None


def test_the_give_up_rule_waits_while_the_copy_streams(tmp_path, monkeypatch):
    # 1 kB/s against 1 MiB in 5 s: hopeless, which the give-up rule alone stops at its first
    # check (test_scp_early); streamed (and never settling: +-0.1 %), it runs to its cap
    monkeypatch.setattr(progress, "MIN_S", 0.5)
    monkeypatch.setattr(progress, "WINDOW_S", 0.2)
    monkeypatch.setattr(progress, "STREAM_POLL_S", 0.2)
    node = GrowingNode(1000)
    ctx = Context(node, node, "198.18.0.2", tmp_path / "raw")
    rnd, got = random.Random(5), [0]

    def erratic() -> int:  # a file growing by 0-2 kB a reading: the rule never settles
        got[0] += rnd.randint(0, 2000)
        return got[0]

    stream = Stream(Rule(rel_half_width=0.001, min_s=1.0, batch_s=0.2), MIB, erratic)
    inv, watch = progress.watch_copy(
        ctx, node, ["sleep", "30"], label="scp", timeout=2.0, size=MIB, addr="198.18.0.2",
        poll_s=0.2, stream=stream,
    )  # fmt: skip
    assert watch.stopped is None and watch.checks >= 2 and inv.timed_out
    assert watch.stream is stream and stream.decision is None


def _stepped(stream: Stream, rate: float, seconds: int, step: int) -> int | None:
    """A copy at a steady `rate` whose file grows in `step`-byte writes (sftp writes whole
    requests, up to 255 KiB) while its socket's bytes grow smoothly: the second the
    stream said stop, else None."""
    for t in range(1, seconds + 1):
        wire = int(rate * t)
        stream.size_of = lambda w=wire: w // step * step
        if stream.received is not None:
            stream.received = lambda w=wire: w + 4000  # + the SSH handshake's bytes
        if stream.read(float(t)):
            return t
    return None


def test_a_buffering_writer_is_read_at_its_socket():
    rule = Rule(rel_half_width=0.10, min_s=10.0)
    # 55 kB/s in 255 KiB writes (study A, network3): the file moves every 4.8 s, its
    # per-second rates are 0 or 4.7x
    by_file = Stream(rule, 256 * MIB, lambda: 0)
    assert _stepped(by_file, 55e3, 200, 255 * 1024) is None
    assert "file's size" in by_file.source
    by_wire = Stream(rule, 256 * MIB, lambda: 0, received=lambda: 0)
    at = _stepped(by_wire, 55e3, 200, 255 * 1024)
    assert at is not None and at <= 20
    assert "bytes_received" in by_wire.source
    assert by_wire.decision.interval.mean == pytest.approx(55e3, rel=0.01)
    # the projection takes the bytes still to come from the file, the rate from the socket
    now, got = by_wire.samples[-1]
    assert by_wire.projected_s() == pytest.approx(now + (256 * MIB - got) / 55e3, rel=0.01)


def test_a_socket_that_cannot_be_read_leaves_the_file_to_decide():
    s = Stream(RULE, 256 * MIB, lambda: 0, received=lambda: None)
    assert _feed(s, 1e6, 30, wobble=0.02) is not None
    assert s.wire is None and "file's size" in s.source
