"""iperf3 UDP under loss (issue 33): a lost stream set-up datagram is tried again on a fresh
connection, a bounded number of times and counted in the record; nothing else is retried; a
client still running past its time-out waits on while its receiver still receives (a backlog
draining) and, killed, says so. Fake nodes answer with recorded iperf3 output: no root, no
network (the real set-up loss: tests/test_measure_integration.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from lab.measure import TESTS, Context, iperf3
from lab.measure.base import MeasurementFailed, invoke
from lab.measure.iperf3 import client_call, run_client
from lab.measure.iperf3loss import UDP_SETUP_ATTEMPTS, setup_lost, udp_in_datagrams
from tests.test_measure_commands import FakeNode, golden

LOST = "iperf3_udp_setup_lost.json"  # iperf3 3.12's client, its set-up reply lost (study A)
GOOD = "iperf3_udp_1m_256.json"
UDP_CALL = client_call("198.18.0.2", 5201, duration=2, udp=True, rate_bps=1e6, length=256)


def run_udp(tmp_path, answers: list[str], **params):
    client, server = FakeNode("client", lambda a: (answers.pop(0), "", 0)), FakeNode("server")
    ctx = Context(client, server, "198.18.0.2", tmp_path / "raw", timeout_s=5)
    t = TESTS["udp"]
    [rec] = t.run(ctx, t.validate({"duration_s": 1, "size": 256, **params}, source="test"))
    return rec, client


# --- which failure is a lost set-up -------------------------------------------------------


def test_a_lost_setup_is_the_stream_read_error_before_any_interval():
    doc = json.loads(golden(LOST))
    assert setup_lost(True, doc)
    assert not setup_lost(False, doc)  # a TCP stream is set up by TCP, which retransmits
    # the same error once data flowed is a failure of the run, not of its set-up
    ran = json.loads(golden(GOOD))
    assert not setup_lost(True, {**ran, "error": doc["error"]})
    assert not setup_lost(True, json.loads(golden("iperf3_connection_refused.json")))
    assert not setup_lost(True, {**doc, "error": "unable to write to stream socket: x"})
    assert not setup_lost(True, ran)


# --- bounded retry --------------------------------------------------------------------------


def test_lost_setups_are_tried_again_and_counted(tmp_path):
    rec, client = run_udp(tmp_path, [golden(LOST), golden(LOST), golden(GOOD)])
    assert rec["ok"], rec["error"]
    assert rec["setup_retries"] == 2
    assert len(client.popened) == 3 and client.popened[0] == client.popened[2]
    # server log + the three attempts, the lost ones kept as evidence
    jsons = [Path(f) for f in rec["raw_files"] if f.endswith(".json")]
    assert [("stream socket" in f.read_text()) for f in jsons] == [True, True, False]


def test_a_setup_lost_in_every_attempt_fails_and_says_so(tmp_path):
    rec, client = run_udp(tmp_path, [golden(LOST)] * (UDP_SETUP_ATTEMPTS + 1))
    assert not rec["ok"]
    assert len(client.popened) == UDP_SETUP_ATTEMPTS
    assert "unable to read from stream socket" in rec["error"]
    assert f"all {UDP_SETUP_ATTEMPTS} attempts" in rec["error"]
    assert rec["setup_retries"] == UDP_SETUP_ATTEMPTS - 1


def test_a_run_without_loss_records_no_retry(tmp_path):
    rec, client = run_udp(tmp_path, [golden(GOOD)])
    assert rec["ok"] and rec["setup_retries"] == 0 and len(client.popened) == 1


@pytest.mark.parametrize(
    "answer",
    [
        golden("iperf3_connection_refused.json"),
        # the stream read error after intervals: data flowed, the run itself failed
        json.dumps({**json.loads(golden(GOOD)), "error": json.loads(golden(LOST))["error"]}),
    ],
    ids=["refused", "read-error-after-data"],
)
def test_other_failures_are_not_retried(tmp_path, answer):
    rec, client = run_udp(tmp_path, [answer, golden(GOOD)])
    assert not rec["ok"] and len(client.popened) == 1 and rec["setup_retries"] == 0


# --- a client outliving its time-out ----------------------------------------------------------

SNMP = """Ip: Forwarding DefaultTTL
Ip: 1 64
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors
Udp: {n} 3 0 7 0 0
UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors
UdpLite: 900 0 0 0 0 0
Udp6InDatagrams                 \t{m}
Udp6NoPorts                     \t4
"""


def test_udp_in_datagrams_adds_both_families_and_ignores_udplite():
    assert udp_in_datagrams(SNMP.format(n=120, m=5)) == 125
    assert udp_in_datagrams(SNMP.format(n=120, m=5).split("Udp6")[0]) == 120
    assert udp_in_datagrams("") is None


class SlowClient(FakeNode):
    """A client whose iperf3 runs `seconds` and prints nothing; the receiving node's UDP
    counters come from `counts` (one per read; the last repeats)."""

    def __init__(self, name, seconds=30.0, counts=()):
        super().__init__(name)
        self.seconds, self.counts = seconds, list(counts)

    def popen(self, argv, *, stdout=None, stderr=None, env=None):
        self.popened.append(list(argv))
        return subprocess.Popen(["sleep", str(self.seconds)], stdout=stdout, stderr=stderr)

    def run(self, argv, *, check=True, timeout=60, input=None, env=None):
        if argv[:2] != ["cat", "/proc/net/snmp"]:
            return super().run(argv, check=check, timeout=timeout)
        n = self.counts.pop(0) if len(self.counts) > 1 else self.counts[0]
        return subprocess.CompletedProcess(argv, 0, SNMP.format(n=n, m=0), "")


def test_a_client_still_delivering_is_waited_for(tmp_path):
    node = SlowClient("client", seconds=0.6)
    ctx = Context(node, node, "198.18.0.2", tmp_path / "raw", timeout_s=5)
    calls = []

    def moving():
        calls.append(1)
        return True

    inv = invoke(
        ctx, node, ["x"], label="c", timeout=0.2, progress=moving, max_timeout=5, step_s=0.1
    )
    assert not inv.timed_out and inv.returncode == 0 and calls


def test_a_client_whose_receiver_stopped_is_killed(tmp_path):
    node = SlowClient("client", seconds=30)
    ctx = Context(node, node, "198.18.0.2", tmp_path / "raw", timeout_s=5)
    answers = [True, True, False, True]
    inv = invoke(
        ctx, node, ["x"], label="c", timeout=0.1, progress=lambda: answers.pop(0), step_s=0.05,
        max_timeout=20,
    )  # fmt: skip
    assert inv.timed_out and answers == [True]  # asked three times, killed on the first "no"
    inv = invoke(ctx, node, ["x"], label="c", timeout=0.1, progress=lambda: True, max_timeout=0.4)
    assert inv.timed_out  # never past max_timeout, however long the receiver receives


def kill_message(tmp_path, monkeypatch, counts) -> str:
    monkeypatch.setattr(iperf3, "UDP_SETUP_WAIT_S", 0.0)
    monkeypatch.setattr(iperf3, "DRAIN_FACTOR", 1.0)
    client, server = SlowClient("client"), SlowClient("server", counts=counts)
    ctx = Context(client, server, "198.18.0.2", tmp_path / "raw", timeout_s=0.2)
    with pytest.raises(MeasurementFailed) as e:
        run_client(ctx, UDP_CALL, expected_s=0.2, label="iperf3-udp", files=[])
    return str(e.value)


def test_the_setup_watch_looks_for_the_stream_sockets_at_the_port_it_is_given(
    tmp_path, monkeypatch
):
    # a UDP client at a port of its own: while it runs (1.2 s, the watch asked every 0.5 s)
    # the client's sockets connected to that port are what is looked for
    monkeypatch.setattr(iperf3, "UDP_SETUP_WAIT_S", 0.0)
    monkeypatch.setattr(iperf3, "DRAIN_FACTOR", 1.0)
    client, server = SlowClient("client"), SlowClient("server", counts=[500])
    ctx = Context(client, server, "198.18.0.2", tmp_path / "raw", timeout_s=0.2)
    call = client_call("198.18.0.2", 5300, duration=1, udp=True, rate_bps=1e6, length=256)
    assert (call.port, call.udp, call.reverse) == (5300, True, False)
    with pytest.raises(MeasurementFailed, match="timed out"):
        run_client(ctx, call, expected_s=1.0, label="iperf3-udp", files=[])
    asked = [a for a in client.ran if a[0] == "ss"]
    assert asked and all(a == ["ss", "-Hun", "dport = :5300"] for a in asked)


def test_killed_while_the_receiver_still_receives_names_the_backlog(tmp_path, monkeypatch):
    msg = kill_message(tmp_path, monkeypatch, counts=range(0, 10**6, 1000))
    assert "timed out" in msg and "server still received datagrams" in msg
    assert "backlog" in msg


def test_killed_with_an_idle_receiver_is_a_plain_time_out(tmp_path, monkeypatch):
    msg = kill_message(tmp_path, monkeypatch, counts=[500])
    assert "timed out" in msg and "backlog" not in msg


# --- a lost set-up told early ---------------------------------------------------------------


class Scripted(FakeNode):
    """`ss` answers with the next number of stream sockets, `cat` with the next counters."""

    def __init__(self, name, sockets=(), datagrams=()):
        super().__init__(name)
        self.sockets, self.datagrams = list(sockets), list(datagrams)

    def run(self, argv, *, check=True, timeout=60, input=None, env=None):
        self.ran.append(list(argv))
        if argv[0] == "ss":
            out = "ESTAB 0 0 198.18.0.1:40000 198.18.0.2:5201\n" * self.sockets.pop(0)
        else:
            out = SNMP.format(n=self.datagrams.pop(0), m=0)
        return subprocess.CompletedProcess(argv, 0, out, "")


def test_setup_watch_stalls_only_once_streams_exist_and_nothing_arrives():
    from lab.measure.iperf3loss import SetupWatch

    client = Scripted("client", sockets=[0, 0, 1, 1, 1])
    server = Scripted("server", datagrams=[100, 101, 103])
    watch = SetupWatch(client, server, 5201, stall_s=0.0)
    assert [watch(), watch()] == [False, False]  # control connection still being set up
    assert watch() is False  # the stream appears: its set-up starts now
    assert watch() is True and watch() is True  # 1, then 3 datagrams: no stream data
    assert ["ss", "-Hun", "dport = :5201"] in client.ran


def test_setup_watch_lets_flowing_data_be_and_stops_reading():
    from lab.measure.iperf3loss import SetupWatch

    client = Scripted("client", sockets=[1, 1])
    server = Scripted("server", datagrams=[100, 100 + 10])
    watch = SetupWatch(client, server, 5201, stall_s=0.0)
    assert [watch(), watch()] == [False, False]
    ran = len(client.ran) + len(server.ran)
    assert [watch() for _ in range(3)] == [False] * 3
    assert len(client.ran) + len(server.ran) == ran  # done: nothing more is read


def test_setup_watch_restarts_its_clock_for_each_new_stream():
    from lab.measure.iperf3loss import SetupWatch

    client = Scripted("client", sockets=[1, 2, 2])
    server = Scripted("server", datagrams=[5, 6, 6])
    watch = SetupWatch(client, server, 5201, stall_s=3600.0)
    assert [watch(), watch(), watch()] == [False, False, False]  # within stall_s of stream 2
    assert watch.sockets == 2


def test_invoke_ends_a_stalled_process_with_sigint(tmp_path):
    class Sleeper(FakeNode):
        def popen(self, argv, *, stdout=None, stderr=None, env=None):
            script = "trap 'kill $!; echo interrupted; exit 1' INT; sleep 60 & wait"
            return subprocess.Popen(["sh", "-c", script], stdout=stdout, stderr=stderr)

    node = Sleeper("client")
    ctx = Context(node, FakeNode("server"), "198.18.0.2", tmp_path / "raw", timeout_s=5)
    calls = []
    inv = invoke(
        ctx, node, ["x"], label="t", timeout=60, stall=lambda: calls.append(1) or len(calls) >= 2
    )
    assert inv.stalled and not inv.timed_out
    assert "interrupted" in inv.stdout and len(calls) == 2
    assert inv.seconds < 30
