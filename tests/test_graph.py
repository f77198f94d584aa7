"""lab.model.graph: the one graph search over a topology (adjacency, shortest path, reachable segments)."""

from __future__ import annotations

from mininet.topo import Topo

from lab.model.graph import adjacency, reachable_segments, segment_members, shortest_path
from lab.model.topology import load_topology, resolve

from .conftest import TOPOS


class Chain(Topo):
    """a -- r1 -- s1 -- r2 -- b, plus c on s1 and a side host d on r2 (r1, r2 route; c does not)."""

    def build(self):
        a, b, c, d = (self.addHost(n) for n in "abcd")
        r1 = self.addHost("r1", router=True)
        r2 = self.addHost("r2", router=True)
        s1 = self.addSwitch("s1")
        self.addLink(a, r1)  # 0
        self.addLink(r1, s1)  # 1
        self.addLink(s1, r2)  # 2
        self.addLink(r2, b)  # 3
        self.addLink(c, s1)  # 4
        self.addLink(r2, d)  # 5


def chain():
    return resolve(Chain(), source="chain", topo_name="chain")


def test_adjacency_both_directions_in_link_order():
    adj = adjacency(chain().links)
    assert adj["s1"] == [(1, "r1"), (2, "r2"), (4, "c")]
    assert adj["a"] == [(0, "r1")]


def test_shortest_path_through_switches_and_routers_only():
    spec = chain()
    assert shortest_path(spec.nodes, spec.links, "a", "b") == [
        (0, "a", "r1"),
        (1, "r1", "s1"),
        (2, "s1", "r2"),
        (3, "r2", "b"),
    ]
    assert shortest_path(spec.nodes, spec.links, "a", "c") == [
        (0, "a", "r1"),
        (1, "r1", "s1"),
        (4, "s1", "c"),
    ]
    assert shortest_path(spec.nodes, spec.links, "a", "a") == []
    # a host that does not route is not passed through
    spec.nodes["r1"].router = False
    assert shortest_path(spec.nodes, spec.links, "a", "b") is None


def test_segment_members_lists_host_interfaces():
    spec = chain()
    members = segment_members(spec.nodes)
    lan = spec.nodes["c"].interfaces[0].segment
    assert sorted(i.node for i in members[lan]) == ["c", "r1", "r2"]
    assert "s1" not in {i.node for seg in members.values() for i in seg}


def test_reachable_segments_hops_and_first_hop():
    spec = chain()
    seg = {n: spec.nodes[n].interfaces[0].segment for n in "abcd"}
    reach = reachable_segments(spec.nodes, "a")
    assert reach[seg["a"]].hops == 0 and reach[seg["a"]].via is None
    assert reach[seg["c"]].hops == 1
    assert reach[seg["b"]].hops == 2 and reach[seg["d"]].hops == 2
    r1_to_a = next(i for i in spec.nodes["r1"].interfaces if i.segment == seg["a"])
    assert {r.via.name for r in reach.values() if r.hops} == {r1_to_a.name}
    assert {r.out.name for r in reach.values()} == {"a-eth0"}
    # a blocked router forwards nothing; a skipped interface is not left by
    assert set(reachable_segments(spec.nodes, "a", blocked={"r2"})) == {seg["a"], seg["c"]}
    r2_lan = next(i for i in spec.nodes["r2"].interfaces if i.segment == seg["c"])
    far = reachable_segments(spec.nodes, "r2", skip_ifs={r2_lan.name}, blocked={"r1"})
    assert set(far) == {seg["b"], seg["d"]}


def test_routes_come_from_reachable_segments():
    spec = load_topology(TOPOS / "site_to_site.py")
    h1 = spec.nodes["h1"]
    reach = reachable_segments(spec.nodes, "h1")
    assert [r["dst"] for r in h1.routes[::2]] == [
        spec.segments[s].v4 for s, r in sorted(reach.items()) if r.hops
    ]
    assert {r["via"] for r in h1.routes} == {"10.1.0.1", "fd00:a1::1"}
