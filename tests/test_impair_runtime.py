"""Impairment placement (no root) and run-time control in a real lab (root)."""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from types import SimpleNamespace

import pytest

from lab.core.errors import ConfigError
from lab.impair import runtime
from lab.substrate.local.lab import Lab
from lab.substrate.local.build import up
from lab.substrate.local.impair import splice_side
from lab.core.teardown import teardown
from lab.model.topology import load_topology

from .conftest import TOPOS, lab_traces, run_lab


def test_placements_resolve_to_egress_points():
    mb = load_topology(TOPOS / "pi_pair_middlebox.py")
    assert runtime.default_placement(mb) == "middlebox"
    pts = runtime.points(mb, "middlebox")
    assert {(p.node, p.ifname, p.way) for p in pts} == {
        ("router", "router-eth0", "rev"),
        ("router", "router-eth1", "fwd"),
    }
    assert runtime.engine_links(mb, "middlebox") == [1]  # one engine hop: router-server
    eg = runtime.points(mb, "egress")
    assert {(p.node, p.way) for p in eg} == {("client", "fwd"), ("server", "rev")}
    assert runtime.engine_links(mb, "egress") == [0, 1]
    pair = load_topology(TOPOS / "pi_pair.py")
    assert runtime.default_placement(pair) == "egress"
    assert runtime.engine_links(pair, "ingress") == [0]
    with pytest.raises(
        ConfigError, match="placement 'middlebox' needs a node between client and server"
    ):
        runtime.points(pair, "middlebox")
    s2s = load_topology(TOPOS / "site_to_site.py")
    assert [(i, a, b) for i, a, b in runtime.path_links(s2s, "gw1", "gw2")] == [(1, "gw1", "gw2")]


def test_bad_impairment_at_up_creates_nothing(lab_id):
    spec = load_topology(TOPOS / "pi_pair_middlebox.py")
    with pytest.raises(ConfigError, match="loss must be 0..100"):
        up(spec, lab_id, impair="loss 120%")
    with pytest.raises(ConfigError, match="placement must be one of"):
        up(spec, lab_id, impair="none", placement="sideways")
    assert lab_traces(lab_id) == []


def _rtt_ms(node, addr, n=5):
    out = node.run(["ping", "-c", str(n), "-i", "0.05", "-W", "2", addr]).stdout
    return float(re.search(r"= ([\d.]+)/", out).group(1))


@pytest.mark.root
def test_runtime_set_merge_clear_and_teardown(lab_id):
    lab = up(load_topology(TOPOS / "pi_pair_middlebox.py"), lab_id, impair="delay 10ms")
    c = lab.node("client")
    # the minimum of 5 RTTs: load only adds to it; the bounds tell 10, 20 and 30 ms apart
    assert 19.5 < _rtt_ms(c, "10.0.2.2") < 30  # 10 ms each way, once per direction
    shown = runtime.set_impairment(lab, "delay 20ms")
    assert shown["requested"]["router:router-eth1"] == "delay 20ms"
    assert 39.5 < _rtt_ms(c, "10.0.2.2") < 50  # not 10 + 20 ms stacked
    # one parameter on one point: the rest kept
    shown = runtime.set_impairment(lab, "duplicate 100%", "router:router-eth1")
    assert shown["requested"]["router:router-eth1"] == "delay 20ms duplicate 100%"
    assert shown["requested"]["router:router-eth0"] == "delay 20ms"
    out = c.run(["ping", "-c", "2", "-i", "0.2", "10.0.2.2"], check=False).stdout
    assert "DUP!" in out
    runtime.clear_impairment(lab)
    assert _rtt_ms(c, "10.0.2.2") < 5
    if shown["backend"] == "userspace":
        counters = runtime.show_impairment(lab)["engines"]["imp1"]["a2b"]["counters"]
        assert counters["duplicated"] >= 2 and counters["forwarded"] > 10
    with pytest.raises(ConfigError, match="unknown impairment target 'x'; valid:"):
        runtime.set_impairment(lab, "delay 1ms", "x")
    assert teardown(lab_id) == []
    assert lab_traces(lab_id) == []


def test_node_target_and_splice_side():
    mb = load_topology(TOPOS / "pi_pair_middlebox.py")
    lab = SimpleNamespace(spec=mb)
    st = {"points": [asdict(p) for p in runtime.points(mb, "middlebox")]}
    assert {p.ifname for p in runtime._select(lab, st, "router")} == {"router-eth0", "router-eth1"}
    with pytest.raises(ConfigError, match="valid: .*router"):
        runtime._select(lab, st, "client")
    # the router's end is re-created, never the VPN server's; between two endpoints: node1's
    assert splice_side(mb, 1) == ("router", "router-eth1")
    assert splice_side(load_topology(TOPOS / "pi_pair.py"), 0) == ("client", "client-eth0")


@pytest.mark.root
def test_cli_impair_adds_points_to_a_lab_built_without(lab_id):
    assert run_lab("up", TOPOS / "pi_pair.py", "--id", lab_id).returncode == 0
    c = Lab.open(lab_id).node("client")
    assert _rtt_ms(c, "10.0.1.2") < 5
    assert run_lab("impair", "clear", "--id", lab_id).returncode == 0  # nothing to clear yet
    # bad input is refused before the splice: the lab stays without points
    r = run_lab("impair", "set", "--id", lab_id, "all", "loss", "120%")
    assert r.returncode == ConfigError.exit_code and "loss must be 0..100" in r.stderr
    r = run_lab("impair", "set", "--id", lab_id, "nowhere", "delay", "5ms")
    assert r.returncode == ConfigError.exit_code and "unknown impairment target" in r.stderr
    assert "impair" not in Lab.open(lab_id).info
    r = run_lab("impair", "set", "--id", lab_id, "all", "delay", "5ms", "--json")
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    if shown["backend"] == "userspace":
        assert shown["placement"] == "egress" and list(shown["engines"]) == ["imp0"]
    assert 9.5 < _rtt_ms(c, "10.0.1.2") < 15
    assert run_lab("impair", "clear", "--id", lab_id).returncode == 0
    assert _rtt_ms(c, "10.0.1.2") < 5
    assert run_lab("down", "--id", lab_id).returncode == 0
    assert lab_traces(lab_id) == []
