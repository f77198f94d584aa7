"""results.csv's `throttled` and `throttled_periods` (issue 30): every row of a test whose nodes
had a CPU cap shows the seconds and CFS periods they were throttled; a lab without caps leaves
them empty (not 0). The plumbing on hand-made monitor summaries and fake cgroup trees, and a
real reading: a busy loop in a capped node of a real lab, monitored the way the runner does."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from lab.core import cgroups
from lab.core.hostreadings import node_uncapped
from lab.core.teardown import teardown
from lab.model.topology import load_topology
from lab.results.rundir import cfs_throttling, rows
from lab.substrate.local.build import up
from lab.substrate.local.monitor import Monitor


def _line(monitor: dict) -> dict:
    return {
        "case": "p|none|tcp|0",
        "profile": "p",
        "test": "tcp",
        "label": "tcp",
        "rep": 0,
        "ok": True,
        "records": [{"test": "tcp", "ok": True}],
        "monitor": monitor,
    }


def test_the_column_sums_the_capped_nodes():
    mon = {
        "nodes": {
            "client": {"throttled_s": 0.5, "throttled_periods": 10},
            "server": {"throttled_s": 0.25, "throttled_periods": 5},
            "router": {"throttled_s": None, "throttled_periods": None},  # no quota
        }
    }
    assert cfs_throttling(mon) == (0.75, 15.0)
    (row,) = rows("R", [_line(mon)])
    assert row["throttled"] == 0.75 and row["throttled_periods"] == 15.0
    assert row["firmware_throttled"] is None  # no vcgencmd here
    # a capped node that was never throttled reads 0, not empty
    (row,) = rows("R", [_line({"nodes": {"a": {"throttled_s": 0.0, "throttled_periods": 0}}})])
    assert row["throttled"] == 0.0 and row["throttled_periods"] == 0.0
    # no capped node, no monitor, a board's summary: empty
    for mon in ({"nodes": {"a": {"throttled_s": None}}}, {}, {"nodes": {"b": {"total": {}}}}):
        (row,) = rows("R", [_line(mon)])
        assert row["throttled"] is None and row["throttled_periods"] is None


def _write(p: Path, text: str) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def test_an_uncapped_node_reads_null_not_zero(tmp_path):
    layout = cgroups.CgroupLayout(1, tmp_path)
    for node, quota in (("capped", "2407"), ("free", "-1")):
        d = tmp_path / "cpu" / "lab" / "x" / node
        _write(d / "cpu.cfs_quota_us", "-1\n")
        _write(d / "core0" / "cpu.cfs_quota_us", f"{quota}\n")
        for g in (d, d / "core0"):
            _write(g / "cpu.stat", "nr_periods 9\nnr_throttled 0\nthrottled_time 0\n")
        _write(tmp_path / "cpuacct" / "lab" / "x" / node / "cpuacct.usage", "0\n")
    assert not node_uncapped(layout, "lab/x/capped") and node_uncapped(layout, "lab/x/free")
    assert not node_uncapped(layout, "lab/x/gone")  # nothing read: counters read as they are
    v2 = cgroups.CgroupLayout(2, tmp_path / "v2")
    _write(v2.root / "lab" / "x" / "a" / "cpu.max", "max 10000\n")
    _write(v2.root / "lab" / "x" / "b" / "cpu.max", "2407 10000\n")
    assert node_uncapped(v2, "lab/x/a") and not node_uncapped(v2, "lab/x/b")

    groups = {"capped": "lab/x/capped", "free": "lab/x/free"}
    mon = Monitor(layout, groups, vcgencmd=False, temp_sensors=lambda: {}, proc=tmp_path / "p")
    mon.sample()
    time.sleep(0.06)
    mon.sample()
    s = mon.summary()
    assert s["nodes"]["capped"]["throttled_periods"] == 0
    assert s["nodes"]["free"]["throttled_periods"] is None
    (row,) = rows("R", [_line(s)])
    assert row["throttled"] == 0.0 and row["throttled_periods"] == 0.0


@pytest.mark.root
def test_a_capped_nodes_run_fills_the_column(lab_id, tmp_path):
    """A real lab: a busy loop in a node capped at a quarter core, the monitor started and
    stopped around it as the runner does; the row shows the throttling, the uncapped node none."""
    topo = tmp_path / "capped.py"
    topo.write_text(
        textwrap.dedent("""
        from mininet.topo import Topo
        class T(Topo):
            def build(self):
                self.addLink(self.addHost("busy", cpu=0.25), self.addHost("idle"))
        topos = {"t": T}
    """)
    )
    lab = up(load_topology(topo), lab_id)
    node = lab.node("busy")
    loop = node.spawn("spin", ["python3", "-c", "while True: pass"])
    try:
        mon = Monitor.for_lab(lab).start()
        time.sleep(1.5)
        summary = mon.stop()
    finally:
        node.stop(loop)
        assert teardown(lab_id) == []
    assert summary["nodes"]["idle"]["throttled_s"] is None
    (row,) = rows("R", [_line(summary)])
    assert row["throttled"] is not None and row["throttled"] > 0, summary["nodes"]
    assert row["throttled_periods"] is not None and row["throttled_periods"] > 0
