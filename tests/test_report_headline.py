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
