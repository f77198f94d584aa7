"""strongSwan tunnels for real: every ipsec-* profile on pi_pair_middlebox, real packets.

Per profile: the lab comes up with the tunnel (lab.up(..., vpn=PROFILE)), IPv4 and IPv6 pings
and a 3 s iperf3 pass through it, a capture on the router shows ESP-in-UDP and never the plaintext
marker sent through the tunnel (while a marker sent outside it is seen: the capture works), the
reported tunnel MTU is confirmed with DF pings of growing size, and stopping the tunnel leaves no
TUN device, XFRM state or policy, vici socket, tunnel address or charon behind; tearing the lab
down leaves nothing of its id.
"""

from __future__ import annotations

import secrets
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab.substrate.local import build as labmod
from lab.core import proc
from lab.core.errors import StartupError
from lab.measure.base import wait_listening
from lab.measure.iperf3json import parse_iperf3_tcp
from lab.core.teardown import teardown
from lab.model.topology import load_topology
from lab.vpn.drivers import strongswan as sw
from lab.vpn import charon, tunnel
from lab.vpn.teardown import tear_down

from .conftest import lab_traces

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(
        not all(
            proc.which(t) for t in ("ip", "ping", "iperf3", "tcpdump", "swanctl", charon.CHARON)
        ),
        reason="needs ip, ping, iperf3, tcpdump, swanctl and charon (./setup.sh)",
    ),
]

REPO = Path(__file__).resolve().parent.parent
TOPO = REPO / "topologies" / "pi_pair_middlebox.py"
CIPHERS = {
    "ipsec-aes128gcm": ("AES_GCM_8_128", "MODP_1024"),
    "ipsec-aes256gcm": ("AES_GCM_8_256", "MODP_1024"),
    "ipsec-chacha20poly1305": ("CHACHA20_POLY1305", "MODP_1024"),
    "ipsec-modern": ("AES_GCM_16_256", "CURVE_25519"),
}
SERVER_V4, SERVER_V6 = "10.99.0.2", "fd99::2"
MARKER_PORT = 9999
SEND_MARKER = (
    "import socket, sys\n"
    "fam = socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET\n"
    "s = socket.socket(fam, socket.SOCK_DGRAM)\n"
    "for _ in range(3):\n"
    "    s.sendto(sys.argv[2].encode(), (sys.argv[1], int(sys.argv[3])))\n"
)


@pytest.fixture
def sw_lab_id():
    lid = "sw" + secrets.token_hex(3)
    yield lid
    teardown(lid)
    assert lab_traces(lid) == []


@pytest.mark.parametrize("profile", sorted(CIPHERS))
def test_tunnel_passes_traffic_encrypted_and_leaves_nothing(profile, sw_lab_id, tmp_path):
    lab = labmod.up(load_topology(TOPO), sw_lab_id, vpn=profile)
    client, server, router = lab.node("client"), lab.node("server"), lab.node("router")
    rec = lab.info["vpn"]
    desc = rec["describe"]
    expected_path = sw.StrongSwanDriver().check(rec["params"], client).path
    cipher, group = CIPHERS[profile]
    assert desc["implementation"] == "strongSwan" and desc["version"]
    assert desc["path"] == expected_path
    assert desc["cipher"] == cipher and desc["esp"]["encryption"] == cipher
    assert desc["ike"]["dh_group"] == group and desc["ike"]["version"] == "2"
    assert desc["esp"]["mode"] == "TUNNEL"
    esp_alg = cipher if cipher.startswith("CHACHA") else cipher.rsplit("_", 1)[0]  # no key size
    assert desc["crypto_providers"][esp_alg] == "openssl"
    assert len(desc["config_hash"]) == 16
    if expected_path == "kernel-libipsec":
        assert desc["esp"]["udp_encap"] and desc["interface"] == "ipsec0"
        assert desc["mtu"] == rec["params"]["mtu"]

    # IPv4 and IPv6 through the tunnel
    for addr in (SERVER_V4, SERVER_V6):
        client.run(["ping", "-n", "-q", "-c", "3", "-i", "0.1", "-W", "2", addr], timeout=15)

    # 3 s of iperf3 through the tunnel
    port = 5201
    daemon = server.spawn(
        "iperf3-ipsec",
        ["iperf3", "-s", "-1", "-B", SERVER_V4, "-p", str(port)],
        log=tmp_path / "iperf3-server.log",
    )
    try:
        wait_listening(server, daemon, proto="tcp", port=port)
        out = client.run(["iperf3", "-c", SERVER_V4, "-p", str(port), "-t", "3", "-J"], timeout=30)
    finally:
        server.stop(daemon)
    result = parse_iperf3_tcp(out.stdout)
    assert result["receiver_bytes"] > 0 and result["receiver_bps"] > 0, result  # traffic passed
    print(
        f"\n{profile}: {desc['path']} {cipher} iperf3 {result['receiver_bps'] / 1e6:.0f} Mbit/s "
        f"ready in {rec['timing']['ready_s']:.2f} s, mtu {desc['mtu']}"
    )
    ctx = _ctx(lab, profile)
    _, child = sw.StrongSwanDriver().sa(ctx, ctx.client)
    # everything the server received crossed the SA (plus headers): ESP carried the test
    assert int(child["bytes-out"]) > result["receiver_bytes"], "iperf3 bytes did not cross the SA"

    # the wire between client and router carries ESP, never the plaintext
    hidden, control = f"LABMARKER-{secrets.token_hex(8)}", f"LABCONTROL-{secrets.token_hex(8)}"
    pcap = tmp_path / "router-eth0.pcap"
    with _capture(router, "router-eth0", pcap):
        for addr, marker in ((SERVER_V4, hidden), (SERVER_V6, hidden), ("10.0.2.2", control)):
            client.run([sys.executable, "-c", SEND_MARKER, addr, marker, str(MARKER_PORT)])
    wire = pcap.read_bytes()
    assert control.encode() in wire, "capture saw nothing: the test would prove nothing"
    assert hidden.encode() not in wire, "plaintext marker visible on the wire"
    esp = proc.run(["tcpdump", "-r", str(pcap), "-n", "udp port 4500 or esp"]).stdout
    assert len(esp.splitlines()) >= 6, esp

    # the reported MTU, confirmed with DF pings of growing size (v4: +28, v6: +48 bytes)
    mtu = desc["mtu"]
    for size in (64, 512, 1024, mtu - 28):
        client.run(
            ["ping", "-n", "-q", "-c", "1", "-W", "2", "-M", "do", "-s", str(size), SERVER_V4]
        )
    too_big = client.run(
        ["ping", "-n", "-c", "1", "-W", "1", "-M", "do", "-s", str(mtu - 27), SERVER_V4],
        check=False,
    )
    assert too_big.returncode != 0
    client.run(
        ["ping", "-n", "-q", "-c", "1", "-W", "2", "-M", "do", "-s", str(mtu - 48), SERVER_V6]
    )
    assert (
        client.run(
            ["ping", "-n", "-c", "1", "-W", "1", "-M", "do", "-s", str(mtu - 47), SERVER_V6],
            check=False,
        ).returncode
        != 0
    )

    # stop: nothing of the tunnel left in either node, the lab itself still up
    pids = [(d["pid"], d["start_time"]) for d in rec["daemons"]]
    assert len(pids) == 2
    tear_down(lab)
    for pid, start in pids:
        assert not proc.is_same_process(pid, start)
    for node in (client, server):
        assert node.run(["ip", "link", "show", "dev", "ipsec0"], check=False).returncode != 0
        assert node.run(["ip", "xfrm", "state"]).stdout.strip() == ""
        assert node.run(["ip", "xfrm", "policy"]).stdout.strip() == ""
        assert node.run(["ip", "route", "show", "table", "220"], check=False).stdout.strip() == ""
        assert node.run(["test", "-e", charon.RUN_DIR], check=False).returncode != 0
        assert node.run(["test", "-e", charon.PID_FILE], check=False).returncode != 0
        lo = node.run(["ip", "addr", "show", "dev", "lo"]).stdout
        assert "10.99.0." not in lo and "fd99::" not in lo
    client.run(["ping", "-n", "-q", "-c", "1", "-W", "2", "10.0.2.2"])  # underlay still fine


def test_charon_dying_at_startup_raises_with_its_log(sw_lab_id):
    lab = labmod.up(load_topology(TOPO), sw_lab_id)
    # charon refuses to start while its pid file names a live process ("already running")
    lab.node("server").run(["sh", "-c", f"echo 1 > {charon.PID_FILE}"])
    with pytest.raises(StartupError) as e:
        tunnel.bring_up(lab, tunnel.prepare(lab.spec, "ipsec-aes128gcm"))
    assert "charon" in str(e.value) and "already running" in str(e.value)
    tear_down(lab)
    for node in (lab.node("client"), lab.node("server")):
        assert node.run(["ip", "link", "show", "dev", "ipsec0"], check=False).returncode != 0
        assert node.run(["test", "-e", charon.RUN_DIR], check=False).returncode != 0


def _ctx(lab, profile):
    p = tunnel.plan(lab.spec, profile)
    nodes = {n: lab.node(n) for n in (p.client.node, p.server.node)}
    return tunnel.make_context(lab.id, p, nodes, lab.dir)


class _capture:
    """tcpdump on `ifname` in `node` into `pcap` while the with-block runs."""

    def __init__(self, node, ifname: str, pcap: Path):
        self.argv = [
            "tcpdump",
            "-i",
            ifname,
            "-n",
            "-U",
            "--immediate-mode",
            "-s",
            "0",
            "-Z",
            "root",
            "-w",
            str(pcap),
        ]
        self.node = node

    def __enter__(self):
        self.p = self.node.popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        sel = selectors.DefaultSelector()
        sel.register(self.p.stderr, selectors.EVENT_READ)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # "listening on ..." once the capture is armed
            if sel.select(timeout=0.1) and b"listening on" in self.p.stderr.readline():
                return self
            assert self.p.poll() is None, "tcpdump exited"
        raise AssertionError("tcpdump did not start")

    def __exit__(self, *exc):
        time.sleep(0.2)  # the last datagrams reach the router
        self.p.send_signal(signal.SIGINT)
        try:
            self.p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait(timeout=5)
        self.p.stderr.close()
