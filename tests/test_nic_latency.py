"""The boards' per-hop NIC latency (issue 16, docs/cpu.md "A board model"): a profile's [link]
nic_latency_us parsed and refused when bad, the per-direction sums over the VPN path by hand,
auto/on/off and what each records, the delay added under every point's own spec (and dilated),
and one real lab whose ping RTT cannot be below the four NIC traversals it now carries.
"""

from __future__ import annotations

import copy
import re
import tomllib
from types import SimpleNamespace

import pytest

from lab.substrate.local import cpuplan
from lab.model.cpuprofile import PROFILE_DIR, load_cpu_profile, parse_nic_latency, parse_profile
from lab.core.errors import ConfigError
from lab.impair import effective, runtime
from lab.model.impairment.model import Impairment
from lab.campaign.load import load_plan
from lab.model.topology import load_topology

from .conftest import TOPOS, run_lab

PI4 = load_cpu_profile("pi4", merge_calibration=False)
NIC = PI4.nic_latency_us  # one traversal of a Pi 4's NIC, us


def _cpu(spec) -> dict[str, dict]:
    """cpu_plan's per-node dicts as far as the NIC goes (plan_entry of each node's profile)."""
    out = {}
    for n in spec.hosts():
        if isinstance(n.cpu, str):
            out[n.name] = cpuplan.plan_entry(load_cpu_profile(n.cpu, merge_calibration=False))
        else:
            out[n.name] = {"profile": None, "cores": n.cpu}
    return out


def _raw_pi4() -> dict:
    return tomllib.loads((PROFILE_DIR / "pi4.toml").read_text())


# ------------------------------------------------------------------ the profile


def test_pi4_profile_states_nic_latency_with_its_derivation():
    assert NIC == 40.0
    assert "issue 16" in PI4.nic_source and "BPI-Router-Linux issue 156" in PI4.nic_source
    assert "/ 4" in PI4.nic_derivation  # from an RTT, per traversal: said in the file
    assert cpuplan.plan_entry(PI4)["nic_latency_us"] == 40.0
    assert "nic_latency_us" not in cpuplan.plan_entry(load_cpu_profile("host"))


@pytest.mark.parametrize(
    "link, field, words",
    [
        ({"nic_latency_us": -1}, "link.nic_latency_us", "from 0 to 10000"),
        ({"nic_latency_us": 20000}, "link.nic_latency_us", "from 0 to 10000"),
        ({"nic_latency_us": "40"}, "link.nic_latency_us", "microseconds"),
        ({"nic_latency_us": True}, "link.nic_latency_us", "microseconds"),
        ({"source": "s", "derivation": "d"}, "link.nic_latency_us", "missing"),
        ({"nic_latency_us": 40, "derivation": "d"}, "link.source", "missing"),
        ({"nic_latency_us": 40, "source": "s"}, "link.derivation", "missing"),
        (
            {"nic_latency_us": 40, "source": "s", "derivation": "d", "rtt": 1},
            "link.rtt",
            "accepted",
        ),
        ("fast", "link", "table"),
    ],
)
def test_bad_link_table_is_refused_naming_file_field_and_range(link, field, words):
    data = _raw_pi4()
    data["link"] = link
    with pytest.raises(ConfigError) as e:
        parse_profile("pi4", data, "cpu_profiles/pi4.toml")
    assert e.value.source == "cpu_profiles/pi4.toml" and e.value.field == field
    assert words in str(e.value)


def test_a_profile_without_link_has_no_nic_latency():
    data = _raw_pi4()
    del data["link"]
    assert parse_profile("pi4", data, "x.toml").nic_latency_us == 0.0


# ------------------------------------------------------------------ the option


@pytest.mark.parametrize("given, want", [("auto", "auto"), ("ON", "on"), (" off ", "off")])
def test_option_values(given, want):
    assert parse_nic_latency(given, source="-p") == want


@pytest.mark.parametrize("bad", ["yes", "", 1, True, None, 0.5])
def test_bad_option_names_source_and_accepted_values(bad):
    with pytest.raises(ConfigError) as e:
        parse_nic_latency(bad, source="plan.toml", field="topology.nic_latency")
    assert str(e.value).startswith("plan.toml: topology.nic_latency: got")
    assert "accepted: auto, on, off" in str(e.value)


def test_option_reaches_the_spec_from_p_and_from_a_plan(tmp_path):
    spec = load_topology(TOPOS / "pi_pair.py", None, {"nic_latency": "on"})
    assert spec.nic_latency == "on"
    assert load_topology(TOPOS / "pi_pair.py").nic_latency == "auto"
    with pytest.raises(ConfigError, match="pi_pair.py: nic_latency: got 'maybe'"):
        load_topology(TOPOS / "pi_pair.py", None, {"nic_latency": "maybe"})
    plan = tmp_path / "p.toml"
    body = 'schema = 1\nprofiles = ["baseline"]\n[topology]\nfile = "topologies/pi_pair.py"\n'
    plan.write_text(body + 'nic_latency = "off"\n[[tests]]\ntest = "ping"\n')
    assert load_plan(plan).topology_params["nic_latency"] == "off"
    assert load_plan(plan, ["topology.nic_latency=on"]).topology_params["nic_latency"] == "on"
    plan.write_text(body + 'nic_latency = true\n[[tests]]\ntest = "ping"\n')
    with pytest.raises(ConfigError, match="topology.nic_latency: got True; accepted: auto, on"):
        load_plan(plan)


# ------------------------------------------------------------------ sums per direction


def test_pi_pair_one_hop_two_nics_each_way():
    spec = load_topology(TOPOS / "pi_pair.py", None, {"cpu": "pi4"})
    path = cpuplan.nic_path(spec, _cpu(spec))
    # client NIC out + server NIC in = 80 us; the round trip 160 us = 4 traversals
    assert path == {
        "client->server": {"us": 80.0, "hops": [{"from": "client", "to": "server", "us": 80.0}]},
        "server->client": {"us": 80.0, "hops": [{"from": "server", "to": "client", "us": 80.0}]},
    }


def test_middlebox_router_without_profile_adds_nothing_with_one_adds_its_two_nics():
    spec = load_topology(TOPOS / "pi_pair_middlebox.py", None, {"cpu": "pi4"})
    path = cpuplan.nic_path(spec, _cpu(spec))
    fwd = path["client->server"]
    assert [(h["from"], h["to"], h["us"]) for h in fwd["hops"]] == [
        ("client", "router", 40.0),
        ("router", "server", 40.0),
    ]
    assert fwd["us"] == 80.0 and path["server->client"]["us"] == 80.0
    spec = load_topology(TOPOS / "pi_pair_middlebox.py", None, {"cpu": "pi4", "router_cpu": "pi4"})
    path = cpuplan.nic_path(spec, _cpu(spec))
    # the router is a Pi too: 40 + 40 on each of the two hops, each way
    assert path["client->server"]["us"] == 160.0 and path["server->client"]["us"] == 160.0


def test_host_profile_or_a_core_fraction_has_no_nic():
    for cpu in ("host", 0.5):
        spec = load_topology(TOPOS / "pi_pair.py", None, {"cpu": cpu, "nic_latency": "on"})
        rec, warnings = cpuplan.nic_latency_plan(spec, _cpu(spec), None)
        assert not rec["applied"] and "no node on the VPN path" in rec["why"] and not warnings


# ------------------------------------------------------------------ auto / on / off


def _path():
    spec = load_topology(TOPOS / "pi_pair.py", None, {"cpu": "pi4"})
    return cpuplan.nic_path(spec, _cpu(spec))


def test_auto_without_netem_is_not_applied_recorded_and_warned():
    rec, warnings = cpuplan.nic_decision("auto", _path(), lambda: (False, "no sch_netem here"))
    assert rec["applied"] is False and rec["backend"] is None
    assert "this kernel has no sch_netem (no sch_netem here)" in rec["why"]
    assert "`-p nic_latency=on`" in rec["why"] and "userspace engine" in rec["why"]
    assert rec["directions"]["client->server"]["us"] == 80.0  # what it would have been
    (w,) = warnings
    assert "client->server 80 us" in w and "not applied" in w


def test_auto_without_netem_applies_it_where_the_engine_is_on_the_path_anyway():
    rec, warnings = cpuplan.nic_decision(
        "auto", _path(), lambda: (False, "no sch_netem here"), engine_anyway=True
    )
    assert rec["applied"] is True and not warnings
    assert "engine is on the path" in rec["why"] and "no sch_netem here" in rec["why"]
    # off stays off, engine or not
    rec, _ = cpuplan.nic_decision("off", _path(), None, engine_anyway=True)
    assert rec["applied"] is False


def test_auto_with_netem_on_and_off():
    rec, warnings = cpuplan.nic_decision("auto", _path(), lambda: (True, None))
    assert rec["applied"] and "kernel netem present" in rec["why"] and not warnings

    def never():
        raise AssertionError("on/off must not probe")

    rec, warnings = cpuplan.nic_decision("on", _path(), never)
    assert rec["applied"] and not warnings
    rec, warnings = cpuplan.nic_decision("off", _path(), never)
    assert not rec["applied"] and rec["why"] == "nic_latency=off" and not warnings


def test_point_delays_per_backend_and_placement():
    rec, _ = cpuplan.nic_decision("on", _path(), None)
    spec = load_topology(TOPOS / "pi_pair.py", None, {"cpu": "pi4"})
    pts = [vars(p) for p in runtime.points(spec, "egress")]
    assert cpuplan.nic_point_delays(rec, pts, "userspace") == {
        "client:client-eth0": 80,
        "server:server-eth0": 80,
    }
    # two routers between the hosts, middlebox: two kernel netem points per direction share a
    # direction's total; on the one engine each point carries all of it (they set one direction)
    spec = load_topology(TOPOS / "host_router_router_host.py", None, {"cpu": "pi4"})
    path = cpuplan.nic_path(spec, _cpu(spec))
    assert path["client->server"]["us"] == 80.0  # routers unprofiled: the hosts' NICs only
    rec, _ = cpuplan.nic_decision("on", path, None)
    pts = [vars(p) for p in runtime.points(spec, "middlebox")]
    kernel = cpuplan.nic_point_delays(rec, pts, "kernel-netem")
    for way in ("fwd", "rev"):
        mine = [kernel[f"{p['node']}:{p['ifname']}"] for p in pts if p["way"] == way]
        assert len(mine) == 2 and sum(mine) == 80
    assert set(cpuplan.nic_point_delays(rec, pts, "userspace").values()) == {80}
    rec["applied"] = False
    assert cpuplan.nic_point_delays(rec, pts, "kernel-netem") == {}


# ------------------------------------------------------------------ under every spec


class _Engine:
    def __init__(self):
        self.sent = {}

    def set(self, direction, spec_json):
        self.sent[direction] = Impairment.from_json(spec_json)


@pytest.mark.parametrize("dilation", [1.0, 2.0])
def test_nic_is_added_to_a_points_own_delay_and_dilated(monkeypatch, dilation):
    spec = load_topology(TOPOS / "pi_pair.py", None, {"cpu": "pi4"})
    spec.dilation = dilation
    lab = SimpleNamespace(spec=spec)
    pts = runtime.points(spec, "egress")
    st = {
        "backend": "userspace",
        "placement": "egress",
        "points": [vars(p) for p in pts],
        "engines": [{"name": "imp0", "link": 0, "fwd_dir": "a2b"}],
        "nic_us": {"client:client-eth0": 80, "server:server-eth0": 80},
    }
    eng = _Engine()
    monkeypatch.setattr(runtime, "engine_client", lambda lab, e: eng)
    fwd, rev = pts
    runtime._apply(
        lab, st, [(fwd, Impairment(delay_us=20_000, jitter_us=1000)), (rev, Impairment())]
    )
    # 20 ms + the NICs (added, not replaced; jitter kept), an empty spec keeps the NICs alone
    assert eng.sent["a2b"].delay_us == round(20_080 * dilation)
    assert eng.sent["a2b"].jitter_us == round(1000 * dilation)
    assert eng.sent["b2a"].delay_us == round(80 * dilation)
    text = effective.base_text(st)
    assert text["client:client-eth0"].startswith("+80us delay")


# ------------------------------------------------------------------ real packets


def _rtt_min_ms(lab_id: str, addr: str, n: int = 30) -> float:
    r = run_lab(
        "exec", "--id", lab_id, "client", "--", "ping", "-c", n, "-i", "0.02", "-W", "2", addr
    )
    assert r.returncode == 0, r.stderr
    return min(float(x) for x in re.findall(r"time=([\d.]+) ms", r.stdout))


@pytest.mark.root
def test_pi_pair_with_nic_latency_on_carries_four_nic_traversals(lab_id):
    """Two pi4 nodes, nic_latency=on (the engine here, kernel netem where present): a ping's
    round trip crosses four NICs, so its minimum cannot be below 4 x nic_latency_us whatever
    the host's speed or load (load only adds); a 2 ms point keeps the NICs on top of it."""
    from lab.substrate.local.lab import Lab
    from lab.core.teardown import teardown

    up = run_lab(
        "up", TOPOS / "pi_pair.py", "-p", "cpu=pi4", "-p", "nic_latency=on", "--id", lab_id
    )
    assert up.returncode == 0, up.stderr
    rec = copy.deepcopy(Lab.open(lab_id).info["nic_latency"])
    assert rec["applied"] and rec["backend"] in ("userspace", "kernel-netem")
    floor = 4 * NIC / 1000
    assert _rtt_min_ms(lab_id, "10.0.1.2") >= floor
    r = run_lab("impair", "set", "--id", lab_id, "all", "delay", "2ms")
    assert r.returncode == 0, r.stderr
    assert _rtt_min_ms(lab_id, "10.0.1.2", 10) >= 2 * 2 + floor
    assert run_lab("down", "--id", lab_id).returncode == 0
    assert teardown(lab_id) == []
