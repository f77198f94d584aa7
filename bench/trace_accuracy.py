"""Does a trace-driven link deliver what its trace allows? Delivered packets/s against the trace.

For each trace, lab-probe sends 1472-byte UDP datagrams (1500-byte IP packets: one per delivery
opportunity) from A-ns through the engine to B-ns, faster than the trace's busiest second, so
the link's queue never runs dry and every opportunity should carry one packet. The receiver's
kernel timestamps (SO_TIMESTAMPNS) are put on the trace's clock with the engine's `start_ns`
(CLOCK_MONOTONIC of the trace's millisecond 0), and each whole second of the saturated window
counts the datagrams received against the trace's opportunities in that second.

    accept: delivered / opportunities over the window within 1 %; the per-second figures are
    reported (their spread is how late the engine sends, not what it sends)

Usage: sudo python3 bench/trace_accuracy.py [--seconds S] [TRACE ...]
(default: every trace in traces/; LAB_ENGINE_DIR=DIR selects another build of engine/).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from impair_netns import EngineLab

from lab.model.impairment.trace import load_trace, shipped, Trace

PAYLOAD = 1472  # + 8 UDP + 20 IP = 1500 bytes: one opportunity each
LIMIT = 1000
WARMUP_S = 1  # the first second fills the queue


def busiest_second(t: Trace, seconds: int) -> int:
    return max(t.opportunities(s * 1000, (s + 1) * 1000) for s in range(seconds))


def run(lab: EngineLab, trace: Trace, seconds: int, port: int) -> dict:
    rate = int(busiest_second(trace, seconds + 1) * 1.25) + 200
    lab.client.set("a2b", {"trace": trace.to_json(), "limit": LIMIT})
    deadline = time.monotonic() + 2
    while "trace" not in lab.client.show()["a2b"]:  # the forwarding thread takes the spec
        if time.monotonic() > deadline:
            raise RuntimeError("the engine did not take the trace")
        time.sleep(0.01)
    start_ns = lab.client.show()["a2b"]["trace"]["start_ns"]
    offset = time.clock_gettime_ns(time.CLOCK_REALTIME) - time.monotonic_ns()
    recs = lab.probe(rate * seconds, rate, PAYLOAD, port=port, idle_ms=2000)
    shown = lab.client.show()["a2b"]
    lab.client.clear()
    t_ms = [(rx - offset - start_ns) / 1e6 for _, _, rx in recs]
    first = next(int(x // 1000) + 1 for x in sorted(t_ms))  # the first whole second of traffic
    begin = first + WARMUP_S
    # while the queue drains after the last send the link is still busy: up to the last whole
    # second received
    end = int(max(t_ms) // 1000)
    rows = []
    for s in range(begin, end):
        got = sum(1 for x in t_ms if s * 1000 <= x < (s + 1) * 1000)
        opp = trace.opportunities(s * 1000 - 1, (s + 1) * 1000 - 1)  # ms s*1000 .. s*1000+999
        rows.append((s, got, opp))
    got = sum(r[1] for r in rows)
    opp = sum(r[2] for r in rows)
    errs = [abs(g - o) / o * 100 for _, g, o in rows if o]
    return {
        "rate": rate,
        "sent": rate * seconds,
        "received": len(recs),
        "window_s": len(rows),
        "delivered": got,
        "opportunities": opp,
        "error_pct": (got - opp) / opp * 100 if opp else float("nan"),
        "per_second_err_median": statistics.median(errs) if errs else float("nan"),
        "per_second_err_max": max(errs) if errs else float("nan"),
        "engine": shown.get("trace"),
        "dropped_limit": shown["counters"]["dropped_limit"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="*", help="trace files or names in traces/ (default: all)")
    ap.add_argument("--seconds", type=int, default=12, help="sending time per trace")
    args = ap.parse_args()
    names = args.traces or shipped()
    ok = True
    print(
        "| trace | mean Mbit/s | sent pps | window s | delivered | opportunities | error % "
        "| per-second median / max % | accept |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    with EngineLab() as lab:
        lab.warm()
        for i, name in enumerate(names):
            trace = load_trace(name)
            r = run(lab, trace, args.seconds, 7400 + i)
            good = abs(r["error_pct"]) <= 1.0
            ok &= good
            print(
                f"| {Path(trace.path).name} | {trace.mean_bps / 1e6:.2f} | {r['rate']} | "
                f"{r['window_s']} | {r['delivered']} | {r['opportunities']} | "
                f"{r['error_pct']:+.3f} | {r['per_second_err_median']:.2f} / "
                f"{r['per_second_err_max']:.2f} | {'PASS' if good else 'FAIL'} |",
                flush=True,
            )
            e = r["engine"] or {}
            print(
                f"|   engine: {e.get('opportunities')} opportunities, {e.get('used')} used, "
                f"{e.get('wasted')} wasted; queue drops {r['dropped_limit']} | | | | | | | | |"
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
