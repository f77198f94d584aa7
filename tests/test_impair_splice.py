"""Issue 20, must-show 2: `lab impair set` on a lab built without `--impair`, under a running
WireGuard tunnel. On a kernel without netem the engine is spliced into the live link; the tunnel
keeps passing traffic through the change (a background ping counts what the swap cost), its
daemons keep their PIDs and it does not handshake again; `lab impair clear` removes the delay and
`lab down` leaves nothing."""

from __future__ import annotations

import re
import time

import pytest

from lab import proc
from lab.lab import Lab
from lab.proc import is_same_process

from .conftest import TOPOS, lab_traces, run_lab

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(not proc.which("wg"), reason="needs wireguard-tools"),
]

#: background ping: one echo every 10 ms for 8 s through the tunnel
BG_INTERVAL_S, BG_COUNT = 0.01, 800


def rtt_ms(node, addr: str, n: int = 40) -> float:
    """The minimum of `n` RTTs: the path's fixed delay; load on the shared host only adds."""
    out = node.run(["ping", "-c", str(n), "-i", "0.02", "-W", "2", addr], timeout=60).stdout
    return min(float(x) for x in re.findall(r"time=([\d.]+) ms", out))


def handshakes(node, ifname: str) -> str:
    return node.run(["wg", "show", ifname, "latest-handshakes"]).stdout


def test_runtime_impairment_under_a_running_wireguard_tunnel(lab_id):
    r = run_lab("up", TOPOS / "pi_pair_middlebox.py", "--vpn", "wireguard", "--id", lab_id)
    assert r.returncode == 0, r.stderr
    try:
        lab = Lab.open(lab_id)
        assert "impair" not in lab.info  # built without impairment points
        vpn = lab.info["vpn"]
        t4, ifname = vpn["traffic"]["v4"], vpn["describe"]["interface"]
        daemons = [(d["pid"], d["start_time"]) for d in vpn["daemons"]]
        client = lab.node("client")
        before = rtt_ms(client, t4)
        hs = handshakes(client, ifname)

        bg = client.spawn(
            "bg-ping",
            ["ping", "-n", "-i", str(BG_INTERVAL_S), "-c", str(BG_COUNT), "-W", "1", t4],
        )
        time.sleep(1.0)
        r = run_lab("impair", "set", "--id", lab_id, "router", "delay 20ms")
        assert r.returncode == 0, r.stderr
        deadline = time.monotonic() + BG_COUNT * BG_INTERVAL_S + 30
        while bg.popen.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert bg.popen.poll() is not None, "background ping did not finish"
        summary = bg.log.read_text()
        sent, got = map(
            int, re.search(r"(\d+) packets transmitted, (\d+) received", summary).groups()
        )
        lost = sent - got
        print(f"background ping through the tunnel: {lost} of {sent} lost during the splice")
        # the swap costs a few ms; the tunnel kept passing traffic (well under a second lost)
        assert got > 0.9 * sent and lost * BG_INTERVAL_S < 1.0

        after = rtt_ms(client, t4)
        added = after - before
        print(f"RTT through the tunnel: {before:.3f} ms before, {after:.3f} ms with delay 20ms")
        assert 40 * 0.98 <= added <= 40 * 1.02, f"added {added:.2f} ms, not 40 ms +- 2 %"
        shown = Lab.open(lab_id).info["impair"]
        assert shown["added_at_run_time"]

        # no reconnect: same daemons, no new handshake
        for pid, start in daemons:
            assert is_same_process(pid, start), f"VPN daemon {pid} was restarted"
        assert handshakes(client, ifname) == hs

        r = run_lab("impair", "clear", "--id", lab_id)
        assert r.returncode == 0, r.stderr
        cleared = rtt_ms(client, t4)
        print(f"RTT after lab impair clear: {cleared:.3f} ms")
        assert cleared < before + 1.0
    finally:
        r = run_lab("down", "--id", lab_id)
    assert r.returncode == 0, r.stderr
    assert lab_traces(lab_id) == []
