"""The boards' per-hop NIC latency (issue 16, docs/cpu.md "A board model"): a profile's [link]
nic_latency_us parsed and refused when bad, the per-direction sums over the VPN path by hand,
auto/on/off and what each records, the delay added under every point's own spec (and dilated),
and one real lab whose ping RTT cannot be below the four NIC traversals it now carries.
"""

from __future__ import annotations

import copy
import re
import secrets
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


# ------------------------------------------------------------------ the side path (no netem)


def _side_path_lab(lab_id: str):
    """A pi4 pi_pair lab up (an ideal network: the side path where netem is missing) and its
    nic_latency record; skipped where kernel netem is present (nic_latency=auto uses it)."""
    from lab.impair.kernel import probe_netem
    from lab.substrate.local.lab import Lab

    up = run_lab("up", TOPOS / "pi_pair.py", "-p", "cpu=pi4", "--id", lab_id)
    assert up.returncode == 0, up.stderr
    lab = Lab.open(lab_id)
    if probe_netem(lab.node("client")).ok:
        pytest.skip("kernel netem is present: nic_latency=auto applies it there, no side path")
    return lab, lab.info["nic_latency"]


def _decided(mode: str, topo: str = "pi_pair.py", **params) -> tuple:
    spec = load_topology(TOPOS / topo, None, {"cpu": "pi4", **params})
    rec, _ = cpuplan.nic_latency_plan(
        spec, _cpu(spec), lambda: (False, "no sch_netem here"), engine_anyway=mode == "engine"
    )
    if mode != "engine":
        spec = load_topology(TOPOS / topo, None, {"cpu": "pi4", "nic_latency": mode, **params})
        rec, _ = cpuplan.nic_latency_plan(spec, _cpu(spec), lambda: (False, "no sch_netem here"))
    return spec, rec


def test_only_auto_without_netem_and_without_the_engine_gets_a_side_path():
    from lab.substrate.local import nicside

    assert nicside.wanted(_decided("auto")[1])
    assert not nicside.wanted(_decided("engine")[1])  # impaired lab: the engine carries it
    assert not nicside.wanted(_decided("on")[1])  # the engine on every link
    assert not nicside.wanted(_decided("off")[1])
    spec = load_topology(TOPOS / "pi_pair.py", None, {"cpu": "pi4"})
    rec, _ = cpuplan.nic_latency_plan(spec, _cpu(spec), lambda: (True, None))
    assert rec["applied"] is True and not nicside.wanted(rec)  # kernel netem carries it
    for cpu in ("host", 0.5):  # no NIC on the path: nothing to add
        spec = load_topology(TOPOS / "pi_pair.py", None, {"cpu": cpu})
        rec, _ = cpuplan.nic_latency_plan(spec, _cpu(spec), lambda: (False, "no"))
        assert not nicside.wanted(rec)


def test_side_links_carry_each_links_own_nics_per_direction():
    from lab.substrate.local import nicside

    spec, rec = _decided("auto")
    assert nicside.side_links(spec, rec) == [{"link": 0, "a2b_us": 80.0, "b2a_us": 80.0}]
    spec, rec = _decided("auto", "pi_pair_middlebox.py")
    got = nicside.side_links(spec, rec)
    # an unprofiled router: each hop has one board NIC (40 us), and both hops get a side bump
    assert [(s["a2b_us"], s["b2a_us"]) for s in got] == [(40.0, 40.0), (40.0, 40.0)]
    assert len({s["link"] for s in got}) == 2
    spec, rec = _decided("auto", "pi_pair_middlebox.py", router_cpu="pi4")
    assert [(s["a2b_us"], s["b2a_us"]) for s in nicside.side_links(spec, rec)] == [(80.0, 80.0)] * 2


def test_side_interface_names_never_take_a_topologys_name():
    from lab.substrate.local import nicside

    assert nicside.free_name("nic0", {"eth0", "client-eth0"}) == "nic0"
    assert nicside.free_name("nic0", {"nic0", "nic0s1"}) == "nic0s2"


def test_side_path_commands():
    from lab.substrate.local import nicside

    cmds = nicside.setup_argvs("L-client", "client-eth0", "nic0", "42:00:00:00:00:01")
    text = [" ".join(c) for c in cmds]
    assert text[0] == "ip -n L-client link set dev nic0 address 42:00:00:00:00:01"
    assert "ip -n L-client link set dev nic0 addrgenmode none" in text
    assert "tc -n L-client qdisc add dev client-eth0 clsact" in text
    assert "tc -n L-client qdisc add dev nic0 clsact" in text
    # the engine's frames are received as if on the link interface, permanently
    assert text[-1].startswith("tc -n L-client filter add dev nic0 ingress protocol all")
    assert text[-1].endswith("action mirred ingress redirect dev client-eth0")
    assert text[-1] == (
        f"tc -n L-client filter add dev nic0 ingress protocol all prio {nicside.PASS_PRIO} u32 "
        "match u32 0 0 action mirred ingress redirect dev client-eth0"
    )
    ends = [
        {"ns": "L-client", "ifname": "client-eth0", "side": "nic0", "mac": "42:00:00:00:00:01"},
        {"ns": "L-server", "ifname": "server-eth0", "side": "nic0", "mac": "42:00:00:00:00:02"},
    ]
    s = {"netns": "L-nic0", "ends": ends}
    on = [" ".join(c) for c in nicside.steer_argvs(s, True)]
    off = [" ".join(c) for c in nicside.steer_argvs(s, False)]
    prio = f"prio {nicside.STEER_PRIO}"
    assert on == [
        f"tc -n L-{n} filter add dev {n}-eth0 egress protocol all {prio} u32 match u32 0 0 "
        "action mirred egress redirect dev nic0"
        for n in ("client", "server")
    ]
    # that filter only, the last one on first
    assert off == [
        f"tc -n L-{n} filter del dev {n}-eth0 egress {prio}" for n in ("server", "client")
    ]
    # ICMP only: ICMP (IPv4 protocol 1) and ICMPv6 (next header 58); the engine's output back to
    # the node it came from (by source MAC) and out through its link interface's qdisc, exempt
    # from steering there (its input device is the side interface)
    on = [" ".join(c) for c in nicside.steer_argvs(s, True, "icmp")]
    off = [" ".join(c) for c in nicside.steer_argvs(s, False, "icmp")]
    hp, p0, p1 = nicside.HAIRPIN_PRIO, nicside.STEER_PRIO - 1, nicside.STEER_PRIO + 1
    egress = "tc -n L-client filter add dev client-eth0 egress"
    assert on[:2] == [
        f"tc -n L-nic0 filter add dev nic-b egress protocol all prio {hp} u32 "
        "match ether src 42:00:00:00:00:01 action mirred egress redirect dev nic-a",
        f"tc -n L-nic0 filter add dev nic-a egress protocol all prio {hp} u32 "
        "match ether src 42:00:00:00:00:02 action mirred egress redirect dev nic-b",
    ]
    assert on[2:6] == [
        f"tc -n L-client filter add dev nic0 ingress protocol all prio {hp} u32 match u32 0 0 "
        "action mirred egress redirect dev client-eth0",
        f"{egress} protocol all prio {p0} u32 match u32 0 0 indev nic0 classid 1:1",
        f"{egress} protocol ip {prio} u32 match ip protocol 1 0xff "
        "action mirred egress redirect dev nic0",
        f"{egress} protocol ipv6 prio {p1} u32 match ip6 protocol 58 0xff "
        "action mirred egress redirect dev nic0",
    ]
    assert len(on) == len(off) == 10 and "L-server" in on[-1]
    assert off[0] == f"tc -n L-server filter del dev server-eth0 egress prio {p1}"  # steering first
    assert off[-1] == f"tc -n L-nic0 filter del dev nic-b egress prio {hp}"
    assert nicside.HAIRPIN_PRIO < nicside.PASS_PRIO  # the hairpin goes before the hand-back
    with pytest.raises(ValueError, match="accepted: all, icmp"):
        nicside.steer_argvs(s, True, "tcp")


def test_steering_only_around_latency_tests_and_off_whatever_happens(monkeypatch):
    from lab.measure import TESTS
    from lab.substrate.local import nicside

    calls = []
    monkeypatch.setattr(nicside, "steer", lambda lab, on, match="all": calls.append((on, match)))
    side = SimpleNamespace(info={"nic_latency": {"applied": "latency tests", "side_path": {}}})
    side.info["nic_latency"]["side_path"] = {"links": [{}]}
    kinds = {n: t.nic_side_path for n, t in TESTS.items() if t.nic_side_path}
    assert kinds == {"ping": "all", "rr": "all", "handshake": "all", "rrul": "icmp"}
    assert nicside.side_path_tests("all") == ["handshake", "ping", "rr"]
    assert nicside.side_path_tests("icmp") == ["rrul"]
    for name, want in (("ping", "all"), ("rr", "all"), ("handshake", "all"), ("tcp", None),
                       ("udp", None), ("scp", None), ("rrul", "icmp")):  # fmt: skip
        calls.clear()
        with nicside.steering(side, TESTS[name]) as nic:
            assert calls == ([(True, want)] if want else [])
        assert calls == ([(True, want), (False, want)] if want else [])
        assert nic["applied"] == {"all": True, "icmp": "icmp", None: False}[want], (name, nic)
        assert ("ICMP only" in nic["note"]) if want == "icmp" else "note" not in nic
    calls.clear()
    with pytest.raises(RuntimeError), nicside.steering(side, TESTS["ping"]):
        raise RuntimeError("the test failed")
    assert calls == [(True, "all"), (False, "all")]
    # a tunnel encapsulates rrul's pings: no ICMP on the link to steer, nothing steered, and
    # the result says so; the no-VPN baseline's pings are ICMP there
    for driver, want in (("wireguard", False), ("openvpn", False), ("none", "icmp")):
        calls.clear()
        side.info["vpn"] = {"driver": driver}
        with nicside.steering(side, TESTS["rrul"]) as nic:
            pass
        steered = [(True, "icmp"), (False, "icmp")] if want else []
        assert nic["applied"] == want and calls == steered, (driver, nic, calls)
        assert (f"the {driver} tunnel carries its pings encapsulated" in nic["note"]) != bool(want)
    with nicside.steering(side, TESTS["ping"]) as nic:  # every frame: the tunnel's too
        assert nic == {"applied": True}
    # a lab whose netem or engine carries the NICs: every test has them; a lab without: none
    for rec, want in (({"applied": True}, True), ({"applied": False}, False), ({}, False)):
        calls.clear()
        with nicside.steering(SimpleNamespace(info={"nic_latency": rec}), TESTS["tcp"]) as nic:
            pass
        assert nic == {"applied": want} and calls == []


def test_each_substrate_steers_the_nics_through_its_own_interface():
    """The runner asks its substrate (Substrate.nic_steering), never a substrate's module: the
    local substrate's is the side path's steering, the boards' and the VM's a no-op that says
    "not applied", as the runner recorded for them before."""
    from lab.measure import TESTS
    from lab.substrate.base import Substrate
    from lab.substrate.local import nicside
    from lab.substrate.registry import get
    from tests.test_layers import LAB, import_graph

    runner = import_graph(LAB)["lab.campaign.runner"]
    assert not any(m.startswith("lab.substrate.local") for m in runner), runner
    for kind in ("boards", "vm"):
        assert get(kind).nic_steering is Substrate.nic_steering
        lab = SimpleNamespace(info={"nic_latency": {"applied": True}})
        with get(kind).nic_steering(object.__new__(get(kind)), lab, TESTS["ping"]) as nic:
            assert nic == {"applied": False}
    local = get("local")()
    side = SimpleNamespace(info={"nic_latency": {"applied": True}})
    with local.nic_steering(side, TESTS["tcp"]) as nic:  # netem carries them: every test
        assert nic == {"applied": True}
    assert local.nic_steering.__func__.__code__.co_names.count("steering") == 1
    assert nicside.steering.__module__ == "lab.substrate.local.nicside"


def test_results_row_says_whether_the_nics_were_in_force():
    from lab.results.columns import COLUMN_NAMES
    from lab.results.rundir import rows

    base = {"case": "p|none|t|0", "profile": "p", "test": "ping", "label": "t", "rep": 0,
            "ok": True, "records": [{"ok": True}]}  # fmt: skip
    assert "nic_latency_applied" in COLUMN_NAMES
    assert rows("r", [{**base, "nic_latency_applied": True}])[0]["nic_latency_applied"] == 1.0
    assert rows("r", [{**base, "nic_latency_applied": False}])[0]["nic_latency_applied"] == 0.0
    assert rows("r", [base])[0]["nic_latency_applied"] is None  # a run from before


@pytest.fixture
def nic_lab_id():
    """A fresh lab id of this file's side-path test, always torn down afterwards."""
    import secrets

    from lab.core.teardown import teardown

    lid = "nic" + secrets.token_hex(3)
    yield lid
    teardown(lid)


def _tx(ns: str, ifname: str) -> int:
    import subprocess

    path = f"/sys/class/net/{ifname}/statistics/tx_packets"
    cp = subprocess.run(["ip", "netns", "exec", ns, "cat", path], capture_output=True, text=True)
    assert cp.returncode == 0, cp.stderr
    return int(cp.stdout)


@pytest.mark.root
def test_side_path_carries_the_four_nics_only_while_steered(nic_lab_id, tmp_path):
    """pi_pair with the default nic_latency=auto on a kernel without netem: the side path is
    built; steered on, a ping's round trip crosses the engine's four NIC traversals (its
    minimum cannot be below 4 x nic_latency_us, load only adds) and the side interfaces carry
    it; steered off, the plain veth carries it and the side interfaces send nothing. A ping
    run through the measurement layer's hook comes out with the NICs in force, a tcp test's
    hook leaves the veth; `lab impair set` moves the NICs onto the engine it splices in and
    removes the side path; `lab down` leaves no namespace, interface or engine."""
    import os

    from lab.core import netops, proc
    from lab.core.teardown import teardown
    from lab.measure import TESTS, Context
    from lab.substrate.local import nicside
    from lab.substrate.local.lab import Lab

    lab_id = nic_lab_id
    lab, rec = _side_path_lab(lab_id)
    assert rec["applied"] == "latency tests" and rec["backend"] == "side path", rec
    assert rec["tests"] == ["handshake", "ping", "rr"]
    (side,) = rec["side_path"]["links"]
    assert (side["a2b_us"], side["b2a_us"]) == (2 * NIC, 2 * NIC)
    ends = [(e["ns"], e["side"]) for e in side["ends"]]
    floor = 4 * NIC / 1000

    def moved_during_ping() -> tuple[float, list[int]]:
        before = [_tx(ns, ifname) for ns, ifname in ends]
        rtt = _rtt_min_ms(lab_id, "10.0.1.2", 20)
        return rtt, [_tx(ns, ifname) - b for (ns, ifname), b in zip(ends, before, strict=True)]

    _rtt, moved = moved_during_ping()
    assert moved == [0, 0]  # nothing steered at lab up: the plain veth
    nicside.steer(lab, True)
    try:
        rtt, moved = moved_during_ping()
        assert rtt >= floor and all(m >= 20 for m in moved), (rtt, moved)
    finally:
        nicside.steer(lab, False)
    _rtt, moved = moved_during_ping()
    assert moved == [0, 0]  # off again: the plain veth

    ping = TESTS["ping"]
    ctx = Context(lab.node("client"), lab.node("server"), "10.0.1.2", tmp_path / "raw")
    params = ping.validate({"count": 20, "interval_s": 0.02}, source="test")
    with nicside.steering(lab, ping) as nic:
        (r,) = ping.run(ctx, params)
    assert nic == {"applied": True} and r["ok"] and r["rtt_min_ms"] >= floor, r
    with nicside.steering(lab, TESTS["tcp"]) as nic:  # a throughput test: the plain veth
        assert nic == {"applied": False} and moved_during_ping()[1] == [0, 0]

    # `lab impair set` puts the engine on the link: it carries the NICs for every test from
    # then on, and the side path goes
    r = run_lab("impair", "set", "--id", lab_id, "all", "delay", "2ms")
    assert r.returncode == 0, r.stderr
    rec = Lab.open(lab_id).info["nic_latency"]
    assert rec["applied"] is True and "side_path" not in rec, rec
    assert not netops.netns_exists(side["netns"])
    assert not proc.is_same_process(side["pid"], side["start_time"])
    assert _rtt_min_ms(lab_id, "10.0.1.2", 10) >= 2 * 2 + floor

    assert run_lab("down", "--id", lab_id).returncode == 0
    assert not any(netops.netns_exists(ns) for ns, _ in ends)
    assert not proc.is_same_process(side["pid"], side["start_time"])
    assert not os.path.exists(side["control"])
    assert teardown(lab_id) == []


def _tcp_transfer(lab_id: str, addr: str, megabytes: int) -> int:
    """Send `megabytes` MiB over one TCP connection client -> server (a Python listener in the
    server's network namespace); returns the bytes the server received."""
    import subprocess
    import sys

    port = 20000 + secrets.randbelow(20000)
    srv = (
        "import socket\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(({addr!r}, {port})); s.listen(1); print('ready', flush=True)\n"
        "c, _ = s.accept(); n = 0\n"
        "while (d := c.recv(1 << 16)):\n    n += len(d)\n"
        "print(n, flush=True)\n"
    )
    cli = (
        "import socket\n"
        f"c = socket.create_connection(({addr!r}, {port}), timeout=20)\n"
        f"for _ in range({megabytes}):\n    c.sendall(b'x' * (1 << 20))\n"
        "c.close()\n"
    )
    netns = ["ip", "netns", "exec"]
    with subprocess.Popen([*netns, f"{lab_id}-server", sys.executable, "-c", srv],
                          stdout=subprocess.PIPE, text=True) as server:  # fmt: skip
        try:
            assert server.stdout.readline().strip() == "ready"
            cp = subprocess.run([*netns, f"{lab_id}-client", sys.executable, "-c", cli],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
            assert cp.returncode == 0, cp.stderr
            out, _ = server.communicate(timeout=30)
        finally:
            server.kill()
    return int(out.strip())


@pytest.mark.root
def test_icmp_steering_puts_the_pings_on_the_nics_and_leaves_tcp_on_the_veth(nic_lab_id, tmp_path):
    """rrul's steering on a side path (pi_pair, nic_latency=auto, no netem, no tunnel): ICMP
    only. While it is on, a ping's minimum round trip carries the four NIC traversals and its
    echoes cross both side interfaces, while 40 MiB of TCP client -> server crosses the link
    interface and not the side interfaces (it would if the match steered everything; the ping
    floor would fail if it steered nothing). rrul itself run under it: its idle and loaded ping
    p50 carry the NICs, its flows stay off the side path, its pings still wait in the link's
    tbf queue with the flows (the hairpin: its loaded inflation is kept, where pings steered
    past the queue lost it, 8.5 -> 0.26 ms), and the result says "icmp" with a note. Off again
    afterwards: nothing on the side path."""
    from lab.measure import TESTS, Context
    from lab.substrate.local import nicside

    lab_id = nic_lab_id
    lab, rec = _side_path_lab(lab_id)
    assert rec["icmp_tests"] == ["rrul"] and "rrul: its ICMP only" in rec["why"], rec
    (side,) = rec["side_path"]["links"]
    sides = [(e["ns"], e["side"]) for e in side["ends"]]
    link = [(e["ns"], e["ifname"]) for e in side["ends"]]
    floor = 4 * NIC / 1000

    def moved(what, run):
        before = [_tx(ns, ifname) for ns, ifname in what]
        out = run()
        return out, [_tx(ns, ifname) - b for (ns, ifname), b in zip(what, before, strict=True)]

    rrul = TESTS["rrul"]
    ctx = Context(lab.node("client"), lab.node("server"), "10.0.1.2", tmp_path / "raw")
    params = rrul.validate(
        {"flows": 2, "duration_s": 3, "idle_s": 1, "ping_interval_s": 0.05}, source="test"
    )
    (plain,) = rrul.run(ctx, params)  # not steered: no NICs, the link's queue under load
    assert plain["ok"], plain
    with nicside.steering(lab, rrul) as nic:
        assert nic["applied"] == "icmp" and "its TCP flows the plain veth" in nic["note"], nic
        rtt, on_side = moved(sides, lambda: _rtt_min_ms(lab_id, "10.0.1.2", 20))
        assert rtt >= floor and all(m >= 20 for m in on_side), (rtt, on_side)
        before = [_tx(ns, ifname) for ns, ifname in link]
        got, on_side = moved(sides, lambda: _tcp_transfer(lab_id, "10.0.1.2", 40))
        on_link = [_tx(ns, ifname) - b for (ns, ifname), b in zip(link, before, strict=True)]
        assert got == 40 << 20
        # the flow's segments and ACKs (hundreds of packets even at 64 KiB GSO) on the link
        # interfaces; the side interfaces at most a stray ICMPv6 neighbour message
        assert all(n >= 300 for n in on_link) and all(m <= 5 for m in on_side), (on_link, on_side)

        (r,), on_side = moved(sides, lambda: rrul.run(ctx, params))
    assert r["ok"], r
    assert r["rtt_idle_p50_ms"] >= floor and r["rtt_loaded_p50_ms"] >= floor, r
    # the pings still queue with the flows: the loaded inflation is not lost to the side path
    inflation = r["rtt_loaded_p50_ms"] - r["rtt_idle_p50_ms"]
    plain_inflation = plain["rtt_loaded_p50_ms"] - plain["rtt_idle_p50_ms"]
    assert inflation >= 0.5 * plain_inflation - 0.2, (r, plain)
    pings = (1 + 3) / 0.05  # at most this many echoes each way, both phases
    assert all(20 <= m <= pings + 10 for m in on_side), (on_side, pings)
    _rtt, on_side = moved(sides, lambda: _rtt_min_ms(lab_id, "10.0.1.2", 10))
    assert on_side == [0, 0]  # off again: the plain veth
    assert run_lab("down", "--id", lab_id).returncode == 0


@pytest.mark.root
def test_a_side_path_that_cannot_be_built_leaves_the_lab_up_as_before(nic_lab_id, tmp_path):
    """No engine (LAB_ENGINE_DIR names a build that is not there): `lab up` still succeeds, the
    NICs are not applied and lab.json and the warnings say why, and nothing of the side path
    is left (its namespace, the side interfaces, the clsact on the link interfaces)."""
    from lab.core import netops
    from lab.core.teardown import teardown
    from lab.impair.kernel import probe_netem
    from lab.substrate.local.lab import Lab

    lab_id = nic_lab_id
    env = {"LAB_ENGINE_DIR": str(tmp_path / "no-engine")}
    up = run_lab("up", TOPOS / "pi_pair.py", "-p", "cpu=pi4", "--id", lab_id, env=env)
    assert up.returncode == 0, up.stderr
    lab = Lab.open(lab_id)
    if probe_netem(lab.node("client")).ok:
        pytest.skip("kernel netem is present: nic_latency=auto applies it there, no side path")
    rec = lab.info["nic_latency"]
    assert rec["applied"] is False and "side_path" not in rec, rec
    assert "side path for latency tests could not be built" in rec["why"]
    assert "no-engine" in rec["why"]  # the engine's own error, naming the missing build
    assert any("could not be built" in w for w in lab.info["warnings"])
    assert not netops.netns_exists(f"{lab_id}-nic0")
    for node in ("client", "server"):
        assert not netops.link_exists(f"{lab_id}-{node}", "nic0")
        r = run_lab("exec", "--id", lab_id, node, "--", "tc", "qdisc", "show")
        assert r.returncode == 0 and "clsact" not in r.stdout, r.stdout
    assert _rtt_min_ms(lab_id, "10.0.1.2", 5) < 10  # the plain link works
    assert run_lab("down", "--id", lab_id).returncode == 0
    assert teardown(lab_id) == []
