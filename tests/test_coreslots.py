"""Board cores as capped cgroups (lab/substrate/local/coreslots.py): the balancer's decision by hand, then a pi4
node on this machine: four per-core groups capped at one board core each under the node's
quota, a new process started on the emptiest core, two busy processes spread onto different
cores by the lab's balancer, a single busy thread never above one core's quota, and teardown
removing the groups and ending the balancer by PID."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lab.core import cgroups, proc
from lab.substrate.local.coreslots import BUSY_FRACTION, assign
from lab.substrate.local.build import up
from lab.core.teardown import teardown
from lab.model.topology import load_topology

from .conftest import TOPOS, kernel_quota_cores

Q = 0.25  # one core's quota in host cores


def test_busy_threads_are_spread_busiest_first():
    # two busy threads sharing core 0 (each got half of it), two idle ones there too
    current = {1: 0, 2: 0, 3: 0, 4: 0}
    rates = {1: 0.125, 2: 0.124, 3: 0.0, 4: 0.001}
    # 1 keeps core 0 (all empty: it is the least loaded, tie to the lowest); 2 goes to core 1;
    # the idle ones are never moved
    assert assign(current, rates, 4, Q) == {2: 1}


def test_a_thread_keeps_its_core_within_the_tolerance():
    # 1 on core 2 alone, 2 on core 0 alone: balanced, nothing moves (no ping-pong to core 0)
    assert assign({1: 2, 2: 0}, {1: 0.25, 2: 0.2}, 4, Q) == {}


def test_more_busy_threads_than_cores_share_the_least_loaded():
    current = {t: 0 for t in range(1, 6)}
    rates = {1: 0.05, 2: 0.05, 3: 0.05, 4: 0.05, 5: 0.05}
    moves = assign(current, rates, 4, Q)
    placed = {t: moves.get(t, 0) for t in current}
    # 1..4 one per core (ties to the lowest core), 5 joins core 0 (all equally loaded)
    assert placed == {1: 0, 2: 1, 3: 2, 4: 3, 5: 0}


def test_idle_threads_are_below_the_busy_fraction():
    rate = BUSY_FRACTION * Q * 0.99
    assert assign({1: 0, 2: 0}, {1: rate, 2: rate}, 2, Q) == {}


def _slots_of(lab, node):
    return lab.runtime[node].cpu_slots


def _core_of(slots, pid):
    return [i for i, d in enumerate(slots) if pid in cgroups.thread_ids(d)]


@pytest.mark.root
def test_pi4_node_gets_one_capped_group_per_board_core_and_busy_work_is_spread(lab_id):
    layout = cgroups.probe()
    if cgroups.slots_supported(layout):
        pytest.skip(f"per-core groups unavailable: {cgroups.slots_supported(layout)}")
    lab = up(load_topology(TOPOS / "pi_pair.py"), lab_id)
    try:
        cpu = lab.info["nodes"]["client"]["cpu"]
        slots = _slots_of(lab, "client")
        assert cpu["slots"] == 4 and len(slots) == 4
        assert cpu["cgroup"] == ("v1" if layout.version == 1 else "v2-threaded")
        node_rel = lab.runtime["client"].cgroup
        node_quota = kernel_quota_cores(lab.cg, node_rel)
        for i, d in enumerate(slots):
            assert Path(d).parent == cgroups.cpu_dir(layout, node_rel)
            assert kernel_quota_cores(lab.cg, f"{node_rel}/core{i}") == pytest.approx(
                cpu["slot_cores"], abs=0.01
            )
        # the node as a whole: all its (possibly scaled) cores
        assert node_quota == pytest.approx(cpu["cores"], abs=0.01)
        bal = lab.info["core_balancer"]
        assert proc.is_same_process(bal["pid"], bal["start_time"])

        node = lab.node("client")
        a = node.spawn("spin-a", ["sh", "-c", "while :; do :; done"])
        # started on the emptiest core: not where a runs
        b = node.spawn("spin-b", ["sh", "-c", "while :; do :; done"])
        assert _core_of(slots, a.pid) != _core_of(slots, b.pid)
        # both children of one shell start on its core; the balancer must split them
        c = node.spawn(
            "spin-cd", ["sh", "-c", "(while :; do :; done) & (while :; do :; done) & wait"]
        )
        deadline = time.monotonic() + 6
        kids: list[int] = []
        while time.monotonic() < deadline:
            kids = [
                int(x) for x in Path(f"/proc/{c.pid}/task/{c.pid}/children").read_text().split()
            ]
            cores = {i for k in kids for i in _core_of(slots, k)}
            if len(kids) == 2 and len(cores) == 2:
                break
            time.sleep(0.2)
        assert len(kids) == 2 and len({i for k in kids for i in _core_of(slots, k)}) == 2
        # a single busy thread is held to one core's quota, whatever the node's total
        ns0 = int(Path(f"/proc/{a.pid}/schedstat").read_text().split()[0])
        t0 = time.monotonic()
        time.sleep(2.0)
        ns1 = int(Path(f"/proc/{a.pid}/schedstat").read_text().split()[0])
        rate = (ns1 - ns0) / 1e9 / (time.monotonic() - t0)
        assert rate <= cpu["slot_cores"] * 1.2 + 0.02, (rate, cpu["slot_cores"])
        for d in (a, b, c):
            node.stop(d)
    finally:
        left = teardown(lab_id)
    assert left == []
    assert not proc.is_same_process(bal["pid"], bal["start_time"])
    assert not any(Path(d).exists() for d in slots)
