"""The board's data plane queues held by a stand-in (lab.model.dpqueue, lab.core.sockbuf,
lab.substrate.local.queues): the profile's tables, bad input refused naming the file and field,
the record a node gets, the commands and socket calls, and on this machine (root) a real
stand-in's sockets and TUN queue read back with ss and ip, not from the lab's own record."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from lab.core import sockbuf
from lab.core.errors import ConfigError
from lab.model import boardkernel, dpqueue
from lab.model.cpuprofile import load_cpu_profile
from tests.profiletext import BOARD_HEAD
from tests.profiletext import load_text as load
from lab.substrate.local import queues

PROFILE = (
    BOARD_HEAD
    + """
[reference.kernel-chacha20-poly1305]
mbps = 60
source = "tcrypt on the board"
[kernel]
version = "5.10"
[kernel.dataplane.xfrm-esp]
threading = "one-core"
source = "esp4.c"
[kernel.dataplane.xfrm-esp.crypto]
aes-128-gcm = "kernel-gcm-aes-128"
chacha20-poly1305 = "kernel-chacha20-poly1305"
[kernel.dataplane.xfrm-esp.queue]
tx = 1000
source = "the NIC's ring, cryptd's queue"
[kernel.dataplane.xfrm-esp.queue.rx]
aes-128-gcm = 1256
chacha20-poly1305 = 256
"""
)


def esp(primitive: str) -> boardkernel.DataPlaneCpu:
    return boardkernel.DataPlaneCpu("charon", primitive, "kernel:xfrm-esp", what="libipsec")


def test_a_queue_per_primitive_or_for_all(tmp_path, monkeypatch):
    q = load(tmp_path, monkeypatch, PROFILE).kernel.dataplanes["xfrm-esp"].queue
    assert q.packets("aes-128-gcm") == (1256, 1000)
    assert q.packets("chacha20-poly1305") == (256, 1000)
    assert q.packets("aes-256-gcm") == (None, 1000)


def test_a_stand_ins_record_holds_the_boards_queue_in_packets_and_socket_bytes(
    tmp_path, monkeypatch
):
    prof = load(tmp_path, monkeypatch, PROFILE)
    rec = boardkernel.plan(prof, esp("chacha20-poly1305"), cores=4)
    assert rec["queue"]["rx_packets"] == 256 and rec["queue"]["tx_packets"] == 1000
    assert rec["queue"]["rx_bytes"] == 256 * dpqueue.DATAGRAM_TRUESIZE
    # the board runs the same program: its own sockets are the board's too, nothing to hold
    same = boardkernel.DataPlaneCpu("charon", "chacha20-poly1305", "userspace")
    assert "queue" not in boardkernel.plan(prof, same, cores=4)


def test_the_shipped_pi4_profiles_state_the_queues_of_both_stand_ins():
    for name in ("pi4", "pi4-64"):
        dps = load_cpu_profile(name).kernel.dataplanes
        rx, tx = dps["wireguard"].queue.packets("go-chacha20-poly1305")
        assert rx > 1024 and tx >= 1024  # MAX_QUEUED_PACKETS, the NIC's ring in front
        assert all(dps["xfrm-esp"].queue.packets("chacha20-poly1305"))


@pytest.mark.parametrize(
    "edit, field, says",
    [
        ("tx = 1000.5", "kernel.dataplane.xfrm-esp.queue.tx", "positive integer"),
        ("tx = 0", "kernel.dataplane.xfrm-esp.queue.tx", "positive integer"),
        ('tx = "1000"', "kernel.dataplane.xfrm-esp.queue.tx", "positive integer"),
        ("tx = 1000\nqlen = 5", "kernel.dataplane.xfrm-esp.queue", "qlen"),
    ],
)
def test_bad_queue_lengths_are_refused_naming_file_and_field(
    tmp_path, monkeypatch, edit, field, says
):
    with pytest.raises(ConfigError) as e:
        load(tmp_path, monkeypatch, PROFILE.replace("tx = 1000", edit, 1))
    msg = str(e.value)
    assert msg.startswith(str(tmp_path / "odd.toml")) and field in msg and says in msg


def test_a_queue_for_a_primitive_outside_the_crypto_table_is_refused(tmp_path, monkeypatch):
    text = PROFILE.replace("chacha20-poly1305 = 256", "rot13 = 256")
    with pytest.raises(ConfigError) as e:
        load(tmp_path, monkeypatch, text)
    assert "queue.rx.rot13" in str(e.value)
    assert "accepted: aes-128-gcm, chacha20-poly1305" in str(e.value)


def test_a_queue_without_its_source_is_refused(tmp_path, monkeypatch):
    text = PROFILE.replace("source = \"the NIC's ring, cryptd's queue\"\n", "")
    with pytest.raises(ConfigError) as e:
        load(tmp_path, monkeypatch, text)
    assert "kernel.dataplane.xfrm-esp.queue.source" in str(e.value)


# ------------------------------------------------------------------ the node's side, recorded


class FakeNode:
    name = "client"

    def __init__(self, links):
        self.links, self.calls = links, []

    def run(self, argv, *, check=True, timeout=60, input=None, env=None):
        self.calls.append(list(argv))
        out = json.dumps(self.links) if argv[:3] == ["ip", "-j", "-d"] else ""
        return subprocess.CompletedProcess(argv, 0, out, "")


def test_holding_the_queues_sizes_the_stand_ins_sockets_and_the_nodes_tun_devices(monkeypatch):
    links = [
        {"ifname": "lo", "txqlen": 1000},
        {"ifname": "eth0", "txqlen": 1000, "linkinfo": {"info_kind": "veth"}},
        {"ifname": "wg0", "txqlen": 500, "linkinfo": {"info_kind": "tun"}},
    ]
    node = FakeNode(links)
    asked = []

    def set_rcvbuf(pid, port, nbytes):
        asked.append((pid, port, nbytes))
        return [sockbuf.SocketBuffer(pid, 7, 51820, 212992, nbytes)]

    monkeypatch.setattr(queues.sockbuf, "set_receive_buffer", set_rcvbuf)
    monkeypatch.setattr(queues, "stand_in_pids", lambda name, groups, daemons, node: [4242])
    q = {"rx_packets": 1280, "tx_packets": 1024, "rx_bytes": 1280 * 2304}
    rec = queues.hold_queues(node, q, "wireguard-go", [], [])
    assert asked == [(4242, None, 1280 * 2304)]
    assert node.calls[-1] == ["ip", "link", "set", "wg0", "txqueuelen", "1024"]
    assert rec["tun"] == {"wg0": {"txqueuelen_before": 500, "txqueuelen": 1024}}
    assert rec["sockets"] == [
        {"pid": 4242, "port": 51820, "rcvbuf_before": 212992, "rcvbuf": 1280 * 2304}
    ]


# ------------------------------------------------------------------ on this machine


def udp_rbufs(port: int, netns: str | None = None) -> list[int]:
    """The receive buffers (ss's rb: the accounting limit) of the UDP sockets on local `port`,
    read by ss, not by the lab (in network namespace `netns` when given)."""
    pre = ["ip", "netns", "exec", netns] if netns else []
    argv = [*pre, "ss", "-uamnH", "sport", "=", f":{port}"]
    ss = subprocess.run(argv, capture_output=True, text=True).stdout
    return [int(b) for b in re.findall(r"\brb(\d+)", ss)]


@pytest.mark.root
def test_another_processs_udp_socket_gets_the_buffer_asked_for():
    child = subprocess.Popen(
        [sys.executable, "-c", "import socket, time\n"
         "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('127.0.0.1', 0))\n"
         "print(s.getsockname()[1], flush=True); time.sleep(30)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        port = int(child.stdout.readline())
        before = udp_rbufs(port)
        got = sockbuf.set_receive_buffer(child.pid, port, 3_000_000)
        assert [(g.port, g.before, g.after) for g in got] == [(port, before[0], 3_000_000)]
        assert before != [3_000_000] and udp_rbufs(port) == [3_000_000]
        assert sockbuf.set_receive_buffer(child.pid, port + 1 if port < 65535 else 1, 4096) == []
    finally:
        child.kill()
        child.wait()


@pytest.mark.root
def test_wireguard_gos_socket_and_tun_hold_the_board_kernels_queues(lab_id):
    """wireguard-go standing in for the pi4's kernel WireGuard: both ends' UDP sockets hold the
    board's 1280 full-size datagrams and wg0 queues 1024 packets, read with ss and ip in the
    nodes; the tunnel carries packets."""
    from lab.core.teardown import teardown
    from lab.model.topology import load_topology
    from lab.substrate.local.build import up

    from .conftest import TOPOS

    lab = up(load_topology(TOPOS / "pi_pair.py"), lab_id, vpn="wireguard")
    try:
        if lab.info["vpn"].get("path") != "wireguard-go":
            pytest.skip(f"kernel WireGuard here ({lab.info['vpn'].get('path')}): no stand-in")
        q = lab.info["nodes"]["server"]["cpu"]["dataplane"].get("queue")
        if q is None:
            pytest.skip("pi4 not applied here (no per-core groups): no data plane record")
        want = load_cpu_profile("pi4").kernel.dataplanes["wireguard"].queue
        rx, tx = want.packets("go-chacha20-poly1305")
        for node in ("client", "server"):
            bufs = udp_rbufs(51820, f"{lab_id}-{node}")
            assert bufs and all(b == rx * dpqueue.DATAGRAM_TRUESIZE for b in bufs), bufs
            link = subprocess.run(["ip", "-n", f"{lab_id}-{node}", "-j", "link", "show", "wg0"],
                                  capture_output=True, text=True).stdout  # fmt: skip
            assert json.loads(link)[0]["txqlen"] == tx
        target = lab.info["vpn"]["tunnel"]["server"]["v4"].split("/")[0]
        r = lab.node("client").run(["ping", "-c", "2", "-i", "0.2", "-W", "2", target], check=False)
        assert r.returncode == 0, r.stdout
    finally:
        left = teardown(lab_id)
    assert left == []


def test_lab_status_says_what_the_stand_in_holds():
    from lab.cli.printing import queue_words

    held = {
        "client": {
            "daemon": "wireguard-go",
            "rx_packets": 1280,
            "sockets": [{"pid": 1, "port": 51820, "rcvbuf_before": 212992, "rcvbuf": 2949120}],
            "tun": {"wg0": {"txqueuelen_before": 500, "txqueuelen": 1024}},
        }
    }
    assert queue_words(held) == (
        "client wireguard-go: UDP receive 1280 datagrams (2949120 B), wg0 txqueuelen 1024"
    )
    assert queue_words({}) == ""


def test_a_result_line_says_which_queues_the_stand_in_held():
    from lab.campaign.runner import held_queues

    held = {
        "server": {
            "daemon": "charon",
            "rx_packets": 256,
            "tx_packets": 1000,
            "sockets": [{"pid": 9, "port": 4500, "rcvbuf_before": 212992, "rcvbuf": 589824}],
            "tun": {"ipsec0": {"txqueuelen_before": 500, "txqueuelen": 1000}},
            "pids": [9],
        }
    }
    assert held_queues(held) == {
        "server": {"daemon": "charon", "rx_packets": 256, "tx_packets": 1000}
    }
