"""Board cores as cgroups: no thread faster than one board core, the node no more than its cores.

A CFS quota caps a group's total CPU time, not a thread's. A node standing for a 4-core board
therefore gets one child group per board core (`<node>/core0` ... `core3`, each capped at one
board core's worth of host CPU), under the node's own quota (all its cores): on cgroup v1 in the
cpu hierarchy, on v2 threaded children of the node group (lab.core.cgroups.ensure_slot; the
threads of one process may sit in different ones). lab.core.cgroups reads and moves threads the
way the hierarchy needs (`tasks` or `cgroup.threads`), so nothing here depends on it. Every
thread of the node sits in exactly one of them, so a thread can never run faster than one board
core, and threads on different "cores" run in parallel as on the board.

Where each thread sits is decided like a kernel load balancer would: a new process starts on
the core with the fewest threads (lab.substrate.local.node), and this balancer, one process per lab started
by `lab up` (recorded in the ledger, ended by teardown by PID), samples every thread's CPU time
(/proc/TID/schedstat) every TICK_S seconds and spreads the busy ones over the cores, busiest
first, each onto the least-loaded core, keeping a thread where it is while its core is within
TOLERANCE of the least-loaded one (no ping-pong). Idle threads stay where they are.

Run as `python -m lab.substrate.local.coreslots CONFIG.json`; CONFIG = {"nodes": {node: {"group": DIR,
"slots": [DIR, ...], "slot_cores": float}}} (DIR: the group's directory that holds its quota,
cgroups.cpu_dir), written by lab.substrate.local.cpuplan. `assign()` is the pure decision,
unit-tested; `Balancer.tick()` reads and moves.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from lab.core import cgroups

TICK_S = 0.1
#: exponential smoothing of a thread's measured rate (weight of the newest sample)
ALPHA = 0.5
#: a thread using less than this fraction of one core's quota is idle: it is never moved
BUSY_FRACTION = 0.05
#: keep a thread on its core while that core's load is within this fraction of one core's quota
#: of the least-loaded core's
TOLERANCE = 0.15


def assign(
    current: dict[int, int], rates: dict[int, float], n_slots: int, slot_quota: float
) -> dict[int, int]:
    """Which core each busy thread should be on: {tid: slot} for the threads to move.

    `current` maps every thread to its core now, `rates` its recent CPU rate (host cores). Busy
    threads (rate >= BUSY_FRACTION x slot_quota) are placed busiest first onto the least-loaded
    core (load = sum of the rates placed there so far); a thread keeps its core while that core
    is within TOLERANCE x slot_quota of the least-loaded one. Ties go to the lowest core number.
    """
    busy = [t for t in current if rates.get(t, 0.0) >= BUSY_FRACTION * slot_quota]
    busy.sort(key=lambda t: (-rates[t], t))
    load = [0.0] * n_slots
    moves = {}
    for t in busy:
        best = min(range(n_slots), key=lambda s: (load[s], s))
        cur = current[t]
        keep = 0 <= cur < n_slots and load[cur] <= load[best] + TOLERANCE * slot_quota
        choice = cur if keep else best
        load[choice] += rates[t]
        if choice != cur:
            moves[t] = choice
    return moves


def least_populated(slot_dirs: list[str]) -> str:
    """The core with the fewest threads (where a new process starts); the first on a tie."""
    return min(slot_dirs, key=lambda d: len(cgroups.thread_ids(d)))


def thread_cpu_ns(tid: int) -> int | None:
    """Nanoseconds thread `tid` has run (/proc/TID/schedstat, first field); None if gone."""
    try:
        with open(f"/proc/{tid}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class NodeSlots:
    group: str  # the node's own group (cgroups.cpu_dir): threads found there are placed too
    slots: list[str]
    slot_cores: float
    seen: dict[int, tuple[int, float]] = field(default_factory=dict)  # tid -> (ns, monotonic)
    rate: dict[int, float] = field(default_factory=dict)
    moves: int = 0

    def tick(self) -> None:
        where: dict[int, int] = {}
        for i, d in enumerate(self.slots):
            for t in cgroups.thread_ids(d):
                where[t] = i
        # threads in the node group itself (not yet on a core): the least populated core (a
        # data plane's set has no group of its own: "")
        for t in cgroups.thread_ids(self.group) if self.group else ():
            if cgroups.move_thread(least_populated(self.slots), t):
                self.moves += 1
        now = time.monotonic()
        for t in list(where):
            ns = thread_cpu_ns(t)
            if ns is None:
                del where[t]
                continue
            prev = self.seen.get(t)
            self.seen[t] = (ns, now)
            if prev is None or now <= prev[1]:
                continue
            r = (ns - prev[0]) / 1e9 / (now - prev[1])
            self.rate[t] = ALPHA * r + (1 - ALPHA) * self.rate.get(t, r)
        for t in set(self.seen) - set(where):
            self.seen.pop(t, None)
            self.rate.pop(t, None)
        for t, s in assign(where, self.rate, len(self.slots), self.slot_cores).items():
            if cgroups.move_thread(self.slots[s], t):
                self.moves += 1


def load_config(path: str | Path) -> dict[str, NodeSlots]:
    cfg = json.loads(Path(path).read_text())
    return {
        n: NodeSlots(c["group"], list(c["slots"]), float(c["slot_cores"]))
        for n, c in cfg["nodes"].items()
    }


def main(argv: list[str]) -> int:
    nodes = load_config(argv[0])
    running = True

    def stop(*_):
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while running:
        for n in nodes.values():
            try:
                n.tick()
            except OSError as e:  # a node's groups going away under us: teardown is running
                print(f"coreslots: {e}", file=sys.stderr, flush=True)
        time.sleep(TICK_S)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
