"""The lab's patched libipsec (lab.vpn.libipsec, tools/libipsec): the board's queue limits in
the rendered strongswan.conf, the charon's LD_LIBRARY_PATH only where the queues are bounded
and the library is built from this checkout's patch, the record of which library ran and the
drops read from charon's log lines, and the library a real process mapped read from /proc."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from lab.cli.printing import queue_words
from lab.vpn import charon, libipsec
from lab.vpn.base import Endpoint, TunnelContext
from lab.vpn.drivers import strongswan as sw
from lab.substrate.local.queues import mapped_file
from tests.fakenode import RecordingNode

# lab.model.dpqueue.queue_record of a pi4 node whose SA is AES-GCM
GCM_QUEUE = {"rx_packets": 1256, "tx_packets": 1000, "rx_bytes": 1256 * 2304, "source": "x"}


def _node(name: str, queue: dict | None, arch=None) -> RecordingNode:
    n = RecordingNode(name=name)
    n.dataplane_queue = queue
    if arch is not None:
        n.arch = arch
    return n


def _ctx(tmp: Path, client_queue: dict | None, server_queue: dict | None) -> TunnelContext:
    def ep(name, queue, under, t4, t6):
        return Endpoint(name, _node(name, queue), under, None, t4, t6)

    return TunnelContext(
        "unit",
        ep("client", client_queue, "10.0.1.2", "10.99.0.1/24", "fd99::1/64"),
        ep("server", server_queue, "10.0.2.2", "10.99.0.2/24", "fd99::2/64"),
        tmp / "secrets",
        tmp / "config",
        tmp / "logs",
    )


def _render(tmp: Path, dataplane: str, client_queue, server_queue) -> dict[str, str]:
    params = {k: v.default for k, v in sw.StrongSwanDriver.params.items()}
    ctx = _ctx(tmp, client_queue, server_queue)
    out = charon.render_configs(ctx, params, "0sPSK", dataplane, selectors=sw.traffic_selectors)
    return {node: files["strongswan.conf"] for node, files in out.items()}


def _section(conf: str) -> str:
    m = re.search(r"^    kernel-libipsec \{\n(.*?)^    \}", conf, re.MULTILINE | re.DOTALL)
    assert m, conf
    return m.group(1)


def test_a_board_nodes_strongswan_conf_holds_its_queue_limits_in_the_plugins_section(tmp_path):
    confs = _render(tmp_path, "kernel-libipsec", GCM_QUEUE, None)
    section = _section(confs["client"])
    assert re.search(r"^\s*queue_limit_in = 1256$", section, re.MULTILINE)
    assert re.search(r"^\s*queue_limit_out = 1000$", section, re.MULTILINE)
    assert re.search(r"^\s*queue_full = wait$", section, re.MULTILINE)
    # the server runs at this host's speed (cpu="host"): upstream's unbounded queues
    assert "queue_limit" not in confs["server"]


def test_the_kernel_data_plane_renders_no_queue_limit(tmp_path):
    confs = _render(tmp_path, "kernel", GCM_QUEUE, GCM_QUEUE)
    assert all("queue_limit" not in c for c in confs.values())


def test_limits_are_the_queue_records_packets_each_way():
    assert libipsec.limits(_node("a", GCM_QUEUE)) == {"in": 1256, "out": 1000}
    assert libipsec.limits(_node("a", {"rx_packets": 256, "tx_packets": None})) == {
        "in": 256,
        "out": 0,  # 0: the patch's "no limit"
    }
    assert libipsec.limits(_node("a", None)) is None
    assert libipsec.limits(None) is None  # `lab render` without a lab


@pytest.fixture
def built(tmp_path, monkeypatch):
    """A patched library 'built' from this checkout's patch, in a cache of the test's own."""
    root = tmp_path / "cache" / "libipsec"
    (root / "lib").mkdir(parents=True)
    (root / "lib" / "libipsec.so.0").write_bytes(b"\x7fELF")
    sha = hashlib.sha256(libipsec.PATCH.read_bytes()).hexdigest()
    (root / "stamp.json").write_text(json.dumps({"strongswan": "5.9.8", "patch_sha256": sha}))
    monkeypatch.setattr(libipsec, "LIBRARY", root / "lib" / "libipsec.so.0")
    monkeypatch.setattr(libipsec, "STAMP", root / "stamp.json")
    return root


def test_a_bounded_node_gets_the_patched_library_first_on_its_loader_path(built):
    assert libipsec.env(_node("a", GCM_QUEUE)) == {"LD_LIBRARY_PATH": str(built / "lib")}


def test_no_library_path_without_a_board_queue_or_for_a_board_of_its_own(built):
    assert libipsec.env(_node("a", None)) == {}
    # a node of another architecture runs the board's own charon: this machine's library is
    # not for it
    assert libipsec.env(_node("a", GCM_QUEUE, arch=object())) == {}


def test_a_library_built_from_another_patch_is_not_used(built):
    (built / "stamp.json").write_text(json.dumps({"patch_sha256": "0" * 64}))
    assert libipsec.env(_node("a", GCM_QUEUE)) == {}
    lib, why = libipsec.library()
    assert lib is None and "another queue-limit.patch" in why


def test_no_library_built_says_how_to_build_it(tmp_path, monkeypatch):
    monkeypatch.setattr(libipsec, "LIBRARY", tmp_path / "none" / "libipsec.so.0")
    assert libipsec.env(_node("a", GCM_QUEUE)) == {}
    assert "setup.sh" in libipsec.library()[1]


LOG = """\
04:20:01 00[ESP] libipsec queue limits (lab patch): inbound 1256, outbound 1000 packets (0: none), full queues drop
04:20:09 12[ESP] libipsec outbound queue (limit 1000): 1 packets dropped
04:20:10 12[ESP] libipsec outbound queue (limit 1000): 52311 packets dropped
04:20:11 07[ESP] libipsec outbound queue (limit 1000): 60002 packets dropped
04:20:11 08[ESP] libipsec inbound queue (limit 1256): 17 packets dropped
04:20:11 09[ESP] libipsec encrypted queue (limit 1000): 4 packets dropped
04:20:12 09[ESP] libipsec encrypted queue (limit 1000): 9975 packets dropped
"""


def test_the_record_says_bounded_with_the_limits_the_library_itself_logged(built):
    rec = libipsec.record(_node("a", GCM_QUEUE), str(libipsec.LIBRARY), LOG)
    assert rec["bounded"] is True
    assert (rec["limit_in"], rec["limit_out"], rec["full"]) == (1256, 1000, "drop")
    waiting = LOG.replace("full queues drop", "full queues wait")
    assert libipsec.record(_node("a", GCM_QUEUE), "/x/libipsec.so.0", waiting)["full"] == "wait"
    assert rec["library"] == str(libipsec.LIBRARY)


def test_the_record_says_why_a_charon_ran_unbounded(tmp_path, monkeypatch):
    monkeypatch.setattr(libipsec, "LIBRARY", tmp_path / "none" / "libipsec.so.0")
    rec = libipsec.record(_node("a", GCM_QUEUE), libipsec.DEBIAN_LIBRARY, "charon starting\n")
    assert rec == {
        "library": libipsec.DEBIAN_LIBRARY,
        "bounded": False,
        "why": libipsec.library()[1],
    }
    # the patched library without limits in its strongswan.conf
    zero = "libipsec queue limits (lab patch): inbound 0, outbound 0 packets (0: none)\n"
    rec = libipsec.record(_node("a", GCM_QUEUE), "/x/libipsec.so.0", zero)
    assert rec["bounded"] is False and "queue_limit_in" in rec["why"]
    rec = libipsec.record(_node("a", GCM_QUEUE, arch=object()), "/r/libipsec.so.0", "")
    assert rec["bounded"] is False and "architecture" in rec["why"]


def test_drops_are_the_last_running_total_per_direction():
    assert libipsec.drops(LOG) == {"inbound": 17, "outbound": 60002, "encrypted": 9975}
    assert libipsec.drops("nothing dropped\n") == {"inbound": 0, "outbound": 0, "encrypted": 0}
    assert libipsec.waits(LOG) == {"inbound": 0, "outbound": 0, "encrypted": 0}


def test_waits_are_counted_apart_from_drops():
    log = (
        "libipsec outbound queue (limit 1000): 12 packets waited\n"
        "libipsec outbound queue (limit 1000): 4410 packets waited\n"
        "libipsec encrypted queue (limit 1000): 7 packets waited\n"
    )
    assert libipsec.waits(log) == {"inbound": 0, "outbound": 4410, "encrypted": 7}
    assert libipsec.drops(log) == {"inbound": 0, "outbound": 0, "encrypted": 0}


def test_status_words_say_whether_libipsec_was_bounded():
    bounded = {
        "daemon": "charon",
        "libipsec": {"bounded": True, "limit_in": 256, "limit_out": 1000, "full": "wait"},
    }
    free = {"daemon": "charon", "libipsec": {"bounded": False, "why": "not built"}}
    words = queue_words({"client": bounded, "server": free})
    assert "client charon: libipsec queues in 256 / out 1000 (full: wait)" in words
    assert "server charon: libipsec unbounded (not built)" in words


def test_the_mapped_library_is_read_from_the_process():
    # this interpreter has the C library mapped: the file the loader chose, by its path
    path = mapped_file(os.getpid(), "libc.so.6")
    assert path is not None and path.endswith("/libc.so.6") and Path(path).exists()
    assert mapped_file(os.getpid(), "libipsec-none.so.0") is None
    # a soname that links to a longer-versioned file (Debian's libipsec.so.0 -> .so.0.0.0)
    import zlib  # noqa: F401 -- maps libz.so.1, a link to libz.so.1.2.N

    path = mapped_file(os.getpid(), "libz.so.1")
    assert path is not None and re.search(r"/libz\.so\.1\.\d+", path), path
    assert mapped_file(2**22 + 12345, "libc.so.6") is None  # no such process


# ------------------------------------------------------------------ on this machine

FLOOD_S = 10


@pytest.mark.root
@pytest.mark.parametrize("profile", ["ipsec-aes128gcm", "ipsec-chacha20poly1305"])
def test_a_flood_through_bounded_libipsec_stops_arriving_with_its_sender(lab_id, profile):
    """Two pi4 nodes, IPsec over kernel-libipsec: iperf3 sends UDP of 1300 B at study A's 400
    Mbit/s for 10 s, above the capped tunnel's rate. With every queue bounded (libipsec's inbound
    and outbound queues, and the encrypted packets handed to charon's sender) the server receives
    for the client's 10 s and the client ends then. The bounds hold their producers
    (queue_full = wait): charon dropped nothing itself, its TUN reader waited, and the packets
    were dropped in front of it, at the client's TUN device (its tx drops), as a board drops
    before doing any work on them.
    Unbounded, the backlog is delivered for seconds after the sender stopped: ahead of it in
    AES-GCM's outbound queue; behind ChaCha20's encryption, in charon's sender. Checked by hand
    against the library of s18's patch (in and out bounded, the sender not): ChaCha20's server
    received for 11.6-12.6 s of the 10 (this library: 10.2), so the ChaCha20 case fails there."""
    from lab.core.teardown import teardown
    from lab.measure.iperf3json import parse_iperf3_udp
    from lab.model.topology import load_topology
    from lab.substrate.local.build import up

    from .conftest import TOPOS

    lib, why = libipsec.library()
    if lib is None:
        pytest.skip(f"the lab's patched libipsec: {why}")
    for t in (charon.CHARON, "/usr/lib/ipsec/plugins/libstrongswan-kernel-libipsec.so"):
        if not Path(t).exists():
            pytest.skip(f"needs {t} (./setup.sh)")
    lab = up(load_topology(TOPOS / "pi_pair.py"), lab_id, vpn=profile)
    try:
        vpn = lab.info["vpn"]
        if vpn.get("path") != "kernel-libipsec":
            pytest.skip(f"data plane {vpn.get('path')} here: no kernel-libipsec stand-in")
        held = (vpn.get("queues") or {}).get("client")
        if not held:
            pytest.skip("pi4 not applied here (no per-core groups): no board queue to hold")
        assert held["libipsec"]["library"] == str(lib), held["libipsec"]
        target = vpn["tunnel"]["server"]["v4"].split("/")[0]
        server, client = lab.node("server"), lab.node("client")
        tun0 = _tx_dropped(client, "ipsec0")
        srv = server.popen(["iperf3", "-s", "-1", "-p", "5999"], stdout=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while not server.run(["ss", "-Hltn", "sport = :5999"]).stdout.strip():
                assert time.monotonic() < deadline, "iperf3 -s did not listen on port 5999"
                time.sleep(0.05)
            t0 = time.monotonic()
            cp = client.run(
                ["iperf3", "-c", target, "-p", "5999", "-u", "-b", "400M", "-l", "1300",
                 "-t", str(FLOOD_S), "-J"],
                timeout=FLOOD_S + 90,
            )  # fmt: skip
            wall = time.monotonic() - t0
        finally:
            srv.kill()
            srv.wait()
        time.sleep(1.0)  # the dequeuing threads log their totals once the queues ran empty
        tun_dropped = _tx_dropped(client, "ipsec0") - tun0
        logs = "".join(
            Path(d["log"]).read_text(errors="replace")
            for d in vpn.get("daemons", [])
            if d.get("name") == "charon" and d.get("log")
        )
    finally:
        assert teardown(lab_id) == []
    got = parse_iperf3_udp(cp.stdout)
    assert got["packets_received"] > 0 and got["packets_lost"] > 0, got
    # the server's own seconds (its report, in the client's sum_received): it counts until the
    # client's end-of-test message reaches it through the tunnel, behind whatever the tunnel's
    # queues still hold
    served = json.loads(cp.stdout)["end"]["sum_received"]["seconds"]
    assert served < FLOOD_S + 1.0, f"the server received for {served:.2f} s of {FLOOD_S}"
    assert wall < FLOOD_S + 2.0, f"the client ran {wall:.2f} s for -t {FLOOD_S}"
    assert libipsec.drops(logs) == {"inbound": 0, "outbound": 0, "encrypted": 0}, logs[-2000:]
    assert libipsec.waits(logs)["outbound"] > 0, logs[-2000:]
    assert tun_dropped > 0, "the client's TUN device dropped nothing"


def _tx_dropped(node, dev: str) -> int:
    """The tx drops of `dev` on `node`, from the kernel's own counters (ip -j -s link)."""
    cp = node.run(["ip", "-j", "-s", "link", "show", "dev", dev])
    return int(json.loads(cp.stdout)[0]["stats64"]["tx"]["dropped"])


def test_a_result_line_says_whether_libipsec_bounded_its_queues():
    from lab.campaign.runner import held_queues

    held = {
        "client": {"daemon": "charon", "rx_packets": 1256, "tx_packets": 1000, "pids": [9],
                   "libipsec": {"library": "/x/libipsec.so.0", "bounded": True, "limit_in": 1256,
                                "limit_out": 1000}},
        "server": {"daemon": "wireguard-go", "rx_packets": 1280, "tx_packets": 1024},
    }  # fmt: skip
    assert held_queues(held) == {
        "client": {
            "daemon": "charon",
            "rx_packets": 1256,
            "tx_packets": 1000,
            "libipsec_bounded": True,
        },
        "server": {"daemon": "wireguard-go", "rx_packets": 1280, "tx_packets": 1024},
    }
