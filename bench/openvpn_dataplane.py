#!/usr/bin/env python3
"""OpenVPN's per-packet data plane path on the board, counted.

    sudo .venv/bin/python bench/openvpn_dataplane.py [--packets 4000] [--json FILE] [--from-log]

bench/kernel_dataplane.py counts the board kernel's ESP and WireGuard path; this counts the same
for OpenVPN, a userspace data plane the board runs too (one thread): what one datagram costs
through OpenVPN besides its cipher. Same guest (Debian 11's 5.10 armmp kernel, `qemu-system-arm
-cpu cortex-a15 -icount shift=0`: one guest nanosecond is one executed instruction) with Debian
12's armhf openvpn 2.6 (the lab's major version; study A's boards ran 2.5) and openssl 3.0:

1. two network namespaces `a` and `b` on a veth pair; an openvpn in each, p2p over UDP with a
   static key, AES-256-CBC and HMAC-SHA1, tun-mtu 1500, keepalive 10 120, no DCO: the lab's
   rendered config for vpn_profiles/openvpn-aes256cbc-static.toml (lab/vpn/drivers/openvpn.py),
   without ifconfig-ipv6 and with sndbuf/rcvbuf/txqueuelen raised so that nothing of a burst is
   dropped (buffer sizes, not per-packet work);
2. `dd | socat` in `a` sends N UDP datagrams of 1300 and of 1400 bytes to a stopped socat in
   `b` (as kernel_dataplane.py: its socket only queues them), once to b's veth address (plain)
   and once to b's tunnel address (through both openvpns); the CPU's non-idle time per datagram
   (/proc/schedstat) is the trip; the difference is what OpenVPN adds;
3. again through the tunnel with b's openvpn stopped (its socket only queues the outer
   datagrams): what the sending openvpn adds (read(TUN), encrypt, HMAC, sendto, the TUN device's
   transmit); the rest of the difference is the receiving openvpn's (recvfrom, HMAC check,
   decrypt, write(TUN), the inner packet's delivery);
4. `openssl speed -elapsed` of AES-256-CBC (encrypt and decrypt) and HMAC-SHA1 at the sizes
   OpenVPN's static-key mode processes for one datagram: their instructions per call are taken
   out of each side, which leaves the path; the UnixBench loops (bench/armloops.S) again for the
   kernel-code IPC.

Prints instructions per datagram (trip, OpenVPN's part, cipher, HMAC, path per side), and the
slower side's board cycles and packets/s of one 1.5 GHz core: the figures of cpu_profiles/
pi4.toml's [userspace.dataplane.openvpn.path]. A few minutes here; `--from-log` re-reports from
the saved guest log. docs/cpu.md "OpenVPN's packet path" has the results.
"""

from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import guestcount as gc  # noqa: E402
import kernel_crypto as kc  # noqa: E402

USERLAND = ("busybox-static/bookworm", "socat/bookworm", "iproute2/bookworm",
            "openvpn/bookworm", "openssl/bookworm")  # fmt: skip
MODULES = ("veth", "tun")
PAYLOADS = (1300, 1400)


def cbc_bytes(payload: int) -> tuple[int, int]:
    """(bytes AES-256-CBC processes, bytes HMAC-SHA1 covers) for one UDP datagram of `payload`
    bytes in OpenVPN's static-key mode: the inner IPv4 packet plus the 8-byte packet id and
    timestamp, padded (PKCS#7, at least one byte) to 16; the HMAC over IV + ciphertext."""
    plain = 20 + 8 + payload + 8
    padded = (plain // 16 + 1) * 16
    return padded, 16 + padded


def static_key() -> str:
    """An OpenVPN static key V1 (2048 bits), as `openvpn --genkey secret` writes it."""
    hexed = secrets.token_bytes(256).hex()
    lines = [hexed[i : i + 32] for i in range(0, len(hexed), 32)]
    return "\n".join(
        ["-----BEGIN OpenVPN Static key V1-----", *lines, "-----END OpenVPN Static key V1-----"]
    )


def config(local: str, remote: str, key_direction: int, key: str) -> str:
    """The lab's openvpn.conf for the profile (templates openvpn/openvpn.conf.j2, static mode)."""
    return f"""dev tun0
dev-type tun
proto udp4
port 1194
remote {remote} 1194
topology subnet
ifconfig {local} 255.255.255.0
tun-mtu 1500
keepalive 10 120
cipher AES-256-CBC
auth SHA1
disable-dco
verb 3
key-direction {key_direction}
# not in the lab's config: room for a burst (buffer sizes, not per-packet work)
sndbuf 67108864
rcvbuf 67108864
txqueuelen 10000
<secret>
{key}
</secret>
"""


def guest_script(n: int) -> str:
    sh = [gc.GUEST_HEAD]
    sh += [f"$B insmod /m/{m}.ko || echo @@INSMOD_FAILED {m}" for m in MODULES]
    sh += [
        *gc.VETH_PAIR,
        "echo 134217728 > /proc/sys/net/core/rmem_max; echo 134217728 > /proc/sys/net/core/wmem_max",
        "echo \"@@VERSION $(/usr/sbin/openvpn --version | $B head -2 | $B tr '\\n' ' ')\"",
        "$B mkdir -p /dev/net; [ -e /dev/net/tun ] || $B mknod /dev/net/tun c 10 200",
    ]
    # the counted cipher and HMAC calls, at each datagram's sizes (-elapsed: virtual time, so
    # bytes/s are bytes per instruction x 1e9)
    for p in PAYLOADS:
        c, h = cbc_bytes(p)
        for what, args in (("aes-256-cbc-enc", f"-bytes {c} -evp aes-256-cbc"),
                           ("aes-256-cbc-dec", f"-bytes {c} -decrypt -evp aes-256-cbc"),
                           ("hmac-sha1", f"-bytes {h} -hmac sha1")):  # fmt: skip
            sh.append(
                f'echo "@@OPENSSL {what} {p} $(/usr/bin/openssl speed -elapsed -seconds 1 '
                f"{args} 2>&1 | $B grep Doing | $B tr '\\n' ' ')\""
            )
    # SHA-1 alone at 16 KiB (instructions per byte: the cross-check of the HMAC's IPC against
    # the cryptogams NEON code's published cycles per byte)
    sh.append(
        'echo "@@OPENSSL sha1-16k 16384 $(/usr/bin/openssl speed -elapsed -seconds 1 -bytes 16384'
        " -evp sha1 2>&1 | $B grep Doing | $B tr '\\n' ' ')\""
    )
    # one measurement: $1 name, $2 destination, $3 IP deliveries in b per datagram, $4 payload
    sh.append(rf"""
task() {{ local x; read -r x rest < /proc/$1/schedstat; echo "$x"; }}
# utime and stime (ticks, sampled at HZ: the user/kernel split of a task's run time)
ticks() {{ local l; read -r l < /proc/$1/stat; set -- $l; echo "${{14}},${{15}}"; }}
measure() {{
  /bin/ip netns exec b socat -u -b2000 UDP-RECV:5001,rcvbuf=67108864 /dev/null & R=$!
  $B sleep 1; $B kill -STOP $R
  /bin/ip netns exec a sh -c "$B dd if=/dev/zero bs=$4 count=50 2>/dev/null | socat -u -b$4 STDIN UDP-SENDTO:$2:5001"
  $B sleep 2
  r0=$(snmp $R Ip InDelivers); e0=$(snmp $R Udp RcvbufErrors); a0=$(task $PA); b0=$(task $PB); ta0=$(ticks $PA); tb0=$(ticks $PB); t0=$(busy)
  /bin/ip netns exec a sh -c "$B dd if=/dev/zero bs=$4 count={n} 2>/dev/null | socat -u -b$4 STDIN UDP-SENDTO:$2:5001"
  k=0; while [ $(( $(snmp $R Ip InDelivers) - r0 )) -lt $(({n} * $3)) ] && [ $k -lt 500 ]; do $B usleep 20000; k=$((k+1)); done
  t1=$(busy); a1=$(task $PA); b1=$(task $PB); ta1=$(ticks $PA); tb1=$(ticks $PB); r1=$(snmp $R Ip InDelivers); e1=$(snmp $R Udp RcvbufErrors)
  echo "@@RESULT $1 packets={n} payload=$4 received=$(((r1-r0) / $3)) rcvbuf_errors=$((e1-e0)) busy_ns=$((t1-t0)) ovpn_a_ns=$((a1-a0)) ovpn_b_ns=$((b1-b0)) polls=$k"
  echo "@@TICKS $1 a=$ta0:$ta1 b=$tb0:$tb1"
  $B kill -9 $R; wait $R 2>/dev/null
}}
""")  # fmt: skip
    sh += [
        "/bin/ip netns exec a /usr/sbin/openvpn --config /etc/ovpn-a.conf > /run/a.log 2>&1 & PA=$!",
        "/bin/ip netns exec b /usr/sbin/openvpn --config /etc/ovpn-b.conf > /run/b.log 2>&1 & PB=$!",
        "k=0; until $B grep -q 'Initialization Sequence Completed' /run/a.log && $B grep -q"
        " 'Initialization Sequence Completed' /run/b.log || [ $k -gt 100 ]; do $B usleep 100000;"
        " k=$((k+1)); done",
        "echo @@OVPN_A; $B cat /run/a.log; echo @@OVPN_B; $B cat /run/b.log",
        "/bin/ip -n a addr show tun0",
    ]
    for p in PAYLOADS:
        sh.append(f"measure plain-{p} 10.0.0.2 1 {p}")
    for p in PAYLOADS:
        sh.append(f"measure openvpn-{p} 10.1.0.2 2 {p}")
    # the sending side: b's openvpn stopped, its socket queues the outer datagrams
    for p in PAYLOADS:
        sh += [
            "$B kill -STOP $PB",
            f"measure openvpn-send-{p} 10.1.0.2 1 {p}",
            "$B kill -CONT $PB; $B sleep 3",
        ]
    sh += [
        "echo \"@@TUN $(/bin/ip -n a -s link show tun0 | $B tr '\\n' ' ')\"",
        "echo \"@@SNMP_B $($B grep -A1 '^Udp:' /proc/$PB/net/snmp | $B tr '\\n' ' ')\"",
        "echo @@OVPN_A_END; $B tail -5 /run/a.log; echo @@OVPN_B_END; $B tail -5 /run/b.log",
    ]
    sh += [*gc.loop_lines(), "echo @@DONE", "$B poweroff -f"]
    return "\n".join(sh) + "\n"


def parse_openssl(text: str) -> dict[tuple[str, int], float]:
    """{(what, payload): instructions per call} from the @@OPENSSL lines."""
    out = {}
    for line in text.splitlines():
        if "@@OPENSSL " not in line:
            continue
        what, p, *rest = line.split("@@OPENSSL ", 1)[1].split()
        m = kc.OPENSSL_LINE.search(" ".join(rest))
        if m:
            _name, _s, _size, calls, secs = m.groups()
            out[(what, int(p))] = float(secs) * 1e9 / int(calls)
    return out


#: IPC taken, for the sensitivity only, for OpenVPN's own userspace code (not a fitted figure)
USER_IPC_ALT = 1.0


def parse_ticks(text: str) -> dict[str, dict[str, tuple[int, int]]]:
    """{run: {"a"|"b": (user ticks, system ticks)}} over a run, from the @@TICKS lines."""
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for line in text.splitlines():
        if "@@TICKS " not in line:
            continue
        name, *kv = line.split("@@TICKS ", 1)[1].split()
        for x in kv:
            who, span = x.split("=", 1)
            (u0, s0), (u1, s1) = (tuple(map(int, y.split(","))) for y in span.split(":"))
            out.setdefault(name, {})[who] = (u1 - u0, s1 - s0)
    return out


def report(res: dict[str, dict], loops: dict[str, dict[int, int]], ossl: dict,
           ticks: dict | None = None) -> dict:  # fmt: skip
    clock = gc.CLOCK
    ipcs, ipc = gc.ipc_anchors(loops)
    print(f"  scalar crypto IPC {gc.SCALAR_IPC} (the HMAC)")
    sha = ossl.get(("sha1-16k", 16384))
    if sha:
        # crypto/sha/asm/sha1-armv4-large.pl (OpenSSL): its NEON code, 5.6 cycles/byte on a
        # Cortex-A15 (no published A72 figure); the counted code at that rate runs at this IPC
        print(f"  SHA-1 (NEON, 16 KiB): {sha / 16384:.2f} instructions/byte; at the A15's published"
              f" 5.6 cycles/byte that is IPC {sha / 16384 / 5.6:.2f} (HMAC taken at {gc.SCALAR_IPC})")  # fmt: skip
    out: dict = {"kernel": gc.KERNEL,
                 "ipc": {"anchors": ipcs, "mean": ipc, "scalar": gc.SCALAR_IPC}, "runs": {}}  # fmt: skip
    print("\nper UDP datagram, instructions: the plain trip, OpenVPN's part (through the tunnel -"
          " plain), split into the sending openvpn (b's stopped) and the receiving one; the"
          " cipher and HMAC calls (openssl speed here) out of each side leave the path")  # fmt: skip
    hdr = ("payload", "plain", "ovpn", "send", "enc", "hmac", "path_s", "recv", "dec", "hmac",
           "path_r", "cycles", "pps", "received")  # fmt: skip
    print("  " + " ".join(f"{h:>8s}" for h in hdr))
    for p in PAYLOADS:
        plain, full, snd = (res.get(f"{k}-{p}") for k in ("plain", "openvpn", "openvpn-send"))
        if not (plain and full and snd):
            print(f"  {p}: missing runs")
            continue
        base = plain["busy_ns"] / plain["packets"]
        delta = full["busy_ns"] / full["packets"] - base
        send = snd["busy_ns"] / snd["packets"] - base
        recv = delta - send
        enc, dec = ossl[("aes-256-cbc-enc", p)], ossl[("aes-256-cbc-dec", p)]
        mac = ossl[("hmac-sha1", p)]
        path_s, path_r = send - enc - mac, recv - dec - mac
        # the board's time of a side's path: kernel and OpenVPN's own code at the kernel-path IPC,
        # its HMAC at the scalar crypto IPC (the cipher is the board figure's part)
        sides = ((path_s, mac), (path_r, mac))
        cyc_s, cyc_r = gc.board_cycles(sides, ipc)
        cyc = max(cyc_s, cyc_r)
        rng = gc.pps_range(sides, ipcs)
        ok = f"{full.get('received', 0):.0f}/{snd.get('received', 0):.0f}/{full['packets']:.0f}"
        vals = (p, base, delta, send, enc, mac, path_s, recv, dec, mac, path_r, cyc, clock / cyc)
        print("  " + " ".join(f"{v:8.0f}" for v in vals) + f" {ok:>8s}")
        out["runs"][p] = {
            "plain": round(base), "openvpn": round(delta), "send": round(send), "recv": round(recv),
            "aes_enc": round(enc), "aes_dec": round(dec), "hmac": round(mac),
            "path_send": round(path_s), "path_recv": round(path_r),
            "cycles_send": round(cyc_s), "cycles_recv": round(cyc_r),
            "pps": round(clock / cyc), "pps_range": rng,
            "task_ns_per_packet": {
                k: round(full[k] / full["packets"]) for k in ("ovpn_a_ns", "ovpn_b_ns") if k in full
            },
            "received": [full.get("received"), snd.get("received"), full["packets"]],
            "rcvbuf_errors": [full.get("rcvbuf_errors"), snd.get("rcvbuf_errors")],
        }  # fmt: skip
        print(f"    IPC range {rng} packets/s; per-task (openvpn a, b) ns/packet:"
              f" {out['runs'][p]['task_ns_per_packet']}")  # fmt: skip
        tk = (ticks or {}).get(f"openvpn-{p}", {})
        if "a" in tk and "b" in tk and full.get("ovpn_a_ns"):
            # the user/kernel split of each openvpn's run time (tick samples): its own userspace
            # code apart from the cipher and HMAC, and what the board time would be were that
            # code to run at USER_IPC_ALT instead of the kernel-path IPC
            user = {}
            for who, crypto in (("a", enc + mac), ("b", dec + mac)):
                u, k = tk[who]
                task_i = full[f"ovpn_{who}_ns"] / full["packets"]
                user[who] = max(0.0, task_i * u / max(1, u + k) - crypto)
            alt_s = cyc_s - user["a"] / ipc + user["a"] / USER_IPC_ALT
            alt_r = cyc_r - user["b"] / ipc + user["b"] / USER_IPC_ALT
            alt = clock / max(alt_s, alt_r)
            out["runs"][p].update(user_noncrypto={k: round(v) for k, v in user.items()},
                                  ticks=tk, pps_user_ipc_alt=round(alt))  # fmt: skip
            print(f"    openvpn's own userspace code besides cipher and HMAC (tick split):"
                  f" sender {user['a']:.0f}, receiver {user['b']:.0f} instructions; at IPC"
                  f" {USER_IPC_ALT} instead of {ipc:.3f}: {alt:.0f} packets/s")  # fmt: skip
    return out


def main() -> None:
    a = gc.arguments(__doc__)
    key = static_key()
    files = {
        "etc/ovpn-a.conf": config("10.1.0.1", "10.0.0.2", 1, key).encode(),
        "etc/ovpn-b.conf": config("10.1.0.2", "10.0.0.1", 0, key).encode(),
    }
    text = gc.guest_log(a, "openvpn", lambda: gc.fetch_userland("ovpn", USERLAND),
                        lambda _mods: guest_script(a.packets), MODULES, files)  # fmt: skip
    res, loops = gc.parse(text)
    out = report(res, loops, parse_openssl(text), parse_ticks(text))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    gc.run(main)
