"""`lab status` (issue 21): the VPN and the impairment in the table, an unknown id refused."""

from __future__ import annotations

import io

from rich.console import Console

import lab.cli.printing as cliprint
from lab.cli.main import main

STATUS = {
    "id": "t21",
    "state": "up",
    "topology": "topologies/pi_pair.py",
    "nodes": {
        "client": {
            "kind": "local",
            "netns": "t21-client",
            "router": False,
            "cpu": {},
            "interfaces": [
                {
                    "name": "client-eth0",
                    "ip": "10.0.1.1/24",
                    "ip6": "fd00:1::1/64",
                    "peer": "server:server-eth0",
                }
            ],
        },
        "server": {
            "kind": "local",
            "netns": "t21-server",
            "router": False,
            "cpu": {},
            "interfaces": [
                {
                    "name": "server-eth0",
                    "ip": "10.0.1.2/24",
                    "ip6": "fd00:1::2/64",
                    "peer": "client:client-eth0",
                }
            ],
        },
    },
    "vpn": {
        "profile": "wireguard",
        "driver": "wireguard",
        "state": "up",
        "path": "wireguard-go",
        "describe": {"interface": "wg0", "mtu": 1420, "cipher": "ChaCha20-Poly1305"},
        "tunnel": {
            "client": {"node": "client", "v4": "10.99.0.1/24", "v6": "fd99::1/64"},
            "server": {"node": "server", "v4": "10.99.0.2/24", "v6": "fd99::2/64"},
        },
    },
    "impair": {
        "backend": "userspace",
        "placement": "egress",
        "points": [
            {"node": "client", "ifname": "client-eth0", "link": 0, "way": "fwd"},
            {"node": "server", "ifname": "server-eth0", "link": 0, "way": "rev"},
        ],
        "applied": {
            "client:client-eth0": {
                "delay_us": 10000,
                "loss": {"model": "random", "p_pct": 1.0, "corr_pct": 0.0},
            },
            "server:server-eth0": {"delay_us": 20000},
        },
    },
}  # fmt: skip  (the shape `lab status --json` gives for a lab up with --vpn and --impair)


def _printed(monkeypatch, status) -> str:
    buf = io.StringIO()
    monkeypatch.setattr(cliprint, "out", Console(file=buf, width=250))
    cliprint.print_status(status)
    return buf.getvalue()


def test_status_shows_the_tunnel_and_the_impairment_per_point(monkeypatch):
    text = _printed(monkeypatch, STATUS)
    row = {ln.split("│")[4].strip(): ln for ln in text.splitlines() if "│" in ln}
    assert "10.99.0.1/24" in row["wg0 (VPN)"] or "10.99.0.2/24" in row["wg0 (VPN)"]
    assert "delay 10ms loss 1% (client->server)" in row["client-eth0"]
    assert "delay 20ms (server->client)" in row["server-eth0"]
    assert "data plane wireguard-go" in text and "MTU 1420" in text
    assert "backend userspace, placement egress" in text and "each direction" in text


def test_status_of_a_lab_without_vpn_or_impairment_says_so(monkeypatch):
    bare = {k: v for k, v in STATUS.items() if k not in ("vpn", "impair")}
    text = _printed(monkeypatch, bare)
    assert "VPN: none" in text and "impairment: none" in text and "(VPN)" not in text


def test_status_of_an_unknown_lab_exits_non_zero_and_names_it(capsys):
    rc = main(["status", "--id", "nolab21x"])
    err = capsys.readouterr().err
    assert rc != 0
    assert "no lab 'nolab21x'" in err and "lab clean" not in err


def test_impair_set_without_target_says_the_target_is_missing(capsys):
    # `delay` in the TARGET position: the target was forgotten, not a bad keyword '40ms'
    assert main(["impair", "set", "delay", "40ms", "5ms", "loss", "0.5%"]) == 2
    msg = capsys.readouterr().err
    assert "TARGET: missing: the TARGET ('delay' is an impairment word)" in msg
    assert "a link name, a node, NODE:IFACE or all" in msg
    assert "lab impair set all delay 40ms 5ms loss 0.5%" in msg
    assert main(["impair", "set", "network1"]) == 2  # a preset alone: no SPEC, usage
    assert main(["impair", "set", "lossy", "delay", "5ms"]) == 2
    assert "('lossy' is an impairment word)" in capsys.readouterr().err
