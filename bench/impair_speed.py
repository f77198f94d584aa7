"""Is the userspace impairment engine fast enough not to be the bottleneck it measures?

One run, three measurements (root; throw-away namespaces named eng<hex>-*):
  1. iperf3 TCP through the engine (no impairment) vs a direct veth pair: ratio (goal >= 0.3).
  2. iperf3 UDP 1 Gbit/s of 1300-byte datagrams under network1 (delay 40ms 5ms normal, loss 0.5%)
     applied in both directions: loss beyond the configured 0.5 % (goal < 0.1 %), engine CPU from
     /proc/<pid>/stat (goal <= 1 core).
  3. Added one-way latency with no impairment (lab-probe, kernel receive timestamps): p50 through
     the engine minus p50 of the direct pair (goal <= 50 us).
  4. iperf3 TCP through a per-packet model (`delay 1ms`, then `loss 1%`): throughput, engine CPU
     per Gbit/s, and how the engine saw the stream: GSO super-frames split into wire packets
     (`gso_frames` -> `gso_segments`), so `loss 1%` is 1 % of wire packets. Run it with
     LAB_ENGINE_DIR=<another engine/ checkout> to compare two builds of the engine.
  5. (--parts splice) The two designs for `lab impair set` on a lab built without impairment
     (issue 20). "Always a pass-through bump" costs every lab, impaired or not, what 1. and 3.
     measure with no impairment (throughput ratio, added latency, engine CPU) plus the bump's
     share of `lab up`; "splice the engine in when first needed" costs only a lab that is
     impaired, once: the wall time of the splice and the packets lost meanwhile, counted by a
     ping every millisecond across the spliced link of a real lab (pi_pair_middlebox,
     uncapped, no tunnel).

Usage: sudo python3 bench/impair_speed.py [--seconds 5] [--parts engine,splice] [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO))

from impair_netns import B_IP, DB_IP, EngineLab, cpu_seconds, percentile

# network1 from lab/model/impairment/presets.py. limit is raised from netem's default 1000: at 1 Gbit/s
# 45 ms of delay holds ~4300 packets of 1300 bytes, so limit 1000 would drop ~75 % (kernel
# netem does the same); the preset alone is not meant for line-rate UDP.
NETWORK1 = {
    "delay_us": 40000,
    "jitter_us": 5000,
    "distribution": "normal",
    "loss": {"model": "random", "p_pct": 0.5, "corr_pct": 0.0},
    "limit": 20000,
}


def iperf3(lab: EngineLab, client: str, server: str, server_ip: str, args: list[str], secs: int):
    port = "5201"
    srv = lab.spawn(server, ["iperf3", "-s", "-1", "-p", port, "-B", server_ip])
    deadline = time.monotonic() + 5
    while True:  # poll until the server listens
        ss = lab.exec(server, ["ss", "-Htln", f"sport = :{port}"], check=False)
        if ss.stdout.strip() or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    cp = lab.exec(
        client,
        ["iperf3", "-c", server_ip, "-p", port, "-t", str(secs), "--json", *args],
        check=False,
        timeout=secs + 30,
    )
    lab.stop(srv)
    if cp.returncode != 0:
        raise RuntimeError(f"iperf3 failed: {cp.stdout[-500:]} {cp.stderr[-500:]}")
    return json.loads(cp.stdout)


def udp_rcvbuf_errors(lab: EngineLab, key: str) -> int:
    """Datagrams the namespace's UDP sockets dropped for a full receive buffer (/proc/net/snmp)."""
    lines = [ln.split() for ln in lab.exec(key, ["cat", "/proc/net/snmp"]).stdout.splitlines()]
    udp = [ln for ln in lines if ln and ln[0] == "Udp:"]
    return int(dict(zip(udp[0][1:], udp[1][1:], strict=True))["RcvbufErrors"])


def latency(lab: EngineLab, src: str, dst: str, ip: str, port: int) -> list[float]:
    recs = lab.probe(3000, 1000, 64, src=src, dst=dst, dst_ip=ip, port=port)
    return [(rx - tx) / 1000 for _, tx, rx in recs]


#: ping across the spliced link: one echo per millisecond, so one lost echo ~ 1 ms of outage
SPLICE_PING_INTERVAL_S, SPLICE_PING_COUNT = 0.001, 3000


def splice_cost(reps: int) -> list[tuple[str, str, str, str]]:
    """5.: `lab up` with and without a bump, and the cost of splicing one into the live link."""
    from lab.substrate.local.build import up
    from lab.substrate.local.impair import ensure_points
    from lab.core.state import new_lab_id
    from lab.core.teardown import teardown
    from lab.model.topology import load_topology

    spec = load_topology(REPO / "topologies" / "pi_pair_middlebox.py", params={"cpu": None})
    up_plain, up_bump, splice_s, lost, left = [], [], [], [], []
    for _ in range(reps):
        for impair, times in ((None, up_plain), ("none", up_bump)):
            lab_id = new_lab_id("bsp")
            t0 = time.monotonic()
            try:
                up(spec, lab_id, impair=impair)
                times.append(time.monotonic() - t0)
            finally:
                left += teardown(lab_id)
        lab_id = new_lab_id("bsp")
        try:
            lab = up(spec, lab_id)
            client = lab.node("client")
            argv = ["ping", "-n", "-i", str(SPLICE_PING_INTERVAL_S), "-c", str(SPLICE_PING_COUNT)]
            bg = client.spawn("bg-ping", [*argv, "-W", "1", "10.0.2.2"])
            time.sleep(1.0)
            t0 = time.monotonic()
            ensure_points(lab)
            splice_s.append(time.monotonic() - t0)
            bg.popen.wait(timeout=SPLICE_PING_COUNT * SPLICE_PING_INTERVAL_S + 30)
            m = re.search(r"(\d+) packets transmitted, (\d+) received", bg.log.read_text())
            lost.append(int(m.group(1)) - int(m.group(2)))
        finally:
            left += teardown(lab_id)
    up_add = statistics.median(up_bump) - statistics.median(up_plain)
    ms = SPLICE_PING_INTERVAL_S * 1000
    return [
        ("lab up, no bump (median)", f"{statistics.median(up_plain):.2f} s", "", ""),
        ("lab up, pass-through bump (median)", f"{statistics.median(up_bump):.2f} s", "", ""),
        ("always-bump: added to every lab up", f"{up_add * 1000:.0f} ms", "", ""),
        (
            "splice: wall time (median, max)",
            f"{statistics.median(splice_s) * 1000:.0f} ms, {max(splice_s) * 1000:.0f} ms",
            "",
            "",
        ),
        (
            "splice: echoes lost (1 per ms; each run)",
            f"{lost} = {max(lost) * ms:.0f} ms max outage",
            "< 1 s",
            _pf(max(lost) * ms < 1000),
        ),
        ("splice: left over after teardown", f"{left or 'nothing'}", "nothing", _pf(not left)),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--parts", default="engine,splice", help="engine (1.-4.), splice (5.)")
    ap.add_argument("--reps", type=int, default=5, help="splice: labs built per design")
    args = ap.parse_args()
    secs = args.seconds
    rows: list[tuple[str, str, str, str]] = []
    parts = set(args.parts.split(","))
    if "engine" in parts:
        rows += engine_rows(secs)
    if "splice" in parts:
        rows += splice_cost(args.reps)
    print(
        f"lab-impaird speed ({os.uname().release}, {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.1f})"
    )
    _table(rows)
    return 0 if all(r[3] != "FAIL" for r in rows) else 1


def engine_rows(secs: int) -> list[tuple[str, str, str, str]]:
    """1.-4.: the engine between throw-away namespaces (bench/impair_netns.py)."""
    rows: list[tuple[str, str, str, str]] = []
    with EngineLab(direct=True) as lab:
        lab.warm()
        lab.warm("da", DB_IP)
        pid = lab.engine.pid

        # 1. TCP throughput, engine vs direct
        direct = iperf3(lab, "da", "db", DB_IP, [], secs)["end"]["sum_received"]["bits_per_second"]
        c0 = cpu_seconds(pid)
        t0 = time.monotonic()
        through = iperf3(lab, "a", "b", B_IP, [], secs)["end"]["sum_received"]["bits_per_second"]
        tcp_cpu = (cpu_seconds(pid) - c0) / (time.monotonic() - t0)
        ratio = through / direct
        rows.append(("TCP direct veth", f"{direct / 1e9:.2f} Gbit/s", "", ""))
        rows.append(("TCP through engine", f"{through / 1e9:.2f} Gbit/s", "", ""))
        rows.append(("engine CPU during TCP", f"{tcp_cpu:.2f} cores", "", ""))
        rows.append(("TCP ratio engine/direct", f"{ratio:.2f}", ">= 0.3", _pf(ratio >= 0.3)))

        # 3. added latency, no impairment
        d_direct = latency(lab, "da", "db", DB_IP, 7100)
        d_engine = latency(lab, "a", "b", B_IP, 7101)
        p50d, p50e = percentile(d_direct, 50), percentile(d_engine, 50)
        added = p50e - p50d
        rows.append(("one-way p50 direct", f"{p50d:.1f} us", "", ""))
        rows.append(("one-way p50 engine", f"{p50e:.1f} us", "", ""))
        rows.append(("one-way p99 engine", f"{percentile(d_engine, 99):.1f} us", "", ""))
        rows.append(("added latency p50", f"{added:.1f} us", "<= 50 us", _pf(added <= 50)))

        # 2. UDP 1 Gbit/s under network1. -w 4M: the receiving socket must absorb the bursts
        # of a CPU-starved iperf3 server; its own overflows are counted separately (RcvbufErrors).
        udp_args = ["-u", "-b", "1G", "-l", "1300", "-w", "4M"]
        base = iperf3(lab, "da", "db", DB_IP, udp_args, secs)["end"]["sum"]
        lab.client.set("both", NETWORK1)
        before = lab.client.show()["a2b"]["counters"]
        rcvbuf0 = udp_rcvbuf_errors(lab, "b")
        c0 = cpu_seconds(pid)
        t0 = time.monotonic()
        res = iperf3(lab, "a", "b", B_IP, udp_args, secs)["end"]["sum"]
        udp_cpu = (cpu_seconds(pid) - c0) / (time.monotonic() - t0)
        time.sleep(0.2)  # let the 45 ms queue drain before reading the counters
        after = lab.client.show()["a2b"]["counters"]
        rcvbuf = udp_rcvbuf_errors(lab, "b") - rcvbuf0
        lab.client.clear()
        d = {k: after[k] - before[k] for k in after if k not in ("queue_depth", "queue_depth_max")}
        seen = max(d["seen"], 1)
        # Frames the engine lost beyond the configured loss: its own receive-buffer drops, queue
        # limit drops, send errors, and frames still unaccounted for.
        unaccounted = d["seen"] - d["forwarded"] - d["dropped_loss"] - d["dropped_limit"]
        engine_extra = 100 * (d["dropped_rx"] + d["dropped_limit"] + d["tx_errors"] + unaccounted)
        engine_extra /= seen + d["dropped_rx"]
        lost_pct = res["lost_percent"]
        e2e_beyond = lost_pct - 0.5
        rows.append(
            (
                "UDP direct (no engine): rate / loss",
                f"{base['bits_per_second'] / 1e9:.3f} Gbit/s / {base['lost_percent']:.3f} %",
                "",
                "",
            )
        )
        rows.append(
            (
                "UDP network1: sent",
                f"{res['packets']} pkts = {res['packets'] * 1300 * 8 / secs / 1e9:.3f} Gbit/s",
                "1 Gbit/s",
                "",
            )
        )
        rows.append(
            (
                "UDP network1: engine random loss",
                f"{100 * d['dropped_loss'] / seen:.3f} % of {d['seen']}",
                "0.5 %",
                "",
            )
        )
        rows.append(("UDP network1: queue max", f"{after['queue_depth_max']}", "", ""))
        rows.append(
            (
                "UDP loss beyond configured, engine",
                f"{engine_extra:.4f} %",
                "< 0.1 %",
                _pf(engine_extra < 0.1),
            )
        )
        rows.append(("UDP network1: end-to-end loss", f"{lost_pct:.3f} %", "", ""))
        rows.append(
            (
                "  of which receiver socket overflow",
                f"{100 * rcvbuf / max(res['packets'], 1):.3f} %",
                "",
                "",
            )
        )
        rows.append(
            (
                "UDP loss beyond configured, end-to-end",
                f"{e2e_beyond:.3f} %",
                "< 0.1 %",
                _pf(e2e_beyond < 0.1),
            )
        )
        rows.append(("engine CPU during UDP", f"{udp_cpu:.2f} cores", "<= 1", _pf(udp_cpu <= 1.0)))
        # 4. TCP through per-packet models: what the engine splits, what it costs
        for name, spec in (
            ("delay 1ms", {"delay_us": 1000, "limit": 20000}),
            ("loss 1%", {"loss": {"model": "random", "p_pct": 1.0, "corr_pct": 0.0}}),
        ):
            lab.client.set("both", spec)
            before = lab.client.show()["a2b"]["counters"]
            c0 = cpu_seconds(pid)
            t0 = time.monotonic()
            res = iperf3(lab, "a", "b", B_IP, [], secs)["end"]
            cpu = (cpu_seconds(pid) - c0) / (time.monotonic() - t0)
            after = lab.client.show()["a2b"]["counters"]
            lab.client.clear()
            d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            gbit = res["sum_received"]["bits_per_second"] / 1e9
            wire = d["seen"] - d.get("gso_frames", 0) + d.get("gso_segments", 0)
            rows.append((f"TCP {name}: throughput", f"{gbit:.3f} Gbit/s", "", ""))
            rows.append(
                (
                    f"TCP {name}: engine CPU",
                    f"{cpu:.2f} cores = {cpu / max(gbit, 1e-9):.2f} cores per Gbit/s",
                    "",
                    "",
                )
            )
            rows.append(
                (
                    f"TCP {name}: frames seen / wire packets",
                    f"{d['seen']} / {wire} ({d.get('gso_frames', 0)} GSO frames split)",
                    "",
                    "",
                )
            )
            if d["dropped_loss"]:
                rows.append(
                    (
                        f"TCP {name}: dropped / wire packets",
                        f"{100 * d['dropped_loss'] / max(wire, 1):.3f} %",
                        "1 %",
                        "",
                    )
                )
            rows.append(
                (f"TCP {name}: retransmits", f"{res['sum_sent'].get('retransmits', 0)}", "", "")
            )
        rt = lab.client.show()["a2b"].get("realtime")
        leftovers = lab.close()
    rows.append(("engine SCHED_FIFO", f"{rt}", "", ""))
    rows.append(
        ("engine lab left over", f"{leftovers or 'nothing'}", "nothing", _pf(not leftovers))
    )
    return rows


def _pf(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _table(rows) -> None:
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    hdr = ("measure", "value", "goal", "")
    print("  ".join(h.ljust(w[i]) for i, h in enumerate(hdr)))
    for r in rows:
        print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)))


if __name__ == "__main__":
    sys.exit(main())
