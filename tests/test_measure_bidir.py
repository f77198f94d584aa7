"""tcp/udp `bidir` and `streams` (issue 33): the command built, the parsing of real iperf3 --bidir
documents (tests/data/iperf3_*_bidir_p2.json, captured with the server's egress limited to
40 Mbit/s so the two directions differ), one record per direction through results.csv, the
report and `lab check`, and the plan digest of plans written before the options."""

from __future__ import annotations

import json
import pytest

from lab.campaign.load import load_plan
from lab.core.errors import ConfigError
from lab.measure import TESTS
from lab.measure.iperf3 import client_argv
from lab.measure.iperf3json import parse_iperf3_tcp, parse_iperf3_udp, records_of
from lab.results.doc import Doc
from lab.results.expect import parse_expectations
from lab.results.verdicts import judge
from lab.results.report import _results_tables
from lab.results.columns import COLUMN_NAMES, SUMMARY_METRICS
from lab.results.rundir import rows
from tests.test_measure_commands import golden, make, run

C2S, S2C = "client-to-server", "server-to-client"


# --- the command ------------------------------------------------------------------------------


def test_bidir_flag_and_streams():
    argv = client_argv("198.18.0.2", 5201, duration=2, streams=2, bidir=True)
    assert argv[-3:] == ["-P", "2", "--bidir"] and "-R" not in argv
    assert "--bidir" not in client_argv("198.18.0.2", 5201, duration=2)


def test_tcp_bidir_runs_one_client_and_returns_a_record_per_direction(tmp_path):
    ctx, client, server = make(tmp_path, lambda a: (golden("iperf3_tcp_bidir_p2.json"), "", 0))
    recs = run("tcp", ctx, duration_s=2, streams=2, bidir=True)
    assert client.popened == [
        ["iperf3", "-c", "198.18.0.2", "-p", "5201", "-J", "-i", "1", "-t", "2", "-P", "2",
         "--bidir"]
    ]  # fmt: skip
    assert len(server.spawned) == 1 and server.stopped == ["iperf3-server-5201"]
    assert [r["direction"] for r in recs] == [C2S, S2C]
    assert all(r["ok"] and r["bidir"] and r["streams"] == 2 for r in recs)
    # each direction's own receiver rate, and packets/s from it
    assert recs[0]["receiver_bps"] == pytest.approx(217468709.08968216)
    assert recs[1]["receiver_bps"] == pytest.approx(38106386.945687845)
    assert recs[1]["packets_per_s"] == pytest.approx(38106386.945687845 / 8 / 1448)
    assert recs[0]["raw_files"] == recs[1]["raw_files"]


def test_udp_bidir_rate_is_the_total_of_the_streams(tmp_path):
    ctx, client, _ = make(tmp_path, lambda a: (golden("iperf3_udp_bidir_p2.json"), "", 0))
    recs = run("udp", ctx, rate_mbit=60, size=1300, duration_s=2, streams=2, bidir=True)
    [argv] = client.popened
    assert argv[argv.index("-b") + 1] == "30000000"  # iperf3's -b is per stream
    assert {"-P", "2", "--bidir", "-u"} <= set(argv)
    assert [r["direction"] for r in recs] == [C2S, S2C]
    assert [r["target_pps"] for r in recs] == [pytest.approx(60e6 / 8 / 1300)] * 2
    assert recs[0]["loss_pct"] == 0 and recs[1]["loss_pct"] == pytest.approx(100 * 4056 / 11518)


def test_udp_streams_without_bidir_split_the_rate(tmp_path):
    ctx, client, _ = make(tmp_path, lambda a: (golden("iperf3_udp_400m_1300.json"), "", 0))
    [r] = run("udp", ctx, rate_mbit=400, streams=4)
    [argv] = client.popened
    assert argv[argv.index("-b") + 1] == "100000000" and argv[argv.index("-P") + 1] == "4"
    assert "--bidir" not in argv and "bidir" not in r


@pytest.mark.parametrize("name", ["tcp", "udp"])
def test_a_failed_bidir_test_fails_both_directions(tmp_path, name):
    ctx, _, server = make(tmp_path, lambda a: (golden("iperf3_connection_refused.json"), "", 0))
    recs = run(name, ctx, duration_s=1, bidir=True)
    assert [(r["ok"], r["direction"]) for r in recs] == [(False, C2S), (False, S2C)]
    assert all("Connection refused" in r["error"] for r in recs)
    assert server.stopped


# --- parsing real --bidir documents -------------------------------------------------------------


def test_tcp_bidir_document_per_direction():
    fwd, rev = records_of(parse_iperf3_tcp(golden("iperf3_tcp_bidir_p2.json")))
    assert (fwd["direction"], rev["direction"]) == (C2S, S2C)
    # end.sum_sent / sum_received, and the *_bidir_reverse pair
    assert fwd["sender_bps"] == pytest.approx(240635077.38828233)
    assert fwd["receiver_bytes"] == 54382536 and fwd["retransmits"] == 0
    assert rev["sender_bps"] == pytest.approx(45024554.16179818)
    assert rev["receiver_bytes"] == 9529288
    assert rev["retransmits"] == 2145  # the server sent: its retransmits, through the tbf
    # streams assigned by who sent them; per direction they add up to the direction's sums
    for m, sockets in ((fwd, [5, 7]), (rev, [9, 12])):
        assert [s["socket"] for s in m["per_stream"]] == sockets and m["streams"] == 2
        assert sum(s["receiver_bytes"] for s in m["per_stream"]) == m["receiver_bytes"]
        assert sum(s["retransmits"] for s in m["per_stream"]) == m["retransmits"]
    # per-second series: intervals[].sum one way, sum_bidir_reverse the other
    assert fwd["intervals"][0]["bps"] == pytest.approx(335093269.5426857)
    assert rev["intervals"][0]["bps"] == pytest.approx(38130677.935220346)
    assert len(fwd["intervals"]) == len(rev["intervals"]) == 2
    assert fwd["cpu_client_pct"] == rev["cpu_client_pct"]  # the whole test's


def test_udp_bidir_document_loss_and_jitter_per_direction():
    fwd, rev = records_of(parse_iperf3_udp(golden("iperf3_udp_bidir_p2.json")))
    assert (fwd["direction"], rev["direction"]) == (C2S, S2C)
    assert (fwd["packets_sent"], fwd["packets_lost"]) == (11534, 0)
    assert (rev["packets_sent"], rev["packets_lost"]) == (11518, 4056)
    assert fwd["jitter_ms"] == pytest.approx(0.01087097893726483)
    assert rev["jitter_ms"] == pytest.approx(0.4849690365841326)
    assert rev["receiver_bps"] == pytest.approx(38796890.8415005)
    assert [s["packets_lost"] for s in rev["per_stream"]] == [1723, 2333]
    assert [s["packets_lost"] for s in fwd["per_stream"]] == [0, 0]
    assert rev["intervals"][0]["bps"] < fwd["intervals"][0]["bps"]


def test_one_way_documents_have_no_reverse():
    m = parse_iperf3_tcp(golden("iperf3_tcp_s2c_p2.json"))  # -R -P 2: both streams the server's
    assert "reverse" not in m and "bidir" not in m
    assert m["direction"] == S2C and [s["socket"] for s in m["per_stream"]] == [5, 7]
    assert sum(s["retransmits"] for s in m["per_stream"]) == m["retransmits"] == 43146


def test_streams_without_a_sender_flag_all_count():
    """iperf3 < 3.10 (Debian 11's 3.9 on boards) has no `sender` in end.streams."""
    doc = json.loads(golden("iperf3_udp_1m_256.json"))
    for s in doc["end"]["streams"]:
        s["udp"].pop("sender")
    m = parse_iperf3_udp(json.dumps(doc))
    assert m["streams"] == 1 and m["per_stream"][0]["packets_sent"] == 977


# --- results.csv, report, lab check -------------------------------------------------------------


def _line(test: str, recs: list[dict], rep: int, label: str = "bi") -> dict:
    return {
        "case": f"baseline|none|{label}|{rep}",
        "profile": "baseline",
        "test": test,
        "label": label,
        "rep": rep,
        "ok": True,
        "impairment": {"name": "none", "spec": ""},
        "records": recs,
    }


def _table(name: str, fixture: str, reps: int = 2) -> list[dict]:
    """results.csv rows of `reps` repetitions that each measured the fixture."""
    t = TESTS[name]
    parse = parse_iperf3_tcp if name == "tcp" else parse_iperf3_udp
    out = []
    for rep in range(reps):
        recs = [t.record(**m) for m in records_of(parse(golden(fixture)))]
        out.append(_line(name, recs, rep))
    return rows("run", out)


def test_results_csv_has_a_row_per_direction():
    table = _table("tcp", "iperf3_tcp_bidir_p2.json")
    assert "streams" in COLUMN_NAMES and "streams" not in SUMMARY_METRICS
    assert [(r["point"], r["direction"], r["streams"]) for r in table[:2]] == [
        (0, C2S, 2.0),
        (1, S2C, 2.0),
    ]
    assert table[0]["throughput_bps"] == pytest.approx(217468709.08968216)
    assert table[1]["throughput_bps"] == pytest.approx(38106386.945687845)
    assert table[1]["retransmits"] == 2145


def test_report_names_the_directions():
    plan = {"tests": [{"label": "bi", "test": "tcp"}]}
    doc = Doc("r")
    _results_tables(doc, _table("tcp", "iperf3_tcp_bidir_p2.json"), ["baseline"], ["none"],
                    ["bi"], plan, {}, {})  # fmt: skip
    text = doc.markdown()
    assert "**bi** (tcp, client-to-server)" in text and "**bi** (tcp, server-to-client)" in text
    assert "| baseline | 217 ± 0 (n=2) |" in text and "| baseline | 38.1 ± 0 (n=2) |" in text

    plan = {"tests": [{"label": "bi", "test": "udp"}]}
    doc = Doc("r")
    _results_tables(doc, _table("udp", "iperf3_udp_bidir_p2.json"), ["baseline"], ["none"],
                    ["bi"], plan, {}, {})  # fmt: skip
    lines = [ln for ln in doc.markdown().splitlines() if ln.startswith("| baseline")]
    assert [ln.split("|")[3].strip() for ln in lines] == [C2S, S2C]
    assert "| 35.2 ± 0 (n=2) |" in lines[1] and "35.2" not in lines[0]  # loss one way only


def test_lab_check_judges_and_names_each_direction():
    table = _table("tcp", "iperf3_tcp_bidir_p2.json")
    kw = dict(source="plan.toml", profiles=["baseline"], points=["none"], tests={"bi": "tcp"})
    both = parse_expectations([{"test": "bi", "that": "throughput_bps >= 100 Mbit/s"}], **kw)
    verdicts = [v for v in judge(both, table) if v.kind == "bound"]
    assert [(v.case, v.status) for v in verdicts] == [
        (f"none/bi {C2S}", "pass"),
        (f"none/bi {S2C}", "fail"),
    ]
    one = parse_expectations(
        [{"test": "bi", "direction": S2C, "that": "throughput_bps >= 30 Mbit/s"}], **kw
    )
    [v] = [v for v in judge(one, table) if v.kind == "bound"]
    assert (v.case, v.status) == (f"none/bi {S2C}", "pass")
    with pytest.raises(ConfigError) as e:
        parse_expectations([{"direction": "in", "that": "throughput_bps >= 1"}], **kw)
    assert "expect[0].direction" in str(e.value) and "server-to-client" in str(e.value)


# --- plans ------------------------------------------------------------------------------------


PLAN = """
name = "bidir"
profiles = ["baseline"]
impairments = ["none"]
reps = 1
[topology]
file = "topologies/pi_pair.py"
[[tests]]
test = "tcp"
duration_s = 2
{tcp}
[[tests]]
test = "udp"
{udp}
[[tests]]
test = "contention"
args = {{ test = "tcp", params = {{ duration_s = 2 {inner} }} }}
"""


def _plan(tmp_path, name, tcp="", udp="", inner=""):
    path = tmp_path / f"{name}.toml"
    path.write_text(PLAN.format(tcp=tcp, udp=udp, inner=inner))
    return load_plan(path)


def test_options_at_their_defaults_keep_a_plans_digest(tmp_path):
    before = _plan(tmp_path, "a")
    same = _plan(tmp_path, "b", "bidir = false", "bidir = false\nstreams = 1", ", bidir = false")
    assert before.digest() == same.digest()
    assert before.digest() != _plan(tmp_path, "c", "bidir = true").digest()
    assert before.digest() != _plan(tmp_path, "d", udp="streams = 2").digest()
    assert before.digest() != _plan(tmp_path, "e", inner=", bidir = true").digest()


def test_plan_rejects_bidir_with_adaptive_naming_file_and_field(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(PLAN.format(tcp="bidir = true", udp="", inner="") + "\n")
    raw = path.read_text().replace("reps = 1", "reps = 1\nadaptive = true")
    path.write_text(raw)
    with pytest.raises(ConfigError) as e:
        load_plan(path)
    msg = str(e.value)
    assert str(path) in msg and "tests[0]" in msg and "adaptive" in msg
    assert "accepted: adaptive = false on this test" in msg
    path.write_text(raw.replace("bidir = true", "bidir = true\nadaptive = false"))
    assert load_plan(path).tests[0].params["bidir"] is True
