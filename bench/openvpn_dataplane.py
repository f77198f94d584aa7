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

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import kernel_crypto as kc  # noqa: E402
import kernel_dataplane as kd  # noqa: E402

ARCH = kd.ARCH
USERLAND = ("busybox-static/bookworm", "socat/bookworm", "iproute2/bookworm",
            "openvpn/bookworm", "openssl/bookworm")  # fmt: skip
MODULES = ("veth", "tun")
PAYLOADS = (1300, 1400)
#: the Cortex-A72's IPC for scalar integer crypto code (aes-armv4, sha1-armv4 are of this
#: class): bench/kernel_crypto.py's fit on published Pi 4 figures (cpu_profiles/pi4.toml)
SCALAR_IPC = 2.26
LOG_GLOB = "*-openvpn.log"


def cbc_bytes(payload: int) -> tuple[int, int]:
    """(bytes AES-256-CBC processes, bytes HMAC-SHA1 covers) for one UDP datagram of `payload`
    bytes in OpenVPN's static-key mode: the inner IPv4 packet plus the 8-byte packet id and
    timestamp, padded (PKCS#7, at least one byte) to 16; the HMAC over IV + ciphertext."""
    plain = 20 + 8 + payload + 8
    padded = (plain // 16 + 1) * 16
    return padded, 16 + padded


def fetch_root() -> Path:
    """Debian 12's openvpn, openssl, socat and iproute2 for armhf, unpacked (cached)."""
    base = kc.CACHE / ARCH.name
    root = base / "ovpnroot"
    if (root / ".done").exists():
        return root
    kc.fetch(ARCH)
    apt = kc.apt_argv(ARCH, base / "apt")
    dl = base / "ovpndebs"
    (dl / "partial").mkdir(parents=True, exist_ok=True)
    os.chmod(dl, 0o755)  # apt-get downloads as _apt
    kc.log(f"[{ARCH.name}] apt-get install --download-only {' '.join(USERLAND)}")
    kc.run([*apt, "-o", f"Dir::Cache::archives={dl}", "install", "-y", "--download-only",
            "--no-install-recommends", *USERLAND])  # fmt: skip
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    versions = {}
    for deb in sorted(dl.glob("*.deb")):
        pkg = kc.run(["dpkg-deb", "--show", "--showformat=${Package}\t${Version}", str(deb)])
        name, ver = pkg.stdout.split("\t")
        versions[name] = ver
        kc.run(["dpkg-deb", "-x", str(deb), str(root)])
    (root / "versions.json").write_text(json.dumps(versions, indent=1))
    (root / ".done").write_text("")
    return root


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
    sh = [kd.GUEST_HEAD]
    sh += [f"$B insmod /m/{m}.ko || echo @@INSMOD_FAILED {m}" for m in MODULES]
    sh += [
        "/bin/ip netns add a; /bin/ip netns add b",
        "/bin/ip link add va netns a address 02:00:00:00:00:0a type veth peer name vb netns b"
        " address 02:00:00:00:00:0b",
        "/bin/ip -n a addr add 10.0.0.1/24 dev va; /bin/ip -n b addr add 10.0.0.2/24 dev vb",
        "for ns in a b; do /bin/ip -n $ns link set lo up; done; /bin/ip -n a link set va up;"
        " /bin/ip -n b link set vb up",
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
    for kind in ("syscall", "pipe"):
        for loops in kd.LOOPS:
            sh.append(
                f"t0=$(busy); /bin/armloops {kind[0]} {loops}; t1=$(busy); "
                f'echo "@@LOOP {kind} loops={loops} busy_ns=$((t1-t0))"'
            )
    sh += ["echo @@DONE", "$B poweroff -f"]
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
    clock = ARCH.clock_mhz * 1e6
    ipcs = {}
    print("IPC anchors (UnixBench 5.1.3 on a Pi 4, armv7l, 1.5 GHz; loops counted here):")
    for kind, pts in loops.items():
        (n0, t0), (n1, t1) = sorted(pts.items())
        ipl = (t1 - t0) / (n1 - n0)
        ipcs[kind] = ipl / (clock / kd.UNIXBENCH[kind])
        print(f"  {kind:8s} {ipl:8.0f} instructions/loop  IPC {ipcs[kind]:.3f}")
    if not ipcs:
        raise SystemExit("no UnixBench loops in the guest log")
    ipc = sum(ipcs.values()) / len(ipcs)
    print(f"  kernel-path IPC: {ipc:.3f} (mean); scalar crypto IPC {SCALAR_IPC}")
    sha = ossl.get(("sha1-16k", 16384))
    if sha:
        # crypto/sha/asm/sha1-armv4-large.pl (OpenSSL): its NEON code, 5.6 cycles/byte on a
        # Cortex-A15 (no published A72 figure); the counted code at that rate runs at this IPC
        print(f"  SHA-1 (NEON, 16 KiB): {sha / 16384:.2f} instructions/byte; at the A15's published"
              f" 5.6 cycles/byte that is IPC {sha / 16384 / 5.6:.2f} (HMAC taken at {SCALAR_IPC})")  # fmt: skip
    out: dict = {"kernel": "5.10.0-32-armmp (Debian 11 5.10.223), armv7l",
                 "ipc": {"anchors": ipcs, "mean": ipc, "scalar": SCALAR_IPC}, "runs": {}}  # fmt: skip
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
        cyc_s = path_s / ipc + mac / SCALAR_IPC
        cyc_r = path_r / ipc + mac / SCALAR_IPC
        cyc = max(cyc_s, cyc_r)
        rng = tuple(
            round(clock / max(path_s / x + mac / SCALAR_IPC, path_r / x + mac / SCALAR_IPC))
            for x in sorted(ipcs.values())
        )
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
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packets", type=int, default=4000)
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--from-log", action="store_true")
    a = ap.parse_args()
    runs = kc.CACHE / ARCH.name / "runs"
    if a.from_log:
        text = sorted(runs.glob(LOG_GLOB))[-1].read_text(errors="replace")
    else:
        if os.geteuid() != 0:
            raise SystemExit("run as root (apt's private download into /var/cache/lab)")
        kroot, _uroot, release = kc.fetch(ARCH)
        root = fetch_root()
        runs.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        key = static_key()
        files = {
            "etc/ovpn-a.conf": config("10.1.0.1", "10.0.0.2", 1, key).encode(),
            "etc/ovpn-b.conf": config("10.1.0.2", "10.0.0.1", 0, key).encode(),
        }
        with tempfile.TemporaryDirectory(prefix="lab-ovpn-") as td:
            loops = kd.build_loops(Path(td) / "armloops")
            initrd = Path(td) / "initrd"
            kd.build_initramfs(kroot, release, root, loops, guest_script(a.packets), initrd,
                               modules=MODULES, files=files)  # fmt: skip
            text = kc.boot(ARCH, kroot, release, initrd, runs / f"{stamp}-openvpn.log",
                           ARCH.cpu, a.timeout)  # fmt: skip
    for bad in ("@@INSMOD_FAILED",):
        for line in text.splitlines():
            if bad in line:
                kc.log(line.strip())
    res, loops = kd.parse(text)
    out = report(res, loops, parse_openssl(text), parse_ticks(text))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    try:
        main()
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"{e.cmd[0]} failed ({e.returncode}): {e.stderr.strip()[-800:]}")
