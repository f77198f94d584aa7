"""Write the link traces shipped in traces/ from their documented models (traces/README.md).

    python3 tools/make_traces.py [--out DIR]      (default: traces/ beside this folder)

Every trace is Mahimahi's format: one line per delivery opportunity, the millisecond at which one
1500-byte packet may leave; the last line is the period (the trace repeats after it). The models
are seeded, so the files are the same on every run; tests/test_impair_trace.py regenerates them
and compares with the shipped files. Pure Python, no dependency beyond the standard library.
"""

from __future__ import annotations

import argparse
import math
import random
from pathlib import Path

PACKET_BITS = 1500 * 8


def poisson(rng: random.Random, lam: float) -> int:
    """A Poisson(lam) draw by counting uniform products (Knuth): fine for lam below ~30."""
    limit, k, p = math.exp(-lam), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


def lines(per_ms: list[int]) -> list[int]:
    """Opportunities per millisecond (index 0 = ms 1) -> trace lines. An opportunity at the last
    millisecond is added when it has none, so the period is the whole duration."""
    out = [ms for ms, n in enumerate(per_ms, 1) for _ in range(n)]
    if not out or out[-1] != len(per_ms):
        out.append(len(per_ms))
    return out


def constant(mbit: float, seconds: int) -> list[int]:
    """A constant rate as evenly spread opportunities: `mbit` x 1e6 / 12000 per second. 12 Mbit/s
    is one opportunity every millisecond: the one-line trace `1`."""
    per_s = round(mbit * 1e6 / PACKET_BITS)
    if 1000 % per_s == 0:  # whole ms apart: one period of one opportunity says it all
        return [1000 // per_s]
    return [math.ceil((i + 1) * 1000 * seconds / (per_s * seconds)) for i in range(per_s * seconds)]


def cellular(seconds: int, seed: int) -> tuple[list[int], list[int], list[float], list[float]]:
    """Downlink and uplink of a cellular-like link; also each's capacity per epoch (Mbit/s).

    Per 50-ms epoch (a scheduling/CQI reporting interval), each direction's capacity follows a
    mean-reverting random walk of its logarithm (Ornstein-Uhlenbeck, discretised):
        x' = x + THETA (ln MEAN - x) + SIGMA N(0, 1),   capacity = exp(x) clamped to [LO, HI]
    with MEAN 8 Mbit/s down, 2.5 Mbit/s up, THETA 0.05, SIGMA 0.18, LO 0.3, HI 40 Mbit/s. Both
    share a two-state Markov fade (the radio's): good -> fade with p 0.004 per epoch (one every
    12.5 s on average), fade -> good with p 0.1 (500 ms mean), capacity x 0.05 in a fade. Within
    an epoch, each millisecond (an LTE TTI) gets Poisson(capacity / 12 Mbit/s) opportunities, so
    deliveries come in the clumps a scheduler's grants make.
    """
    rng = random.Random(seed)
    epoch_ms, theta, sigma, lo, hi = 50, 0.05, 0.18, 0.3, 40.0
    mean = {"down": 8.0, "up": 2.5}
    x = {d: math.log(m) for d, m in mean.items()}
    fade = False
    per_ms = {"down": [], "up": []}
    caps = {"down": [], "up": []}
    for _ in range(seconds * 1000 // epoch_ms):
        fade = rng.random() < (0.9 if fade else 0.004)  # stays in a fade with 1 - 0.1
        for d in ("down", "up"):
            x[d] += theta * (math.log(mean[d]) - x[d]) + sigma * rng.gauss(0.0, 1.0)
            cap = min(hi, max(lo, math.exp(x[d]))) * (0.05 if fade else 1.0)
            caps[d].append(cap)
            lam = cap * 1e6 / PACKET_BITS / 1000
            per_ms[d] += [poisson(rng, lam) for _ in range(epoch_ms)]
    return lines(per_ms["down"]), lines(per_ms["up"]), caps["down"], caps["up"]


def wifi(seconds: int, seed: int) -> list[int]:
    """A Wi-Fi-like link: the station wins the channel after a contention gap of 0.3 ms plus an
    exponential time (mean 1.2 ms), then sends an aggregate (A-MPDU) of 2..12 packets
    (uniform) at that millisecond; with p 0.01 per access a neighbour's burst or interference
    holds the channel for 20..60 ms (uniform) first. Mean about 40 Mbit/s, in bursts."""
    rng = random.Random(seed)
    end = seconds * 1000.0
    t, per_ms = 0.0, [0] * (seconds * 1000)
    while True:
        t += 0.3 + rng.expovariate(1 / 1.2)
        if rng.random() < 0.01:
            t += rng.uniform(20.0, 60.0)
        if t >= end:
            break
        per_ms[min(len(per_ms) - 1, int(t))] += rng.randint(2, 12)  # the ms it ends in
    return lines(per_ms)


#: file -> (lines) of every shipped trace; the seeds are part of the documented model
def traces() -> dict[str, list[int]]:
    down, up, _, _ = cellular(30, seed=33)
    return {
        "const-12mbit.trace": constant(12, 1),
        "cellular-walk.down": down,
        "cellular-walk.up": up,
        "wifi-bursty.trace": wifi(10, seed=34),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "traces")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, ms in traces().items():
        (args.out / name).write_text("".join(f"{x}\n" for x in ms))
        mbit = len(ms) * PACKET_BITS / ms[-1] / 1000
        print(f"{args.out / name}: {len(ms)} lines, period {ms[-1]} ms, mean {mbit:.2f} Mbit/s")


if __name__ == "__main__":
    main()
