"""Adaptive length for real (issue 17): a steady TCP stream between two uncapped namespaces
stops on the rule (or at its cap) and says why, the decision agreeing with the raw rates; ping stopped by SIGINT mid-run still reports.

The link is shaped to 100 Mbit/s with tbf on the client's egress (the client sends) so
the stream is steady whatever else this shared machine runs; the assertions re-derive the
figures from iperf3's and ping's raw output, not from the record's own report.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import statistics
from pathlib import Path

import pytest

from lab.core import proc
from lab.measure import Context, get_test
from lab.measure.adaptive import watch
from lab.measure.ping import parse_ping, parse_ping_replies, ping_argv
from tests.test_measure_integration import NetnsNode

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root for network namespaces"),
    pytest.mark.skipif(
        not all(proc.which(t) for t in ("ip", "tc", "iperf3", "ping", "ss")),
        reason="needs ip, tc, iperf3, ping, ss",
    ),
]

C4, S4 = "198.18.7.1", "198.18.7.2"
#: Student's t, two-sided 95 %, by degrees of freedom (tables; not lab.model.stoprule's own)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306}
T975.update({9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131})


@pytest.fixture
def shaped_pair():
    tag = f"adap{secrets.token_hex(3)}"
    cns, sns = f"{tag}-c", f"{tag}-s"
    created = []
    try:
        for ns in (cns, sns):
            proc.run(["ip", "netns", "add", ns])
            created.append(ns)
        proc.run(
            ["ip", "link", "add", f"{tag}-c", "netns", cns, "type", "veth"]
            + ["peer", "name", f"{tag}-s", "netns", sns]
        )
        for ns, dev, a4 in ((cns, f"{tag}-c", C4), (sns, f"{tag}-s", S4)):
            proc.run(["ip", "-n", ns, "link", "set", "lo", "up"])
            proc.run(["ip", "-n", ns, "link", "set", dev, "up"])
            proc.run(["ip", "-n", ns, "addr", "add", f"{a4}/24", "dev", dev])
        tbf = ["tc", "qdisc", "add", "dev", f"{tag}-c", "root", "tbf", "rate", "100mbit"]
        cp = proc.run(
            ["ip", "netns", "exec", cns, *tbf, "burst", "64kb", "latency", "20ms"], check=False
        )
        if cp.returncode != 0:
            pytest.skip(f"kernel lacks the tbf qdisc (sch_tbf): {cp.stderr.strip()}")
        yield NetnsNode("client", cns), NetnsNode("server", sns)
        for ns in (cns, sns):  # the tests stopped everything they started
            assert proc.run(["ip", "netns", "pids", ns]).stdout.strip() == "", ns
    finally:
        for ns in created:
            proc.run(["ip", "netns", "del", ns], check=False)


def _ctx(pair, tmp_path: Path) -> Context:
    client, server = pair
    return Context(client, server, S4, tmp_path / "raw", timeout_s=20, state_dir=tmp_path / "st")


def test_long_tcp_stops_as_it_streams_with_figures_from_both_ends_json(shaped_pair, tmp_path):
    """Issue 33 item 5: a 300-s TCP test of a steady stream ends early on the rule read from
    the receiver's bytes while it runs (lab/measure/tcpstream.py); its figures are the
    complete per-second intervals of the server's document (the receiver: the client sends)."""
    ctx = _ctx(shaped_pair, tmp_path)
    tcp = get_test("tcp")
    cap = 300.0
    params = tcp.validate(
        {"duration_s": cap, "adaptive": True, "adaptive_min_s": 4, "adaptive_rel_pct": 10},
        source="test",
    )
    (rec,) = tcp.run(ctx, params)
    assert rec["ok"], rec["error"]
    # a tbf-shaped stream is steady to far better than +-10 % in 2-s batches: the rule holds
    # long before the cap, whatever else the machine runs
    assert rec["stop_reason"] == rec["adaptive"]["reason"] == "ci"
    why = rec["adaptive"]["stopped_early_because"]
    assert rec["adaptive"]["stopped_early"] and why["requested_s"] == cap
    assert why["live_interval"]["rel"] <= 0.10
    # the sending namespace's timeout counter was read (a count, 0 or more, not None)
    assert isinstance(why["timeouts_in_run"], int) and why["timeouts_in_run"] >= 0

    # what iperf3 itself was asked and printed: -t 300, stopped by SIGINT
    (client_file,) = [f for f in rec["raw_files"] if f.endswith(".json")]
    client = json.loads(Path(client_file).read_text())
    assert client["start"]["test_start"]["duration"] == cap
    assert client["error"] == "interrupt - the client has terminated"
    # the server's first document in its log (iperf3 -s -J prints one per test, and one more
    # when it is stopped); 3.12 repeats the last interval when the client terminates: count
    # each (start, end) once, whole seconds only
    (log,) = [f for f in rec["raw_files"] if f.endswith(".log")]
    text = Path(log).read_text()
    server, _ = json.JSONDecoder().raw_decode(text, text.index("{"))
    assert server["error"] == "the client has terminated"
    ivs = {(i["sum"]["start"], i["sum"]["end"]): i["sum"]["bytes"] for i in server["intervals"]}
    full = sorted((k, b) for k, b in ivs.items() if k[1] - k[0] >= 0.9)
    assert rec["measured_s"] == pytest.approx(sum(e - s for (s, e), _ in full))
    assert 4 <= rec["measured_s"] < cap
    # the figures cover the seconds the live rule kept: iperf3's seconds before its first live
    # rate (the first reading is the byte count's origin), then the warm-up MSER-5 dropped (a
    # multiple of 5)
    drop = rec["adaptive"]["warmup_samples"]
    assert why["warmup_samples"] % 5 == 0 and why["lead_seconds"] >= 0
    assert drop == why["lead_seconds"] + why["warmup_samples"] and drop < len(full)
    kept = full[drop:]
    secs = sum(e - s for (s, e), _ in kept)
    assert rec["receiver_bps"] == pytest.approx(sum(b for _, b in kept) * 8 / secs, rel=1e-9)
    # the configuration's bound: tbf lets through 100 Mbit/s plus one 64 kB burst, on any host
    assert 0 < rec["receiver_bps"] <= 100e6 * 1.01 + 64 * 1024 * 8 / secs


def test_ping_stopped_by_sigint_prints_its_statistics(shaped_pair, tmp_path):
    """The streaming path adaptive ping uses: replies read as they arrive, SIGINT when enough
    came (here a fixed 20: the RTT of a bare veth is too noisy on a loaded 2-core machine for
    the rule to finish quickly, and the rule itself is tests/test_stoprule.py's)."""
    ctx = _ctx(shaped_pair, tmp_path)
    argv = ping_argv(S4, count=1000, interval_s=0.01)  # cap: 10 s
    inv, stopped = watch(
        ctx,
        ctx.client,
        argv,
        label="ping",
        timeout=30,
        enough=lambda text: len(parse_ping_replies(text)) >= 20,
    )
    # stopped by the rule, not by its count or the time-out (how soon moves with the host's
    # load: no wall-clock bound here)
    assert stopped and not inv.timed_out
    m = parse_ping(inv.stdout)  # raises without ping's statistics line
    replies = re.findall(r"icmp_seq=\d+ ttl=\d+ time=([\d.]+) ms", inv.stdout)
    assert 20 <= len(replies) == m["received"] < 1000
    assert m["rtt_avg_ms"] == pytest.approx(statistics.fmean(map(float, replies)), abs=0.01)
