"""rrul: the percentiles, inflation and responsiveness from recorded samples, the per-flow
figures from a recorded iperf3 --bidir document, option validation, what the test runs (fake
nodes) and one real run through a baseline pi_pair lab (root)."""

from __future__ import annotations

import json
import secrets
import statistics

import pytest

from lab.campaign.load import load_plan
from lab.core import proc
from lab.core.errors import ConfigError
from lab.measure import TESTS
from lab.measure.base import MeasurementFailed
from lab.measure.ping import parse_ping
from lab.measure.rrul import (
    PROBES,
    echoes,
    flow_series,
    flows_of,
    percentile,
    queueing_split,
    responsiveness_rpm,
    rtt_summary,
)
from lab.results.columns import COLUMN_NAMES, SUMMARY_METRICS

from .conftest import REPO, lab_traces
from .test_measure_commands import golden, make

RRUL = TESTS["rrul"]


# ------------------------------------------------------------------ the computation


def test_percentile_interpolates_between_closest_ranks():
    xs = [4.0, 1.0, 3.0, 2.0]  # sorted: 1 2 3 4
    assert percentile(xs, 50) == pytest.approx(2.5)
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 4.0
    assert percentile(xs, 90) == pytest.approx(3.7)  # position 2.7: 3 + 0.7 x (4 - 3)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def test_responsiveness_is_round_trips_per_minute_at_the_loaded_median():
    assert responsiveness_rpm(20.0) == pytest.approx(3000.0)
    assert responsiveness_rpm(0.5) == pytest.approx(120_000.0)
    assert responsiveness_rpm(None) is None and responsiveness_rpm(0.0) is None


def test_rtt_summary_from_recorded_ping_outputs():
    idle = [r["rtt_ms"] for r in parse_ping(golden("ping_ipv4_ok.txt"))["rtts"]]
    loaded = [r["rtt_ms"] for r in parse_ping(golden("ping_ipv4_partial_loss.txt"))["rtts"]]
    assert len(idle) >= 5 and len(loaded) >= 2
    s = rtt_summary(idle, loaded)
    assert s["rtt_idle_p50_ms"] == pytest.approx(statistics.median(idle))
    assert s["rtt_loaded_p50_ms"] == pytest.approx(statistics.median(loaded))
    assert s["rtt_idle_p50_ms"] <= s["rtt_idle_p90_ms"] <= s["rtt_idle_p99_ms"] <= max(idle)
    assert s["rtt_loaded_p99_ms"] <= max(loaded)
    assert s["latency_inflation_ms"] == pytest.approx(s["rtt_loaded_p50_ms"] - s["rtt_idle_p50_ms"])
    assert s["responsiveness_rpm"] == pytest.approx(60_000 / s["rtt_loaded_p50_ms"])


def test_rtt_summary_by_hand():
    s = rtt_summary([1.0, 1.0, 2.0, 2.0, 2.0], [10.0, 20.0, 30.0, 40.0, 50.0])
    assert s["rtt_idle_p50_ms"] == 2.0 and s["rtt_loaded_p50_ms"] == 30.0
    assert s["rtt_loaded_p90_ms"] == pytest.approx(46.0)  # position 3.6: 40 + 0.6 x 10
    assert s["latency_inflation_ms"] == 28.0
    assert s["responsiveness_rpm"] == pytest.approx(2000.0)
    none = rtt_summary([], [5.0])
    assert none["rtt_idle_p50_ms"] is None and none["latency_inflation_ms"] is None


def test_flows_from_a_recorded_bidir_document():
    text = golden("iperf3_tcp_bidir_p2.json")
    doc = json.loads(text)
    f = flows_of(text)
    assert [(x["direction"], x["socket"]) for x in f["flows"]] == [
        ("client-to-server", 5),
        ("client-to-server", 7),
        ("server-to-client", 9),
        ("server-to-client", 12),
    ]
    end = doc["end"]
    assert f["rrul_c2s_bps"] == end["sum_received"]["bits_per_second"]
    assert f["rrul_s2c_bps"] == end["sum_received_bidir_reverse"]["bits_per_second"]
    assert f["rrul_total_bps"] == pytest.approx(f["rrul_c2s_bps"] + f["rrul_s2c_bps"])
    by_socket = {s["sender"]["socket"]: s for s in end["streams"]}
    for flow in f["flows"]:
        assert flow["receiver_bytes"] == by_socket[flow["socket"]]["receiver"]["bytes"] > 0
        ivs = flow["intervals"]
        assert len(ivs) == len(doc["intervals"])
        first = next(s for s in doc["intervals"][0]["streams"] if s["socket"] == flow["socket"])
        assert ivs[0]["bps"] == first["bits_per_second"] and ivs[0]["end"] == first["end"]


def test_flow_series_keeps_each_socket_apart():
    doc = {
        "intervals": [
            {"streams": [{"socket": 5, "start": 0, "end": 1, "bits_per_second": 10.0},
                         {"socket": 7, "start": 0, "end": 1, "bits_per_second": 20.0}]},
            {"streams": [{"socket": 5, "start": 1, "end": 2, "bits_per_second": 11.0,
                          "omitted": True}]},
        ]
    }  # fmt: skip
    s = flow_series(doc)
    assert [iv["bps"] for iv in s[5]] == [10.0, 11.0] and s[5][1]["omitted"]
    assert [iv["bps"] for iv in s[7]] == [20.0]


def test_a_one_way_document_is_not_an_rrul_result():
    with pytest.raises(MeasurementFailed, match="one direction"):
        flows_of(golden("iperf3_tcp_c2s.json"))
    with pytest.raises(MeasurementFailed, match="server is busy"):
        flows_of(golden("iperf3_server_busy.json"))


def test_echoes_counts_the_first_at_once():
    assert echoes(3.0, 0.2) == 15 and echoes(0.1, 0.2) == 1 and echoes(4.75, 0.25) == 19


# ------------------------------------------------------------------ options


def test_defaults_are_rrul_four_and_four():
    p = RRUL.validate({}, source="t")
    assert p["flows"] == 4 and p["ping_interval_s"] == 0.2 and p["duration_s"] == 10


@pytest.mark.parametrize(
    "params, field, accepted",
    [
        ({"flows": 0}, "flows", ">= 1"),
        ({"flows": "four"}, "flows", "int"),
        ({"idle_s": 1, "ping_interval_s": 0.5}, "idle_s", "ping_interval_s <= 0.2"),
        (
            {"duration_s": 2, "ping_interval_s": 1, "idle_s": 10},
            "duration_s",
            "ping_interval_s <= 0.35",
        ),
        ({"probe": "irtt"}, "probe", "flows"),
    ],
)
def test_bad_options_name_the_field_and_what_is_accepted(params, field, accepted):
    with pytest.raises(ConfigError) as e:
        RRUL.validate(params, source="plans/x.toml: tests[0]")
    msg = str(e.value)
    assert "plans/x.toml: tests[0]" in msg and field in msg and accepted in msg, msg


def test_a_plan_with_a_bad_rrul_entry_names_file_and_entry(tmp_path):
    plan = tmp_path / "p.toml"
    plan.write_text(
        'schema = 1\nname = "r"\nprofiles = ["baseline"]\nimpairments = ["none"]\n'
        '[topology]\nfile = "topologies/pi_pair.py"\n'
        '[[tests]]\ntest = "rrul"\nflows = 200\n'
    )
    with pytest.raises(ConfigError) as e:
        load_plan(plan)
    msg = str(e.value)
    assert str(plan) in msg and "tests[0]" in msg and "flows" in msg and "64" in msg, msg


def test_the_quick_plan_runs_a_short_rrul():
    plan = load_plan("quick")
    [entry] = [t for t in plan.tests if t.test == "rrul"]
    assert entry.params["duration_s"] == 5 and entry.params["flows"] == 4


def test_columns_come_after_the_frozen_ones_and_are_summarised():
    tail = COLUMN_NAMES[COLUMN_NAMES.index("not_applicable") + 1 :]
    assert tail[:3] == ["rrul_c2s_bps", "rrul_s2c_bps", "rrul_total_bps"]
    assert "responsiveness_rpm" in tail and "rtt_loaded_p99_ms" in tail
    assert {"responsiveness_rpm", "latency_inflation_ms", "rrul_total_bps"} <= set(SUMMARY_METRICS)


# ------------------------------------------------------------------ what it runs (fake nodes)


def _responder(ping_text: str, iperf_text: str):
    def answer(argv):
        if argv[0] == "ping":
            return ping_text, "", 0
        return iperf_text, "", 0

    return answer


def test_run_pings_idle_then_loads_both_ways_and_pings_again(tmp_path):
    ctx, client, server = make(
        tmp_path, _responder(golden("ping_ipv4_ok.txt"), golden("iperf3_tcp_bidir_p2.json"))
    )
    ctx.timeout_s = 0.2  # the fake server never shows established flows: stop waiting soon
    params = RRUL.validate({"flows": 2, "duration_s": 2, "idle_s": 1}, source="t")
    [rec] = RRUL.run(ctx, params)
    assert rec["ok"], rec["error"]
    pings = [a for a in client.popened if a[0] == "ping"]
    iperfs = [a for a in client.popened if a[0] == "iperf3"]
    assert len(pings) == 2 and len(iperfs) == 1
    assert pings[0][pings[0].index("-c") + 1] == "5"  # 1 s at 0.2 s
    assert "--bidir" in iperfs[0] and iperfs[0][iperfs[0].index("-P") + 1] == "2"
    assert client.popened.index(pings[0]) < client.popened.index(iperfs[0])
    assert [n for n, _ in server.spawned] == ["iperf3-server-5201"]
    assert server.stopped == ["iperf3-server-5201"]
    assert len(rec["flows"]) == 4 and rec["rtts_idle"] and rec["rtts_loaded"]
    assert rec["probes"] == PROBES and rec["flows_each_way"] == 2
    assert rec["responsiveness_rpm"] == pytest.approx(60_000 / rec["rtt_loaded_p50_ms"])
    assert rec["rtt_loaded_loss_pct"] == 0.0


def test_queueing_split_by_hand():
    summary = rtt_summary([1.0, 1.0, 1.0], [31.0, 31.0, 31.0])  # the tunnel: +30 ms
    out = queueing_split(summary, [0.5, 0.5, 0.7], [8.5, 8.5, 9.0])  # the link: +8 ms
    assert out["link_rtt_idle_p50_ms"] == 0.5 and out["link_rtt_loaded_p50_ms"] == 8.5
    assert out["link_inflation_ms"] == 8.0 and out["vpn_inflation_ms"] == 22.0
    assert queueing_split(summary, [], [8.0])["vpn_inflation_ms"] is None


def test_with_a_link_address_both_phases_also_ping_the_underlay(tmp_path):
    ctx, client, server = make(
        tmp_path, _responder(golden("ping_ipv4_ok.txt"), golden("iperf3_tcp_bidir_p2.json"))
    )
    ctx.timeout_s = 0.2
    ctx.link_addr = "192.0.2.77"
    params = RRUL.validate({"flows": 2, "duration_s": 2, "idle_s": 1}, source="t")
    [rec] = RRUL.run(ctx, params)
    assert rec["ok"], rec["error"]
    pings = [a for a in client.popened if a[0] == "ping"]
    assert sorted(a[-1] == "192.0.2.77" for a in pings) == [False, False, True, True], pings
    # the same recorded output on both paths: neither queue adds anything over the other
    assert rec["link_inflation_ms"] == rec["latency_inflation_ms"]
    assert rec["vpn_inflation_ms"] == 0.0
    assert "192.0.2.77" in rec["link_probe"] and rec["link_rtts_loaded"]
    raws = [p.name for p in (tmp_path / "raw").iterdir()] if (tmp_path / "raw").exists() else []
    assert len(raws) == len(set(raws))


def test_without_a_link_address_there_is_no_underlay_ping(tmp_path):
    ctx, client, _ = make(
        tmp_path, _responder(golden("ping_ipv4_ok.txt"), golden("iperf3_tcp_bidir_p2.json"))
    )
    ctx.timeout_s = 0.2
    [rec] = RRUL.run(ctx, RRUL.validate({"duration_s": 2, "idle_s": 1}, source="t"))
    assert len([a for a in client.popened if a[0] == "ping"]) == 2
    assert rec["link_probe"].startswith("none") and rec.get("vpn_inflation_ms") is None


def test_no_idle_reply_is_a_failed_record_and_nothing_is_left_running(tmp_path):
    ctx, client, server = make(
        tmp_path,
        _responder(golden("ping_ipv4_total_loss.txt"), golden("iperf3_tcp_bidir_p2.json")),
    )
    [rec] = RRUL.run(ctx, RRUL.validate({"duration_s": 2, "idle_s": 1}, source="t"))
    assert not rec["ok"] and "ping-idle: no echo reply" in rec["error"]
    assert not server.spawned and rec["raw_files"]


def test_an_iperf3_error_fails_the_record_and_stops_the_server(tmp_path):
    ctx, client, server = make(
        tmp_path,
        _responder(golden("ping_ipv4_ok.txt"), golden("iperf3_connection_refused.json")),
    )
    ctx.timeout_s = 0.2
    [rec] = RRUL.run(ctx, RRUL.validate({"duration_s": 2, "idle_s": 1}, source="t"))
    assert not rec["ok"] and "iperf3" in rec["error"] and rec["rtts_idle"]
    assert server.stopped == ["iperf3-server-5201"]


# ------------------------------------------------------------------ a real run (root)


@pytest.fixture
def rrul_lab_id():
    lid = "r" + secrets.token_hex(3)
    yield lid
    from lab.core.teardown import teardown

    teardown(lid)
    assert lab_traces(lid) == []


@pytest.mark.root
@pytest.mark.skipif(
    not all(proc.which(t) for t in ("ip", "ping", "iperf3", "ss")),
    reason="needs ip, ping, iperf3 and ss (./setup.sh)",
)
def test_rrul_through_a_baseline_pi_pair(rrul_lab_id, tmp_path):
    from lab.measure import Context
    from lab.model.topology import load_topology
    from lab.substrate.local import build as labmod

    lab = labmod.up(load_topology(REPO / "topologies" / "pi_pair.py"), rrul_lab_id)
    ctx = Context(lab.node("client"), lab.node("server"), "10.0.1.2", tmp_path / "raw")
    params = RRUL.validate({"flows": 2, "duration_s": 3, "idle_s": 1}, source="t")
    [rec] = RRUL.run(ctx, params)
    assert rec["ok"], rec["error"]
    flows = rec["flows"]
    assert (
        sorted(f["direction"] for f in flows) == ["client-to-server"] * 2 + ["server-to-client"] * 2
    )
    assert all(f["receiver_bytes"] > 0 and f["intervals"] for f in flows), flows
    assert len(rec["rtts_idle"]) >= 1 and len(rec["rtts_loaded"]) >= 1
    assert rec["rtt_idle_p50_ms"] is not None and rec["rtt_loaded_p50_ms"] is not None
    assert rec["rrul_c2s_bps"] > 0 and rec["rrul_s2c_bps"] > 0


# ------------------------------------------------------------------ results, report and plots


def _line(rep: int, rec: dict, profile: str = "baseline") -> dict:
    return {
        "run": "run",
        "case": f"{profile}|none|load|{rep}",
        "profile": profile,
        "test": "rrul",
        "label": "load",
        "rep": rep,
        "ok": True,
        "impairment": {"name": "none", "spec": ""},
        "records": [rec],
    }


def _recorded(rep: int) -> dict:
    """An rrul record made of the recorded outputs: the bidir document, ping idle and loaded."""
    idle = parse_ping(golden("ping_ipv4_ok.txt"))
    loaded = parse_ping(golden("ping_ipv4_partial_loss.txt"))
    summary = rtt_summary(
        [r["rtt_ms"] for r in idle["rtts"]], [r["rtt_ms"] for r in loaded["rtts"]]
    )
    return RRUL.record(
        **flows_of(golden("iperf3_tcp_bidir_p2.json")),
        **summary,
        rtts_idle=idle["rtts"],
        rtts_loaded=loaded["rtts"] * (rep + 1),
    )


def test_results_report_and_plot_data_of_recorded_cases():
    from lab.results.doc import Doc
    from lab.results.report import _results_tables
    from lab.results.rundir import rows
    from lab.results.series import rrul_flows_over_time, rrul_rtt_cdf

    results = [_line(rep, _recorded(rep)) for rep in range(2)]
    table = rows("run", results)
    assert len(table) == 2 and table[0]["rrul_total_bps"] == pytest.approx(255575096.03537)
    end = json.loads(golden("iperf3_tcp_bidir_p2.json"))["end"]
    both = end["sum_sent"]["retransmits"] + end["sum_sent_bidir_reverse"]["retransmits"]
    assert table[0]["retransmits"] == both  # the senders' of both directions
    assert table[0]["responsiveness_rpm"] == pytest.approx(60_000 / table[0]["rtt_loaded_p50_ms"])
    plan = {"tests": [{"label": "load", "test": "rrul"}], "profiles": ["baseline"],
            "impairments": [{"name": "none"}]}  # fmt: skip
    doc = Doc("r")
    _results_tables(doc, table, ["baseline"], ["none"], ["load"], plan, results, {})
    text = doc.markdown()
    assert "**load** (rrul): latency under load" in text
    row = next(ln for ln in text.splitlines() if ln.startswith("| baseline | none |"))
    assert "| 217 ± 0 (n=2) | 38.1 ± 0 (n=2) | 256 ± 0 (n=2) |" in row

    flows = rrul_flows_over_time(results, plan, "load")
    [(title, panel)] = flows["panels"].items()
    assert title == "baseline, none #0" and list(panel) == ["up 1", "up 2", "down 1", "down 2"]
    doc_ = json.loads(golden("iperf3_tcp_bidir_p2.json"))
    first = [s["bits_per_second"] * 1e-6 for s in doc_["intervals"][0]["streams"]]
    assert [s["y"][0] for s in panel.values()] == pytest.approx(first)

    cdf = rrul_rtt_cdf(results, plan, "load")
    idle, loaded = cdf["panels"]["none"]["baseline idle"], cdf["panels"]["none"]["baseline loaded"]
    n_idle = 2 * len(parse_ping(golden("ping_ipv4_ok.txt"))["rtts"])
    n_loaded = 3 * len(parse_ping(golden("ping_ipv4_partial_loss.txt"))["rtts"])  # 1x + 2x
    assert len(idle["x"]) == n_idle and len(loaded["x"]) == n_loaded
    assert idle["x"] == sorted(idle["x"]) and idle["y"][-1] == 1.0
