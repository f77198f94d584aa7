"""What each test runs, where, and that everything it starts is stopped: a fake Node answers
with golden outputs, no root and no network needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from lab.core import proc
from lab.measure import TESTS, Context
from lab.measure.base import invoke
from lab.measure.iperf3 import client_argv
from lab.measure.ping import ping_argv
from lab.measure.rr import RR_PROGRAM, rr_argv
from lab.measure.scp import scp_argv, sshd_config
from lab.core.node import Daemon, Node

DATA = Path(__file__).parent / "data"
# sh, not python: it starts in milliseconds and the mtu bisection spawns dozens
ECHO = 'printf "%s" "$1"; printf "%s" "$2" >&2; exit "$3"'
Responder = Callable[[list[str]], tuple[str, str, int]]


def golden(name: str) -> str:
    return (DATA / name).read_text()


class FakeNode(Node):
    """Answers popen() through `responder`; spawn/stop only record (the 'daemon' is us)."""

    def __init__(self, name: str, responder: Responder | None = None):
        self.name = name
        self.env = {}
        self.responder = responder or (lambda argv: ("", "", 0))
        self.ran: list[list[str]] = []
        self.popened: list[list[str]] = []
        self.spawned: list[tuple[str, list[str]]] = []
        self.stopped: list[str] = []

    def run(self, argv, *, check=True, timeout=60, input=None, env=None):
        argv = list(argv)
        self.ran.append(argv)
        out = "LISTEN 0 5 0.0.0.0:1 0.0.0.0:*\n" if argv[0] == "ss" else ""
        return subprocess.CompletedProcess(argv, 0, out, "")

    def spawn(self, name, argv, *, log=None, env=None):
        self.spawned.append((name, list(argv)))
        pid = os.getpid()
        return Daemon(self.name, name, pid, proc.proc_start_time(pid), log)

    def stop(self, daemon, *, grace=3.0):
        self.stopped.append(daemon.name)
        return True

    def popen(self, argv, *, stdout=None, stderr=None, env=None):
        argv = list(argv)
        self.popened.append(argv)
        out, err, rc = self.responder(argv)
        return subprocess.Popen(
            ["sh", "-c", ECHO, "sh", out, err, str(rc)], stdout=stdout, stderr=stderr
        )


def make(tmp_path, responder: Responder, addr: str = "198.18.0.2", iface=None):
    client, server = FakeNode("client", responder), FakeNode("server")
    ctx = Context(client, server, addr, tmp_path / "raw", iface=iface, timeout_s=5)
    return ctx, client, server


def run(name, ctx, /, **params):
    t = TESTS[name]
    return t.run(ctx, t.validate(params, source="test"))


# --- iperf3 ---------------------------------------------------------------------------------


def test_tcp_runs_server_and_client_and_stops_server(tmp_path):
    ctx, client, server = make(tmp_path, lambda a: (golden("iperf3_tcp_c2s.json"), "", 0))
    [r] = run("tcp", ctx, duration_s=3, omit_s=1, port=5301)
    assert server.spawned == [
        ("iperf3-server-5301", ["iperf3", "-s", "-p", "5301", "-B", "198.18.0.2"])
    ]
    assert client.popened == [
        ["iperf3", "-c", "198.18.0.2", "-p", "5301", "-J", "-i", "1", "-t", "3", "-O", "1"]
    ]
    assert server.stopped == ["iperf3-server-5301"]
    assert r["ok"] and r["error"] is None
    assert r["receiver_bps"] == pytest.approx(17700742901.269733)
    assert r["packets_per_s"] == pytest.approx(17700742901.269733 / 8 / 1448)
    server_log, client_json = map(Path, r["raw_files"])
    assert server_log.name.endswith("iperf3-server.log")
    assert client_json.read_text() == golden("iperf3_tcp_c2s.json")


def test_tcp_reverse_streams_mss_flags():
    argv = client_argv("2001:2::2", 5201, duration=60, streams=4, reverse=True, mss=88)
    assert argv[2] == "2001:2::2"
    assert argv[-5:] == ["-P", "4", "-R", "-M", "88"]


def test_udp_flags():
    argv = client_argv("198.18.0.2", 5201, duration=10, udp=True, rate_bps=400e6, length=1300)
    assert argv[-5:] == ["-u", "-b", "400000000", "-l", "1300"]


def test_busy_server_is_retried(tmp_path):
    answers = [golden("iperf3_server_busy.json"), golden("iperf3_tcp_c2s.json")]
    ctx, client, _server = make(tmp_path, lambda a: (answers.pop(0), "", 0))
    [r] = run("tcp", ctx, duration_s=3)
    assert r["ok"] and len(client.popened) == 2
    assert len(r["raw_files"]) == 3  # server log + both attempts
    assert "busy" in Path(r["raw_files"][1]).read_text()


def test_iperf3_error_is_a_failed_record_and_server_stopped(tmp_path):
    ctx, _client, server = make(
        tmp_path, lambda a: (golden("iperf3_connection_refused.json"), "", 0)
    )
    [r] = run("udp", ctx, rate_mbit=400, size=1300, duration_s=1)
    assert not r["ok"] and "Connection refused" in r["error"]
    assert r["rate_mbit"] == 400 and r["raw_files"]
    assert server.stopped == ["iperf3-server-5201"]


def test_iperf3_crash_without_json(tmp_path):
    ctx, _, server = make(tmp_path, lambda a: ("", "iperf3: parameter error\n", 1))
    [r] = run("tcp", ctx, duration_s=1)
    assert not r["ok"] and "exited 1" in r["error"] and "parameter error" in r["error"]
    assert any(f.endswith(".stderr") for f in r["raw_files"])
    assert server.stopped


def test_server_stopped_when_client_side_raises(tmp_path):
    def boom(argv):
        raise RuntimeError("node vanished")

    ctx, _, server = make(tmp_path, boom)
    with pytest.raises(RuntimeError):
        run("tcp", ctx, duration_s=1)
    assert server.stopped == ["iperf3-server-5201"]


def test_udp_sweep_one_server_one_client_per_rate(tmp_path):
    ctx, client, server = make(tmp_path, lambda a: (golden("iperf3_udp_400m_1300.json"), "", 0))
    recs = run("udp-sweep", ctx, rates_mbit=[25, 50, 75], duration_s=1)
    assert len(server.spawned) == 1 and len(server.stopped) == 1
    assert [a[a.index("-b") + 1] for a in client.popened] == ["25000000", "50000000", "75000000"]
    assert [r["step"] for r in recs] == [0, 1, 2]
    assert recs[0]["target_pps"] == pytest.approx(25e6 / 8 / 1300)
    assert all(r["sent_pps"] and r["received_pps"] for r in recs)


# --- ping -----------------------------------------------------------------------------------


def test_ping_argv():
    assert ping_argv("2001:2::2", count=500, interval_s=0.2) == [
        "ping", "-n", "-6", "-c", "500", "-i", "0.2", "-s", "56", "-W", "2", "2001:2::2",
    ]  # fmt: skip
    assert ping_argv("peer", count=1, interval_s=1, dont_fragment=True, size=1400)[2:4] == [
        "-M",
        "do",
    ]


def test_ping_record_and_total_loss(tmp_path):
    ctx, _, _ = make(tmp_path, lambda a: (golden("ping_ipv4_ok.txt"), "", 0))
    [r] = run("ping", ctx, count=10, interval_s=0.01)
    assert r["ok"] and r["family"] == 4 and len(r["rtts"]) == 10
    ctx, _, _ = make(tmp_path, lambda a: (golden("ping_ipv4_total_loss.txt"), "", 1))
    [r] = run("ping", ctx, count=4)
    assert not r["ok"] and "no echo reply" in r["error"] and r["loss_pct"] == 100.0


# --- mtu --------------------------------------------------------------------------------------


def df_responder(path_mtu: dict[int, int], *, lossy_first: bool = False, iface_mtu=1420):
    """Answer `ip -j link` and DF pings as a path with the given MTU per family would."""
    seen: set[tuple[int, int]] = set()

    def respond(argv):
        if argv[:2] == ["ip", "-j"]:
            return json.dumps([{"ifname": argv[-1], "mtu": iface_mtu}]), "", 0
        fam = 6 if "-6" in argv else 4
        size = int(argv[argv.index("-s") + 1])
        hdr = 48 if fam == 6 else 28
        if lossy_first and (fam, size) not in seen:
            seen.add((fam, size))
            return golden("ping_ipv4_total_loss.txt"), "", 1
        if size + hdr <= path_mtu[fam]:
            return golden("ping_ipv4_df_ok.txt"), "", 0
        if size + hdr > iface_mtu:
            return golden("ping_ipv4_df_too_big.txt"), "", 1
        return golden("ping_ipv4_total_loss.txt"), "", 1  # dropped silently in the path

    return respond


def test_mtu_bisects_to_path_mtu_below_iface(tmp_path):
    ctx, client, _ = make(tmp_path, df_responder({4: 1400, 6: 1380}), iface="wg0")
    recs = run("mtu", ctx, addr6="2001:2::2", attempts=1)
    assert client.popened[0] == ["ip", "-j", "link", "show", "wg0"]
    assert [(r["family"], r["path_mtu"], r["largest_payload"]) for r in recs] == [
        (4, 1400, 1372),
        (6, 1380, 1332),
    ]
    assert all(r["ok"] and r["iface_mtu"] == 1420 and not r["matches_iface"] for r in recs)
    assert len(client.popened) < 1 + 2 * 14  # bisection, not a linear walk


def test_mtu_ipv6_probes_the_contexts_ipv6_traffic_address(tmp_path):
    # study A's plan asks for both families on every profile: the baseline has no tunnel, so
    # the IPv6 target must be the one the runner hands over, not a fixed tunnel address
    ctx, client, _ = make(tmp_path, df_responder({4: 1500, 6: 1500}, iface_mtu=1500))
    ctx.server_addr6 = "fd00:1::2"
    recs = run("mtu", ctx, ipv6=True, attempts=1)
    assert [(r["family"], r["target"], r["path_mtu"]) for r in recs] == [
        (4, "198.18.0.2", 1500),
        (6, "fd00:1::2", 1500),
    ]
    v6_pings = [a for a in client.popened if "-6" in a]
    assert v6_pings and all(a[-1] == "fd00:1::2" for a in v6_pings)


def test_mtu_ipv6_on_an_ipv4_only_tunnel_is_not_applicable(tmp_path):
    # an imported IPv4-only wg-quick file: no IPv6 traffic address; the IPv6 row says why,
    # fails nothing and measures nothing, and no IPv6 probe is sent
    ctx, client, _ = make(tmp_path, df_responder({4: 1420}), iface="wg0")
    v4, v6 = run("mtu", ctx, ipv6=True, attempts=1)
    assert v6["family"] == 6 and v6["ok"] and v6["error"] is None
    assert "no IPv6 traffic address" in v6["not_applicable"]
    assert "path_mtu" not in v6 and "iface_mtu" not in v6
    assert v4["family"] == 4 and v4["ok"] and v4["path_mtu"] == 1420
    assert "not_applicable" not in v4 and not [a for a in client.popened if "-6" in a]


def test_mtu_survives_loss_with_retries(tmp_path):
    ctx, _, _ = make(tmp_path, df_responder({4: 1420}, lossy_first=True), iface="wg0")
    [r] = run("mtu", ctx, attempts=2)
    assert r["path_mtu"] == 1420 and r["matches_iface"]


def test_mtu_without_iface_uses_upper_and_reports_unreachable(tmp_path):
    ctx, client, _ = make(tmp_path, lambda a: (golden("ping_ipv4_total_loss.txt"), "", 1))
    [r] = run("mtu", ctx, upper_mtu=1500, attempts=1)
    assert not r["ok"] and "no DF echo" in r["error"]
    assert client.popened[0][client.popened[0].index("-s") + 1] == "1472"


# --- rr, scp, contention ----------------------------------------------------------------------


def test_rr_argv():
    p = TESTS["rr"].validate({"proto": "udp", "request": 516, "response": 4}, source="t")
    assert rr_argv("server", p, "198.18.0.2") == [
        "python3", str(RR_PROGRAM), "server", "--proto", "udp", "--bind", "198.18.0.2",
        "--port", "7100", "--request", "516", "--response", "4",
    ]  # fmt: skip
    assert rr_argv("client", p, "[2001:2::2]")[5:7] == ["--host", "2001:2::2"]
    assert rr_argv("client", p, "h")[-4:] == ["--duration", "10", "--udp-timeout-ms", "200"]


def test_rr_record(tmp_path):
    ctx, _, server = make(tmp_path, lambda a: (golden("rr_tcp_1_1.json"), "", 0))
    [r] = run("rr", ctx, duration_s=1)
    assert r["ok"] and r["transactions_per_s"] > 0
    assert server.stopped == ["rr-server-tcp-7100"]


def test_sshd_config_is_explicit(tmp_path):
    cfg = sshd_config(addr="2001:2::2", port=2222, state=tmp_path)
    lines = cfg.splitlines()
    for want in (
        "Port 2222",
        "ListenAddress 2001:2::2",
        "UsePAM no",
        "PasswordAuthentication no",
        f"PidFile {tmp_path}/sshd.pid",
        f"HostKey {tmp_path}/ssh_host_ed25519_key",
        f"AuthorizedKeysFile {tmp_path}/authorized_keys",
    ):
        assert want in lines


def test_scp_argv_pins_host_key_and_brackets_ipv6(tmp_path):
    argv = scp_argv(
        key=tmp_path / "id",
        known_hosts=tmp_path / "kh",
        port=2222,
        src=tmp_path / "f",
        user="root",
        addr="2001:2::2",
        dest="/dev/null",
        cipher="aes128-gcm@openssh.com",
        protocol="scp",
    )
    assert argv[:3] == ["scp", "-F", "/dev/null"]
    assert "StrictHostKeyChecking=yes" in argv and f"UserKnownHostsFile={tmp_path}/kh" in argv
    assert argv[-2:] == [str(tmp_path / "f"), "root@[2001:2::2]:/dev/null"]
    assert ["-c", "aes128-gcm@openssh.com"] == argv[argv.index("-c") : argv.index("-c") + 2]
    assert "-O" in argv


def test_contention_hogs_the_chosen_node_and_stops_it(tmp_path):
    ctx, client, _server = make(tmp_path, lambda a: (golden("rr_tcp_1_1.json"), "", 0))
    [r] = run("contention", ctx, test="rr", node="client", workers=2, cpu=1)
    assert [n for n, _ in client.spawned] == ["cpu-hog-0", "cpu-hog-1"]
    assert client.spawned[0][1][:3] == ["taskset", "-c", "1"]
    assert client.stopped == ["cpu-hog-0", "cpu-hog-1"]
    assert r["ok"] and r["contention"]["node"] == "client" and r["contention"]["workers"] == 2


def test_contention_stops_hogs_when_wrapped_test_raises(tmp_path):
    def boom(argv):
        raise RuntimeError("gone")

    ctx, _client, server = make(tmp_path, boom)
    with pytest.raises(RuntimeError):
        run("contention", ctx, test="ping", node="server")
    assert server.stopped == ["cpu-hog-0"]


# --- invoke -----------------------------------------------------------------------------------


#: how long SleepNode's command runs unless killed
SLEEP_S = 30


class SleepNode(FakeNode):
    def popen(self, argv, *, stdout=None, stderr=None, env=None):
        code = f"import sys, time; print('started', flush=True); time.sleep({SLEEP_S})"
        return subprocess.Popen([sys.executable, "-c", code], stdout=stdout, stderr=stderr)


def test_invoke_kills_on_timeout_and_keeps_partial_output(tmp_path):
    node = SleepNode("client")
    ctx = Context(node, node, "198.18.0.2", tmp_path / "raw")
    t0 = time.monotonic()
    inv = invoke(ctx, node, ["sleepy"], label="slow", timeout=1.0)
    # killed, not waited out: back before the command's own end
    assert inv.timed_out and inv.returncode != 0 and time.monotonic() - t0 < SLEEP_S
    assert inv.stdout == "started\n" and inv.raw_files[0].name == "001-slow.txt"


def test_raw_files_never_overwrite(tmp_path):
    ctx = Context(FakeNode("c"), FakeNode("s"), "x", tmp_path / "raw")
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "001-a.txt").write_text("earlier run")
    assert ctx.next_raw("a").name == "002-a.txt"
