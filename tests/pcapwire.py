"""Wire packets counted from tcpdump captures (classic pcap, Ethernet), without scapy.

A capture taken where the stack hands over GSO/TSO super-frames (the router's egress towards an
impairment engine) holds TCP frames of up to 64 KB; what a real NIC puts on the wire are
MSS-sized packets. `wire_packets` turns every captured TCP data frame into the packets it stands
for: ceil(payload / MSS) of them, sequence numbers MSS apart, each with the frame's capture
time. A capture taken after segmentation (a receiver's veth, GRO off) already holds wire
packets. Comparing the two counts what an impairment did per wire packet, independently of the
engine's own counters.

Shared by tests/test_impair_wire.py and bench/impair_accuracy.py; standard library only.
"""

from __future__ import annotations

import ipaddress
import re
import struct
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

LINKTYPE_ETHERNET = 1
TH_SYN = 0x02

Flow = tuple[str, int, str, int]  # src, sport, dst, dport


@dataclass(frozen=True)
class TcpFrame:
    """One captured TCP frame: capture time (s), addresses, seq, flags, payload bytes (from the
    IP length fields, so a small snaplen is enough), captured frame length, SYN's MSS option."""

    t: float
    flow: Flow
    seq: int
    flags: int
    payload: int
    frame_len: int
    mss_opt: int | None = None


def read_tcp(path: str | Path) -> list[TcpFrame]:
    """Every IPv4/IPv6 TCP frame of a pcap file (microsecond or nanosecond timestamps)."""
    data = Path(path).read_bytes()
    if len(data) < 24:
        raise ValueError(f"{path}: not a pcap file ({len(data)} bytes)")
    magic = data[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        end = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        end = ">"
    else:
        raise ValueError(f"{path}: not a classic pcap file (magic {magic.hex()})")
    scale = 1e-9 if magic in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d") else 1e-6
    linktype = struct.unpack(end + "I", data[20:24])[0] & 0x0FFFFFFF
    if linktype != LINKTYPE_ETHERNET:
        raise ValueError(f"{path}: link type {linktype}, only Ethernet (1) is read")
    rec = struct.Struct(end + "IIII")
    out: list[TcpFrame] = []
    off = 24
    while off + 16 <= len(data):
        sec, frac, incl, orig = rec.unpack_from(data, off)
        pkt = data[off + 16 : off + 16 + incl]
        off += 16 + incl
        f = _tcp(pkt, orig, sec + frac * scale)
        if f is not None:
            out.append(f)
    return out


def _tcp(pkt: bytes, orig: int, t: float) -> TcpFrame | None:
    if len(pkt) < 14:
        return None
    l3, etype = 14, int.from_bytes(pkt[12:14], "big")
    if etype == 0x8100 and len(pkt) >= 18:
        l3, etype = 18, int.from_bytes(pkt[16:18], "big")
    if etype == 0x0800 and len(pkt) >= l3 + 20:
        ihl = (pkt[l3] & 0x0F) * 4
        if pkt[l3 + 9] != 6 or int.from_bytes(pkt[l3 + 6 : l3 + 8], "big") & 0x3FFF:
            return None  # not TCP, or a fragment
        total = int.from_bytes(pkt[l3 + 2 : l3 + 4], "big") or orig - l3  # 0: BIG TCP
        src, dst = pkt[l3 + 12 : l3 + 16], pkt[l3 + 16 : l3 + 20]
        l4, ip_len = l3 + ihl, total - ihl
    elif etype == 0x86DD and len(pkt) >= l3 + 40:
        if pkt[l3 + 6] != 6:
            return None  # not TCP or behind an extension header
        plen = int.from_bytes(pkt[l3 + 4 : l3 + 6], "big") or orig - l3 - 40  # 0: jumbogram
        src, dst = pkt[l3 + 8 : l3 + 24], pkt[l3 + 24 : l3 + 40]
        l4, ip_len = l3 + 40, plen
    else:
        return None
    if len(pkt) < l4 + 20:
        return None
    sport, dport, seq = struct.unpack_from("!HHI", pkt, l4)
    thl = (pkt[l4 + 12] >> 4) * 4
    flags = pkt[l4 + 13]
    mss = _mss_option(pkt[l4 + 20 : l4 + thl]) if flags & TH_SYN else None
    flow = (str(ipaddress.ip_address(src)), sport, str(ipaddress.ip_address(dst)), dport)
    return TcpFrame(t, flow, seq, flags, max(0, ip_len - thl), orig, mss)


def _mss_option(opts: bytes) -> int | None:
    i = 0
    while i < len(opts):
        kind = opts[i]
        if kind == 0:
            break
        if kind == 1:
            i += 1
            continue
        if i + 1 >= len(opts) or opts[i + 1] < 2:
            break
        if kind == 2 and opts[i + 1] == 4 and i + 4 <= len(opts):
            return int.from_bytes(opts[i + 2 : i + 4], "big")
        i += opts[i + 1]
    return None


def data_frames(frames: list[TcpFrame], dst: str, dport: int) -> list[TcpFrame]:
    """Frames carrying payload towards dst:dport (every connection to that service)."""
    return [f for f in frames if f.payload > 0 and f.flow[2] == dst and f.flow[3] == dport]


def flow_mss(*captures: list[TcpFrame]) -> dict[Flow, int]:
    """Per connection (sender -> receiver), the MSS its super-frames are cut into: the largest
    payload seen that does not exceed the SYNs' MSS option (the gso_size, i.e. the MSS less the
    TCP options every segment carries, such as timestamps). Connections whose SYN is not in the
    captures are left out."""
    syn: dict[Flow, int] = {}
    for cap in captures:
        for f in cap:
            if f.mss_opt is not None:
                for key in (f.flow, (f.flow[2], f.flow[3], f.flow[0], f.flow[1])):
                    syn[key] = min(syn.get(key, 65535), f.mss_opt)
    best: dict[Flow, int] = {}
    for cap in captures:
        for f in cap:
            if f.flow in syn and 0 < f.payload <= syn[f.flow]:
                best[f.flow] = max(best.get(f.flow, 0), f.payload)
    return best


@dataclass(frozen=True)
class WirePacket:
    t: float
    flow: Flow
    seq: int
    length: int


def wire_packets(frames: list[TcpFrame], mss: dict[Flow, int]) -> list[WirePacket]:
    """The wire packets the data frames stand for: a frame of P payload bytes on a connection
    with MSS M is ceil(P / M) packets (seq, seq + M, ...), as TSO/GSO would cut it; each keeps
    the frame's capture time. A connection without a known MSS raises KeyError."""
    out = []
    for f in frames:
        m = mss[f.flow]
        for i in range(0, f.payload, m):
            out.append(WirePacket(f.t, f.flow, (f.seq + i) & 0xFFFFFFFF, min(m, f.payload - i)))
    return out


def transits(
    before: list[WirePacket], after: list[WirePacket], windows: list[tuple[float, float]]
) -> tuple[list[float], int]:
    """Time from the first capture point to the second (s) of every wire packet seen at both,
    matched by (connection, seq, length), and how many copies seen after found no partner.

    A retransmitted or duplicated packet has several copies on each side, and with reordering
    the k-th copy seen after need not be the k-th one sent (TCP retransmits a delayed packet
    while it waits, and the copy may overtake it). Copies are paired so that every transit lies
    in one of `windows`, (low, high) in s with `low` the nominal transit (e.g. (0, 5 ms) for
    "sent at once", (delay, delay + 50 ms) for "delayed"): a maximum bipartite matching per
    packet that tries first the partner whose transit is closest above a window's low end.
    Measured on a 25 %-reorder TCP run with up to 8 copies of a packet, that pairing leaves no
    transit between the two windows; trying the shortest transit first left hundreds."""
    sent: dict[tuple, list[float]] = defaultdict(list)
    got: dict[tuple, list[float]] = defaultdict(list)
    for p in before:
        sent[(p.flow, p.seq, p.length)].append(p.t)
    for p in after:
        got[(p.flow, p.seq, p.length)].append(p.t)
    out: list[float] = []
    unmatched = 0
    for key, ats in got.items():
        bts = sorted(sent.get(key, []))
        ats.sort()
        # per copy seen after: the before copies it may pair with, closest to a window's low first
        edges = [
            [j for _, j in sorted((a - b - lo, j) for j, b in enumerate(bts) for lo, hi in windows
                                  if lo <= a - b <= hi)]
            for a in ats
        ]  # fmt: skip
        owner: dict[int, int] = {}  # before copy -> after copy

        def augment(i: int, seen: set[int], edges=edges, owner=owner) -> bool:
            for j in edges[i]:
                if j not in seen:
                    seen.add(j)
                    if j not in owner or augment(owner[j], seen):
                        owner[j] = i
                        return True
            return False

        for i in range(len(ats)):
            if not augment(i, set()):
                unmatched += 1
        out += [ats[i] - bts[j] for j, i in owner.items()]
    return out, unmatched


def missing_runs(before: list[WirePacket], after: list[WirePacket]) -> list[int]:
    """Lengths of the runs of consecutive wire packets (same connection, one packet's seq +
    length = the next one's seq) that crossed the first point more often than the second:
    independent per-packet loss gives runs of 1, a super-frame dropped whole gives a run as
    long as its segment count."""
    count: dict[tuple, int] = defaultdict(int)
    for p in before:
        count[(p.flow, p.seq, p.length)] += 1
    for p in after:
        count[(p.flow, p.seq, p.length)] -= 1
    lost = sorted(k for k, n in count.items() if n > 0)
    runs: list[int] = []
    prev = None
    for flow, seq, length in lost:
        if prev is not None and prev[0] == flow and (prev[1] + prev[2]) & 0xFFFFFFFF == seq:
            runs[-1] += 1
        else:
            runs.append(1)
        prev = (flow, seq, length)
    return runs


def kernel_drops(tcpdump_stderr: str) -> int:
    """tcpdump's "N packets dropped by kernel" (printed when it exits); -1 when absent."""
    m = re.search(r"(\d+) packets? dropped by kernel", tcpdump_stderr)
    return int(m.group(1)) if m else -1


def binom_interval(n: int, p: float, z: float = 2.576) -> tuple[float, float]:
    """Normal approximation of the 99 % interval of a Binomial(n, p) count."""
    sd = (n * p * (1 - p)) ** 0.5
    return n * p - z * sd, n * p + z * sd
