"""Tunnels really up, with real packets: ping v4/v6, iperf3, a capture on the router proving the
payload is (or, for the baseline and openvpn-none, is not) encrypted on the wire, the tunnel MTU
confirmed with DF pings, and nothing of the lab left after `down`."""

from __future__ import annotations

import json
import os
import time

import pytest

from lab.core import proc
from lab.core.errors import StartupError
from lab.substrate.local.build import up
from lab.core.proc import is_same_process
from lab.core.teardown import teardown
from lab.model.topology import load_topology
from lab.vpn.drivers.openvpn import OpenVPNDriver
from lab.vpn.teardown import tear_down
from tests.conftest import TOPOS, lab_traces, run_lab
from tests.tunnelprobe import capture_marker, largest_df_payload

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(
        not all(proc.which(t) for t in ("iperf3", "tcpdump", "openvpn", "wg", "openssl")),
        reason="needs iperf3, tcpdump, openvpn, wireguard-tools, openssl",
    ),
]

# profile -> is the plaintext visible on the underlay?
PROFILES = {
    "baseline": True,
    "wireguard": False,
    "openvpn-aes256cbc-static": False,
    "openvpn-tls": False,
    "openvpn-tls-tcp": False,  # OpenVPN over TCP (proto tcp-server / tcp-client)
    "openvpn-none": True,
    "openvpn-bf-sha1-static": False,
    "openvpn-nocipher-static": True,
    "openvpn-nodigest-static": False,
    "tinc": False,
    "tinc-nocipher": True,
    "tinc-nodigest": False,
    "tinc-none": True,
    "ipsec-null": True,  # ESP with the NULL cipher: authenticated, not encrypted
}


def spec_of(name: str):
    # uncapped nodes: these tests prove function, not board-like speed
    return load_topology(TOPOS / f"{name}.py", params={"cpu": None})


def iperf3(client, server, addr: str) -> dict:
    srv = server.spawn("iperf3", ["iperf3", "-s", "-1", "-B", addr])
    deadline = time.monotonic() + 5
    while True:  # the server needs a moment to listen; retry "connection refused"
        cp = client.run(["iperf3", "-c", addr, "-t", "3", "-J"], check=False, timeout=30)
        if cp.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    server.stop(srv)
    assert cp.returncode == 0, cp.stdout[-500:] + cp.stderr
    return json.loads(cp.stdout)


@pytest.mark.parametrize("profile", PROFILES)
def test_profile_end_to_end(profile, lab_id):
    lab = up(spec_of("pi_pair_middlebox"), lab_id, vpn=profile)
    v = lab.info["vpn"]
    daemons = [(d["pid"], d["start_time"]) for d in v["daemons"]]
    try:
        client, server = lab.node("client"), lab.node("server")
        t4, t6 = v["traffic"]["v4"], v["traffic"]["v6"]
        d = v["describe"]
        assert v["state"] == "up" and d["path"] and d["version"] and d["config_hash"]
        if profile == "baseline":
            assert (t4, t6) == ("10.0.2.2", "fd00:2::2")
        else:
            assert (t4, t6) == ("10.99.0.2", "fd99::2")
            route = client.run(["ip", "-j", "route", "get", t4]).stdout
            assert json.loads(route)[0]["dev"] == d["interface"]
        for addr in (t4, t6):
            client.run(["ping", "-c", "2", "-i", "0.2", "-W", "2", addr])
        if d["path"] == "wireguard-go":
            # its UAPI socket is in the node's private /run, not the host's
            client.run(["test", "-S", "/run/wireguard/wg0.sock"])
            assert not os.path.exists("/run/wireguard/wg0.sock")

        result = iperf3(client, server, t4)
        # traffic passed (speed: bench/); iperf3 -J can exit 0 with an "error" and no sums
        received = (result.get("end") or {}).get("sum_received") or {}
        assert received.get("bytes", 0) > 0, result.get("error") or sorted(result.get("end", {}))

        seen, size = capture_marker(lab, t4)
        assert size > 200  # the capture worked and carried the packets
        assert seen is PROFILES[profile], f"plaintext marker {'absent' if not seen else 'present'}"

        # secrets: 0600 files in a 0700 dir, never in the lab's record
        record = (lab.dir / "lab.json").read_text()
        assert oct((lab.dir / "secrets").stat().st_mode & 0o777) == "0o700"
        for f in (lab.dir / "secrets").iterdir():
            assert f.stat().st_mode & 0o777 == 0o600, f
            key = f.read_text().strip().splitlines()
            assert all(line not in record for line in key if len(line) > 20), f

        mtu = d["mtu"]
        assert mtu == {"wireguard": 1420, "ipsec-null": 1400}.get(profile, 1500)
        # search up to one byte above what the interface MTU allows: every failed probe costs -W 1
        assert largest_df_payload(client, t4, mtu - 27) + 28 == mtu
        fam6 = ["ping", "-6", "-M", "do", "-c", "1", "-W", "1", "-s"]
        assert client.run([*fam6, str(mtu - 48), t6], check=False).returncode == 0
        assert client.run([*fam6, str(mtu - 47), t6], check=False).returncode != 0
    finally:
        assert teardown(lab_id) == []
    assert lab_traces(lab_id) == []
    for pid, start_time in daemons:
        # by PID and start time: PIDs recycle fast here (pid_max 32768), zombies do not count
        assert not is_same_process(pid, start_time), f"daemon {pid} survived"
    assert not list(lab.dir.parent.glob(f"{lab_id}*"))


@pytest.mark.parametrize(
    "topo, frm, targets",
    [
        ("router_under_test", "lan", ["10.99.0.2", "fd99::2"]),
        ("site_to_site", "h1", ["10.2.0.2", "fd00:a2::2"]),
    ],
)
def test_traffic_endpoints_behind_gateways_use_the_tunnel(topo, frm, targets, lab_id):
    lab = up(spec_of(topo), lab_id, vpn="wireguard")
    v = lab.info["vpn"]
    assert [v["traffic"]["v4"], v["traffic"]["v6"]] == targets
    gw = lab.node(v["client"])
    for addr in targets:
        lab.node(frm).run(["ping", "-c", "2", "-i", "0.2", "-W", "2", addr])
        assert json.loads(gw.run(["ip", "-j", "route", "get", addr]).stdout)[0]["dev"] == "wg0"
    transfer = gw.run(["wg", "show", "wg0", "transfer"]).stdout.split()
    assert int(transfer[1]) > 0 and int(transfer[2]) > 0  # bytes received and sent by the peer

    tear_down(lab)  # the VPN goes, the lab stays and routes over the underlay again
    assert "vpn" not in lab.info
    assert gw.run(["ip", "link", "show", "wg0"], check=False).returncode != 0
    lab.node(frm).run(
        [
            "ping",
            "-c",
            "1",
            "-W",
            "2",
            lab.info["spec"]["nodes"][v["server"]]["interfaces"][0]["ip"].split("/")[0],
        ]
    )
    assert teardown(lab_id) == []
    assert lab_traces(lab_id) == []


def test_daemon_dying_at_startup_unwinds_the_lab(lab_id, monkeypatch):
    render = OpenVPNDriver.render

    def broken(self, ctx, params, secrets):
        out = render(self, ctx, params, secrets)
        node = ctx.server.name
        out[node]["openvpn.conf"] += "no-such-option-labtest 1\n"
        return out

    monkeypatch.setattr(OpenVPNDriver, "render", broken)
    with pytest.raises(StartupError) as e:
        up(spec_of("pi_pair_middlebox"), lab_id, vpn="openvpn-aes256cbc-static")
    msg = str(e.value)
    assert "openvpn on server exited during start-up" in msg
    assert "no-such-option-labtest" in msg  # the log tail says why
    assert lab_traces(lab_id) == []
    assert not [n for n in os.listdir("/var/run/netns") if n.startswith(f"{lab_id}-")]


def test_cli_rejects_bad_profile_before_creating_anything(lab_id):
    r = run_lab("up", TOPOS / "pi_pair_middlebox.py", "--id", lab_id, "--vpn", "wireguardd")
    assert r.returncode == 2
    assert "unknown VPN profile 'wireguardd' (did you mean 'wireguard'" in r.stderr
    assert "openvpn-tls" in r.stderr  # the shipped names are listed
    r = run_lab("up", TOPOS / "pi_pair_middlebox.py", "--id", lab_id, "--vpn", "wireguard:mtu=1")
    assert (
        r.returncode == 2
        and "params.mtu" in r.stderr
        and "accepted: int >= 1280 and <= 9000" in r.stderr
    )
    assert lab_traces(lab_id) == []


def test_cli_up_with_vpn_and_down(lab_id):
    r = run_lab(
        "up",
        TOPOS / "pi_pair_middlebox.py",
        "-p",
        "cpu=0.5",
        "--id",
        lab_id,
        "--vpn",
        "openvpn-none",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["vpn"]["profile"] == "openvpn-none" and st["vpn"]["describe"]["cipher"] == "none"
    r = run_lab("exec", "--id", lab_id, "client", "--", "ping", "-c1", "-W2", "10.99.0.2")
    assert r.returncode == 0
    assert run_lab("down", "--id", lab_id).returncode == 0
    assert lab_traces(lab_id) == []
