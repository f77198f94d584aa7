#!/usr/bin/env python3
"""TCP through the board kernel's data planes: what a stream costs per segment beside one-way UDP,
and whether a board keeps its segments in order.

    sudo .venv/bin/python bench/kernel_tcp.py [--mib 8] [--json FILE] [--from-log]

bench/kernel_dataplane.py counts one-way UDP datagrams through XFRM ESP and kernel WireGuard;
study A's headline is TCP, whose ACKs go through the tunnel too and whose sender encrypts in two
contexts: its own write (process context: NEON allowed) and the softirq of an arriving ACK (no
kernel-mode NEON on 5.10 armv7l, so a NEON AEAD is handed to cryptd). Same guest as
kernel_dataplane.py (Debian 11's 5.10 armmp kernel, Debian 12's socat, iproute2, wireguard-tools),
two boots:

1. **count** (one CPU, `-icount shift=0`: a guest nanosecond is an instruction): `dd bs=64k |
   socat` sends MIB MiB over TCP from namespace a to b, plain, then through ESP SAs in tunnel mode
   both ways (null, rfc4106(gcm(aes)) 128 and 256, rfc7539esp(chacha20,poly1305)) and through
   kernel WireGuard (wg0 at its default MTU 1420). The scheduler's non-idle run time (ns =
   instructions) from the first byte until the receiving socat has read the last is divided by
   the data segments b received (its Tcp InSegs; nothing merges them on one CPU); ACKs per segment
   are b's OutSegs over InSegs; retransmissions a's RetransSegs. Both ends, both directions,
   the apps' copies included (they are in the plain run too).
2. **order** (four CPUs, multi-threaded TCG, no counts): the two boards' CPU 0 and their apps.
   RPS puts each namespace's receive softirq on a CPU of its own (a: 0, b: 1; a Pi 4 takes all
   of its NIC's interrupts on CPU 0), the sender runs on CPU 2, the receiver on CPU 3. TCP's own
   account of the order its segments came in: b's TCPOFOQueue (segments queued out of order),
   a's TCPSACKReorder and TCPTSReorder (reordering detected), TCPFastRetrans, TCPSackRecovery and
   TCPDSACKRecv (a retransmission the receiver had no need of: spurious), RetransSegs.

About 3 minutes here; `--from-log` re-reports from the saved guest logs. docs/fidelity.md
"TCP through the board kernel's data planes" has the results.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import guestcount as gc  # noqa: E402
import kernel_dataplane as kd  # noqa: E402

PORT = 5002
#: TcpExt counters the order run reports (a: the sender, b: the receiver)
ORDER = (
    ("b", "TCPOFOQueue"),
    ("a", "TCPSACKReorder"),
    ("a", "TCPTSReorder"),
    ("a", "TCPSackRecovery"),
    ("a", "TCPFastRetrans"),
    ("a", "TCPDSACKRecv"),
)
#: /proc/net/snmp's Tcp columns this reads
TCP_COLS = ("InSegs", "OutSegs", "RetransSegs")
FLUSH = (
    "/bin/ip -n a xfrm state flush; /bin/ip -n b xfrm state flush;"
    " /bin/ip -n a xfrm policy flush; /bin/ip -n b xfrm policy flush"
)


def esp_both_ways(algo: str) -> list[str]:
    """An ESP SA and policy each way between a and b, in tunnel mode, as strongSwan installs them."""
    sh = [FLUSH]
    for spi, src, dst in ((0x1000, "10.0.0.1", "10.0.0.2"), (0x2000, "10.0.0.2", "10.0.0.1")):
        reqid = spi >> 12
        tmpl = f"tmpl src {src} dst {dst} proto esp reqid {reqid} mode tunnel"
        sh += [
            f"/bin/ip -n {ns} xfrm state add src {src} dst {dst} proto esp spi {spi:#x}"
            f" reqid {reqid} mode tunnel {algo} || echo @@XFRM_FAILED"
            for ns in ("a", "b")
        ]
        out, inn = ("a", "b") if src == "10.0.0.1" else ("b", "a")
        sh += [
            f"/bin/ip -n {out} xfrm policy add src {src}/32 dst {dst}/32 dir out {tmpl}",
            f"/bin/ip -n {inn} xfrm policy add src {src}/32 dst {dst}/32 dir in {tmpl}",
        ]
    return sh


def guest_script(mods: list[str], mib: int, order: bool) -> str:
    sh = [gc.GUEST_HEAD]
    sh += [
        f"$B insmod /m/{m} || echo @@INSMOD_FAILED {m}" for m in mods if not m.startswith("tcrypt")
    ]
    sh += [*gc.VETH_PAIR, "echo 134217728 > /proc/sys/net/core/rmem_max"]
    pin_a = pin_b = ""
    if order:
        # each board's receive softirq on its own CPU, the apps on two others
        sh += [
            "/bin/ip netns exec a $B sh -c 'echo 1 > /sys/class/net/va/queues/rx-0/rps_cpus'",
            "/bin/ip netns exec b $B sh -c 'echo 2 > /sys/class/net/vb/queues/rx-0/rps_cpus'",
            "echo @@CPUS $($B grep -c ^processor /proc/cpuinfo)",
        ]
        pin_a, pin_b = "$B taskset 4 ", "$B taskset 8 "
    # one transfer: $1 name, $2 the receiver's address; a 512 KiB warm-up connection first
    # (neighbours, routes, the SAs' crypto contexts, WireGuard's handshake)
    sh.append(rf"""
counters() {{ for ns in a b; do
  echo "@@SNMP $1 $ns $(/bin/ip netns exec $ns $B grep -E '^Tcp:' /proc/net/snmp | $B tail -1)"
  echo "@@EXTHEAD $(/bin/ip netns exec $ns $B grep -E '^TcpExt:' /proc/net/netstat | $B head -1)"
  echo "@@EXT $1 $ns $(/bin/ip netns exec $ns $B grep -E '^TcpExt:' /proc/net/netstat | $B tail -1)"
done; }}
send() {{ /bin/ip netns exec a {pin_a}sh -c "$B dd if=/dev/zero bs=65536 count=$1 2>/dev/null | socat -u -b65536 STDIN TCP:$2:{PORT}"; }}
measure() {{
  /bin/ip netns exec b {pin_b}socat -u -b65536 TCP-LISTEN:{PORT},reuseaddr /dev/null & R=$!
  $B sleep 1; send 8 $2; wait $R
  /bin/ip netns exec b {pin_b}socat -u -b65536 TCP-LISTEN:{PORT},reuseaddr /dev/null & R=$!
  $B sleep 1; counters $1-0; t0=$(busy)
  send {mib * 16} $2; wait $R
  t1=$(busy); counters $1-1
  echo "@@TCP $1 bytes={mib * 1048576} busy_ns=$((t1-t0))"
}}
""")
    sh.append("measure plain 10.0.0.2")
    for name, algo, _ in kd.ESP:
        sh += [*esp_both_ways(algo), f"measure {name} 10.0.0.2"]
    sh += [
        FLUSH,
        *kd.WG_PAIR,
        "/bin/ip -n a link set wg0 up; /bin/ip -n b link set wg0 up",
        "measure wireguard 10.1.0.2",
        "echo @@DONE",
        "$B poweroff -f",
    ]
    return "\n".join(sh) + "\n"


def parse(text: str) -> dict[str, dict]:
    """{run: {"bytes", "busy_ns", "a"/"b": {counter: delta}}} from a guest log."""
    runs: dict[str, dict] = {}
    heads = [
        line.split("TcpExt:", 1)[1].split() for line in text.splitlines() if "@@EXTHEAD" in line
    ]
    snap: dict[tuple[str, str, str], dict[str, int]] = {}
    for m in re.finditer(r"@@SNMP (\S+)-([01]) ([ab]) Tcp: ([-\d ]+)", text):
        # RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets
        # CurrEstab InSegs OutSegs RetransSegs ...
        v = [int(x) for x in m[4].split()]
        snap[(m[1], m[2], m[3])] = dict(zip(TCP_COLS, v[9:12], strict=True))
    for m in re.finditer(r"@@EXT (\S+)-([01]) ([ab]) TcpExt: ([-\d ]+)", text):
        snap.setdefault((m[1], m[2], m[3]), {}).update(
            zip(heads[0], (int(x) for x in m[4].split()), strict=False)
        )
    for m in re.finditer(r"@@TCP (\S+) bytes=(\d+) busy_ns=(\d+)", text):
        name = m[1]
        row: dict = {"bytes": int(m[2]), "busy_ns": int(m[3])}
        for ns in "ab":
            before, after = snap.get((name, "0", ns), {}), snap.get((name, "1", ns), {})
            row[ns] = {k: after[k] - before.get(k, 0) for k in after}
        runs[name] = row
    return runs


def report(count: dict[str, dict], order: dict[str, dict]) -> dict:
    out: dict = {"kernel": gc.KERNEL, "count": {}, "order": {}}
    if count:
        plain = count.get("plain")
        if not plain:
            raise SystemExit("no plain run in the count guest's log")
        per_byte0 = plain["busy_ns"] / plain["bytes"]
        print("\ncount (one CPU, -icount): instructions per data segment b received, the whole trip"
              " (both ends and directions, the apps' copies included), and what the tunnel adds to"
              " plain TCP at the same bytes")  # fmt: skip
        print(f"  {'run':21s} {'segments':>8s} {'payload B':>9s} {'ACKs/seg':>8s} {'retrans':>7s}"
              f" {'per segment':>11s} {'tunnel':>8s}")  # fmt: skip
        for name, r in count.items():
            seg = r["b"].get("InSegs", 0)
            if not seg:
                continue
            per_seg = r["busy_ns"] / seg
            tunnel = per_seg - per_byte0 * r["bytes"] / seg
            row = {"segments": seg, "payload_bytes": round(r["bytes"] / seg),
                   "acks_per_segment": round(r["b"].get("OutSegs", 0) / seg, 3),
                   "retransmissions": r["a"].get("RetransSegs", 0),
                   "instructions_per_segment": round(per_seg),
                   "tunnel_instructions_per_segment": round(tunnel)}  # fmt: skip
            out["count"][name] = row
            print(f"  {name:21s} {seg:8d} {row['payload_bytes']:9d} {row['acks_per_segment']:8.2f}"
                  f" {row['retransmissions']:7d} {per_seg:11.0f} {tunnel:8.0f}")  # fmt: skip
    if order:
        print("\norder (four CPUs: each board's receive softirq on its own CPU, the apps on two"
              " others): TCP's account of the order its segments arrived in")  # fmt: skip
        print(f"  {'run':21s} " + " ".join(f"{ns}:{k:>15s}" for ns, k in ORDER) + "  retrans")
        for name, r in order.items():
            row = {f"{ns}:{k}": r[ns].get(k, 0) for ns, k in ORDER}
            row["retransmissions"] = r["a"].get("RetransSegs", 0)
            row["bytes"] = r["bytes"]
            out["order"][name] = row
            print(f"  {name:21s} " + " ".join(f"{row[f'{ns}:{k}']:17d}" for ns, k in ORDER)
                  + f"  {row['retransmissions']:7d}")  # fmt: skip
    return out


def main() -> None:
    ap = gc.argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=8, help="MiB per transfer")
    ap.add_argument("--timeout", type=float, default=3600, help="for each boot, host seconds")
    ap.add_argument("--json", type=Path, help="write the results here too")
    ap.add_argument("--from-log", action="store_true", help="no boot: the newest saved logs")
    a = ap.parse_args()

    def userland() -> Path:
        return gc.fetch_userland("net", kd.NET_USERLAND)

    count = gc.guest_log(a, "tcpcount", userland, lambda m: guest_script(m, a.mib, False),
                         kd.NET_MODULES)  # fmt: skip
    order = gc.guest_log(a, "tcporder", userland, lambda m: guest_script(m, a.mib, True),
                         kd.NET_MODULES, smp=4)  # fmt: skip
    out = report(parse(count), parse(order))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    gc.run(main)
