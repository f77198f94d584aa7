"""Issue 32, items 13 and 16: `lab impair show` in the words of the `lab status` table (no Python
repr anywhere), and no ARP/NDP round trip lost to the engine spliced into a live link by the first
`lab impair set` on a lab built without `--impair`."""

from __future__ import annotations

import json
import re

import pytest

from lab.cli.labs import impairment_lines
from lab.substrate.local.lab import Lab

from .conftest import TOPOS, lab_traces, run_lab

#: what a Python dict, list, tuple or None looks like when printed as it is
REPR = re.compile(r"\{'|'\}|\['|'\]|\(\)|\bNone\b|\bTrue\b|\bFalse\b")


def _no_repr(text: str) -> None:
    found = REPR.findall(text)
    assert not found, f"Python repr {found} in:\n{text}"


def test_kernel_netem_show_in_words():
    """The kernel back end's shape (NODE:DEV keys, a qdisc's words), an engine that did not
    answer and a lab without points: words, never reprs (no root: the rendering alone)."""
    where = {
        "router:router-eth0": {
            "link": "client-router",
            "from": "router",
            "to": "client",
            "way": "server->client",
        }
    }
    kernel = {
        "backend": "kernel-netem",
        "why": "sch_netem present",
        "placement": "middlebox",
        "requested": {"router:router-eth0": "delay 10ms"},
        "applied": {"router:router-eth0": "delay 10ms limit 1000"},
        "where": where,
        "warnings": ["a warning"],
    }
    text = "\n".join(impairment_lines(kernel))
    _no_repr(text)
    assert "in force at router:router-eth0 router->client (server->client): delay 10ms" in text
    dead = {
        "backend": "userspace",
        "placement": "egress",
        "applied": {"imp0": {}},
        "engines": {"imp0": {"error": "connection refused"}},
    }
    text = "\n".join(impairment_lines(dead))
    _no_repr(text)
    assert "not answering: connection refused" in text
    none = impairment_lines({"backend": None, "placement": None, "applied": None})
    _no_repr("\n".join(none))
    assert none[0].startswith("impairment: none")


@pytest.mark.root
def test_impair_show_speaks_the_status_words(lab_id):
    r = run_lab("up", TOPOS / "pi_pair_middlebox.py", "-p", "cpu=host", "--id", lab_id)
    assert r.returncode == 0, r.stderr
    try:
        shown = run_lab("impair", "show", "--id", lab_id)
        assert shown.returncode == 0, shown.stderr
        _no_repr(shown.stdout)
        assert "impairment: none" in shown.stdout

        r = run_lab("impair", "set", "--id", lab_id, "client-router", "delay", "10ms")
        assert r.returncode == 0, r.stderr
        _no_repr(r.stdout)
        shown = run_lab("impair", "show", "--id", lab_id)
        assert shown.returncode == 0, shown.stderr
        _no_repr(shown.stdout)
        # the point as the status table names it: NODE:IFACE, the hop and the tunnel direction
        assert (
            "requested at router:router-eth0 router->client (server->client): delay 10ms"
            in shown.stdout
        ), shown.stdout
        assert "requested at router:router-eth1 router->server (client->server): none" in (
            shown.stdout
        )
        backend = json.loads(run_lab("impair", "show", "--id", lab_id, "--json").stdout)
        assert backend["where"]["router:router-eth0"]["way"] == "server->client"
        if backend["backend"] == "userspace":  # the engine's directions, on its link
            assert re.search(r"in force in engine \w+ on link router-server:", shown.stdout)
            assert "server->router (server->client): delay 10ms" in shown.stdout, shown.stdout
            assert "router->server (client->server): none" in shown.stdout
        else:
            assert "in force at router:router-eth0 router->client (server->client): delay 10ms" in (
                shown.stdout
            )
        r = run_lab("impair", "clear", "--id", lab_id)
        assert r.returncode == 0, r.stderr
        _no_repr(r.stdout)
    finally:
        assert run_lab("down", "--id", lab_id).returncode == 0
    assert not lab_traces(lab_id)


def _neighbour(node, ifname: str, addr: str) -> dict | None:
    rows = json.loads(node.run(["ip", "-j", "neigh", "show", "dev", ifname]).stdout or "[]")
    return next((n for n in rows if n.get("dst") == addr and n.get("lladdr")), None)


def _mac(node, ifname: str) -> str:
    return json.loads(node.run(["ip", "-j", "link", "show", ifname]).stdout)[0]["address"]


def _first_rtt_ms(node, addr: str) -> float:
    out = node.run(["ping", "-n", "-c", "1", "-W", "2", addr], timeout=30).stdout
    m = re.search(r"time=([\d.]+) ms", out)
    assert m, out
    return float(m.group(1))


@pytest.mark.root
def test_first_echo_after_the_first_impair_set_takes_one_round_trip(lab_id):
    """pi_pair, no CPU cap, no `--impair`: both nodes have resolved each other (one ping each
    family), then `lab impair set all delay 20ms` (the engine spliced into the link where the
    kernel has no netem). Both neighbour tables still hold the peer's MAC, and the first echo
    takes one configured round trip (40 ms), not two (an ARP/NDP exchange through the delay
    first): bounded by 1.5 x the configured round trip, which no host load lowers."""
    r = run_lab("up", TOPOS / "pi_pair.py", "-p", "cpu=host", "--id", lab_id)
    assert r.returncode == 0, r.stderr
    try:
        lab = Lab.open(lab_id)
        client, server = lab.node("client"), lab.node("server")
        peers = {"client": ("10.0.1.2", "fd00:1::2"), "server": ("10.0.1.1", "fd00:1::1")}
        for addr in peers["client"]:  # undelayed: each side resolves the other
            _first_rtt_ms(client, addr)
        r = run_lab("impair", "set", "--id", lab_id, "all", "delay", "20ms")
        assert r.returncode == 0, r.stderr
        backend = json.loads(run_lab("impair", "show", "--id", lab_id, "--json").stdout)["backend"]
        print(f"backend {backend}")
        for node, ifname, other, other_if in (
            (client, "client-eth0", server, "server-eth0"),
            (server, "server-eth0", client, "client-eth0"),
        ):
            for addr in peers[node.name]:
                n = _neighbour(node, ifname, addr)
                assert n, f"{node.name} lost its neighbour entry for {addr}"
                assert n["lladdr"] == _mac(other, other_if)
        round_trip_ms = 2 * 20
        for addr in peers["client"]:
            rtt = _first_rtt_ms(client, addr)
            print(f"first echo to {addr} after the splice: {rtt} ms")
            assert round_trip_ms * 0.99 <= rtt < 1.5 * round_trip_ms, rtt
    finally:
        assert run_lab("down", "--id", lab_id).returncode == 0
    assert not lab_traces(lab_id)
