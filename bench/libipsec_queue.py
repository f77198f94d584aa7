#!/usr/bin/env python3
"""kernel-libipsec's queues bounded at the board kernel's against Debian's unbounded ones
(issue 30; lab.vpn.libipsec, tools/libipsec).

    sudo flock /work/notes/bench.lock .venv/bin/python bench/libipsec_queue.py
        [--profiles ipsec-aes128gcm,ipsec-chacha20poly1305] [--reps 2] [--duration 10]
        [--json FILE]

Per profile and repetition, one lab on topologies/pi_pair.py (two pi4 nodes) per variant, the
variants' order alternating from repetition to repetition so a drift of this machine's load
falls on both alike: `patched` (the lab's libipsec from tools/libipsec/build.sh, as the lab
starts it) and `unpatched` (LAB_CACHE pointed at an empty directory, so the lab finds no
patched library and charon loads Debian's). In each: iperf3 UDP 400 Mbit/s of 1300-byte
datagrams for --duration s, then TCP for --duration s, through the tunnel. Recorded per test:
the receiver's Mbit/s and (UDP) loss and seconds, the client's wall time (the drain of a
backlog shows there: iperf3 ends once its last message got through), the packets the patched
libipsec counted as dropped or held waiting (charon's log lines, lab.vpn.libipsec.drops and
waits, both nodes; the lab's charons wait, queue_full = wait), ipsec0's tx drops on the
client, and the client charon's resident memory after the test. Which library each lab's
charons ran is read from lab.json (vpn.queues.NODE.libipsec). Bench output from one run on
this machine, never a test's assertion.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from lab.vpn import libipsec  # noqa: E402

TOPO = str(REPO / "topologies" / "pi_pair.py")
VARIANTS = ("patched", "unpatched")


class Lab:
    def __init__(self, lab_id: str, state: str, cache: str | None):
        self.id, self.state = lab_id, state
        path = os.pathsep.join(x for x in (str(REPO), os.environ.get("PYTHONPATH")) if x)
        self.env = {**os.environ, "LAB_STATE_DIR": state, "PYTHONPATH": path}
        if cache is not None:
            self.env["LAB_CACHE"] = cache

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "lab.cli.main", *args]
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, check=check)

    def exec(self, node: str, *argv: str) -> subprocess.CompletedProcess:
        return self.cli("exec", "--id", self.id, node, "--", *argv, check=False)

    def info(self) -> dict:
        return json.loads(Path(self.state, self.id, "lab.json").read_text())

    def charon_logs(self) -> str:
        logs = Path(self.state, self.id, "logs")
        return "".join(p.read_text(errors="replace") for p in sorted(logs.glob("*-charon.log")))


def tx_drops(lab: Lab, node: str, dev: str = "ipsec0") -> int:
    cp = lab.exec(node, "ip", "-j", "-s", "link", "show", "dev", dev)
    try:
        return int(json.loads(cp.stdout)[0]["stats64"]["tx"]["dropped"])
    except (ValueError, KeyError, IndexError):
        return -1


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def iperf3(lab: Lab, target: str, duration: int, udp: bool) -> dict:
    lab.exec("server", "iperf3", "-s", "-D", "-1")
    time.sleep(0.5)
    logs0, tun0 = lab.charon_logs(), tx_drops(lab, "client")
    extra = ["-u", "-b", "400M", "-l", "1300"] if udp else []
    t0 = time.monotonic()
    cp = lab.exec("client", "iperf3", "-c", target, "-t", str(duration), "-J", *extra)
    wall = time.monotonic() - t0
    time.sleep(1.0)  # the dequeuing threads log their totals once the queues ran empty
    logs1, tun1 = lab.charon_logs(), tx_drops(lab, "client")
    out: dict = {"wall_s": round(wall, 2), "rc": cp.returncode}
    try:
        end = json.loads(cp.stdout)["end"]
        recv = end["sum_received"] if not udp or "sum_received" in end else end["sum"]
        out.update(mbit=recv["bits_per_second"] / 1e6, recv_s=recv.get("seconds"))
        if udp:
            out.update(loss_pct=recv.get("lost_percent"), packets=end["sum"].get("packets"))
        else:
            out["retransmits"] = end["sum_sent"].get("retransmits")
    except (ValueError, KeyError):
        out.update(mbit=float("nan"), error=(cp.stdout + cp.stderr)[-300:])
    for key, totals in (("libipsec_drops", libipsec.drops), ("libipsec_waits", libipsec.waits)):
        before, after = totals(logs0), totals(logs1)
        out[key] = {k: after[k] - before[k] for k in after}
    out["ipsec0_tx_drops"] = tun1 - tun0
    return out


def run_variant(prof: str, variant: str, a, state: str, empty: str) -> dict:
    lab = Lab(
        f"lq{os.getpid() % 1000}{variant[0]}", state, empty if variant == "unpatched" else None
    )
    lab.cli("up", TOPO, "--id", lab.id, "--vpn", prof)
    try:
        info = lab.info()
        vpn = info.get("vpn") or {}
        target = vpn["tunnel"]["server"]["v4"].split("/")[0]
        held = vpn.get("queues") or {}
        rec = {n: q.get("libipsec") for n, q in held.items()}
        pid = (held.get("client") or {}).get("pids", [None])[0]
        udp = iperf3(lab, target, a.duration, udp=True)
        udp["charon_rss_mb"] = rss_mb(pid) if pid else None
        tcp = iperf3(lab, target, a.duration, udp=False)
        return {"profile": prof, "variant": variant, "libipsec": rec, "udp": udp, "tcp": tcp}
    finally:
        lab.cli("down", "--id", lab.id, check=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profiles", default="ipsec-aes128gcm,ipsec-chacha20poly1305")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    lib, why = libipsec.library()
    if lib is None:
        print(f"no patched libipsec: {why}", file=sys.stderr)
        return 2
    results = []
    with (
        tempfile.TemporaryDirectory(prefix="lq-state-") as state,
        tempfile.TemporaryDirectory(prefix="lq-empty-") as empty,
    ):
        for prof in a.profiles.split(","):
            for rep in range(a.reps):
                for variant in VARIANTS if rep % 2 == 0 else VARIANTS[::-1]:
                    r = run_variant(prof, variant, a, state, empty)
                    r["rep"] = rep
                    results.append(r)
                    u, t = r["udp"], r["tcp"]
                    bounded = {n: (x or {}).get("bounded") for n, x in r["libipsec"].items()}
                    print(
                        f"{prof} r{rep} {variant:>9} (bounded {bounded}): UDP {u['mbit']:.1f} "
                        f"Mbit/s loss {u.get('loss_pct', float('nan')):.1f} % recv "
                        f"{u.get('recv_s')} s wall {u['wall_s']} s drops {u['libipsec_drops']} "
                        f"ipsec0 {u['ipsec0_tx_drops']} charon {u['charon_rss_mb']} MB; TCP "
                        f"{t['mbit']:.1f} Mbit/s wall {t['wall_s']} s drops {t['libipsec_drops']}"
                        f" load {os.getloadavg()[0]:.1f}",
                        flush=True,
                    )
    print("\nmedians:")
    for prof in a.profiles.split(","):
        for variant in VARIANTS:
            rs = [r for r in results if r["profile"] == prof and r["variant"] == variant]

            def med(f, rs=rs):
                xs = [f(r) for r in rs]
                xs = [x for x in xs if x is not None]
                return statistics.median(xs) if xs else float("nan")

            print(
                f"{prof} {variant}: UDP {med(lambda r: r['udp']['mbit']):.1f} Mbit/s, loss "
                f"{med(lambda r: r['udp'].get('loss_pct')):.1f} %, wall "
                f"{med(lambda r: r['udp']['wall_s']):.1f} s, drops out "
                f"{med(lambda r: r['udp']['libipsec_drops']['outbound']):.0f} in "
                f"{med(lambda r: r['udp']['libipsec_drops']['inbound']):.0f}, charon "
                f"{med(lambda r: r['udp']['charon_rss_mb']):.0f} MB; TCP "
                f"{med(lambda r: r['tcp']['mbit']):.1f} Mbit/s, wall "
                f"{med(lambda r: r['tcp']['wall_s']):.1f} s"
            )
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
