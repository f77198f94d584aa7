"""Does scp's stop-early margin hold? (issue 17; lab/measure/progress.py, docs/measurements.md)

The rule stops a copy when even twice its best measured rate (the higher of the last 10 s and
the average) cannot finish it in time. It wrongly stops a copy that would have finished only
if, after some check, the copy then went more than twice as fast as that rate projected. This
runs whole copies of study A's cases (pi_pair, Pi 4 CPU caps, the study's profiles and
impairment points, the impairment on both egresses) without ever stopping them (margin
infinite, long time-out) and replays the rule on their byte-counter series (the raw
``scp-progress`` file). Per copy it prints:

- the worst *speed-up* over the checks from 20 s on: (remaining / rate at the check) /
  (seconds the copy really took from there); below 2 at every check = the margin held;
- when the real rule would have stopped study A's copy (256 MiB, time-out 286 s) on the same
  series, as long as the copy ran (a smaller copy's series stands for the start of a big one).

One run per case on a shared, loaded machine: an indication, not a bound.

Usage: sudo .venv/bin/python bench/scp_early.py [--quick | CASE ...]   (--quick: the first case;
CASE: indices into CASES). Each copy's byte series goes to /tmp/lab-bench-scp-early.json.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.substrate.local.build import up
from lab.measure import Context, get_test, progress
from lab.core.teardown import teardown
from lab.model.topology import load_topology
from lab.vpn.tunnel import prepare

REPO = Path(__file__).resolve().parents[1]
#: (profile, impairment, MiB): two that study A's runs saw fail at the time-out (docs/scale.md)
#: with a copy that stands for the start of theirs, one that finished there in 84-176 s, whole
CASES = [
    ("baseline", "delay 20ms 9ms distribution normal", 24),
    ("openvpn-aes256cbc-static", "network1", 24),
    ("openvpn-aes256cbc-static", "delay 100ms", 256),
    # the first case's condition for longer: how its rate goes on
    ("baseline", "delay 20ms 9ms distribution normal", 96),
]
STUDY_SIZE, STUDY_TIMEOUT = 256 * progress.MIB, 256 + 30.0


def series(path: Path | None) -> list[tuple[float, int]]:
    lines = path.read_text().splitlines() if path else []
    return [(0.0, 0)] + [(float(t), int(b)) for t, b in (ln.split() for ln in lines)]


def replay(samples, size: int, t_end: float, margin: float):
    """(worst speed-up, its time, checks from 20 s on, when study A's copy would be stopped)."""
    worst, at, n, stop_at = 0.0, None, 0, None
    for i in range(1, len(samples)):
        t, sent = samples[i]
        window, prev = progress.window_rates(samples[: i + 1])
        if stop_at is None and sent < size:
            progress.MARGIN = margin
            v = progress.decide(
                elapsed_s=t,
                sent=sent,
                size=STUDY_SIZE,
                timeout_s=STUDY_TIMEOUT,
                window_rate=window,
                prev_rate=prev,
            )
            progress.MARGIN = float("inf")
            stop_at = t if v.stop else None
        if t < progress.MIN_S or sent >= size or t_end <= t:
            continue
        rate = max(sent / t, window)
        if rate > 0:
            n += 1
            up_ = (size - sent) / rate / (t_end - t)
            if up_ > worst:
                worst, at = up_, t
    return worst, at, n, stop_at


def main() -> int:
    picked = [int(a) for a in sys.argv[1:] if a.isdigit()]
    cases = CASES[:1] if "--quick" in sys.argv else [CASES[i] for i in picked] or CASES
    out = []
    margin = progress.MARGIN
    progress.MARGIN = float("inf")  # never stop: the whole series is wanted
    scp = get_test("scp")
    print("| profile | impairment | MiB | copy s | Mbit/s | checks >= 20 s | worst speed-up "
          "(at s) | study A's copy stopped at | load |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for profile, cond, size_mb in cases:
        lid = "scpe" + os.urandom(2).hex()
        spec = load_topology(REPO / "topologies" / "pi_pair.py")
        plan = prepare(spec, profile)
        lab = up(spec, lid, vpn=plan, impair=cond)
        try:
            with tempfile.TemporaryDirectory(prefix="scp-early-") as d:
                ctx = Context(
                    lab.node("client"), lab.node("server"), plan.traffic_target(spec)["v4"],
                    Path(d) / "raw", timeout_s=1200, state_dir=Path(d) / "st",
                )  # fmt: skip
                [rec] = scp.run(ctx, scp.validate({"size_mb": size_mb}, source="bench"))
                load = os.getloadavg()[0]
                head = f"| {profile} | {cond} | {size_mb} |"
                if not rec["ok"]:
                    print(f"{head} failed: {rec['error']} |")
                    continue
                prog = [Path(f) for f in rec["raw_files"] if "scp-progress" in f]
                samples = series(prog[0] if prog else None)
                worst, at, n, stop_at = replay(samples, rec["size_bytes"], rec["seconds"], margin)
                out.append({"profile": profile, "impairment": cond, "size_mb": size_mb,
                            "seconds": rec["seconds"], "samples": samples})  # fmt: skip
                Path("/tmp/lab-bench-scp-early.json").write_text(json.dumps(out))
                stop = (
                    f"{stop_at:.0f} s" if stop_at is not None else f"not in {samples[-1][0]:.0f} s"
                )
                print(f"{head} {rec['seconds']:.0f} | {rec['rate_bps'] / 1e6:.2f} | {n} | "
                      + (f"{worst:.2f} (at {at:.0f})" if n else "-")
                      + f" | {stop} | {load:.1f} |")  # fmt: skip
        finally:
            teardown(lid)
        time.sleep(1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
