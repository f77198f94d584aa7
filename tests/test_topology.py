"""Topology loading: the shipped files resolve; malformed inputs are clear errors (no root)."""

from __future__ import annotations

import ipaddress
import textwrap

import pytest

from lab.core.errors import ConfigError
from lab.model.topology import load_topology, parse_param

from .conftest import TOPOS

SHIPPED = sorted(TOPOS.glob("*.py"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_topologies_resolve_dual_stack(path):
    spec = load_topology(path)
    for n in spec.hosts():
        assert n.interfaces, n.name
        for i in n.interfaces:
            assert ipaddress.ip_interface(i.ip).version == 4
            assert ipaddress.ip_interface(i.ip6).version == 6
            assert len(i.name) <= 15
    client, server = spec.endpoints("vpn")
    assert client != server
    # every host can reach every segment: directly or through a route
    for n in spec.hosts():
        direct = {i.segment for i in n.interfaces}
        routed = {r["dst"] for r in n.routes}
        for s in spec.segments:
            assert s.index in direct or (s.v4 in routed and s.v6 in routed), (n.name, s)


def test_middlebox_layout():
    spec = load_topology(TOPOS / "pi_pair_middlebox.py")
    assert spec.nodes["router"].router
    assert spec.nodes["client"].cpu == "pi4"
    r = {x["dst"]: x["via"] for x in spec.nodes["client"].routes}
    assert r["10.0.2.0/24"] == "10.0.1.1"
    assert r["fd00:2::/64"] == "fd00:1::1"
    assert spec.endpoints("vpn") == ("client", "server")
    assert spec.endpoints("traffic") == ("client", "server")


def test_site_to_site_routes_go_through_both_gateways():
    spec = load_topology(TOPOS / "site_to_site.py")
    r = {x["dst"]: x["via"] for x in spec.nodes["h1"].routes}
    assert r["10.2.0.0/24"] == "10.1.0.1"
    r = {x["dst"]: x["via"] for x in spec.nodes["gw1"].routes}
    assert r["10.2.0.0/24"] == "10.0.0.2"
    assert spec.endpoints("vpn") == ("gw1", "gw2")
    assert spec.endpoints("traffic") == ("h1", "h2")


def test_auto_addressing_and_switch(tmp_path):
    f = tmp_path / "sw.py"
    f.write_text(
        textwrap.dedent("""
        from mininet.topo import Topo
        class T(Topo):
            def build(self, n=3):
                s = self.addSwitch("s1")
                for i in range(n):
                    self.addLink(self.addHost(f"h{i}"), s)
        topos = {"t": T}
    """)
    )
    spec = load_topology(f, params={"n": 4})
    assert len(spec.segments) == 1
    ips = {n.interfaces[0].ip for n in spec.hosts()}
    assert len(ips) == 4
    nets = {ipaddress.ip_interface(i).network for i in ips}
    assert len(nets) == 1


def test_parse_param():
    assert parse_param("bw=100") == ("bw", 100)
    assert parse_param("cpu=0.5") == ("cpu", 0.5)
    assert parse_param("x=true") == ("x", True)
    assert parse_param("cpu=pi4") == ("cpu", "pi4")
    with pytest.raises(ConfigError, match="key=value"):
        parse_param("novalue")


HEADER = "from mininet.topo import Topo\n"


def _pair(host_a="", host_b="", link=""):
    return HEADER + textwrap.dedent(f"""
        class T(Topo):
            def build(self):
                a = self.addHost("a"{host_a})
                b = self.addHost("b"{host_b})
                self.addLink(a, b{link})
        topos = {{"t": T}}
    """)


# (name, file text, regex the message must match)
MALFORMED = [
    (
        "unknown host option",
        _pair(host_a=", cpux=1"),
        r"host 'a': cpux: unknown option \(did you mean 'cpu'\?\); accepted: arch, cpu, defaultRoute, ip",
    ),
    (
        "unknown link option",
        _pair(link=", bandwidth=10"),
        r"link a-b: bandwidth: unknown option; accepted: bw, delay",
    ),
    (
        "unknown cpu profile",
        _pair(host_a=", cpu='pi9'"),
        r"host 'a': cpu: unknown CPU profile 'pi9'; profiles: .*pi4",
    ),
    (
        "cpu fraction too small",
        _pair(host_a=", cpu=0.001"),
        r"cpu: got 0.001 cores; accepted: .* or a core fraction 0.01..1024",
    ),
    ("cpu negative", _pair(host_a=", cpu=-1"), r"cpu: got -1.0 cores"),
    ("cpu bool", _pair(host_a=", cpu=True"), r"cpu: got True; accepted: a CPU profile name"),
    ("cpu list", _pair(host_a=", cpu=[1]"), r"cpu: got list \[1\]; accepted: a CPU profile name"),
    (
        "bw zero",
        _pair(link=", bw=0"),
        r"link a-b: bw: got 0; accepted: float >= 0.001 and <= 100000 Mbit/s",
    ),
    ("bw negative", _pair(link=", bw=-5"), r"bw: got -5;"),
    ("bw string", _pair(link=", bw='fast'"), r"bw: got str 'fast'; accepted: float"),
    (
        "bw too big",
        _pair(link=", bw=10**7"),
        r"bw: got 10000000; accepted: float >= 0.001 and <= 100000",
    ),
    (
        "mtu too small",
        _pair(link=", mtu=10"),
        r"mtu: got 10; accepted: int >= 68 and <= 65535 bytes",
    ),
    ("bad ip", _pair(host_a=", ip='10.0.0.300/24'"), r"ip must be an IPv4 address with prefix"),
    ("ip is v6", _pair(host_a=", ip='fd00::1/64'"), r"ip must be IPv4"),
    ("bad ip6", _pair(host_a=", ip6='zz::1/64'"), r"ip6 must be an IPv6 address"),
    ("network address", _pair(host_a=", ip='10.0.5.0/24'"), r"is the network address"),
    (
        "different subnets on one link",
        _pair(host_a=", ip='10.0.1.1/24'", host_b=", ip='10.0.2.1/24'"),
        r"same L2 segment but in different subnets",
    ),
    (
        "same address twice",
        _pair(host_a=", ip='10.0.1.1/24'", host_b=", ip='10.0.1.1/24'"),
        r"address 10.0.1.1 assigned twice",
    ),
    (
        "router not bool",
        _pair(host_a=", router='yes'"),
        r"router: got str 'yes'; accepted: one of True, False",
    ),
    (
        "vpn role",
        _pair(host_a=", vpn='initiator'"),
        r"vpn: got 'initiator'; accepted: one of 'client', 'server'",
    ),
    (
        "traffic role",
        _pair(host_a=", traffic=1"),
        r"traffic: got int 1; accepted: one of 'client', 'server'",
    ),
    (
        "defaultRoute syntax",
        _pair(host_a=", defaultRoute='10.0.0.1'"),
        r"defaultRoute must be 'via ADDRESS'",
    ),
    (
        "defaultRoute dev",
        _pair(host_a=", defaultRoute='dev eth9'"),
        r"defaultRoute names interface 'eth9'",
    ),
    (
        "defaultRoute off-subnet",
        _pair(host_a=", ip='10.0.1.1/24', defaultRoute='via 10.9.9.9'"),
        r"gateway 10.9.9.9 is on none of the host's subnets",
    ),
    (
        "ifname too long",
        _pair(link=", intfName1='a-very-long-interface'"),
        r"is 21 bytes; Linux allows 1..15",
    ),
    (
        "loss out of range",
        _pair(link=", loss=120"),
        r"loss: got 120; accepted: float >= 0 and <= 100 %",
    ),
    ("jitter without delay", _pair(link=", jitter='5ms'"), r"jitter needs delay|jitter"),
    (
        "params not dict",
        _pair(link=", params1='10.0.0.1'"),
        r"params1: got str '10.0.0.1'; accepted: a dict with keys ip, ip6",
    ),
    (
        "params unknown key",
        _pair(link=", params1={'mac': 'x'}"),
        r"link a-b params1: mac: unknown option; accepted: ip, ip6",
    ),
    ("impair not str", _pair(link=", impair=5"), r"impair: got int 5; accepted: str"),
    (
        "no topos dict",
        HEADER + "class T(Topo):\n    def build(self):\n        pass\n",
        r"defines no `topos",
    ),
    (
        "empty topology",
        HEADER + "class T(Topo):\n    def build(self):\n        pass\ntopos={'t': T}\n",
        r"topology has no nodes",
    ),
    (
        "import raises",
        "raise RuntimeError('boom')\n",
        r"importing raised RuntimeError: boom at line 1",
    ),
    ("syntax error", "def (:\n", r"syntax error at line 1"),
    (
        "build raises",
        HEADER + "class T(Topo):\n    def build(self):\n        1/0\ntopos={'t': T}\n",
        r"building topology 't' raised ZeroDivisionError",
    ),
    (
        "bad node name",
        HEADER
        + "class T(Topo):\n    def build(self):\n        self.addHost('a-b')\ntopos={'t': T}\n",
        r"node names must start with a letter",
    ),
    (
        "long node name",
        HEADER
        + textwrap.dedent("""
        class T(Topo):
            def build(self):
                self.addLink(self.addHost('averyveryverylongname'), self.addHost('b'))
        topos = {'t': T}
    """),
        r"interface name 'averyveryverylongname-eth0' is 26 bytes",
    ),
    (
        "overlapping subnets",
        HEADER
        + textwrap.dedent("""
        class T(Topo):
            def build(self):
                r = self.addHost('r', router=True)
                a = self.addHost('a'); b = self.addHost('b')
                self.addLink(a, r, params1={'ip': '10.1.0.2/16'}, params2={'ip': '10.1.0.1/16'})
                self.addLink(r, b, params1={'ip': '10.1.5.1/24'}, params2={'ip': '10.1.5.2/24'})
        topos = {'t': T}
    """),
        r"subnets 10.1.0.0/16 and 10.1.5.0/24 overlap",
    ),
    (
        "switch option",
        HEADER
        + textwrap.dedent("""
        class T(Topo):
            def build(self):
                s = self.addSwitch('s1', stp=True)
                self.addLink(self.addHost('a'), s)
        topos = {'t': T}
    """),
        r"switch 's1': stp: unknown option; accepted: \(none\)",
    ),
    (
        "self link",
        HEADER
        + textwrap.dedent("""
        class T(Topo):
            def build(self):
                a = self.addHost('a')
                self.addLink(a, a)
        topos = {'t': T}
    """),
        r"a link must join two different nodes",
    ),
    (
        "topo args",
        HEADER
        + "class T(Topo):\n    def build(self):\n        self.addHost('a')\ntopos={'t': T}\n",
        None,
    ),  # placeholder replaced below (bad -p)
]


@pytest.mark.parametrize(
    "name,text,pattern", [m for m in MALFORMED if m[2]], ids=[m[0] for m in MALFORMED if m[2]]
)
def test_malformed_topology_is_a_clear_error(tmp_path, name, text, pattern):
    f = tmp_path / "bad_topo.py"
    f.write_text(text)
    with pytest.raises(ConfigError) as ei:
        load_topology(f)
    msg = str(ei.value)
    assert str(f) in msg, msg  # names the file
    assert __import__("re").search(pattern, msg), msg


def test_unknown_parameter_and_topo_name(tmp_path):
    f = tmp_path / "t.py"
    f.write_text(_pair().replace('topos = {"t": T}', 'topos = {"t": T, "u": T}'))
    with pytest.raises(ConfigError, match="choose one with --topo: t, u"):
        load_topology(f)
    with pytest.raises(ConfigError, match="unknown topology 'x'; valid: t, u"):
        load_topology(f, "x")
    with pytest.raises(ConfigError, match="cannot build topology 't' with parameters"):
        load_topology(f, "t", {"nope": 1})


def test_missing_file():
    with pytest.raises(ConfigError, match="topology file not found"):
        load_topology("/nonexistent/topo.py")


def test_at_least_30_malformed_cases():
    assert len([m for m in MALFORMED if m[2]]) >= 30
