"""Probes of a live tunnel from outside it, shared by the VPN integration tests: a UDP marker
sent through the tunnel and looked for in the router's capture of the underlay (is the payload
readable on the wire?), and the largest DF ping that still gets a reply (the tunnel's MTU)."""

from __future__ import annotations

import secrets
import sys

from tests.conftest import router_capture


def capture_marker(lab, target: str) -> tuple[bool, int]:
    """Send a UDP marker to `target` from the client while the router captures its client-side
    interface; returns (marker seen in the capture, capture size)."""
    marker = f"LABMARKER-{secrets.token_hex(8)}".encode()
    pcap = lab.dir / "test-capture.pcap"
    send = (
        "import socket,sys,time\n"
        "fam = socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET\n"
        "s = socket.socket(fam, socket.SOCK_DGRAM)\n"
        "for _ in range(5):\n"
        "    s.sendto(sys.argv[2].encode(), (sys.argv[1], 9)); time.sleep(0.02)\n"
    )
    with router_capture(lab, pcap):
        lab.node("client").run([sys.executable, "-c", send, target, marker.decode()])
    data = pcap.read_bytes()
    return marker in data, len(data)


def largest_df_payload(node, addr: str, hi: int) -> int:
    """Largest `ping -M do -s N` that gets a reply, by bisection over [0, hi]."""
    fam = "-6" if ":" in addr else "-4"

    def ok(n: int) -> bool:
        argv = ["ping", fam, "-M", "do", "-s", str(n), "-c", "1", "-W", "1", addr]
        return node.run(argv, check=False).returncode == 0

    lo = 0
    assert ok(lo)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
