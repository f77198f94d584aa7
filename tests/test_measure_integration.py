"""Real iperf3/ping/sshd/rr runs between two network namespaces this test creates.

Uses a tiny local Node (``ip netns exec`` through lab.core.proc) so the tests need nothing but root
and the tools; the lab's real LocalNode can replace it later. Addresses are from the
benchmarking ranges (198.18.0.0/15, 2001:2::/48) inside namespaces named ``meas<random>-*``,
which are removed in finally; no packet leaves them.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from lab.core import proc
from lab.measure import TESTS, Context, get_test
from lab.core.node import Daemon, Node, merged_env

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root for network namespaces"),
    pytest.mark.skipif(
        not all(proc.which(t) for t in ("ip", "iperf3", "ping", "sshd", "scp", "ss")),
        reason="needs ip, iperf3, ping, sshd, scp, ss",
    ),
]

C4, S4 = "198.18.0.1", "198.18.0.2"
C6, S6 = "2001:2::1", "2001:2::2"
MTU = 1420


class NetnsNode(Node):
    """Commands in one network namespace of this machine."""

    def __init__(self, name: str, netns: str):
        self.name = name
        self.netns = netns
        self.env: dict[str, str] = {}

    def _argv(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *map(str, argv)]

    def run(self, argv, *, check=True, timeout=60, input=None, env=None):
        return proc.run(
            self._argv(argv),
            check=check,
            timeout=timeout,
            input=input,
            env=merged_env(self.env, env),
            where=self.netns,
        )

    def spawn(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Daemon:
        out = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115 - child keeps it
        try:
            p = proc.spawn(
                self._argv(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=merged_env(self.env, env),
            )
        finally:
            if log:
                out.close()
        return Daemon(self.name, name, p.pid, proc.proc_start_time(p.pid), log, p)

    def stop(self, daemon: Daemon, *, grace: float = 3.0) -> bool:
        gone = proc.stop_pid(daemon.pid, daemon.start_time, grace=grace)
        if daemon.popen is not None:
            daemon.popen.wait(timeout=5)
        return gone

    def popen(self, argv, *, stdout=None, stderr=None, env=None):
        return proc.spawn(
            self._argv(argv), stdout=stdout, stderr=stderr, env=merged_env(self.env, env)
        )


@pytest.fixture(scope="module")
def pair():
    tag = f"meas{secrets.token_hex(3)}"
    cns, sns = f"{tag}-c", f"{tag}-s"
    created = []
    try:
        for ns in (cns, sns):
            proc.run(["ip", "netns", "add", ns])
            created.append(ns)
        proc.run(
            [
                "ip",
                "link",
                "add",
                f"{tag}-c",
                "netns",
                cns,
                "type",
                "veth",
                "peer",
                "name",
                f"{tag}-s",
                "netns",
                sns,
            ]
        )
        for ns, dev, a4, a6 in ((cns, f"{tag}-c", C4, C6), (sns, f"{tag}-s", S4, S6)):
            ip = ["ip", "-n", ns]
            proc.run([*ip, "link", "set", "lo", "up"])
            proc.run([*ip, "link", "set", dev, "mtu", str(MTU), "up"])
            proc.run([*ip, "addr", "add", f"{a4}/24", "dev", dev])
            proc.run([*ip, "addr", "add", f"{a6}/64", "dev", dev, "nodad"])
        client, server = NetnsNode("client", cns), NetnsNode("server", sns)
        yield client, server, f"{tag}-c"
        for ns in (cns, sns):  # every test stopped what it started
            assert proc.run(["ip", "netns", "pids", ns]).stdout.strip() == "", ns
    finally:
        for ns in created:
            proc.run(["ip", "netns", "del", ns], check=False)


def ctx_for(pair, tmp_path: Path, addr: str = S4) -> Context:
    client, server, iface = pair
    return Context(
        client,
        server,
        addr,
        tmp_path / "raw",
        iface=iface,
        timeout_s=20,
        state_dir=tmp_path / "state",
    )


def run(test: str, ctx: Context, /, **params):
    t = get_test(test)
    records = t.run(ctx, t.validate(params, source="test"))
    for r in records:
        assert r["raw_files"], r
        assert all(Path(f).exists() for f in r["raw_files"])
    return records


def test_tcp_both_directions_and_small_mss(pair, tmp_path):
    ctx = ctx_for(pair, tmp_path)
    [up] = run("tcp", ctx, duration_s=1)
    assert up["ok"], up["error"]
    # traffic passed; how fast is bench territory, not a test's
    assert up["direction"] == "client-to-server" and up["receiver_bytes"] > 0
    assert up["receiver_bps"] > 0
    [down] = run("tcp", ctx, duration_s=1, direction="server-to-client", streams=2, mss=88)
    assert down["ok"], down["error"]
    assert down["direction"] == "server-to-client" and down["streams"] == 2
    assert down["payload_bytes_per_packet"] == 76 and down["packets_per_s"] > 0


def test_tcp_ipv6(pair, tmp_path):
    [r] = run("tcp", ctx_for(pair, tmp_path, S6), duration_s=1)
    assert r["ok"], r["error"]
    assert r["tcp_mss"] == MTU - 40 - 20 - 12
    assert "IPv6 40" in r["pps_assumption"]


def test_udp_and_sweep(pair, tmp_path):
    from lab.measure.iperf3loss import UdpReceiving

    ctx = ctx_for(pair, tmp_path)
    before = {n.name: UdpReceiving(n).datagrams() for n in (ctx.client, ctx.server)}
    [r] = run("udp", ctx, rate_mbit=1, size=256, duration_s=1)
    assert r["ok"], r["error"]
    assert r["packets_sent"] > 0 and r["jitter_ms"] is not None
    assert r["setup_retries"] == 0
    # the drain probe (run_client) reads each namespace's own UDP counters: the receiver got
    # the flow, the sender only the server's reply to its set-up datagram
    moved = {n.name: UdpReceiving(n).datagrams() - before[n.name] for n in (ctx.client, ctx.server)}
    assert moved[ctx.server.name] >= r["packets_received"] > 100
    assert moved[ctx.client.name] < 10
    recs = run("udp-sweep", ctx, rates_mbit=[10, 20], duration_s=1)
    assert [x["rate_mbit"] for x in recs] == [10, 20] and all(x["ok"] for x in recs)
    assert recs[1]["sent_pps"] > recs[0]["sent_pps"]


@pytest.mark.parametrize(
    ("lost", "direction"),
    [("hello", "client-to-server"), ("reply", "server-to-client")],
)
def test_a_lost_udp_setup_is_told_early_and_tried_again(pair, tmp_path, lost, direction):
    """The set-up datagram (at the server) or its reply (at the client) is dropped by a tc
    filter until the first attempt has stalled: the second attempt runs, long before iperf3's
    own 30-s wait would have ended the first (lab.measure.iperf3loss.SetupWatch)."""
    import threading
    import time

    from lab.measure.iperf3loss import SETUP_STALL_S, UDP_SETUP_WAIT_S

    client, server, cdev = pair
    node, dev, port = (server, cdev[:-1] + "s", 5311) if lost == "hello" else (client, cdev, 5312)
    match = ["dport" if lost == "hello" else "sport", str(port), "0xffff"]
    ns = ["ip", "-n", node.netns]
    # a redirect to a veth end whose peer is down drops (this kernel has no act_gact)
    proc.run([*ns, "link", "add", "sinkx", "type", "veth", "peer", "name", "sinky"])
    try:
        proc.run([*ns, "link", "set", "sinkx", "up"])
        proc.run(["tc", "-n", node.netns, "qdisc", "add", "dev", dev, "ingress"])
        proc.run(
            ["tc", "-n", node.netns, "filter", "add", "dev", dev, "parent", "ffff:"]
            + ["protocol", "ip", "prio", "1", "u32", "match", "ip", "protocol", "17", "0xff"]
            + ["match", "ip", *match, "action", "mirred", "egress", "redirect", "dev", "sinkx"]
        )
        lift = threading.Timer(
            SETUP_STALL_S / 2,
            lambda: proc.run(["tc", "-n", node.netns, "qdisc", "del", "dev", dev, "ingress"]),
        )
        lift.start()
        t0 = time.monotonic()
        [r] = run(
            "udp",
            ctx_for(pair, tmp_path),
            rate_mbit=1,
            size=256,
            duration_s=2,
            port=port,
            direction=direction,
        )
        took = time.monotonic() - t0
        lift.join()
    finally:
        proc.run(["tc", "-n", node.netns, "qdisc", "del", "dev", dev, "ingress"], check=False)
        proc.run([*ns, "link", "del", "sinkx"], check=False)
    assert r["ok"], r["error"]
    assert r["setup_retries"] == 1 and r["packets_received"] > 100
    assert took < UDP_SETUP_WAIT_S  # iperf3 alone would have waited that long on attempt 1


def test_ping_ok_v4_v6_and_total_loss(pair, tmp_path):
    [r] = run("ping", ctx_for(pair, tmp_path), count=20, interval_s=0.01)
    assert r["ok"] and r["received"] == 20 and len(r["rtts"]) == 20
    [r6] = run("ping", ctx_for(pair, tmp_path, S6), count=5, interval_s=0.01)
    assert r6["ok"] and r6["family"] == 6
    [lost] = run(
        "ping",
        ctx_for(pair, tmp_path, "198.18.0.99"),
        count=3,
        interval_s=0.01,
        reply_timeout_s=0.5,
    )
    assert not lost["ok"] and lost["loss_pct"] == 100.0


def test_mtu_bisection(pair, tmp_path):
    recs = run("mtu", ctx_for(pair, tmp_path), addr6=S6)
    assert [(r["family"], r["path_mtu"], r["iface_mtu"]) for r in recs] == [
        (4, MTU, MTU),
        (6, MTU, MTU),
    ]
    assert all(r["matches_iface"] for r in recs)


def test_scp(pair, tmp_path):
    ctx = ctx_for(pair, tmp_path)
    [r] = run("scp", ctx, size_mb=8, port=2299)
    assert r["ok"], r["error"]
    assert r["rate_bps"] > 0 and r["size_bytes"] == 8 * 1024 * 1024
    # the keys and the received file are removed; the payload stays for the lab's next copy
    [kept] = list((tmp_path / "state").iterdir())
    assert kept.name == "scp-payload-8MiB.bin" and kept.stat().st_size == 8 * 1024 * 1024
    assert r["payload"]["reused"] is False and r["payload"]["prepare_s"] > 0
    assert not any("PRIVATE KEY" in Path(f).read_text() for f in r["raw_files"])
    ino = kept.stat().st_ino
    [again] = run("scp", ctx, size_mb=8, port=2299)
    assert again["ok"], again["error"]
    assert kept.stat().st_ino == ino  # the same file sent, not written again
    assert again["payload"] == {"reused": True, "prepare_s": None}
    kept.write_bytes(b"short")  # a file of another size is never sent: written anew
    [third] = run("scp", ctx, size_mb=8, port=2299)
    assert third["ok"] and third["payload"]["reused"] is False
    assert kept.stat().st_size == 8 * 1024 * 1024


def test_rr_tcp_and_udp(pair, tmp_path):
    ctx = ctx_for(pair, tmp_path)
    [t] = run("rr", ctx, duration_s=1)
    assert t["ok"] and t["transactions"] > 0 and t["transactions_per_s"] > 0
    assert t["latency_p99_us"] > 0
    [u] = run("rr", ctx, proto="udp", request=516, response=4, duration_s=1)
    assert u["ok"] and u["request_bytes"] == 516 and u["response_bytes"] == 4


def test_contention_wraps_and_stops_hog(pair, tmp_path):
    [r] = run(
        "contention", ctx_for(pair, tmp_path), test="rr", node="server", params={"duration_s": 1}
    )
    assert r["ok"], r["error"]
    assert r["contention"]["node"] == "server" and r["contention"]["alive_throughout"]


def test_tcp_unreachable_port_is_failed_record(pair, tmp_path):
    """Connect to a port nobody listens on: the server-side bind still works, the client fails."""
    from lab.measure.iperf3 import client_call, run_client

    ctx = ctx_for(pair, tmp_path)
    files: list[Path] = []
    call = client_call(S4, 5999, duration=1)
    text = run_client(ctx, call, expected_s=1, label="x", files=files)
    assert "Connection refused" in text and files


def test_registry_is_complete():
    # the shipped tests; a new test kind adds itself (tests/test_measure_registry.py)
    assert {"tcp", "udp", "udp-sweep", "ping", "scp", "mtu", "rr", "contention"} <= set(TESTS)
