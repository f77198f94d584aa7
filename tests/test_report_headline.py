"""The headline `lab run` ends with and report.md's result titles (lab.results.report.headline,
lab.results.doc.metric_name/labelled): each column names its test and metric once, with the unit
beside it. Pure: rows as results.csv has them, no run."""

from __future__ import annotations

from lab.results.doc import labelled, metric_name
from lab.results.report import headline


def _row(label: str, value: float, *, point: int = 0, col: str = "handshake_ms", **kw) -> dict:
    return {"test_label": label, "profile": "wg", "impairment": "none", "point": point,
            "ok": True, col: value, **kw}  # fmt: skip


def _plan(*tests: tuple[str, str]) -> dict:
    return {"tests": [{"label": lb, "test": t} for lb, t in tests]}


def test_a_test_labelled_by_its_kind_names_its_metric_once():
    plan = _plan(("handshake", "handshake"), ("hs", "handshake"), ("tcp", "tcp"))
    table = [_row("handshake", 3.0), _row("hs", 4.0),
             _row("tcp", 2e8, col="throughput_bps")]  # fmt: skip
    head = headline(table, ["wg"], ["none"], ["handshake", "hs", "tcp"], plan)
    assert head["header"] == [
        "profile",
        "condition",
        "handshake time (ms)",  # was "handshake handshake ms (ms)"
        "hs handshake time (ms)",
        "tcp throughput (Mbit/s)",
    ]


def test_a_metric_name_leaves_its_unit_to_the_unit_beside_it():
    assert metric_name("responsiveness_rpm") == "responsiveness"
    assert metric_name("latency_inflation_ms") == "latency inflation"
    assert metric_name("rtt_avg_ms") == "mean RTT"  # a name of its own wins
    assert metric_name("path_mtu") == "path MTU"


def test_labelled_drops_only_a_whole_leading_word():
    assert labelled("rrul", "rrul score") == "rrul score"
    assert labelled("rr", "rrul score") == "rr rrul score"
    assert labelled("ping", "ping") == "ping"
    assert labelled("tcp", "throughput") == "tcp throughput"


def _bidir(impairment: str, c2s: float, s2c: float, *, rep: int) -> list[dict]:
    """One bidir tcp case's rows: point 0 client-to-server, 1 server-to-client."""
    return [
        {**_row("bidir", c2s, col="throughput_bps"), "impairment": impairment, "rep": rep,
         "direction": "client-to-server"},
        {**_row("bidir", s2c, col="throughput_bps", point=1), "impairment": impairment,
         "rep": rep, "direction": "server-to-client"},
    ]  # fmt: skip


def test_a_bidir_test_has_a_headline_column_per_direction_at_every_condition():
    plan = _plan(("bidir", "tcp"), ("ping", "ping"))
    table = [
        *_bidir("none", 100e6, 40e6, rep=0),
        *_bidir("none", 100e6, 40e6, rep=1),
        *_bidir("delay40", 30e6, 20e6, rep=0),
        _row("ping", 1.5, col="rtt_avg_ms"),
    ]
    table[-2]["ok"] = False  # delay40's server-to-client failed
    head = headline(table, ["wg"], ["none", "delay40"], ["bidir", "ping"], plan)
    assert head["header"] == [
        "profile",
        "condition",
        "bidir throughput, client-to-server (Mbit/s)",
        "bidir throughput, server-to-client (Mbit/s)",
        "ping mean RTT (ms)",
    ]
    assert head["rows"] == [
        ["wg", "none", "100 ± 0 (n=2)", "40.0 ± 0 (n=2)", "1.50 (n=1)"],
        ["wg", "delay40", "30.0 (n=1)", "- [1 failed]", "-"],
    ]


def test_mtu_families_are_headline_columns_named_as_their_tables():
    plan = _plan(
        ("mtu", "mtu"),
    )
    table = [
        _row("mtu", 1420, col="path_mtu", ip=4),
        _row("mtu", 1400, col="path_mtu", point=1, ip=6),
    ]
    head = headline(table, ["wg"], ["none"], ["mtu"], plan)
    assert head["header"][2:] == ["mtu path MTU, IPv4 (bytes)", "mtu path MTU, IPv6 (bytes)"]
    assert head["rows"] == [["wg", "none", "1420 (n=1)", "1400 (n=1)"]]
