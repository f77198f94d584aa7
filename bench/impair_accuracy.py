"""Does the userspace impairment engine do what the spec says? Configured vs measured.

Every case sends lab-probe UDP datagrams (sequence number + send time; kernel receive timestamp
on the same clock) from A-ns through the engine to B-ns and compares with the spec:
  delay 40 ms             -> median one-way delay within max(2 %, 50 us) of 40 ms
  delay 40ms 5ms normal   -> standard deviation within 10 % of 5 ms
  loss 1 %   (100 000)    -> lost count inside the 99 % binomial interval
  gemodel p 1% r 25%      -> mean loss-burst length within 10 % of 1/r = 4
  duplicate 2 %           -> duplicate count inside the 99 % binomial interval
  reorder 25% (delay 10ms)-> early-sent count inside the 99 % binomial interval
  corrupt 1 %             -> engine's corrupted count inside the 99 % binomial interval
  rate 10 Mbit/s          -> receive rate within 2 %
  loss 1 %, TCP (wire)    -> iperf3 TCP through the engine, tcpdump on both sides: lost wire
                             packets (super-frames cut at the MSS, tests/pcapwire.py) inside the
                             99 % binomial interval, no run of more than 3 lost in a row (a
                             dropped 64 KB super-frame is a run of ~45), no frame > MSS after

Usage: sudo python3 bench/impair_accuracy.py
(LAB_ENGINE_DIR=DIR selects another build of engine/, e.g. to compare two builds.)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.pcapwire

from impair_netns import B_IP, EngineLab, binom_interval, percentile

from tests.pcapwire import data_frames, flow_mss, kernel_drops, missing_runs, read_tcp, wire_packets

ROWS: list[tuple[str, str, str, str, str]] = []


def row(case: str, configured: str, measured: str, accept: str, ok: bool) -> None:
    ROWS.append((case, configured, measured, accept, "PASS" if ok else "FAIL"))


_PORT = [7200]  # a fresh UDP port per case


def run_case(lab: EngineLab, spec: dict, n: int, rate: float, size: int = 64):
    lab.client.set("a2b", spec)
    before = lab.client.show()["a2b"]["counters"]
    _PORT[0] += 1
    recs = lab.probe(n, rate, size, port=_PORT[0])
    after = lab.client.show()["a2b"]["counters"]
    lab.client.clear()
    return recs, {k: after[k] - before[k] for k in after}


def bursts(received_seqs: set[int], n: int) -> list[int]:
    out, run = [], 0
    for s in range(n):
        if s not in received_seqs:
            run += 1
        elif run:
            out.append(run)
            run = 0
    if run:
        out.append(run)
    return out


def tcp_wire_run(lab: EngineLab, spec: dict, seconds: int = 3, rate: str = "200M") -> dict:
    """iperf3 TCP A -> B through the engine with `spec` on a2b, tcpdump on A's a0 (the
    super-frames A's stack hands over) and on B's b0 (what the engine sent; veth GRO is off).
    Returns wire packets before/after, frames after, the data connection's MSS, tcpdump's kernel
    drops and the engine's counter deltas."""
    port = 5301
    gro = lab.exec("b", ["ethtool", "-k", lab.p + "b0"]).stdout
    if "generic-receive-offload: off" not in gro:
        raise RuntimeError(f"GRO is on on {lab.p}b0: frames after the engine are not wire packets")
    before, after = os.path.join(lab.tmp, "before.pcap"), os.path.join(lab.tmp, "after.pcap")
    lab.client.set("a2b", spec)
    c0 = lab.client.show()["a2b"]["counters"]
    srv = lab.spawn("b", ["iperf3", "-s", "-1", "-p", str(port), "-B", B_IP])
    deadline = time.monotonic() + 10
    while not lab.exec("b", ["ss", "-Hltn", f"sport = :{port}"]).stdout.strip():
        if time.monotonic() > deadline:
            raise RuntimeError("iperf3 server did not start")
        time.sleep(0.05)
    dumps = []
    for key, dev, path in (("a", lab.p + "a0", before), ("b", lab.p + "b0", after)):
        d = lab.spawn(
            key,
            ["tcpdump", "-i", dev, "-n", "-s", "128", "-B", "16384", "-U", "--immediate-mode",
             "--time-stamp-precision", "nano", "-w", path, "tcp", "port", str(port)],
            stderr=subprocess.PIPE,
        )  # fmt: skip
        dumps.append(d)
        if b"listening on" not in d.popen.stderr.readline():
            raise RuntimeError(f"tcpdump on {dev} did not start")
    cp = lab.exec(
        "a",
        ["iperf3", "-c", B_IP, "-p", str(port), "-t", str(seconds), "-b", rate, "-J"],
        timeout=seconds + 30,
    )
    time.sleep(0.5)
    c1 = lab.client.show()["a2b"]["counters"]
    drops = []
    for d in dumps:
        lab.stop(d)
        drops.append(kernel_drops(d.popen.stderr.read().decode(errors="replace")))
        d.popen.stderr.close()
    lab.stop(srv)
    lab.client.clear()
    b, a = read_tcp(before), read_tcp(after)
    bd, ad = data_frames(b, B_IP, port), data_frames(a, B_IP, port)
    mss = flow_mss(b, a)
    end = json.loads(cp.stdout)["end"]["sum_sent"]
    return {
        "before": wire_packets(bd, mss),
        "after": wire_packets(ad, mss),
        "after_frames": len(ad),
        "mss": max(mss[f.flow] for f in bd),
        "largest_after": max(f.payload for f in ad),
        "super_frames": sum(1 for f in bd if f.payload > mss[f.flow]),
        "drops": drops,
        "engine": {k: c1[k] - c0[k] for k in c1},
        "mbit": end["bits_per_second"] / 1e6,
    }


def main() -> int:
    with EngineLab() as lab:
        lab.warm()
        base = lab.probe(2000, 2000, port=7199)
        base_us = percentile([(rx - tx) / 1000 for _, tx, rx in base], 50)
        row("path without impairment", "-", f"p50 {base_us:.1f} us", "info", True)

        # delay 40 ms
        recs, _ = run_case(lab, {"delay_us": 40000}, 4000, 2000)
        d = [(rx - tx) / 1000 for _, tx, rx in recs]
        p50 = percentile(d, 50)
        tol = max(0.02 * 40000, 50)
        row(
            "delay",
            "40000 us",
            f"p50 {p50:.1f} us (p99 {percentile(d, 99):.1f})",
            f"|p50-40000| <= {tol:.0f} us",
            abs(p50 - 40000) <= tol,
        )
        row(
            "delay error w/o path",
            "0 us",
            f"{p50 - 40000 - base_us:+.1f} us",
            "<= 50 us",
            abs(p50 - 40000 - base_us) <= 50,
        )

        # jitter 5 ms normal
        spec = {"delay_us": 40000, "jitter_us": 5000, "distribution": "normal", "seed": 3}
        recs, _ = run_case(lab, spec, 20000, 5000)
        d = [(rx - tx) / 1000 for _, tx, rx in recs]
        sd, mean = statistics.pstdev(d), statistics.fmean(d)
        row(
            "jitter normal",
            "sd 5000 us",
            f"sd {sd:.0f} us, mean {mean:.0f} us",
            "sd within 10 %",
            abs(sd / 5000 - 1) <= 0.10,
        )

        # loss 1 % over 100 000
        n = 100_000
        recs, c = run_case(lab, {"loss": {"model": "random", "p_pct": 1.0}}, n, 25000)
        seqs = {s for s, _, _ in recs}
        lost = n - len(seqs)
        lo, hi = binom_interval(n, 0.01)
        row(
            "loss random",
            "1 % of 100000",
            f"{lost} lost ({100 * lost / n:.3f} %)",
            f"[{lo:.0f}, {hi:.0f}]",
            lo <= lost <= hi,
        )

        # gemodel bursts
        n = 100_000
        spec = {"loss": {"model": "gemodel", "p": 1.0, "r": 25.0, "one_h": 100.0, "one_k": 0.0}}
        recs, c = run_case(lab, spec, n, 25000)
        b = bursts({s for s, _, _ in recs}, n)
        mb = statistics.fmean(b) if b else 0.0
        rate_exp = 1 / 26
        row(
            "gemodel burst",
            "mean 1/r = 4.00",
            f"{mb:.2f} over {len(b)} bursts",
            "within 10 %",
            abs(mb / 4 - 1) <= 0.10,
        )
        row(
            "gemodel loss rate",
            f"p/(p+r) = {100 * rate_exp:.2f} %",
            f"{100 * sum(b) / n:.2f} %",
            "info",
            True,
        )

        # duplicate 2 %
        n = 50_000
        recs, c = run_case(lab, {"duplicate_pct": 2.0}, n, 25000)
        dups = len(recs) - len({s for s, _, _ in recs})
        lo, hi = binom_interval(n, 0.02)
        row(
            "duplicate",
            "2 % of 50000",
            f"{dups} duplicates (engine {c['duplicated']})",
            f"[{lo:.0f}, {hi:.0f}]",
            lo <= dups <= hi,
        )

        # reorder 25 % with delay 10 ms: reordered datagrams leave at once (delay ~0)
        n = 20_000
        recs, c = run_case(lab, {"delay_us": 10000, "reorder_pct": 25.0}, n, 4000)
        early = sum(1 for _, tx, rx in recs if rx - tx < 5_000_000)
        lo, hi = binom_interval(n, 0.25)
        out_of_order = sum(1 for i in range(1, len(recs)) if recs[i][0] < recs[i - 1][0])
        row(
            "reorder",
            "25 % of 20000",
            f"{early} sent early, {out_of_order} arrive out of order",
            f"[{lo:.0f}, {hi:.0f}]",
            lo <= early <= hi,
        )

        # reorder gap: every 5th
        recs, c = run_case(
            lab, {"delay_us": 10000, "reorder_pct": 100.0, "reorder_gap": 5}, 1000, 2000
        )
        early = sorted(s for s, tx, rx in recs if rx - tx < 5_000_000)
        ok = early == list(range(4, 1000, 5))
        row(
            "reorder gap 5",
            "seq 4, 9, 14 ... early",
            f"{len(early)} early, pattern {'exact' if ok else 'differs'}",
            "exact",
            ok,
        )

        # corrupt 1 %
        n = 50_000
        recs, c = run_case(lab, {"corrupt_pct": 1.0}, n, 25000)
        lo, hi = binom_interval(n, 0.01)
        row(
            "corrupt",
            "1 % of 50000",
            f"engine {c['corrupted']}, receiver lost {n - len(recs)}",
            f"[{lo:.0f}, {hi:.0f}]",
            lo <= c["corrupted"] <= hi,
        )

        # rate 10 Mbit/s, 1000-byte datagrams (1042-byte frames) offered at 16 Mbit/s
        recs, c = run_case(lab, {"rate_bps": 10_000_000, "limit": 100000}, 3000, 2000, 1000)
        t = sorted(rx for _, _, rx in recs)
        got = (len(t) - 1) * 1042 * 8 / ((t[-1] - t[0]) / 1e9)
        row(
            "rate",
            "10.00 Mbit/s",
            f"{got / 1e6:.2f} Mbit/s (frames)",
            "within 2 %",
            abs(got / 10e6 - 1) <= 0.02,
        )
        # loss 1 % on TCP: wire packets, not super-frames
        for rate in ("200M", "100M"):
            r = tcp_wire_run(lab, {"loss": {"model": "random", "p_pct": 1.0}}, rate=rate)
            if r["drops"] == [0, 0]:
                break
        n = len(r["before"])
        lost = n - len(r["after"])  # the after side cut at the MSS too: fair to an old build
        runs = missing_runs(r["before"], r["after"])
        lo, hi = binom_interval(n, 0.01)
        e = r["engine"]
        split = (
            f", engine split {e['gso_frames']} -> {e['gso_segments']} (unsplit {e['gso_unsplit']})"
            if "gso_frames" in e
            else ""
        )
        row(
            "loss TCP (wire)",
            f"1 % of {n} wire pkts",
            f"{lost} lost ({100 * lost / n:.3f} %), longest run {max(runs, default=0)}, "
            f"largest frame after {r['largest_after']} B ({r['super_frames']} super-frames "
            f"before{split})",
            f"[{lo:.0f}, {hi:.0f}], run <= 3, frame <= {r['mss']} B",
            lo <= lost <= hi
            and max(runs, default=0) <= 3
            and r["largest_after"] <= r["mss"]
            and r["drops"] == [0, 0],
        )
        rt = lab.client.show()["a2b"].get("realtime")
    print(
        f"lab-impaird accuracy ({os.uname().release}, SCHED_FIFO={rt}, "
        f"load {os.getloadavg()[0]:.1f})"
    )
    w = [
        max(len(r[i]) for r in ROWS + [("case", "configured", "measured", "accept", "")])
        for i in range(5)
    ]
    for r in [("case", "configured", "measured", "accept", "")] + ROWS:
        print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)))
    return 0 if all(r[4] == "PASS" for r in ROWS) else 1


if __name__ == "__main__":
    sys.exit(main())
