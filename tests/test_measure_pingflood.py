"""ping-flood: the parser on real ``ping -f -q`` output (tests/data/pingflood_*.txt, iputils
20221126 between two namespaces joined by a veth), the command it runs (fake node), and (root)
a real run through a tiny plan that lands in results.csv's own columns."""

from __future__ import annotations

import os

import pandas as pd
import pytest

from lab.core import proc
from lab.measure import TESTS
from lab.measure.base import MeasurementFailed
from lab.measure.pingflood import parse_ping_flood, ping_flood_argv
from lab.results.columns import COLUMN_NAMES

from .conftest import lab_traces
from .test_measure_commands import golden, make, run

# --- parser ---------------------------------------------------------------------------------


def test_flood_ipv4_ok():
    m = parse_ping_flood(golden("pingflood_ipv4_ok.txt"))
    assert (m["transmitted"], m["received"], m["loss_pct"]) == (1000, 1000, 0.0)
    assert (m["rtt_min_ms"], m["rtt_avg_ms"], m["rtt_max_ms"], m["rtt_mdev_ms"]) == (
        0.001,
        0.001,
        0.043,
        0.001,
    )
    assert (m["time_ms"], m["ipg_ms"], m["ewma_ms"], m["pipe"]) == (2.0, 0.002, 0.002, None)


def test_flood_ipv6_ok():
    m = parse_ping_flood(golden("pingflood_ipv6_ok.txt"))
    assert (m["transmitted"], m["received"], m["time_ms"]) == (1000, 1000, 5.0)
    assert m["rtt_max_ms"] == 0.051 and m["ipg_ms"] == 0.004


def test_flood_partial_loss():
    """The server rate-limited its echo replies (icmp_ratemask) during the capture."""
    m = parse_ping_flood(golden("pingflood_ipv4_partial_loss.txt"))
    assert (m["transmitted"], m["received"]) == (300, 139)
    assert m["loss_pct"] == pytest.approx(53.6667)
    assert (m["rtt_avg_ms"], m["rtt_max_ms"], m["time_ms"]) == (0.037, 0.061, 2670.0)


def test_flood_total_loss():
    """An address on the link nobody has: errors, no RTT line, ping's pipe count."""
    m = parse_ping_flood(golden("pingflood_ipv4_total_loss.txt"))
    assert (m["transmitted"], m["received"], m["errors"], m["loss_pct"]) == (50, 0, 12, 100.0)
    assert m["rtt_avg_ms"] is None and m["ipg_ms"] is None
    assert (m["time_ms"], m["pipe"]) == (2477.0, 50)


def test_flood_without_summary_is_a_measurement_failure():
    text = "ping: cannot flood; minimal interval allowed for user is 2ms\n"
    with pytest.raises(MeasurementFailed, match="no statistics line"):
        parse_ping_flood(text)


# --- what it runs ---------------------------------------------------------------------------


def test_flood_command_and_record(tmp_path):
    ctx, client, server = make(
        tmp_path, lambda a: (golden("pingflood_ipv4_partial_loss.txt"), "", 0)
    )
    [r] = run("ping-flood", ctx, count=300, size=100, reply_timeout_s=1)
    assert client.popened == [
        ["ping", "-n", "-q", "-f", "-4", "-c", "300", "-s", "100", "-W", "1", "198.18.0.2"]
    ]
    assert server.spawned == [] and server.ran == []
    assert r["ok"] and r["test"] == "ping-flood"
    assert (r["transmitted"], r["received"], r["size"], r["family"]) == (300, 139, 100, 4)
    assert ping_flood_argv("[2001:2::2]", count=5, size=56, reply_timeout_s=2)[4:5] == ["-6"]


def test_flood_without_replies_is_a_failed_record(tmp_path):
    ctx, _client, _server = make(
        tmp_path, lambda a: (golden("pingflood_ipv4_total_loss.txt"), "", 1)
    )
    [r] = run("ping-flood", ctx, count=50)
    assert not r["ok"] and r["error"] == "no echo reply (50 sent)"


def test_flood_refused_by_ping_is_a_failed_record(tmp_path):
    refusal = "ping: cannot flood; minimal interval allowed for user is 2ms\n"
    ctx, _client, _server = make(tmp_path, lambda a: ("", refusal, 2))
    [r] = run("ping-flood", ctx, count=10)
    assert not r["ok"] and "cannot flood" in r["error"]


def test_flood_columns_in_results_csv():
    t = TESTS["ping-flood"]
    assert t.primary.column == "rtt_avg_ms" and not t.primary.higher_is_better
    assert {"echo_requests", "echo_replies", "flood_time_ms"} <= set(COLUMN_NAMES)
    assert COLUMN_NAMES.index("echo_requests") > COLUMN_NAMES.index("throttled")


# --- for real (root) ------------------------------------------------------------------------

TINY = """
name = "tiny-flood"
profiles = ["baseline"]
impairments = ["none"]
reps = 2
[topology]
file = "topologies/pi_pair.py"
cpu = 0.5
[[tests]]
test = "ping-flood"
count = 200
[[tests]]
test = "ping-flood"
name = "flood6"
ip = 6
count = 50
size = 1000
"""


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root for the lab and ping -f")
@pytest.mark.skipif(not proc.which("ping"), reason="needs iputils ping")
def test_flood_runs_through_a_tiny_plan(tmp_path):
    from lab.campaign.load import load_plan
    from lab.results.report import generate
    from lab.campaign.runner import Runner
    from lab.campaign.setup import create_run_dir

    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    plan = load_plan(path)
    run = create_run_dir(plan, tmp_path / "run")
    counts = Runner(plan, run).execute()
    assert counts == {"ok": 4, "failed": 0, "skipped": 0}
    generate(run.path)
    df = pd.read_csv(run.file("results.csv"))
    assert list(df.columns) == COLUMN_NAMES and len(df) == 4 and df.ok.all()
    assert set(df.test) == {"ping-flood"}
    for label, count in (("ping-flood", 200), ("flood6", 50)):
        rows = df[df.test_label == label]
        assert list(rows.echo_requests) == [count, count]  # ping sent exactly what was asked
        assert (rows.echo_replies >= 1).all() and (rows.echo_replies <= count).all()
        lost = 100 * (rows.echo_requests - rows.echo_replies) / rows.echo_requests
        assert list(rows.loss_pct) == pytest.approx(list(lost), abs=1e-3)
        assert (rows.rtt_avg_ms <= rows.rtt_max_ms).all() and rows.flood_time_ms.notna().all()
    assert set(df[df.test_label == "flood6"].ip) == {6}
    assert set(df[df.test_label == "flood6"]["size"]) == {1000.0}
    summary = pd.read_csv(run.file("summary.csv"))
    assert {"echo_requests", "echo_replies", "flood_time_ms", "rtt_avg_ms"} <= set(
        summary[summary.test == "ping-flood"].metric
    )
    md = run.file("report.md").read_text()
    assert "**ping-flood** (ping-flood): mean RTT (ms)" in md
    # ping -f really ran, in flood mode, in the client node
    raw = next((run.path / "raw").rglob("*-ping-flood.txt")).read_text()
    assert "packets transmitted" in raw and "ipg/ewma" in raw
    for lab_id in {e["lab_id"] for e in run.load_timeline() if e.get("lab_id")}:
        assert not lab_traces(lab_id), lab_traces(lab_id)
