"""`lab calibrate`'s process rows: how many bytes each data plane's process (a kernel data
plane's userspace stand-in, or a userspace data plane) carries per CPU second of this host, as a
whole process.

A stand-in (charon's kernel-libipsec for XFRM ESP, wireguard-go for kernel WireGuard) does far
more per packet than the kernel it stands for: a read from TUN, a UDP send, copies and hand-offs
between its threads. Measured here, charon's ChaCha20-Poly1305 ESP spends about 5 % of its CPU
time in the cipher (60 MB/s per host CPU second as a process against OpenSSL's 1240 MB/s for the
primitive alone). A group share worked out from the primitive alone would therefore hold the
stand-in some twenty times below the board kernel's figure. The share of a kernel data plane's
stand-in is instead the board kernel's figure over the stand-in's own rate, measured as a
process (lab.model.boardkernel.plan): the stand-in as a whole then carries what one board core
running the kernel's code carries, its own extra work included in the price. Assumption,
stated: the board kernel's packet path around the crypto (XFRM lookup, ESP framing, the crypto
API's request set-up) costs the board core nothing beyond the crypto figure; docs/cpu.md "Data
planes" says what that means.

How: a throwaway lab `cal<pid>` of topologies/pi_pair.py without CPU caps, the profile's
masks in every process (the same code paths as a capped node), the stand-in's profile with its
userspace data plane forced; iperf3 UDP at RATE_MBIT with SIZE-byte datagrams through the
tunnel for SECONDS; each end's daemon's CPU time (/proc/PID/stat, every thread) against the bytes
that daemon handled: the client's, the packets it read from its TUN device (the TUN's tx
packets, the kernel's counter), the server's, those it wrote into its TUN (rx packets). Not the
bytes the receiver got: where a run loses packets after the client's daemon worked on them (at
the server's sockets, on a host busy with both ends and both iperf3s: 5-16 % at
200 Mbit/s here), pricing the client by delivered bytes counts that work as the cost of the
others and makes the share too large (the capped stand-in then carried 1.10-1.21 of its figure
under overload, bench/standin_capped.py, docs/fidelity.md). Where a node has no TUN device the
delivered bytes count (`basis`). The slower end (encrypting client or decrypting server) counts.
The lab is torn down in `finally`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from lab import REPO
from lab.core.teardown import teardown
from lab.measure.iperf3json import parse_iperf3_udp
from lab.model.cpuprofile import MASK_VARS, CpuProfile
from lab.model.topology import load_topology
from lab.substrate.local.build import up
from lab.substrate.local.queues import tun_links

#: (daemon, its primitive) -> the VPN profile that runs it (userspace data plane forced): every
#: process a data plane's groups may hold (lab/substrate/local/dataplane.py)
PROCESSES: dict[tuple[str, str], str] = {
    ("charon", "aes-128-gcm"): "ipsec-aes128gcm:dataplane=libipsec",
    ("charon", "aes-256-gcm"): "ipsec-aes256gcm:dataplane=libipsec",
    ("charon", "chacha20-poly1305"): "ipsec-chacha20poly1305:dataplane=libipsec",
    ("wireguard-go", "go-chacha20-poly1305"): "wireguard:implementation=wireguard-go",
    ("openvpn", "aes-256-cbc"): "openvpn-aes256cbc-static",
}
RATE_MBIT = 200  # well below what an uncapped stand-in carries here: no loss, a steady rate
SIZE = 1300  # study A's datagram (1400 would be fragmented through the tunnels)
SECONDS = 3
CLK_TCK = os.sysconf("SC_CLK_TCK")


def tun_packets(node) -> dict[str, int] | None:
    """{"tx": packets, "rx": packets} over the TUN devices in `node`'s network namespace (the
    kernel's counters: tx is what the kernel handed the daemon's reader, rx what the daemon
    wrote), None where it has none."""
    links = tun_links(node, stats=True)
    if not links:
        return None
    return {
        way: sum(int(link["stats64"][way]["packets"]) for link in links) for way in ("tx", "rx")
    }


def process_cpu_s(pid: int) -> float:
    """CPU seconds of a process, all its threads (utime + stime of /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


@contextmanager
def _masked(env: dict[str, str]):
    """The profile's masks in this process's environment (uncapped nodes inherit it), the
    other mask variables removed; restored afterwards."""
    saved = {v: os.environ.get(v) for v in MASK_VARS}
    try:
        for v in MASK_VARS:
            os.environ.pop(v, None)
        os.environ.update({k: v for k, v in env.items() if k in MASK_VARS})
        yield
    finally:
        for v, old in saved.items():
            if old is None:
                os.environ.pop(v, None)
            else:
                os.environ[v] = old


def measure(vpn: str, daemon: str, env: dict[str, str], *, seconds: int = SECONDS) -> dict:
    """One stand-in's bytes per CPU second, each end, through a throwaway uncapped lab."""
    lab_id = f"cal{os.getpid() % 10**8}"
    spec = load_topology(REPO / "topologies" / "pi_pair.py")
    with _masked(env):
        lab = up(spec, lab_id, vpn=vpn)
        try:
            target = lab.info["vpn"]["tunnel"]["server"]["v4"].split("/")[0]
            pids = {
                e["node"]: e["pid"]
                for e in lab.ledger.entries()
                if e["kind"] == "process" and e.get("name") == daemon
            }
            server, client = lab.node("server"), lab.node("client")
            srv = server.spawn("calib-iperf3", ["iperf3", "-s", "-1", "-p", "5299"])
            client.run(["sleep", "0.3"])
            cpu0 = {n: process_cpu_s(p) for n, p in pids.items()}
            tun0 = {"client": tun_packets(client), "server": tun_packets(server)}
            r = client.run(
                [
                    "iperf3",
                    "-c",
                    target,
                    "-p",
                    "5299",
                    "-u",
                    "-b",
                    f"{RATE_MBIT}M",
                    "-l",
                    str(SIZE),
                    "-t",
                    str(seconds),
                    "-J",
                ],
                timeout=seconds + 30,
            )
            cpu = {n: process_cpu_s(p) - cpu0[n] for n, p in pids.items()}
            tun1 = {"client": tun_packets(client), "server": tun_packets(server)}
            server.stop(srv)
        finally:
            teardown(lab_id)
    m = parse_iperf3_udp(r.stdout)
    carried = m["packets_received"] * SIZE / 1e6  # MB of payload the tunnel delivered
    handled = {}  # MB of payload each end's daemon handled: read from / written to its TUN
    for node, way in (("client", "tx"), ("server", "rx")):
        if tun0[node] and tun1[node]:
            handled[node] = (tun1[node][way] - tun0[node][way]) * SIZE / 1e6
    per_end = {n: round(handled.get(n, carried) / c, 1) for n, c in cpu.items() if c > 0}
    return {
        "vpn": vpn,
        "daemon": daemon,
        "rate_mbit": RATE_MBIT,
        "size": SIZE,
        "seconds": seconds,
        "loss_pct": m["loss_pct"],
        "delivered_mb": round(carried, 2),
        "handled_mb": {n: round(v, 2) for n, v in handled.items()},
        "basis": {n: "handled" if n in handled else "delivered" for n in cpu},
        "cpu_s": {n: round(c, 3) for n, c in cpu.items()},
        "mbps_per_cpu_s": per_end,
        # the slower end bounds the tunnel
        "host_mbps": min(per_end.values()) if per_end else None,
    }


def calibrate(prof: CpuProfile, env: dict[str, str], say: Callable[[str], None]) -> dict:
    """{"DAEMON:PRIMITIVE": measure(...)} for every data plane process (PROCESSES)."""
    out = {}
    for (daemon, prim), vpn in PROCESSES.items():
        try:
            rec = measure(vpn, daemon, env)
        except Exception as e:  # a data plane that cannot run here: said, the share falls back
            out[f"{daemon}:{prim}"] = {"vpn": vpn, "skipped": f"{type(e).__name__}: {e}"[:300]}
            say(f"process {vpn}: skipped ({e})")
            continue
        out[f"{daemon}:{prim}"] = rec
        say(f"process {vpn}: {rec['host_mbps']} MB/s per CPU second ({json.dumps(rec['cpu_s'])})")
    return out
