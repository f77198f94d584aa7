"""The report's rrul table (the link's and the VPN's own inflation) and the condition's own loss
for one-way datagrams against echoes."""

from __future__ import annotations

import pytest

from lab.results.doc import Doc, cells
from lab.results.loadtables import condition_loss, rrul_table


def test_one_way_loss_is_the_spec_and_an_echo_crosses_it_twice():
    assert condition_loss("delay 200ms loss 1%", "udp") == (1.0, "1 %")
    both, words = condition_loss("delay 200ms loss 1%", "ping")
    assert both == pytest.approx(1.99) and "each way" in words
    assert condition_loss("delay 20ms", "ping") == (0.0, "0 %")


def _row(prof, ok=True, **kw):
    base = {"profile": prof, "impairment": "none", "ok": ok, "point": 0}
    return {**base, **kw}


def test_rrul_table_splits_the_inflation_only_when_the_underlay_was_probed():
    rows = [
        _row("wireguard", latency_inflation_ms=30.0, link_inflation_ms=2.0, vpn_inflation_ms=28.0),
        _row("baseline", latency_inflation_ms=8.0, link_inflation_ms=None, vpn_inflation_ms=None),
    ]
    doc = Doc("t")
    rrul_table(doc, "load", "rrul", rows, ["baseline", "wireguard"], ["none"])
    md = doc.markdown()
    assert "the VPN's own ms" in md and "of it the link's ms" in md
    assert "28.0" in md and "2.00" in md
    doc2 = Doc("t")
    old = [{k: v for k, v in r.items() if "link" not in k and "vpn" not in k} for r in rows]
    rrul_table(doc2, "load", "rrul", old, ["baseline", "wireguard"], ["none"])
    md2 = doc2.markdown()
    assert "the VPN's own" not in md2 and "inflation ms" in md2


def test_cells_walk_profile_condition_and_point_skipping_empty_ones_and_counting_failures():
    """doc.cells, the walk every results table shares: per profile, then condition, then (where
    asked) record point; a cell without rows is left out, a failed row is counted, not kept."""
    table = [
        {"profile": "wg", "impairment": "loss", "point": 1, "ok": True, "v": 1},
        {"profile": "wg", "impairment": "none", "point": 0, "ok": False, "v": 2},
        {"profile": "wg", "impairment": "none", "point": 0, "ok": True, "v": 3},
        {"profile": "wg", "impairment": "none", "point": 1, "ok": True, "v": 4},
        {"profile": "ovpn", "impairment": "none", "point": 0, "ok": False, "v": 5},
    ]
    got = [(c.profile, c.point, [r["v"] for r in c.ok], c.failed, c.index)
           for c in cells(table, ["ovpn", "wg", "none-such"], ["none", "loss"])]  # fmt: skip
    assert got == [("ovpn", "none", [], 1, None), ("wg", "none", [3, 4], 1, None),
                   ("wg", "loss", [1], 0, None)]  # fmt: skip
    split = [(c.profile, c.point, c.index, [r["v"] for r in c.ok], c.failed)
             for c in cells(table, ["wg"], ["none", "loss"], [0, 1])]  # fmt: skip
    assert split == [("wg", "none", 0, [3], 1), ("wg", "none", 1, [4], 0),
                     ("wg", "loss", 1, [1], 0)]  # fmt: skip
