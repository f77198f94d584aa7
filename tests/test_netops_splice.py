"""lab.core.netops.splice_veth_end on throw-away namespaces (root): a namespace spliced into a live
veth, the re-created end keeps its name, MAC, MTU, addresses and every route through it, and the
peer's end is not touched (issue 20: runtime impairment under a running tunnel)."""

from __future__ import annotations

import secrets

import pytest

from lab.core import netops, proc

pytestmark = pytest.mark.root


@pytest.fixture
def names():
    p = "s" + secrets.token_hex(3)
    ns = {"x": f"{p}-x", "y": f"{p}-y", "bump": f"{p}-bump"}
    yield ns
    for n in ns.values():
        netops.remove_netns(n)


def _run(ns: str, argv: list[str]) -> str:
    return proc.run(["nsenter", f"--net={netops.NETNS_DIR / ns}", "--", *argv]).stdout


def test_splice_keeps_the_interface_and_its_routes(names):
    x, y, bump = names["x"], names["y"], names["bump"]
    for n in names.values():
        netops.create_netns(n)
    # as in every lab node (lab.substrate.local.lab.NODE_SYSCTLS): IPv6 addresses usable at once, no DAD
    for n in (x, y):
        _run(n, ["sysctl", "-q", "-w", "net.ipv6.conf.default.accept_dad=0"])
    netops.create_veth(x, "x-eth0", y, "y-eth0", 1400)
    netops.configure_node(
        x,
        [{"name": "x-eth0", "ip": "10.5.0.1/24", "ip6": "fd05::1/64"}],
        [{"dst": "10.6.0.0/24", "via": "10.5.0.2", "dev": "x-eth0"}],
        default_route="via fd05::2",
    )
    netops.configure_node(y, [{"name": "y-eth0", "ip": "10.5.0.2/24", "ip6": "fd05::2/64"}], [])
    _run(x, ["ip", "route", "add", "10.7.0.0/24", "via", "10.5.0.2", "table", "100"])
    before = netops.read_interface(x, "x-eth0")
    assert {r.get("dst") for r in before["routes"]} >= {"10.6.0.0", "10.7.0.0", None}
    peer_before = _run(y, ["ip", "-o", "link", "show", "y-eth0"]).split("@")[0]

    # the bump forwards with a bridge here instead of an engine
    netops.splice_veth_end(x, before, bump, "imp-b", "imp-a")
    netops.configure_node(bump, [], [], bridge_ports=["imp-a", "imp-b"])

    after = netops.read_interface(x, "x-eth0")
    assert after == before
    assert _run(y, ["ip", "-o", "link", "show", "y-eth0"]).split("@")[0] == peer_before
    assert "10.7.0.0/24 via 10.5.0.2" in _run(x, ["ip", "route", "show", "table", "100"])
    for addr in ("10.5.0.2", "fd05::2"):
        _run(x, ["ping", "-c", "1", "-W", "2", addr])
