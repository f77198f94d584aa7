#!/usr/bin/env python3
"""Stalls under delay: where a capped tunnel drops packets, at the old CFS period and the lab's
(issue 30, mechanism 7).

    sudo .venv/bin/python bench/stalls.py [--profiles wireguard,ipsec-chacha20poly1305]
        [--delays 0,20,60] [--periods lab,min] [--queues board,host] [--rounds 2]
        [--duration 10] [--json FILE] [--tick-helper]
    sudo .venv/bin/python bench/stalls.py --probe 0.2407 [--periods lab,min] [--rounds 2]

A CFS quota lets a node's threads run at this host's speed for share x period, then stalls them
for the rest of the period; a board is slow all the time. Per profile, one lab on
topologies/pi_pair.py (two pi4 nodes, the userspace impairment engine on the link, brought up
through the lab's CLI with a state directory of its own), then per round, per period (the order
alternates from round to round, so a drift of this machine's load falls on both alike) and per
one-way delay (on both egresses, `lab impair set all delay D`): the node groups and per-board-
core groups get that period with the same shares (quota = share x period, the kernel's 1 ms
floor kept), and iperf3 TCP runs `--duration` s through the tunnel. Recorded per test:

- TCP: receiver Mbit/s and the sender's retransmitted segments (iperf3 -J);
- where packets were dropped: each interface's tx/rx drops in each node (`ip -s link`: a TUN's
  tx drops are packets its daemon did not read in time), qdisc drops (`tc -s qdisc`), UDP
  receive-buffer errors (/proc/net/snmp in each netns: a socket not drained in time), the
  engine's own drops (`lab impair show`), the host's backlog drops (/proc/net/softnet_stat);
- the cost: CFS periods throttled per second and the seconds throttled (cpu.stat of every group
  of both nodes), the nodes' CPU (cpuacct) and the host's busy share (/proc/stat).

`--queues board,host` alternates, in the same lab, the stand-in's UDP receive buffers and TUN
queues as the lab sets them from the board kernel's queues (lab.model.dpqueue) with this host's
defaults (the setting before): where a stalled stand-in drops, the one or the other.
`--periods` lists CFS periods in us, `lab` (the period the lab itself set, the current
lab.model.dilation rule) or `min` (the shortest at which the smallest group gets the kernel's
1 ms quota: 4156 us for one Pi core at share 0.2407). `--tick-helper` runs a SCHED_FIFO thread
per CPU waking every 0.5 ms throughout, so that quotas are charged promptly (below). `--probe SHARE` measures the stall pattern itself instead: one busy
thread in a group of its own capped at SHARE host cores (one Pi core: the calibration's
core_share), at each period, at the cgroup default weight (the labs' groups have it) and at a
high one, printing how long it ran between stalls and how long they lasted. It prints each test, then per profile and delay the medians and the
ratio of each period's figures to the first one's (the old setting): bench output measured in
one run on this machine, never a test's assertion. The load average is printed throughout;
other engineers' work on this machine moves the figures. About 15 s per test.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from lab.model import dilation  # noqa: E402 -- this checkout's rule for "lab"
from lab.core import sockbuf  # noqa: E402

LAB = str(REPO / ".venv" / "bin" / "lab")
TOPO = str(REPO / "topologies" / "pi_pair.py")
CG = Path("/sys/fs/cgroup")
NODES = ("client", "server")
#: the kernel's smallest CFS quota (kernel/sched/core.c min_cfs_quota_period: 1 ms)
MIN_QUOTA_US = 1000
SNMP_KEYS = ("UdpRcvbufErrors", "UdpInErrors", "UdpSndbufErrors", "TcpRetransSegs")


class Lab:
    def __init__(self, lab_id: str, state: str):
        self.id, self.state = lab_id, state
        # this checkout's lab package (the venv's editable install may point at another one)
        path = os.pathsep.join(x for x in (str(REPO), os.environ.get("PYTHONPATH")) if x)
        self.env = {**os.environ, "LAB_STATE_DIR": state, "PYTHONPATH": path}

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            [LAB, *args], env=self.env, capture_output=True, text=True, check=check
        )

    def exec(self, node: str, *argv: str) -> subprocess.CompletedProcess:
        return self.cli("exec", "--id", self.id, node, "--", *argv, check=False)

    def netns(self, node: str, *argv: str) -> str:
        cmd = ["ip", "netns", "exec", f"{self.id}-{node}", *argv]
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout

    def groups(self, node: str) -> list[Path]:
        d = CG / "cpu" / "lab" / self.id / node
        return [d, *sorted(d.glob("core*"))]


# ----------------------------------------------------------------------------- counters


def snmp(lab: Lab, node: str) -> dict[str, int]:
    """/proc/net/snmp of the node's netns as {ProtoField: value}."""
    out: dict[str, int] = {}
    lines = lab.netns(node, "cat", "/proc/net/snmp").splitlines()
    for head, vals in zip(lines[::2], lines[1::2], strict=False):
        proto, names = head.split(":", 1)
        for k, v in zip(names.split(), vals.split(":", 1)[1].split(), strict=False):
            out[proto + k] = int(v)
    return {k: out.get(k, 0) for k in SNMP_KEYS}


def links(lab: Lab, node: str) -> dict[str, int]:
    """{IFACE.tx_dropped / IFACE.rx_dropped: n} for every interface of the node."""
    out = {}
    for x in json.loads(lab.netns(node, "ip", "-j", "-s", "link", "show")):
        s = x.get("stats64") or {}
        out[f"{x['ifname']}.tx_dropped"] = s.get("tx", {}).get("dropped", 0)
        out[f"{x['ifname']}.rx_dropped"] = s.get("rx", {}).get("dropped", 0)
    return out


def qdiscs(lab: Lab, node: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in json.loads(lab.netns(node, "tc", "-s", "-j", "qdisc", "show") or "[]"):
        k = f"{x.get('dev')}.qdisc_drops"
        out[k] = out.get(k, 0) + int(x.get("drops", 0))
    return out


def engine_drops(lab: Lab) -> dict[str, int]:
    """The engine's drop counters summed per kind over its directions (lab impair show)."""
    r = lab.cli("impair", "show", "--id", lab.id, "--json", check=False)
    out: dict[str, int] = {}

    def walk(x):
        if isinstance(x, dict):
            c = x.get("counters")
            if isinstance(c, dict):
                for k, v in c.items():
                    if (k.startswith("dropped") or k == "tx_errors") and isinstance(v, int):
                        out[f"engine.{k}"] = out.get(f"engine.{k}", 0) + v
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    try:
        walk(json.loads(r.stdout))
    except json.JSONDecodeError:
        pass
    return out


def softnet_drops() -> int:
    text = Path("/proc/net/softnet_stat").read_text().split("\n")
    return sum(int(line.split()[1], 16) for line in text if line.strip())


def cpu_stat(lab: Lab) -> dict[str, int]:
    out = {"nr_periods": 0, "nr_throttled": 0, "throttled_time": 0, "cpuacct_ns": 0}
    for n in NODES:
        for g in lab.groups(n):
            st = dict(line.split() for line in (g / "cpu.stat").read_text().splitlines() if line)
            if g.name.startswith("core"):  # the node group's periods run alongside: count once
                out["nr_periods"] += int(st["nr_periods"])
            out["nr_throttled"] += int(st["nr_throttled"])
            out["throttled_time"] += int(st["throttled_time"])
        acct = CG / "cpuacct" / "lab" / lab.id / n / "cpuacct.usage"
        out["cpuacct_ns"] += int(acct.read_text())
    return out


def host_busy() -> tuple[int, int]:
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = f[3] + f[4]
    return sum(f) - idle, sum(f)


class Waits:
    """Run and run-queue wait (ns) of every thread of both nodes (/proc/TID/schedstat), sampled
    every 0.2 s so that threads ending before the last sample (iperf3) still count. A thread of
    a throttled group waits too: wait beyond the throttled time is this host's other work."""

    def __init__(self, lab: Lab):
        self.tasks = [CG / "cpuacct" / "lab" / lab.id / n / "tasks" for n in NODES]
        self.first: dict[int, tuple[int, int]] = {}
        self.last: dict[int, tuple[int, int]] = {}
        self.stop = threading.Event()
        self.sample(initial=True)
        self.t = threading.Thread(target=self.loop, daemon=True)
        self.t.start()

    def sample(self, initial: bool = False) -> None:
        for f in self.tasks:
            for tid in (int(x) for x in f.read_text().split()):
                try:
                    st = Path(f"/proc/{tid}/schedstat").read_text().split()
                    run, wait = int(st[0]), int(st[1])
                except (OSError, ValueError, IndexError):
                    continue
                self.first.setdefault(tid, (run, wait) if initial else (0, 0))
                self.last[tid] = (run, wait)

    def loop(self) -> None:
        while not self.stop.wait(0.2):
            self.sample()

    def done(self) -> tuple[float, float]:
        """(seconds run, seconds waited on a run queue) over the test."""
        self.stop.set()
        self.t.join()
        self.sample()
        run = sum(self.last[t][0] - self.first[t][0] for t in self.last) / 1e9
        wait = sum(self.last[t][1] - self.first[t][1] for t in self.last) / 1e9
        return run, wait


def snapshot(lab: Lab) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in NODES:
        for src in (snmp(lab, n), links(lab, n), qdiscs(lab, n)):
            out.update({f"{n}.{k}": v for k, v in src.items()})
    out.update(engine_drops(lab))
    out["host.softnet_drops"] = softnet_drops()
    out.update(cpu_stat(lab))
    out["host.busy"], out["host.total"] = host_busy()
    return out


# ----------------------------------------------------------------------------- settings


def shares(lab: Lab) -> dict[Path, float]:
    """Each capped group's share (host cores) as the lab set it."""
    out = {}
    for n in NODES:
        for g in lab.groups(n):
            q = int((g / "cpu.cfs_quota_us").read_text())
            if q > 0:
                out[g] = q / int((g / "cpu.cfs_period_us").read_text())
    return out


def set_period(lab: Lab, share: dict[Path, float], period_us: int) -> None:
    """Every capped group of both nodes at `period_us` with its share: the node groups are
    lifted first (a child's quota may not exceed its parent's), then capped again."""
    nodes = [g for g in share if not g.name.startswith("core")]
    for g in nodes:
        (g / "cpu.cfs_quota_us").write_text("-1")
    for g in [g for g in share if g.name.startswith("core")] + nodes:
        (g / "cpu.cfs_quota_us").write_text("-1")
        (g / "cpu.cfs_period_us").write_text(str(period_us))
        quota = max(MIN_QUOTA_US, round(share[g] * period_us))
        (g / "cpu.cfs_quota_us").write_text(str(quota))


def period_of(word: str, lab_period: int, share: float) -> int:
    """A `--periods` word: `lab` (what the lab set), `min` (the shortest at which `share`, the
    smallest group, gets the kernel's 1 ms quota) or microseconds."""
    if word == "lab":
        return lab_period
    if word == "min":
        return math.ceil(MIN_QUOTA_US / share)
    return int(word)


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


# ----------------------------------------------------------------------------- one test


def tcp_test(lab: Lab, target: str, duration: int) -> dict:
    lab.exec("server", "iperf3", "-s", "-D", "-1")
    time.sleep(0.4)
    t0, before, waits = time.monotonic(), snapshot(lab), Waits(lab)
    r = lab.exec("client", "iperf3", "-c", target, "-t", str(duration), "-J")
    run_s, wait_s = waits.done()
    dt, after = time.monotonic() - t0, snapshot(lab)
    try:
        end = json.loads(r.stdout)["end"]
        mbit = end["sum_received"]["bits_per_second"] / 1e6
        retr = end["sum_sent"].get("retransmits")
    except (json.JSONDecodeError, KeyError):
        mbit, retr = float("nan"), None
    d = {k: after[k] - before.get(k, 0) for k in after}
    busy, total = d.pop("host.busy"), d.pop("host.total")
    return {
        "mbit": mbit,
        "retransmits": retr,
        "drops": {
            k: v for k, v in d.items() if v and k.split(".")[0] in (*NODES, "engine", "host")
        },
        "throttled_per_s": d["nr_throttled"] / dt,
        "stall_ms": d["throttled_time"] / 1e6 / d["nr_throttled"] if d["nr_throttled"] else 0.0,
        "throttled_s": d["throttled_time"] / 1e9,
        "periods": d["nr_periods"],
        "node_cores": d["cpuacct_ns"] / 1e9 / dt,
        "run_s": run_s,
        "wait_s": wait_s,
        "host_busy_pct": 100.0 * busy / total if total else None,
        "load1": os.getloadavg()[0],
    }


def set_queues(lab: Lab, held: dict, which: str) -> None:
    """The stand-in's UDP receive buffers and TUN queues as the lab set them from the board's
    queues (`board`, lab.json vpn.queues) or back at this host's defaults (`host`: what they
    were before, recorded there too)."""
    for node, rec in held.items():
        for sk in rec.get("sockets", []):
            want = sk["rcvbuf"] if which == "board" else sk["rcvbuf_before"]
            sockbuf.set_receive_buffer(sk["pid"], sk["port"], want)
        for dev, t in rec.get("tun", {}).items():
            n = t["txqueuelen"] if which == "board" else t["txqueuelen_before"]
            lab.netns(node, "ip", "link", "set", dev, "txqueuelen", str(n))


def delay(lab: Lab, ms: int) -> None:
    if ms:
        lab.cli("impair", "set", "--id", lab.id, "all", f"delay {ms}ms")
    else:
        lab.cli("impair", "clear", "--id", lab.id)


# ----------------------------------------------------------------------------- the run


def run_profile(prof: str, a, state: str) -> list[dict]:
    lab = Lab(f"st{os.getpid() % 10000}", state)
    up = ["up", TOPO, "--id", lab.id, "--impair", "none", "--impair-backend", "userspace"]
    lab.cli(*up, *([] if prof == "baseline" else ["--vpn", prof]))
    out = []
    try:
        info = json.loads(Path(state, lab.id, "lab.json").read_text())
        target = ((info.get("vpn") or {}).get("traffic") or {}).get("v4", "10.0.1.2")
        share = shares(lab)
        lab_period = int((next(iter(share)) / "cpu.cfs_period_us").read_text()) if share else 0
        low = min(share.values()) if share else 1.0
        periods = [period_of(p, lab_period, low) for p in a.periods.split(",")]
        print(
            f"{prof}: lab period {lab_period} us, shares "
            f"{sorted({round(s, 3) for s in share.values()})}",
            flush=True,
        )
        held = (info.get("vpn") or {}).get("queues") or {}
        variants = [(p, q) for p in periods for q in a.queues.split(",")]
        for rnd in range(a.rounds):
            order = variants if rnd % 2 == 0 else variants[::-1]
            for period, qs in order:
                if share:
                    set_period(lab, share, period)
                set_queues(lab, held, qs)
                for ms in (int(x) for x in a.delays.split(",")):
                    delay(lab, ms)
                    r = tcp_test(lab, target, a.duration)
                    r.update(profile=prof, period_us=period, delay_ms=ms, round=rnd, queues=qs)
                    out.append(r)
                    drops = ", ".join(f"{k} {v}" for k, v in sorted(r["drops"].items()))
                    print(
                        f"  r{rnd} {period:>6} us {qs:>5} {ms:>3} ms: {r['mbit']:7.1f} Mbit/s, retr "
                        f"{r['retransmits']}, throttled {r['throttled_per_s']:.0f}/s "
                        f"(mean stall {r['stall_ms']:.1f} ms) "
                        f"({r['throttled_s']:.2f} s), threads ran {r['run_s']:.2f} s and "
                        f"waited {r['wait_s']:.2f} s, nodes {r['node_cores']:.2f} cores, host "
                        f"busy {r['host_busy_pct']:.0f} %, load {r['load1']:.1f}; drops: "
                        f"{drops or 'none'}",
                        flush=True,
                    )
    finally:
        delay(lab, 0)
        lab.cli("down", "--id", lab.id, check=False)
    return out


# ----------------------------------------------------------------------------- the probe

#: a busy loop that records how long it ran between stalls and how long each stall (a gap in
#: the clock > 0.2 ms) lasted; prints (runs, gaps) in seconds
SPIN = """
import sys, time
end = time.monotonic() + float(sys.argv[1]); last = start = time.monotonic(); runs = []; gaps = []
while last < end:
    t = time.monotonic()
    if t - last > 0.0002:
        runs.append(last - start); gaps.append(t - last); start = t
    last = t
print(repr((runs, gaps)))
"""


#: a SCHED_FIFO thread pinned to one CPU that wakes every 0.5 ms: each wake-up preempts the CFS
#: task running there, which charges its run time to its group's quota at once (update_curr)
#: instead of at the next 4 ms tick (CONFIG_HZ=250 here), so a group is throttled when its quota
#: is spent, not up to a tick later
TICK = """
import time
while True:
    time.sleep(0.0005)
"""


def tick_helpers() -> list[subprocess.Popen]:
    """One TICK process per CPU of this machine (`--tick-helper`); the caller kills them."""
    return [
        subprocess.Popen(["taskset", "-c", str(c), "chrt", "-f", "1", sys.executable, "-c", TICK])
        for c in sorted(os.sched_getaffinity(0))
    ]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


def probe(share: float, periods: list[int], weights: list[int], secs: float, rounds: int) -> None:
    """One busy thread in a group of this benchmark's own (outside the labs' tree), capped at
    `share` over each period, at the cgroup default weight (1024, as the labs' groups) and at a
    high one (nothing else on this machine runs before it while it has quota): how long it
    runs between stalls and how long they last. Periods and weights alternate per round."""
    g = CG / "cpu" / f"stalls-probe-{os.getpid()}"
    g.mkdir()
    try:
        for rnd in range(rounds):
            for w in weights if rnd % 2 == 0 else weights[::-1]:
                for p in periods if rnd % 2 == 0 else periods[::-1]:
                    quota = max(MIN_QUOTA_US, round(share * p))
                    (g / "cpu.shares").write_text(str(w))
                    (g / "cpu.cfs_quota_us").write_text("-1")
                    (g / "cpu.cfs_period_us").write_text(str(p))
                    (g / "cpu.cfs_quota_us").write_text(str(quota))
                    st0 = (g / "cpu.stat").read_text().split()
                    cp = subprocess.run(
                        [sys.executable, "-c", SPIN, str(secs)],
                        capture_output=True,
                        text=True,
                        check=True,
                        preexec_fn=lambda: (g / "cgroup.procs").write_text(str(os.getpid())),
                    )
                    st1 = (g / "cpu.stat").read_text().split()
                    runs, gaps = eval(cp.stdout)  # noqa: S307 -- our own child's repr
                    thr = int(st1[3]) - int(st0[3])
                    print(
                        f"  r{rnd} weight {w:>5} period {p:>6} us (quota {quota} us): ran "
                        f"{sum(runs) / secs:.3f} cores; runs p50 {pct(runs, 0.5) * 1e3:.2f} ms; "
                        f"stalls {len(gaps) / secs:.0f}/s, p50 {pct(gaps, 0.5) * 1e3:.2f} p90 "
                        f"{pct(gaps, 0.9) * 1e3:.2f} p99 {pct(gaps, 0.99) * 1e3:.2f} max "
                        f"{max(gaps, default=0) * 1e3:.1f} ms; throttled {thr / secs:.0f}/s; load "
                        f"{os.getloadavg()[0]:.1f}",
                        flush=True,
                    )
    finally:
        g.rmdir()


def med(xs: list) -> float:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def summary(results: list[dict]) -> None:
    print("\nmedians per profile, delay, period and queues; ratio = this setting / the first one's")
    print(
        f"{'profile':<26}{'delay':>6}{'period':>8}{'queue':>6}{'Mbit/s':>9}{'ratio':>7}{'retr':>7}"
        f"{'thr/s':>7}{'stall':>7}{'cores':>7}{'busy%':>7}  main drops (sum over rounds)"
    )
    keys = sorted({(r["profile"], r["delay_ms"]) for r in results}, key=str)
    for prof, ms in keys:
        rows = [r for r in results if (r["profile"], r["delay_ms"]) == (prof, ms)]
        periods = list(dict.fromkeys((r["period_us"], r.get("queues", "board")) for r in rows))
        base = None
        for p, qs in periods:
            rs = [r for r in rows if (r["period_us"], r.get("queues", "board")) == (p, qs)]
            mbit = med([r["mbit"] for r in rs])
            base = mbit if base is None else base
            drops: dict[str, int] = {}
            for r in rs:
                for k, v in r["drops"].items():
                    drops[k] = drops.get(k, 0) + v
            top = ", ".join(f"{k} {v}" for k, v in sorted(drops.items(), key=lambda x: -x[1])[:4])
            print(
                f"{prof:<26}{ms:>6}{p:>8}{qs:>6}{mbit:>9.1f}{mbit / base:>7.2f}"
                f"{med([r['retransmits'] for r in rs]):>7.0f}"
                f"{med([r['throttled_per_s'] for r in rs]):>7.0f}"
                f"{med([r['stall_ms'] for r in rs]):>7.1f}"
                f"{med([r['node_cores'] for r in rs]):>7.2f}"
                f"{med([r['host_busy_pct'] for r in rs]):>7.0f}  {top}"
            )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", default="wireguard,ipsec-chacha20poly1305")
    ap.add_argument("--delays", default="0,20,60", help="one-way delays per egress, ms")
    ap.add_argument(
        "--periods",
        default="lab,min",
        help="CFS periods: us, 'lab' (the lab's) or 'min' (1 ms quota)",
    )
    ap.add_argument(
        "--queues",
        default="board",
        help="the stand-in's socket and TUN queues: 'board' (as the lab sets them, lab.json "
        "vpn.queues), 'host' (this host's defaults, as before), or both: 'board,host'",
    )
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--json", help="write every test's record here")
    ap.add_argument(
        "--probe",
        metavar="SHARE",
        type=float,
        help="instead of the labs: a busy thread capped at SHARE host cores (one Pi core: the "
        "calibration's core_share) at each period, weights 1024 and 16384, 3 s each",
    )
    ap.add_argument(
        "--tick-helper",
        action="store_true",
        help="run a SCHED_FIFO 0.5 ms waker per CPU throughout (quotas enforced to ~0.5 ms, "
        "not to this kernel's 4 ms tick)",
    )
    a = ap.parse_args()
    helpers = tick_helpers() if a.tick_helper else []
    try:
        return run(a)
    finally:
        for h in helpers:
            h.kill()
            h.wait()


def run(a) -> int:
    if a.probe:
        lab_period = dilation.cfs_period_us(1.0, min_share=a.probe)
        ps = [period_of(p, lab_period, a.probe) for p in a.periods.split(",")]
        print(f"{time.strftime('%H:%M:%S', time.gmtime())} UTC, load {load()}", flush=True)
        probe(a.probe, ps, [1024, 16384], 3.0, a.rounds)
        return 0
    state = tempfile.mkdtemp(prefix="lab-stalls-")
    print(f"{time.strftime('%H:%M:%S', time.gmtime())} UTC, load {load()}", flush=True)
    results = []
    for prof in a.profiles.split(","):
        results += run_profile(prof, a, state)
    print(f"{time.strftime('%H:%M:%S', time.gmtime())} UTC, load {load()}")
    summary(results)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
