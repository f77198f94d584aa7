"""Run inside the full-kernel VM by tests/test_cgroup2_vm.py (`python -m tests.cgroup2guest`),
with LAB_CGROUP_ROOT pointing at a cgroup2 mount that has the cpu controller: the lab's own code
builds a pi4 lab there (`build.up`: the threaded probe, the node groups, their threaded per-core
groups, the balancer), a process with two busy threads is started in a node (LocalNode's
placement), the balancer spreads them and lab.core.cgroups.move_thread moves one; then the
kernel's own files are read: cgroup.type, cpu.max, cgroup.threads, /proc/TID/cgroup, cpu.stat
and /proc/TID/schedstat over a window. Prints one JSON object; the host test asserts on it.

Nothing here judges: it gathers, so that a failed assertion on the host shows every reading."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

from lab import REPO
from lab.core import cgroups, proc
from lab.core.teardown import teardown
from lab.model.topology import load_topology
from lab.substrate.local.build import up

LAB_ID = "cg2t"
#: seconds of CPU use read per window (guest clock); a mechanism check, not a figure
WINDOW_S = 3.0
#: two threads that stay busy: hashlib releases the GIL on large buffers, so both run at once
BUSY = """
import hashlib, threading
buf = bytes(1 << 20)
def spin():
    while True:
        hashlib.sha256(buf).digest()
ts = [threading.Thread(target=spin, daemon=True) for _ in range(2)]
for t in ts:
    t.start()
for t in ts:
    t.join()
"""


def workers(pid: int) -> list[int]:
    return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid)


def cores_of(slots: list[str], tid: int) -> list[int]:
    return [i for i, d in enumerate(slots) if tid in cgroups.thread_ids(d)]


def v2_line(tid: int) -> str:
    """The cgroup2 line of /proc/TID/cgroup ("0::/path")."""
    lines = Path(f"/proc/{tid}/cgroup").read_text().splitlines()
    return next((ln for ln in lines if ln.startswith("0::")), "")


def cpu_stat(d: str) -> dict[str, int]:
    text = Path(d, "cpu.stat").read_text()
    return {k: int(v) for k, v in (ln.split() for ln in text.splitlines() if ln)}


def thread_ns(tid: int) -> int:
    return int(Path(f"/proc/{tid}/schedstat").read_text().split()[0])


def wait_for(what, budget_s: float):
    """Poll `what()` until it returns something true, for at most `budget_s`; the last value."""
    deadline = time.monotonic() + budget_s
    while True:
        v = what()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(0.2)


def window(slots: list[str], threads: list[int]) -> dict:
    """CPU used per thread and per core group over WINDOW_S, from the kernel's counters."""
    s0 = [cpu_stat(d) for d in slots]
    n0 = {t: thread_ns(t) for t in threads}
    t0 = time.monotonic()
    time.sleep(WINDOW_S)
    n1 = {t: thread_ns(t) for t in threads}
    t1 = time.monotonic()
    s1 = [cpu_stat(d) for d in slots]
    return {
        "seconds": t1 - t0,
        "thread_cpu_s": {str(t): (n1[t] - n0[t]) / 1e9 for t in threads},
        "where": {str(t): cores_of(slots, t) for t in threads},
        "cores": [
            {k: s1[i].get(k, 0) - s0[i].get(k, 0) for k in ("usage_usec", "nr_throttled")}
            for i in range(len(slots))
        ],
    }


def main() -> int:
    out: dict = {}
    layout = cgroups.probe()
    out["layout"] = {"version": layout.version, "root": str(layout.root)}
    out["slots_supported"] = cgroups.slots_supported(layout)
    out["probe_left"] = sorted(
        p.name for p in layout.root.iterdir() if p.name.startswith("lab-threaded-probe-")
    )
    lab = up(load_topology(REPO / "topologies" / "pi_pair.py"), LAB_ID)
    slots: list[str] = []
    try:
        rec = lab.info["nodes"]["client"]
        rel, slots, cpu = rec["cgroup"], rec["cpu_slots"], rec["cpu"]
        node_dir = layout.root / rel
        out.update(cpu=cpu, slots=slots, node_rel=rel)
        # what `lab status --json` (and so a run manifest) says of the node's CPU model
        out["status_cgroup"] = lab.status()["nodes"]["client"]["cpu"].get("cgroup")
        out["node_type"] = (node_dir / "cgroup.type").read_text().strip()
        out["node_subtree_control"] = (node_dir / "cgroup.subtree_control").read_text().split()
        out["node_cpu_max"] = (node_dir / "cpu.max").read_text().strip()
        out["slot_type"] = [Path(d, "cgroup.type").read_text().strip() for d in slots]
        out["slot_cpu_max"] = [Path(d, "cpu.max").read_text().strip() for d in slots]
        bal = lab.info["core_balancer"]
        out["balancer"] = {"alive": proc.is_same_process(bal["pid"], bal["start_time"]), **bal}

        node = lab.node("client")
        d = node.spawn("spin2", ["python3", "-c", BUSY])
        busy = wait_for(lambda: (w := workers(d.pid)) and len(w) == 2 and w, 60)
        out["pid"], out["workers"] = d.pid, busy
        out["pids_node"] = cgroups.pids(layout, rel)
        out["node_threads"] = cgroups.node_threads(layout, rel)
        out["pids_slots"] = [
            cgroups.pids(layout, cgroups.slot_rel(rel, i)) for i in range(len(slots))
        ]

        # the lab's balancer spreads the two busy threads (single threads via cgroup.threads)
        def spread():
            where = {t: cores_of(slots, t) for t in busy}
            cores = [c[0] for c in where.values() if len(c) == 1]
            return len(cores) == 2 and len(set(cores)) == 2 and where

        out["spread"] = {str(t): c for t, c in (wait_for(spread, 120) or {}).items()}
        out["window_spread"] = window(slots, busy)

        # the lab's own function moves one thread to a core group neither is on
        where = {t: cores_of(slots, t) for t in busy}
        taken = {c for cs in where.values() for c in cs}
        target = min(set(range(len(slots))) - taken)
        moved_tid = busy[1]
        out["move"] = {
            "tid": moved_tid,
            "to": target,
            "returned": cgroups.move_thread(slots[target], moved_tid),
            "threads_file": Path(slots[target], "cgroup.threads").read_text().split(),
            "proc_cgroup": {str(t): v2_line(t) for t in busy},
            "other_thread_core": cores_of(slots, busy[0]),
        }
        # a thread of a process outside the node (this script's): the kernel refuses it
        try:
            cgroups.move_thread(slots[0], threading.get_native_id())
            out["foreign_move"] = "moved"
        except OSError as e:
            out["foreign_move"] = e.errno
        out["window_moved"] = window(slots, busy)
        out["moved_still_there"] = cores_of(slots, moved_tid)
        node.stop(d)
    finally:
        out["teardown_left"] = teardown(LAB_ID)
    out["slots_after"] = [Path(s).exists() for s in slots]
    out["node_after"] = (layout.root / out.get("node_rel", "lab/none")).exists()
    bal = out.get("balancer") or {}
    out["balancer_after"] = bool(bal) and proc.is_same_process(bal["pid"], bal["start_time"])
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
