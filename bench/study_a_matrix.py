#!/usr/bin/env python3
"""Study A's ideal-network matrix and TCP delay sweep, as issue 30 checks the board model.

    sudo .venv/bin/python bench/study_a_matrix.py --run OUT_DIR          # run both plans
    .venv/bin/python bench/study_a_matrix.py OUT_DIR [--before DIR]      # print (and compare)
    .venv/bin/python bench/study_a_matrix.py OUT_DIR --hardware FILE.csv # against board figures

Runs bench/plans/study_a_ideal.toml (every study A profile this host can run; TCP, UDP 400
Mbit/s 1300 B, scp 256 MB, ping; 2 x 10 s) and bench/plans/study_a_delay.toml (TCP at 0, 20 and
60 ms per direction on both boards' egress, 1 x 10 s) through the lab's own CLI into OUT_DIR/ideal
and OUT_DIR/delay, then prints per profile the figures from each run's summary.csv: TCP and UDP
received Mbit/s (UDP loss %), scp Mbit/s, ping RTT ms; per delay TCP Mbit/s and retransmissions.
`--before DIR` adds the same figures of an earlier OUT_DIR and the ratio after/before.
`--hardware FILE` (CSV: profile,test,value in the units printed; kept outside the repository)
adds lab/board ratios, how many are within x1.5, and the Kendall tau of the TCP ranking.
Bench output only: the figures move with this host's CPU and load. About 12 + 5 minutes here.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAB = REPO / ".venv" / "bin" / "lab"
PLANS = {"ideal": "bench/plans/study_a_ideal.toml", "delay": "bench/plans/study_a_delay.toml"}
#: (column, test label, summary metric, scale to the printed unit)
IDEAL = [
    ("tcp Mbit/s", "tcp", "throughput_bps", 1e-6),
    ("udp400 Mbit/s", "udp-400m-1300", "receiver_bps", 1e-6),
    ("udp400 loss %", "udp-400m-1300", "loss_pct", 1.0),
    ("scp Mbit/s", "scp", "throughput_bps", 1e-6),
    ("ping ms", "ping", "rtt_avg_ms", 1.0),
]
#: the tests a hardware file compares (its `test` column)
HARDWARE_TESTS = {"tcp": 0, "udp": 1, "scp": 3, "ping": 4}
BAND = 1.5


def summary(run: Path) -> dict[tuple[str, str, str, str], float]:
    """{(profile, impairment, test label, metric): mean} from a run's summary.csv."""
    out = {}
    with open(run / "summary.csv") as f:
        for row in csv.DictReader(f):
            try:
                out[(row["profile"], row["impairment"], row["test_label"], row["metric"])] = float(
                    row["mean"]
                )
            except (TypeError, ValueError):
                continue
    return out


def profiles(s: dict) -> list[str]:
    return list(dict.fromkeys(k[0] for k in s))


def ideal_rows(run: Path) -> dict[str, list[float | None]]:
    s = summary(run)
    return {
        p: [(s[(p, "none", t, m)] * k) if (p, "none", t, m) in s else None for _, t, m, k in IDEAL]
        for p in profiles(s)
    }


def delay_rows(run: Path) -> tuple[list[str], dict[str, list[tuple[float | None, float | None]]]]:
    s = summary(run)
    imps = list(dict.fromkeys(k[1] for k in s))
    rows = {}
    for p in profiles(s):
        rows[p] = [
            (
                s.get((p, i, "tcp", "throughput_bps"), 0) * 1e-6 or None,
                s.get((p, i, "tcp", "retransmits")),
            )
            for i in imps
        ]
    return imps, rows


def fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's tau-a of two rankings (1: the same order)."""

    def sign(x: float) -> int:
        return (x > 0) - (x < 0)

    n = len(a)
    s = sum(sign(a[i] - a[j]) * sign(b[i] - b[j]) for i in range(n) for j in range(i + 1, n))
    pairs = n * (n - 1) / 2
    return s / pairs if pairs else float("nan")


def print_ideal(out: Path, before: Path | None, hardware: Path | None) -> None:
    rows = ideal_rows(out / "ideal")
    old = ideal_rows(before / "ideal") if before else {}
    print(f"\n## Study A, ideal network ({out / 'ideal'})\n")
    head = ["profile"] + [c for c, *_ in IDEAL]
    if old:
        head += [f"{c} after/before" for c, *_ in IDEAL if "loss" not in c]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for p, vals in rows.items():
        cells = [p] + [
            fmt(v, 3 if "ping" in c else 1) for (c, *_), v in zip(IDEAL, vals, strict=True)
        ]
        if old:
            ov = old.get(p, [None] * len(IDEAL))
            cells += [
                f"x{v / o:.2f}" if v and o else "-"
                for (c, *_), v, o in zip(IDEAL, vals, ov, strict=True)
                if "loss" not in c
            ]
        print("| " + " | ".join(cells) + " |")
    if hardware:
        compare_hardware(rows, hardware)


def compare_hardware(rows: dict, hardware: Path) -> None:
    hw: dict[tuple[str, str], float] = {}
    with open(hardware) as f:
        for r in csv.DictReader(f):
            hw[(r["profile"], r["test"])] = float(r["value"])
    print(f"\n### lab / board ({hardware})\n")
    print("| profile | " + " | ".join(HARDWARE_TESTS) + " |")
    print("|---|" + "---|" * len(HARDWARE_TESTS))
    within = total = 0
    for p, vals in rows.items():
        cells = []
        for t, i in HARDWARE_TESTS.items():
            b, v = hw.get((p, t)), vals[i]
            if b and v:
                r = v / b
                total += 1
                within += 1 / BAND <= r <= BAND
                cells.append(f"x{r:.2f}" + ("" if 1 / BAND <= r <= BAND else " (!)"))
            else:
                cells.append("-")
        print(f"| {p} | " + " | ".join(cells) + " |")
    tcp = [(vals[0], hw[(p, "tcp")]) for p, vals in rows.items() if vals[0] and (p, "tcp") in hw]
    tau = kendall_tau([a for a, _ in tcp], [b for _, b in tcp])
    print(f"\nwithin x{BAND}: {within} of {total}; TCP ranking Kendall tau {tau:.2f}")


def print_delay(out: Path, before: Path | None) -> None:
    imps, rows = delay_rows(out / "delay")
    old = delay_rows(before / "delay")[1] if before else {}
    print(f"\n## TCP under delay, per direction on both egresses ({out / 'delay'})\n")
    head = ["profile"] + [f"{i}: Mbit/s (retr)" for i in imps]
    if old:
        head += [f"{i}: before" for i in imps]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for p, vals in rows.items():
        cells = [p] + [f"{fmt(t)} ({fmt(r, 0)})" for t, r in vals]
        if old:
            cells += [f"{fmt(t)} ({fmt(r, 0)})" for t, r in old.get(p, [(None, None)] * len(imps))]
        print("| " + " | ".join(cells) + " |")


def run(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, plan in PLANS.items():
        subprocess.run([str(LAB), "run", plan, "--out", str(out / name)], cwd=REPO, check=True)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path, help="directory holding ideal/ and delay/ runs")
    ap.add_argument("--run", action="store_true", help="run both plans into OUT first")
    ap.add_argument("--before", type=Path, help="an earlier OUT to compare with")
    ap.add_argument("--hardware", type=Path, help="CSV profile,test,value of board figures")
    a = ap.parse_args(argv)
    if a.run:
        run(a.out)
    if (a.out / "ideal" / "summary.csv").exists():
        print_ideal(a.out, a.before, a.hardware)
    if (a.out / "delay" / "summary.csv").exists():
        print_delay(a.out, a.before)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
