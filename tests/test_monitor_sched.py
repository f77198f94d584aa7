"""The monitor's scheduler view of a node: throttled CFS periods and run-queue wait (issue 16).

A node held back by this machine's other work (threads waiting on a run queue, its groups not
throttled) must be told apart from one held back by its board's cores (throttled): fake cgroup
and /proc trees with hand-set counters, no root needed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from lab.core import cgroups
from lab.core.hostreadings import node_thread_sched, node_throttling
from lab.substrate.local.monitor import Monitor, host_contention_warning, host_held_nodes


def _write(p: Path, text: str) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def _cpu_stat(p: Path, throttled: int, ns: int = 7) -> None:
    _write(p / "cpu.stat", f"nr_periods 50\nnr_throttled {throttled}\nthrottled_time {ns}\n")


def _schedstat(proc: Path, tid: int, run_ns: int, wait_ns: int) -> None:
    _write(proc / str(tid) / "schedstat", f"{run_ns} {wait_ns} 3\n")


def test_readers_on_fake_trees(tmp_path):
    v1 = cgroups.CgroupLayout(1, tmp_path / "v1")
    node = v1.root / "cpu" / "lab" / "x" / "a"
    _cpu_stat(node, 2)
    _cpu_stat(node / "core0", 1)
    _cpu_stat(node / "core1", 4)
    # the node's group and its core groups
    assert node_throttling(v1, "lab/x/a") == (7, 21)
    assert node_throttling(v1, "lab/x/gone") is None
    proc = tmp_path / "proc"
    _write(v1.root / "cpuacct" / "lab" / "x" / "a" / "tasks", "101\n102\n103\n")
    _schedstat(proc, 101, 5, 6)
    _schedstat(proc, 102, 7, 8)  # 103 has exited: skipped
    assert node_thread_sched(v1, "lab/x/a", proc) == {101: (5, 6), 102: (7, 8)}
    assert node_thread_sched(v1, "lab/x/gone", proc) == {}
    v2 = cgroups.CgroupLayout(2, tmp_path / "v2")
    _write(v2.root / "lab" / "x" / "a" / "cpu.stat", "nr_throttled 3\nthrottled_usec 40\n")
    _write(v2.root / "lab" / "x" / "a" / "cgroup.threads", "101\n")
    assert node_throttling(v2, "lab/x/a") == (3, 40_000)
    assert node_thread_sched(v2, "lab/x/a", proc) == {101: (5, 6)}


def test_monitor_sums_throttling_and_run_queue_wait(tmp_path):
    root, proc = tmp_path / "cg", tmp_path / "proc"
    layout = cgroups.CgroupLayout(1, root)
    a_cpu, a_acct = root / "cpu" / "lab" / "x" / "a", root / "cpuacct" / "lab" / "x" / "a"
    _write(a_acct / "cpuacct.usage", "1000000000\n")
    _write(root / "cpuacct" / "lab" / "x" / "b" / "cpuacct.usage", "0\n")  # b: uncapped, no tasks
    _cpu_stat(a_cpu, 2)
    _cpu_stat(a_cpu / "core0", 1)
    _write(a_acct / "tasks", "101\n102\n")
    _schedstat(proc, 101, 1_000_000_000, 500_000_000)
    _schedstat(proc, 102, 2_000_000, 0)
    mon = Monitor(
        layout,
        {"a": "lab/x/a", "b": "lab/x/b"},
        vcgencmd=False,
        temp_sensors=lambda: {},
        proc=proc,
    )
    mon.sample()  # primes

    time.sleep(0.06)
    _cpu_stat(a_cpu, 5, 7)  # +3 periods, no time (the node's own quota)
    _cpu_stat(a_cpu / "core0", 2, 150_000_007)  # +1 period of 0.15 s
    _schedstat(proc, 101, 1_200_000_000, 1_100_000_000)  # ran 0.2 s, waited 0.6 s
    (proc / "102" / "schedstat").unlink()  # 102 exits; 103 is new: counted from its 1st sample
    _write(a_acct / "tasks", "101\n103\n")
    _schedstat(proc, 103, 50_000_000, 40_000_000)
    first = mon.sample()
    assert first["nodes"]["a"]["throttled_periods"] == 4
    assert first["nodes"]["a"]["throttled_s"] == pytest.approx(0.15)
    assert first["nodes"]["a"]["run_s"] == pytest.approx(0.2)
    assert first["nodes"]["a"]["runq_wait_s"] == pytest.approx(0.6)

    time.sleep(0.06)
    _schedstat(proc, 103, 150_000_000, 140_000_000)  # ran 0.1 s, waited 0.1 s; no throttling
    mon.sample()

    s = mon.summary()
    assert s["nodes"]["a"]["throttled_periods"] == 4
    assert s["nodes"]["a"]["throttled_s"] == pytest.approx(0.15)
    assert s["nodes"]["a"]["run_queue"] == {
        "run_s": pytest.approx(0.3),
        "wait_s": pytest.approx(0.7),
        "wait_per_run": pytest.approx(2.3333, abs=1e-4),
    }
    assert s["nodes"]["b"]["throttled_periods"] is None and s["nodes"]["b"]["throttled_s"] is None
    assert s["nodes"]["b"]["run_queue"] == {"run_s": 0.0, "wait_s": 0.0, "wait_per_run": None}
    assert "errors" not in s  # a node without cpu.stat or tasks is not an error
    json.dumps(s)


def _summary(**nodes) -> dict:
    return {
        "nodes": {
            n: {"throttled_s": thr, "run_queue": {"run_s": run, "wait_s": wait}}
            for n, (run, wait, thr) in nodes.items()
        }
    }


def test_host_held_nodes_and_the_report_warning():
    s = _summary(
        a=(1.0, 2.0, 0.05),  # waited twice as long as it ran, throttled 0.05 s: the host
        b=(1.0, 2.0, 0.5),  # throttling (x10 = 5 s) could explain the wait: the board's caps
        c=(0.01, 1.0, None),  # ran 10 ms: an idle node's wake-ups say nothing
        d=(1.0, 0.9, None),  # waited less than it ran
    )
    assert host_held_nodes(s) == ["a"]
    assert host_held_nodes({"nodes": {"e": {"total": {"mean": 1.0}}}}) == []  # older summary
    assert host_held_nodes({}) == []
    results = [{"monitor": s}, {"monitor": _summary(b=(1.0, 2.0, 0.5))}, {"ok": False}]
    w = host_contention_warning(results)
    assert w is not None and w.startswith("1 of 3 tests ran with node threads waiting")
    assert host_contention_warning(results[1:]) is None
