#!/usr/bin/env python3
"""The board kernel's own per-packet data plane path (XFRM ESP, kernel WireGuard), counted.

    sudo .venv/bin/python bench/kernel_dataplane.py [--packets 4000] [--json FILE] [--from-log]

bench/kernel_crypto.py counts the board kernel's AEADs; this counts what the kernel does around
them for each packet of a tunnel, the board's side of what a userspace stand-in (charon's
kernel-libipsec, wireguard-go) does with TUN reads, UDP sends and thread hand-offs. The same
guest as kernel_crypto.py (Debian 11's 5.10 armmp kernel, `qemu-system-arm -cpu cortex-a15`:
NEON, no AES/PMULL, `-icount shift=0`: one guest nanosecond is one executed instruction), with
Debian 12's iproute2, socat and wireguard-tools added to the initramfs:

1. two network namespaces `a` and `b` on a veth pair; `dd bs=1400 | socat -b1400` in `a` sends
   N UDP datagrams of 1400 bytes to a socat in `b` (stopped: its socket, 64 MiB of buffer, only
   queues them, so every datagram is delivered through the whole receive path and nothing is
   read back); the scheduler's own account of the CPU's non-idle run time (/proc/schedstat
   rq_cpu_time, ns = instructions here) from before the first datagram until the receiver's
   counter shows all N, divided by N, is the instructions of one datagram's trip;
2. the same with an ESP SA in tunnel mode (as strongSwan installs it) between a and b, for
   rfc4106(gcm(aes)) 128 and 256 and rfc7539esp(chacha20,poly1305), all with 128-bit ICVs
   (esp4_offload not loaded), and with a null ESP (ecb(cipher_null) + digest_null): the
   difference to the plain trip is the tunnel's cost per packet, encryption (xfrm_output,
   esp_output, the AEAD in the sender's process context) plus decryption (esp_input,
   xfrm_input, the AEAD in the NET_RX softirq: GCM handed to cryptd's kworker, ChaCha20 scalar
   in place); the AEAD's share is taken out with tcrypt's counts of the same drivers (the
   kernel_crypto.py guest logs: NEON for encryption and GCM's cryptd decryption, NEON-off for
   ChaCha20's softirq decryption), which leaves the path;
3. the same through kernel WireGuard (wg0 in each namespace, the 5.10 module, MTU 1440 so that
   nothing is fragmented; its encryption and decryption workers and NAPI poll are kworkers and
   softirqs on the one CPU);
   then every run again with b's end of the veth down and b's address resolved for good: a's
   qdisc drops each packet once it is encrypted and framed, so the difference to the plain
   send is the sending side alone (xfrm_output, esp_output and the AEAD; wg's queues, workers
   and UDP tunnel send) and the rest of the trip's difference is the receiving side;
4. the UnixBench 5.1.3 loops (System Call Overhead: close(dup), getpid, getuid, umask; Pipe
   Throughput: 512-byte write + read), written in ARM assembly here (bench/armloops.S:
   arm-linux-gnueabihf-as, binutils-arm-linux-gnueabihf), counted at two loop counts (the
   difference removes fork and exec); with the published Pi 4 loops/s of cpu_profiles/pi4.toml
   they give the Cortex-A72's IPC for kernel entry and copy code, the IPC the path's
   instructions are turned into cycles with.

Prints instructions per packet (the trip, the tunnel's part, its AEAD, the path around it on
the sending and the receiving side), the IPC anchors, and the slower side's board cycles per
packet and packets/s of one 1.5 GHz core: the figures of cpu_profiles/pi4.toml's
[kernel.dataplane.NAME.path]. About 5 minutes here; `--from-log` re-reports from the saved
guest log. docs/cpu.md "The board kernel's packet path" has the results.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import guestcount as gc  # noqa: E402
import kernel_crypto as kc  # noqa: E402

#: the guest's network userland (Debian 12, as the board's roots: lab.core.arch.fetch)
NET_USERLAND = ("busybox-static/bookworm", "socat/bookworm", "iproute2/bookworm",
                "wireguard-tools/bookworm")  # fmt: skip
NET_MODULES = (
    "veth",
    "esp4",
    "xfrm_user",
    "seqiv",
    "authenc",
    "jitterentropy_rng",
    "drbg",
    "wireguard",
)
#: seqiv seeds its IVs from the default "stdrng" (crypto_get_default_rng): without drbg an AEAD SA
#: fails with ENOENT (the board has one: nothing in Raspberry Pi OS works without it)
PAYLOAD = 1400  # UDP payload bytes per datagram
#: (name, `ip xfrm state` algorithm arguments, tcrypt alg and key bits of its AEAD or None)
ESP = (
    ("esp-null", "enc 'ecb(cipher_null)' '' auth digest_null ''", None),
    ("esp-aes128gcm", "aead 'rfc4106(gcm(aes))' 0x" + "11" * 20 + " 128", ("rfc4106(gcm(aes))", 160)),
    ("esp-aes256gcm", "aead 'rfc4106(gcm(aes))' 0x" + "22" * 36 + " 128", ("gcm(aes)", 256)),
    ("esp-chacha20poly1305", "aead 'rfc7539esp(chacha20,poly1305)' 0x" + "33" * 36 + " 128",
     ("rfc7539esp(chacha20,poly1305)", 288)),
)  # fmt: skip


#: kernel WireGuard between a (10.1.0.1) and b (10.1.0.2) over the veth pair, fixed throwaway
#: keys; wg0 left down (its MTU is the caller's)
WG_PAIR = (
    "echo 'aCq3OTE0NDEkbWl4ZWR0ZXN0a2V5a2V5a2V5a2V5a2U=' > /run/ka; echo 'SGVsbG9Xb3JsZEhlbGxvV29ybGRIZWxsb1dvcmxkISE=' > /run/kb",
    "/bin/ip -n a link add wg0 type wireguard; /bin/ip -n b link add wg0 type wireguard || echo @@WG_FAILED",
    "PA=$(/usr/bin/wg pubkey < /run/ka); PB=$(/usr/bin/wg pubkey < /run/kb)",
    "/bin/ip netns exec a /usr/bin/wg set wg0 private-key /run/ka listen-port 51820 peer $PB endpoint 10.0.0.2:51820 allowed-ips 10.1.0.2/32",
    "/bin/ip netns exec b /usr/bin/wg set wg0 private-key /run/kb listen-port 51820 peer $PA endpoint 10.0.0.1:51820 allowed-ips 10.1.0.1/32",
    "/bin/ip -n a addr add 10.1.0.1/24 dev wg0; /bin/ip -n b addr add 10.1.0.2/24 dev wg0",
)  # fmt: skip


def guest_script(mods: list[str], n: int) -> str:
    sh = [gc.GUEST_HEAD]
    for m in mods:
        if not m.startswith("tcrypt"):
            sh.append(f"$B insmod /m/{m} || echo @@INSMOD_FAILED {m}")
    sh += [*gc.VETH_PAIR, "echo 134217728 > /proc/sys/net/core/rmem_max"]
    # one measurement: $1 name, $2 destination address, $3 IP deliveries per datagram (1 plain;
    # $4 the sender's namespace (a; c: forwarded by a);
    # 2 through a tunnel: the outer packet to esp4 or wg's UDP socket, then the inner one; the
    # receiving wg0's own rx counter, printed after the run, confirms WireGuard's).
    # Udp InDatagrams counts reads (udp_recvmsg), and the receiver is stopped: Ip InDelivers.
    sh.append(rf"""
measure() {{
  /bin/ip netns exec b socat -u -b2000 UDP-RECV:5001,rcvbuf=67108864 /dev/null & R=$!
  $B sleep 1; $B kill -STOP $R
  # warm-up: the first packets set up neighbour entries, routes and the SA's crypto contexts
  /bin/ip netns exec ${{4:-a}} sh -c "$B dd if=/dev/zero bs={PAYLOAD} count=50 2>/dev/null | socat -u -b{PAYLOAD} STDIN UDP-SENDTO:$2:5001"
  $B sleep 1
  r0=$(snmp $R Ip InDelivers); e0=$(snmp $R Udp RcvbufErrors); t0=$(busy); u0=$($B cat /proc/uptime)
  /bin/ip netns exec ${{4:-a}} sh -c "$B dd if=/dev/zero bs={PAYLOAD} count={n} 2>/dev/null | socat -u -b{PAYLOAD} STDIN UDP-SENDTO:$2:5001"
  k=0; while [ $(( $(snmp $R Ip InDelivers) - r0 )) -lt $(({n} * $3)) ] && [ $k -lt 200 ]; do $B usleep 20000; k=$((k+1)); done
  t1=$(busy); u1=$($B cat /proc/uptime); r1=$(snmp $R Ip InDelivers); e1=$(snmp $R Udp RcvbufErrors)
  echo "@@RESULT $1 packets={n} received=$(((r1-r0) / $3)) rcvbuf_errors=$((e1-e0)) busy_ns=$((t1-t0)) uptime0=${{u0%% *}} uptime1=${{u1%% *}} polls=$k"
  $B kill -9 $R; wait $R 2>/dev/null
}}
""")
    sh.append("measure plain 10.0.0.2 1")
    for name, algo, _ in ESP:
        sh += [
            "/bin/ip -n a xfrm state flush; /bin/ip -n b xfrm state flush; /bin/ip -n a xfrm policy flush; /bin/ip -n b xfrm policy flush",
            *[f"/bin/ip -n {ns} xfrm state add src 10.0.0.1 dst 10.0.0.2 proto esp spi 0x1000 reqid 1 mode tunnel {algo} || {{ echo @@XFRM_FAILED {name}; $B dmesg | $B tail -5; $B grep -E '^name' /proc/crypto | $B sort | $B uniq | $B tr '\\n' ' '; }}"
              for ns in ("a", "b")],
            "/bin/ip -n a xfrm policy add src 10.0.0.1/32 dst 10.0.0.2/32 dir out tmpl src 10.0.0.1 dst 10.0.0.2 proto esp reqid 1 mode tunnel",
            "/bin/ip -n b xfrm policy add src 10.0.0.1/32 dst 10.0.0.2/32 dir in tmpl src 10.0.0.1 dst 10.0.0.2 proto esp reqid 1 mode tunnel",
            f"measure {name} 10.0.0.2 2",
            f"echo @@XFRM {name}; /bin/ip -n a -s xfrm state | $B grep -E 'aead|enc|lifetime current' -A1 | $B head -8",
        ]  # fmt: skip
    sh += [
        "/bin/ip -n a xfrm state flush; /bin/ip -n b xfrm state flush; /bin/ip -n a xfrm policy flush; /bin/ip -n b xfrm policy flush",
        *WG_PAIR,
        # wg0's default MTU (1420) would fragment a 1428-byte inner packet into two; 1440 keeps
        # it whole (1440 padded + 32 of WireGuard + 28 of UDP/IP = the veth's 1500)
        "/bin/ip -n a link set wg0 mtu 1440 up; /bin/ip -n b link set wg0 mtu 1440 up",
        "measure wireguard 10.1.0.2 2",
        "echo \"@@WGRX $(/bin/ip -n b -s link show wg0 | $B tr '\\n' ' ')\"",
        "echo @@WG; /bin/ip netns exec a /usr/bin/wg show wg0 transfer",
    ]
    # the sending side alone: b's end of the veth down (a's qdisc then drops every packet once it
    # is encrypted and framed), b's address resolved for good; the same for every tunnel
    sh.append(rf"""
measure_out() {{
  /bin/ip netns exec a sh -c "$B dd if=/dev/zero bs={PAYLOAD} count=50 2>/dev/null | socat -u -b{PAYLOAD} STDIN UDP-SENDTO:$2:5001"
  $B usleep 300000
  t0=$(busy)
  /bin/ip netns exec a sh -c "$B dd if=/dev/zero bs={PAYLOAD} count={n} 2>/dev/null | socat -u -b{PAYLOAD} STDIN UDP-SENDTO:$2:5001"
  $B usleep 300000
  t1=$(busy)
  echo "@@OUT $1 packets={n} busy_ns=$((t1-t0))"
}}
""")  # fmt: skip
    sh += [
        # forwarded: c sends through a, which encrypts in the NET_RX softirq of the packet's
        # arrival (a gateway's case, and TCP's ACK-clocked sends): GCM through cryptd there too,
        # ChaCha20 with the scalar code
        "/bin/ip netns add c; /bin/ip link add vc netns c type veth peer name vac netns a",
        "/bin/ip -n c addr add 10.2.0.2/24 dev vc; /bin/ip -n a addr add 10.2.0.1/24 dev vac",
        "/bin/ip -n c link set lo up; /bin/ip -n c link set vc up; /bin/ip -n a link set vac up",
        "/bin/ip -n c route add default via 10.2.0.1; /bin/ip netns exec a $B sh -c 'echo 1 > /proc/sys/net/ipv4/ip_forward'",
        "/bin/ip -n a xfrm state flush; /bin/ip -n b xfrm state flush; /bin/ip -n a xfrm policy flush; /bin/ip -n b xfrm policy flush",
        "measure fwd-plain 10.0.0.2 1 c",
    ]
    for name, algo, _ in ESP[1:]:
        sh += [
            "/bin/ip -n a xfrm state flush; /bin/ip -n b xfrm state flush; /bin/ip -n a xfrm policy flush; /bin/ip -n b xfrm policy flush",
            *[
                f"/bin/ip -n {ns} xfrm state add src 10.0.0.1 dst 10.0.0.2 proto esp spi 0x1000 reqid 1 mode tunnel {algo}"
                for ns in ("a", "b")
            ],
            "/bin/ip -n a xfrm policy add src 10.2.0.0/24 dst 10.0.0.2/32 dir out tmpl src 10.0.0.1 dst 10.0.0.2 proto esp reqid 1 mode tunnel",
            "/bin/ip -n b xfrm policy add src 10.2.0.0/24 dst 10.0.0.2/32 dir in tmpl src 10.0.0.1 dst 10.0.0.2 proto esp reqid 1 mode tunnel",
            f"measure fwd-{name} 10.0.0.2 2 c",
            # where a burst is lost: XFRM's error counters, the CPU's backlog drops (column 2)
            f"echo @@DROPS fwd-{name} $(/bin/ip netns exec a $B grep -v ' 0$' /proc/net/xfrm_stat"
            " | $B tr '\\n' ' ') softnet: $($B cut -d' ' -f1-3 /proc/net/softnet_stat)",
        ]
    sh += [
        "/bin/ip -n a xfrm state flush; /bin/ip -n b xfrm state flush; /bin/ip -n a xfrm policy flush; /bin/ip -n b xfrm policy flush",
    ]
    sh += [
        "/bin/ip -n b link set vb down",
        "/bin/ip -n a neigh replace 10.0.0.2 lladdr 02:00:00:00:00:0b nud permanent dev va",
        "measure_out wireguard 10.1.0.2",
        "/bin/ip -n a link set wg0 down",
        "measure_out plain 10.0.0.2",
    ]
    for name, algo, _ in ESP:
        sh += [
            "/bin/ip -n a xfrm state flush; /bin/ip -n a xfrm policy flush",
            f"/bin/ip -n a xfrm state add src 10.0.0.1 dst 10.0.0.2 proto esp spi 0x1000 reqid 1 mode tunnel {algo}",
            "/bin/ip -n a xfrm policy add src 10.0.0.1/32 dst 10.0.0.2/32 dir out tmpl src 10.0.0.1 dst 10.0.0.2 proto esp reqid 1 mode tunnel",
            f"measure_out {name} 10.0.0.2",
        ]  # fmt: skip
    sh += [
        "echo @@QDISC; /bin/ip -n a -s link show va",
    ]
    sh += [*gc.loop_lines(), "echo @@DONE", "$B poweroff -f"]
    return "\n".join(sh) + "\n"


def aead_ipp(alg: str, bits: int, size: int, softirq_enc: bool = False) -> dict[str, float]:
    """Instructions per message of the AEAD at `size` bytes: encryption with NEON (the
    sender's process context), decryption with NEON (GCM: cryptd's kworker) or without
    (ChaCha20: scalar in the softirq), from kernel_crypto.py's saved guest logs."""
    neon = sorted(gc.RUNS.glob("*-neon.log"))
    if not neon:
        raise SystemExit(f"no kernel_crypto.py guest logs under {gc.RUNS}: run it first")
    rows = kc.parse_tcrypt(neon[-1].read_text(errors="replace"))
    noneon = neon[-1].with_name(neon[-1].name.replace("-neon.log", "-noneon.log"))
    srows = kc.parse_tcrypt(noneon.read_text(errors="replace")) if noneon.exists() else []
    # in softirq (a forwarded packet) ChaCha20 encrypts with the scalar code too
    enc_rows = srows if softirq_enc and "chacha" in alg else rows
    enc = kc.at_size(kc.pick(enc_rows, alg, "encryption", bits), size)
    dec_rows = kc.pick(srows if "chacha" in alg else rows, alg, "decryption", bits)
    dec = kc.at_size(dec_rows, size)
    return {"enc": enc * size, "dec": dec * size, "log": neon[-1].name}


#: what ESP's AEAD processes per datagram: the inner IPv4 packet (20 + 8 + payload) in tunnel
#: mode plus the ESP trailer (pad length, next header, padding to 4 bytes)
ESP_AEAD_BYTES = 20 + 8 + PAYLOAD + 2 + (-(20 + 8 + PAYLOAD + 2) % 4)
WG_AEAD_BYTES = 20 + 8 + PAYLOAD + (-(20 + 8 + PAYLOAD) % 16)  # padded to 16 (MESSAGE_PADDING)


def aead_of(name: str) -> tuple[float, float]:
    """(encryption, decryption) instructions of a run's AEAD for one datagram."""
    alg = next((a for n, _, a in ESP if n == name), None)
    if alg:
        x = aead_ipp(alg[0], alg[1], ESP_AEAD_BYTES)
        return x["enc"], x["dec"]
    if name == "wireguard":
        # kernel WireGuard's lib/crypto chacha20poly1305 in its workers (process context: NEON
        # both ways): tcrypt's chacha20-neon + poly1305-neon, as kernel_crypto.py counts them
        c = json.loads((kc.CACHE / "armhf" / "results.json").read_text())["components"]
        ipb = c["chacha20"]["ipb"] + c["poly1305"]["ipb"]
        return ipb * WG_AEAD_BYTES, ipb * WG_AEAD_BYTES
    return 0.0, 0.0


def report(res: dict[str, dict], loops: dict[str, dict[int, int]]) -> dict:
    clock = gc.CLOCK
    out: dict = {"kernel": gc.KERNEL, "payload": PAYLOAD}
    ipcs, ipc = gc.ipc_anchors(loops)
    if "plain" not in res:
        raise SystemExit("no plain run in the guest log")
    out["ipc"] = {"anchors": ipcs, "mean": ipc}
    plain = res["plain"]
    full0 = plain["busy_ns"] / plain["packets"]
    out0 = plain["out_busy_ns"] / plain["out_packets"] if "out_busy_ns" in plain else None
    print(f"\nper {PAYLOAD}-byte UDP datagram, instructions: the whole trip a -> b, what the tunnel"
          " adds, its AEAD, and the path around it on the sending side (b's end down: a's qdisc"
          " drops) and the receiving side (the rest); cycles and packets/s of the slower side on"
          f" one {gc.ARCH.clock_mhz} MHz board core at IPC {ipc:.3f} (range over the anchors):")  # fmt: skip
    print(f"  {'run':21s} {'trip':>7s} {'tunnel':>7s} {'enc':>6s} {'dec':>6s} {'send':>6s} "
          f"{'recv':>6s} {'cycles':>7s} {'pps':>6s} {'(range)':>15s}  received")  # fmt: skip
    out["plain"] = {"instructions_per_packet": round(full0),
                    "send_side_instructions": round(out0) if out0 else None}  # fmt: skip
    out["runs"] = {}
    for name, v in res.items():
        if name == "plain" or name.startswith("fwd-"):
            continue
        total = v["busy_ns"] / v["packets"]
        delta = total - full0
        enc, dec = aead_of(name)
        row = {"instructions_per_packet": round(total), "tunnel_instructions": round(delta),
               "aead_enc": round(enc), "aead_dec": round(dec),
               "received": v.get("received"), "packets": v.get("packets")}  # fmt: skip
        if out0 and "out_busy_ns" in v:
            sent = v["out_busy_ns"] / v["out_packets"] - out0
            send, recv = sent - enc, delta - sent - dec
        else:  # no split: half each
            send = recv = (delta - enc - dec) / 2
        sides = ((send, 0.0), (recv, 0.0))  # kernel code only: its AEAD is the board figure's
        cyc = max(gc.board_cycles(sides, ipc))
        rng = gc.pps_range(sides, ipcs)
        row.update(path_send=round(send), path_recv=round(recv), path_cycles_slower_side=round(cyc),
                   path_pps=round(clock / cyc), path_pps_range=rng)  # fmt: skip
        out["runs"][name] = row
        print(f"  {name:21s} {total:7.0f} {delta:7.0f} {enc:6.0f} {dec:6.0f} {send:6.0f} {recv:6.0f}"
              f" {cyc:7.0f} {clock / cyc:6.0f} {str(rng):>15s}"
              f"  {v.get('received', 0):.0f}/{v.get('packets', 0):.0f}")  # fmt: skip
    fwd0 = res.get("fwd-plain")
    if fwd0:
        print("\nforwarded c -> a -> b (a encrypts in the NET_RX softirq of the packet's arrival, as a"
              " gateway does and as TCP's ACK-clocked sends do): the path of both sides against the"
              " locally sent datagram's")  # fmt: skip
        print(f"  {'run':25s} {'tunnel':>7s} {'enc':>6s} {'dec':>6s} {'path':>6s} {'local':>6s}"
              f" {'extra':>6s}  received")  # fmt: skip
        out["forwarded"] = {}
        base = fwd0["busy_ns"] / fwd0["packets"]
        for name, v in res.items():
            if not name.startswith("fwd-esp"):
                continue
            if v.get("received") != v.get("packets"):
                print(f"  {name:25s} lost {v['packets'] - v['received']:.0f} of {v['packets']:.0f}"
                      " datagrams (a burst of async encryptions: see @@DROPS in the log): not counted")  # fmt: skip
                continue
            local = name.removeprefix("fwd-")
            alg = next(a for n, _, a in ESP if n == local)
            x = aead_ipp(alg[0], alg[1], ESP_AEAD_BYTES, softirq_enc=True)
            delta = v["busy_ns"] / v["packets"] - base
            path = delta - x["enc"] - x["dec"]
            lr = out["runs"].get(local, {})
            lpath = (lr.get("path_send") or 0) + (lr.get("path_recv") or 0)
            out["forwarded"][local] = {"tunnel_instructions": round(delta), "aead_enc": round(x["enc"]),
                                       "aead_dec": round(x["dec"]), "path": round(path),
                                       "path_local_send": lpath}  # fmt: skip
            print(f"  {name:25s} {delta:7.0f} {x['enc']:6.0f} {x['dec']:6.0f} {path:6.0f} {lpath:6.0f}"
                  f" {path - lpath:6.0f}  {v.get('received', 0):.0f}/{v.get('packets', 0):.0f}")  # fmt: skip
    return out


def main() -> None:
    a = gc.arguments(__doc__)
    text = gc.guest_log(a, "dataplane", lambda: gc.fetch_userland("net", NET_USERLAND),
                        lambda mods: guest_script(mods, a.packets), NET_MODULES)  # fmt: skip
    out = report(*gc.parse(text))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    gc.run(main)
