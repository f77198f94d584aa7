#!/usr/bin/env python3
"""Kernel data planes inside the full-kernel VM: per profile, lab up -> ping v4/v6 -> iperf3 ->
capture on the wire (plaintext marker present or absent) -> lab down, nothing left.

    sudo .venv/bin/python bench/vm_dataplanes.py [PROFILE ...] [--seconds 3]
        boots one VM, runs every profile in it one after another, prints a table and JSON
    (inside a VM) python bench/vm_dataplanes.py --guest --topology T [--id ID] PROFILE
        the per-profile check itself, one JSON line on stdout (tests/test_vpn_kernel.py uses it)

Under TCG the throughput column is functional evidence only (software CPU emulation): it shows
that data passes, not how fast a board or a laptop would be.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: profile spec -> (topology, is the plaintext visible on the wire?)
DEFAULT = {
    "macsec-gcm-aes-128": ("pi_pair", False),
    "macsec-static": ("pi_pair", False),
    "wireguard:implementation=kernel": ("pi_pair_middlebox", False),
    "ipsec-aes128gcm:dataplane=kernel": ("pi_pair_middlebox", False),
    "ipsec-aes256gcm:dataplane=kernel": ("pi_pair_middlebox", False),
    "ipsec-chacha20poly1305:dataplane=kernel": ("pi_pair_middlebox", False),
    "gre": ("pi_pair_middlebox", True),
    "ipip": ("pi_pair_middlebox", True),
    "l2tpv3": ("pi_pair_middlebox", True),
    "ip6gre": ("pi_pair_middlebox", True),
    "ip6tnl": ("pi_pair_middlebox", True),
    # study C: IPsec transport mode, manual keys (AH authenticates but does not encrypt)
    "ipsec-transport-ah": ("pi_pair_middlebox", True),
    "ipsec-transport-esp": ("pi_pair_middlebox", False),
    "ipsec-transport-ah-esp": ("pi_pair_middlebox", False),
    # study D: L2TP/IPsec (L2TP + PPP inside ESP transport mode)
    "l2tp-ipsec": ("pi_pair_middlebox", False),
}

SEND = (
    "import socket,sys,time\n"
    "fam = socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET\n"
    "s = socket.socket(fam, socket.SOCK_DGRAM)\n"
    "for _ in range(5):\n"
    "    s.sendto(sys.argv[2].encode(), (sys.argv[1], 9)); time.sleep(0.05)\n"
)


def _rtt(out: str) -> float | None:
    m = re.search(r"= [\d.]+/([\d.]+)/", out)
    return float(m.group(1)) if m else None


def _iperf3(client, server, addr: str, seconds: float) -> dict:
    """iperf3's sum_received (bytes, bits_per_second) of one TCP run client -> server."""
    srv = server.spawn("iperf3", ["iperf3", "-s", "-1", "-B", addr])
    deadline = time.monotonic() + 15
    try:
        while True:  # the server needs a moment to listen (slow under TCG)
            cp = client.run(
                ["iperf3", "-c", addr, "-t", str(seconds), "-J"], check=False, timeout=seconds + 60
            )
            try:
                result = json.loads(cp.stdout)
            except ValueError:
                result = {"error": cp.stderr.strip()[-300:]}
            got = (result.get("end") or {}).get("sum_received")
            if cp.returncode == 0 and got:
                return got
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"iperf3 failed (exit {cp.returncode}): "
                    f"{result.get('error') or cp.stdout[-300:]}"
                )
            time.sleep(0.2)
    finally:
        server.stop(srv)


def _capture(lab, node_name: str, ifname: str, target: str) -> tuple[bool, int, str]:
    """Marker datagrams to `target` from the client, captured on `node_name`'s `ifname`."""
    marker = f"LABMARKER-{secrets.token_hex(8)}"
    pcap = lab.dir / "capture.pcap"
    tcpdump = lab.node(node_name).popen(
        ["tcpdump", "-i", ifname, "-n", "-U", "--immediate-mode", "-Z", "root", "-w", str(pcap)],
        stderr=subprocess.PIPE,
    )
    try:
        line = tcpdump.stderr.readline()
        if b"listening on" not in line:
            raise RuntimeError(f"tcpdump did not start: {line!r}")
        lab.node("client").run([sys.executable, "-c", SEND, target, marker])
        time.sleep(0.5)
    finally:
        tcpdump.terminate()
        tcpdump.wait(timeout=10)
    data = pcap.read_bytes()
    # what the wire carried, for the record: IP protocols / ethertypes seen (first packets)
    shown = (
        lab.node(node_name)
        .run(["tcpdump", "-r", str(pcap), "-n", "-e", "-c", "10"], check=False)
        .stdout
    )
    return marker.encode() in data, len(data), shown


PROTO_NAMES = {1: "icmp", 6: "tcp", 17: "udp", 50: "esp", 51: "ah", 58: "icmpv6"}


def ip_chains(data: bytes, dst: str) -> list[str]:
    """The IP protocol chains of the captured packets to `dst` (a pcap file's bytes, Ethernet):
    e.g. "ipv4 ah,udp" (AH headers are walked: AH authenticates, the next header is visible),
    "ipv6 esp" (ESP hides what it carries). Sorted, each chain once."""
    import ipaddress
    import struct

    if len(data) < 24:
        return []
    endian = "<" if data[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    want = ipaddress.ip_address(dst)
    chains: set[str] = set()
    off = 24
    while off + 16 <= len(data):
        incl = struct.unpack(endian + "I", data[off + 8 : off + 12])[0]
        pkt = data[off + 16 : off + 16 + incl]
        off += 16 + incl
        if len(pkt) < 14:
            continue
        etype = int.from_bytes(pkt[12:14], "big")
        ip = pkt[14:]
        if etype == 0x0800 and len(ip) >= 20:
            fam, proto, addr, rest = "ipv4", ip[9], ip[16:20], ip[(ip[0] & 15) * 4 :]
        elif etype == 0x86DD and len(ip) >= 40:
            fam, proto, addr, rest = "ipv6", ip[6], ip[24:40], ip[40:]
        else:
            continue
        if ipaddress.ip_address(addr) != want:
            continue
        chain = [proto]
        while proto == 51 and len(rest) >= 2:  # AH: next header, length in 4-byte units - 2
            proto, rest = rest[0], rest[(rest[1] + 2) * 4 :]
            chain.append(proto)
        chains.add(f"{fam} " + ",".join(PROTO_NAMES.get(x, str(x)) for x in chain))
    return sorted(chains)


def _xfrm_left(node) -> list[str]:
    """XFRM states and policies still in `node` (first lines), for --stop-vpn."""
    left = []
    for kind in ("state", "policy"):
        out = node.run(["ip", "xfrm", kind, "list"], check=False).stdout
        left += [
            f"{node.name}: xfrm {kind} {ln}" for ln in out.splitlines() if ln.startswith("src")
        ]
    return left


def guest(
    profile: str,
    topology: str,
    lab_id: str,
    seconds: float,
    *,
    capture_v6: bool = False,
    stop_vpn: bool = False,
) -> dict:
    """One profile's check. `capture_v6`: the marker capture also to the IPv6 target;
    `stop_vpn`: stop the tunnel (lab.vpn.teardown.tear_down) before the lab goes down and record
    in `vpn_left` whatever XFRM state or policy is left in the VPN nodes. Both also record
    `capture_protocols` (the IP protocol chains seen on the wire)."""
    from lab.substrate.local.build import up
    from lab.core.teardown import teardown
    from lab.model.topology import load_topology

    res: dict = {"profile": profile, "topology": topology, "kernel": os.uname().release}
    spec = load_topology(ROOT / "topologies" / f"{topology}.py", params={"cpu": None})
    t0 = time.monotonic()
    lab = None
    try:
        lab = up(spec, lab_id, vpn=profile)
        res["up_s"] = round(time.monotonic() - t0, 2)
        v = lab.info["vpn"]
        d = v["describe"]
        res.update(
            path=d.get("path"),
            implementation=d.get("implementation"),
            cipher=d.get("cipher"),
            interface=d.get("interface"),
            mtu=d.get("mtu"),
            ready_s=v["timing"]["ready_s"],
        )
        client, server = lab.node("client"), lab.node("server")
        t4, t6 = v["traffic"]["v4"], v["traffic"]["v6"]
        for fam, addr in (("v4", t4), ("v6", t6)):
            cp = client.run(["ping", "-n", "-c", "3", "-i", "0.2", "-W", "3", addr], check=False)
            res[f"ping_{fam}_ms"] = _rtt(cp.stdout) if cp.returncode == 0 else None
        got = _iperf3(client, server, t4, seconds)
        res["iperf3_mbps"] = round(got["bits_per_second"] / 1e6, 1)
        res["iperf3_bytes"] = got["bytes"]  # that traffic passed, whatever the rate (TCG)
        node, ifname = wire_point(lab)
        seen, size, shown = _capture(lab, node, ifname, t4)
        res.update(
            marker_seen=seen,
            capture_bytes=size,
            capture_head=shown.splitlines()[:10],
            capture_on=f"{node}:{ifname}",
        )
        res["describe"] = d
        # what went to the server's underlay address: the tunnel's own packets ("ipv4 esp"
        # when only ESP is on the wire)
        under = v["tunnel"]["server"]["underlay_v4"]
        res["wire_protocols"] = ip_chains((lab.dir / "capture.pcap").read_bytes(), under)
        if capture_v6 or stop_vpn:
            res["capture_protocols"] = ip_chains((lab.dir / "capture.pcap").read_bytes(), t4)
        if capture_v6 and t6:
            seen6, size6, _ = _capture(lab, node, ifname, t6)
            res.update(
                marker_seen_v6=seen6,
                capture_bytes_v6=size6,
                capture_protocols_v6=ip_chains((lab.dir / "capture.pcap").read_bytes(), t6),
                wire_protocols_v6=ip_chains((lab.dir / "capture.pcap").read_bytes(), under),
            )
        if stop_vpn:
            from lab.vpn.teardown import tear_down

            t2 = time.monotonic()
            tear_down(lab)
            res["vpn_down_s"] = round(time.monotonic() - t2, 2)
            res["vpn_left"] = [
                x for n in (v["client"], v["server"]) for x in _xfrm_left(lab.node(n))
            ]
    except Exception as e:  # reported, then the lab is still taken down
        res["error"] = f"{type(e).__name__}: {e}"
    finally:
        t1 = time.monotonic()
        res["left"] = teardown(lab_id)
        res["down_s"] = round(time.monotonic() - t1, 2)
        left_ns = [
            n
            for n in subprocess.run(
                ["ip", "netns", "list"], capture_output=True, text=True
            ).stdout.split()
            if n.startswith(f"{lab_id}-")
        ]
        res["left"] += [f"netns {n}" for n in left_ns]
    return res


def capture_existing(lab_id: str) -> dict:
    """The capture check on a lab that is already up (`lab up --vm`): marker to the traffic
    target, captured on the server's wire interface."""
    from lab.substrate.local.lab import Lab

    lab = Lab.open(lab_id)
    node, ifname = wire_point(lab)
    seen, size, shown = _capture(lab, node, ifname, lab.info["vpn"]["traffic"]["v4"])
    return {
        "marker_seen": seen,
        "capture_bytes": size,
        "capture_head": shown.splitlines()[:10],
        "capture_on": f"{node}:{ifname}",
    }


def wire_point(lab) -> tuple[str, str]:
    """Where to capture "the wire": a router's interface toward the client when one sits
    between the ends, else the client's own underlay interface (egress: only what really leaves
    it). Not the server's interface: with kernel XFRM, AF_PACKET on the receiving interface also
    sees the decrypted inner packets (they are re-injected on the same device)."""
    from lab.vpn.tunnel import end_side

    v = lab.info["vpn"]
    client = end_side(lab.spec, v["client"], v["server"])
    for i in lab.spec.nodes[v["client"]].interfaces:
        if i.name == client.underlay_if and lab.spec.nodes[i.peer_node].router:
            return i.peer_node, i.peer_name
    return v["client"], client.underlay_if


def host(profiles: list[str], seconds: float) -> None:
    from lab.substrate.vm import boot

    with tempfile.TemporaryDirectory(prefix="lab-vm-dp-") as d:
        vm = boot(Path(d) / "vm")
        rows = []
        try:
            for i, prof in enumerate(profiles):
                topo = DEFAULT.get(prof, ("pi_pair_middlebox", None))[0]
                cp = vm.run(
                    [
                        sys.executable,
                        str(Path(__file__).resolve()),
                        "--guest",
                        "--topology",
                        topo,
                        "--id",
                        f"kdp{i}",
                        "--seconds",
                        str(seconds),
                        prof,
                    ],
                    check=False,
                    timeout=600,
                    cwd=str(ROOT),
                )
                try:
                    row = json.loads(cp.stdout.strip().splitlines()[-1])
                except (ValueError, IndexError):
                    row = {"profile": prof, "error": f"exit {cp.returncode}: {cp.stderr[-500:]}"}
                rows.append(row)
                print(
                    f"{prof:42} {row.get('path') or '-':8} up {row.get('up_s', '-')} s, "
                    f"ping {row.get('ping_v4_ms')} ms, iperf3 {row.get('iperf3_mbps')} Mbit/s, "
                    f"mtu {row.get('mtu')}, marker {'seen' if row.get('marker_seen') else 'absent'}"
                    f"{', ERROR ' + row['error'] if row.get('error') else ''}",
                    file=sys.stderr,
                )
        finally:
            accel, kernel, boot_s = vm.accel, vm.kernel_release, vm.boot_seconds
            vm.shutdown()
    print(
        json.dumps(
            {
                "kernel": kernel,
                "accel": accel,
                "boot_s": boot_s,
                "evidence": "functional (TCG)" if accel == "tcg" else "performance (KVM)",
                "iperf3_seconds": seconds,
                "rows": rows,
            },
            indent=2,
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("profiles", nargs="*")
    ap.add_argument("--guest", action="store_true", help="run the check here (inside the VM)")
    ap.add_argument("--topology", default="pi_pair_middlebox")
    ap.add_argument("--id", default="kdp")
    ap.add_argument("--seconds", type=float, default=3)
    ap.add_argument(
        "--capture", metavar="LAB_ID", help="(inside a VM) capture check on a lab that is up"
    )
    ap.add_argument(
        "--capture-v6", action="store_true", help="(--guest) capture the marker to IPv6 too"
    )
    ap.add_argument(
        "--stop-vpn",
        action="store_true",
        help="(--guest) stop the tunnel before the lab goes down; record XFRM objects left",
    )
    a = ap.parse_args()
    if a.capture:
        print(json.dumps(capture_existing(a.capture)), flush=True)
        return
    if a.guest:
        for p in a.profiles:
            r = guest(p, a.topology, a.id, a.seconds, capture_v6=a.capture_v6, stop_vpn=a.stop_vpn)
            print(json.dumps(r), flush=True)
        return
    host(a.profiles or list(DEFAULT), a.seconds)


if __name__ == "__main__":
    main()
