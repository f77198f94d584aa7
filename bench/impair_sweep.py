"""Study A's sweep points, applied to the impairment engine and verified by measurement.

    sudo .venv/bin/python bench/impair_sweep.py [--quick]

For every point of lab.model.impairment.presets.study_a_sweeps() (delay 0-100 ms step 10; jitter 0-10 ms
step 1 at delay 20 ms, normal; loss 0-5 % step 0.5; network1-3) the spec goes through the lab's
own parser into the engine, and lab-probe datagrams measure what one direction really does:
  delay  -> median one-way delay within max(2 %, 50 us) of the configured delay (+ path p50)
  jitter -> standard deviation within 10 % of the configured jitter (0: below 50 us)
  loss   -> lost count inside the 99 % binomial interval
Prints one row per point and a PASS/FAIL count.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from impair_netns import EngineLab, binom_interval, percentile

from lab.model.impairment.presets import study_a_sweeps

PORT = [7600]


def probe(lab, imp, n, rate):
    lab.client.set("a2b", imp.to_json())
    PORT[0] += 1
    recs = lab.probe(n, rate, 64, port=PORT[0])
    lab.client.clear()
    return recs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer packets per point")
    a = ap.parse_args()
    k = 0.25 if a.quick else 1.0
    rows, fails = [], 0
    with EngineLab() as lab:
        lab.warm()
        base = percentile([(rx - tx) / 1000 for _, tx, rx in lab.probe(2000, 2000, port=7599)], 50)
        for sweep_name, points in study_a_sweeps().items():
            for pt in points:
                imp = pt.impairment
                j = imp.to_json()
                delay = j.get("delay_us", 0)
                jitter = j.get("jitter_us", 0)
                loss = (j.get("loss") or {}).get("p_pct", 0.0)
                n = int((20000 if loss else 3000) * k) or 500
                recs = probe(lab, imp, n, 4000 if loss else 2000)
                d = [(rx - tx) / 1000 - base for _, tx, rx in recs]
                checks = []
                p50 = percentile(d, 50)
                if not jitter:
                    tol = max(0.02 * delay, 50)
                    checks.append((f"p50 {p50:.0f} us", abs(p50 - delay) <= tol))
                else:
                    sd = statistics.pstdev(d)
                    checks.append((f"sd {sd:.0f} us", abs(sd / jitter - 1) <= 0.10))
                if sweep_name == "jitter" and not jitter:
                    sd = statistics.pstdev(d)
                    checks.append((f"sd {sd:.0f} us", sd <= 50))
                lost = n - len({s for s, _, _ in recs})
                lo, hi = binom_interval(n, loss / 100) if loss else (0, 0)
                checks.append((f"lost {lost}/{n}", lo <= lost <= hi))
                ok = all(c[1] for c in checks)
                fails += not ok
                rows.append(
                    (
                        sweep_name,
                        str(imp),
                        "; ".join(c[0] for c in checks),
                        "PASS" if ok else "FAIL",
                    )
                )
    w = max(len(r[1]) for r in rows)
    print(f"study A sweep points through lab-impaird (path p50 {base:.1f} us subtracted)")
    for r in rows:
        print(f"{r[0]:8} {r[1]:<{w}}  {r[2]:<40} {r[3]}")
    print(f"{len(rows) - fails}/{len(rows)} points PASS")
    return 1 if fails else 0


if __name__ == "__main__":
    raise SystemExit(main())
