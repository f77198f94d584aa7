#!/usr/bin/env python3
"""Where a pi4 dry-run loses UDP packets and ping time: the board model or this host (issue 16).

    sudo .venv/bin/python bench/contention.py [--profiles P ...] [--cpu pi4|host] [--reps N]

For each VPN profile, two nodes on topologies/pi_pair.py (`cpu=pi4` by default; `--cpu host`
runs the same without caps or masks, to see what the board model adds), brought up through the
lab's CLI with a state directory of its own. Per repetition:

- iperf3 UDP at 400 Mbit/s (1300 B) through the tunnel, and where the missing datagrams went:
  the tunnel device's transmit drops in the client (the daemon did not read its TUN queue in
  time), UDP receive-buffer overflows in the server (a socket not drained in time: the daemon's
  or iperf3's), qdisc drops; each node's CPU (cpuacct) against its quota, the number of CFS
  periods in which its groups were throttled, and the run-queue wait of its threads
  (/proc/TID/schedstat: time runnable but not running) per second they ran;
- 50 pings (0.05 s apart) through the tunnel: RTT, and the client node's thread run-queue wait
  and throttled periods during them.

A node whose threads wait on the run queue while its groups are not throttled is held back by
this machine's other work, not by the board's cores: a Pi 4 runs those threads on idle cores.
The figures move with host load (printed before and after): bench output, never a test's.
About 25 s per profile and repetition.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAB = str(REPO / ".venv" / "bin" / "lab")
TOPO = str(REPO / "topologies" / "pi_pair.py")
CG = Path("/sys/fs/cgroup")
NODES = ("client", "server")


class Lab:
    def __init__(self, lab_id: str, state: str):
        self.id, self.env = lab_id, {**os.environ, "LAB_STATE_DIR": state}

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            [LAB, *args], env=self.env, capture_output=True, text=True, check=check
        )

    def exec(self, node: str, *argv: str) -> subprocess.CompletedProcess:
        return self.cli("exec", "--id", self.id, node, "--", *argv, check=False)

    def netns(self, node: str, *argv: str) -> str:
        cmd = ["ip", "netns", "exec", f"{self.id}-{node}", *argv]
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def nstat(lab: Lab, node: str) -> dict[str, int]:
    return {
        k: int(v) for k, v in re.findall(r"^(\w+)\s+(\d+)", lab.netns(node, "nstat", "-az"), re.M)
    }


def link_drops(lab: Lab, node: str, dev: str | None) -> int:
    if dev is None:
        return 0
    stats = json.loads(lab.netns(node, "ip", "-j", "-s", "link", "show", dev))[0]["stats64"]
    return stats["tx"]["dropped"]


def qdisc_drops(lab: Lab, node: str) -> int:
    out = lab.netns(node, "tc", "-s", "qdisc", "show", "dev", f"{node}-eth0")
    return sum(int(x) for x in re.findall(r"dropped (\d+)", out))


def cpu_groups(lab: Lab, node: str) -> list[Path]:
    d = CG / "cpu" / "lab" / lab.id / node
    return [d] + sorted(d.glob("core*"))


def throttled(lab: Lab, node: str) -> int:
    n = 0
    for g in cpu_groups(lab, node):
        n += int(re.search(r"nr_throttled (\d+)", (g / "cpu.stat").read_text()).group(1))
    return n


def cpu_ns(lab: Lab, node: str) -> int:
    return int((CG / "cpuacct" / "lab" / lab.id / node / "cpuacct.usage").read_text())


def quota_cores(lab: Lab, node: str) -> float | None:
    d = cpu_groups(lab, node)[0]
    q = int((d / "cpu.cfs_quota_us").read_text())
    return None if q < 0 else q / int((d / "cpu.cfs_period_us").read_text())


class ThreadWatch:
    """Run and run-queue wait (ns) of every thread of a node's group, sampled every 0.2 s while
    active, so that threads ending before the last sample (iperf3) still count."""

    def __init__(self, lab: Lab, node: str):
        self.tasks = CG / "cpuacct" / "lab" / lab.id / node / "tasks"
        self.first: dict[int, tuple[int, int]] = {}
        self.last: dict[int, tuple[int, int]] = {}
        self.stop = threading.Event()
        self.sample(initial=True)
        self.t = threading.Thread(target=self.loop, daemon=True)
        self.t.start()

    def sample(self, initial: bool = False) -> None:
        for tid in (int(x) for x in self.tasks.read_text().split()):
            try:
                run, wait = (int(x) for x in Path(f"/proc/{tid}/schedstat").read_text().split()[:2])
            except (OSError, ValueError):
                continue
            # a thread born during the measurement counts from zero
            self.first.setdefault(tid, (run, wait) if initial else (0, 0))
            self.last[tid] = (run, wait)

    def loop(self) -> None:
        while not self.stop.wait(0.2):
            self.sample()

    def done(self) -> tuple[float, float]:
        """(seconds run, seconds waited on the run queue) over the measurement."""
        self.stop.set()
        self.t.join()
        self.sample()
        run = sum(self.last[t][0] - self.first[t][0] for t in self.last) / 1e9
        wait = sum(self.last[t][1] - self.first[t][1] for t in self.last) / 1e9
        return run, wait


def udp_run(lab: Lab, target: str, dev: str | None, rate: int) -> dict:
    lab.exec("server", "iperf3", "-s", "-D", "-1")
    time.sleep(0.4)
    before = {
        n: (
            nstat(lab, n),
            link_drops(lab, n, dev),
            qdisc_drops(lab, n),
            cpu_ns(lab, n),
            throttled(lab, n),
        )
        for n in NODES
    }
    watch = {n: ThreadWatch(lab, n) for n in NODES}
    t0 = time.monotonic()
    r = lab.exec(
        "client", "iperf3", "-c", target, "-u", "-b", f"{rate}M", "-l", "1300", "-t", "5", "-J"
    )
    dt = time.monotonic() - t0
    threads = {n: w.done() for n, w in watch.items()}
    after = {
        n: (
            nstat(lab, n),
            link_drops(lab, n, dev),
            qdisc_drops(lab, n),
            cpu_ns(lab, n),
            throttled(lab, n),
        )
        for n in NODES
    }
    s = json.loads(r.stdout)["end"]["sum"]
    out = {
        "sent": s["packets"],
        "lost": s["lost_packets"],
        "delivered_mbit": s["bits_per_second"] / 1e6 * (1 - s["lost_percent"] / 100),
        "client_tun_drops": after["client"][1] - before["client"][1],
        "server_rcvbuf_errors": after["server"][0].get("UdpRcvbufErrors", 0)
        - before["server"][0].get("UdpRcvbufErrors", 0),
        "qdisc_drops": sum(after[n][2] - before[n][2] for n in NODES),
    }
    for n in NODES:
        run, wait = threads[n]
        out[f"{n}_cores"] = (after[n][3] - before[n][3]) / 1e9 / dt
        out[f"{n}_quota"] = quota_cores(lab, n)
        out[f"{n}_throttled"] = after[n][4] - before[n][4]
        out[f"{n}_wait_per_run"] = wait / run if run else 0.0
    return out


def ping_run(lab: Lab, target: str) -> dict:
    th0 = throttled(lab, "client")
    watch = ThreadWatch(lab, "client")
    r = lab.exec("client", "ping", "-c", "50", "-i", "0.05", target)
    run, wait = watch.done()
    rtt = sorted(float(x) for x in re.findall(r"time=([\d.]+)", r.stdout))
    return {
        "rtt_mean": statistics.mean(rtt),
        "rtt_median": rtt[len(rtt) // 2],
        "rtt_p90": rtt[int(len(rtt) * 0.9)],
        "client_run_ms_per_ping": run * 1e3 / len(rtt),
        "client_wait_ms_per_ping": wait * 1e3 / len(rtt),
        "client_throttled": throttled(lab, "client") - th0,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--profiles", nargs="+", default=["baseline", "wireguard", "ipsec-chacha20poly1305"]
    )
    ap.add_argument("--cpu", default="pi4")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--rate", type=int, default=400, help="UDP offered rate, Mbit/s")
    a = ap.parse_args()
    state = tempfile.mkdtemp(prefix="lab-contention-")
    print(f"host load before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    for prof in a.profiles:
        lab = Lab(f"ct{os.getpid() % 10000}", state)
        up = ["up", TOPO, "--id", lab.id, "-p", f"cpu={a.cpu}"]
        lab.cli(*up, *([] if prof == "baseline" else ["--vpn", prof]))
        try:
            info = json.loads(Path(state, lab.id, "lab.json").read_text())
            vpn = info.get("vpn") or {}
            dev = (vpn.get("describe") or {}).get("interface")
            target = (vpn.get("traffic") or {}).get("v4", "10.0.1.2")
            for rep in range(a.reps):
                u, p = udp_run(lab, target, dev, a.rate), ping_run(lab, target)
                print(
                    f"{prof} #{rep + 1} (load {os.getloadavg()[0]:.1f}) UDP {a.rate}: delivered "
                    f"{u['delivered_mbit']:.0f} Mbit/s, lost {u['lost']} of {u['sent']}: client "
                    f"TUN drops {u['client_tun_drops']}, server UDP rcvbuf errors "
                    f"{u['server_rcvbuf_errors']}, qdisc drops {u['qdisc_drops']}",
                    flush=True,
                )
                for n in NODES:
                    q = u[f"{n}_quota"]
                    print(
                        f"    {n}: {u[f'{n}_cores']:.3f} host cores of "
                        f"{'no cap' if q is None else f'{q:.3f}'}, throttled periods "
                        f"{u[f'{n}_throttled']}, run-queue wait {u[f'{n}_wait_per_run']:.2f} s "
                        "per s run"
                    )
                print(
                    f"    ping: RTT mean {p['rtt_mean']:.3f} median {p['rtt_median']:.3f} p90 "
                    f"{p['rtt_p90']:.3f} ms; client threads ran {p['client_run_ms_per_ping']:.3f}"
                    f" ms and waited {p['client_wait_ms_per_ping']:.3f} ms per ping, throttled "
                    f"periods {p['client_throttled']}",
                    flush=True,
                )
        finally:
            lab.cli("down", "--id", lab.id, check=False)
    print(f"host load after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
