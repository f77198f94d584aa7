"""Board cores on cgroup v2, for real: inside the full-kernel VM (a Debian kernel under QEMU,
cgroup2 with the cpu controller, which this host's cgroups lack) a second cgroup2 mount under
/run is given to the lab's own code through LAB_CGROUP_ROOT, and tests/cgroup2guest.py builds a
pi4 lab there (lab.substrate.local.build.up) and reads the kernel's files. Asserted here:

- the threaded probe accepts the kernel and leaves nothing; the node's cpu record says
  "v2-threaded"; the node group is the threaded domain of threaded per-core groups, each with
  the quota the plan asks for in its cpu.max;
- a process with two busy threads enters one core group (LocalNode's placement), the lab's
  balancer moves one of its threads to another (cgroup.threads), cgroups.move_thread moves a
  thread to a third, and cgroup.threads and /proc/TID/cgroup agree; a thread of a process outside
  the node is refused by the kernel (EOPNOTSUPP: threads never leave their threaded domain);
- no busy thread and no core group uses more than its cpu.max over a window (a ratio to the
  quota with a generous margin: TCG is slow and shared; its throttle counter shows the cap bit);
- teardown removes the groups and ends the balancer.

Skipped, naming it, without QEMU or the VM kernel cache (scripts/fetch-kernel.sh).
"""

from __future__ import annotations

import errno
import json
import sys

import pytest

from lab.substrate.vm import boot
from tests.conftest import REPO, vm_kernel_or_skip

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(900)]

#: a thread or core group may use this many times its quota over the window (tick-granular
#: enforcement under an emulated CPU); plus one period's quota for the window's edges
MARGIN = 1.5
CG2 = "/run/cg2"


@pytest.fixture(scope="module")
def guest(tmp_path_factory):
    vm_kernel_or_skip()
    state = tmp_path_factory.mktemp("cg2vm") / "state"
    machine = boot(state, mem_mb=1024, cpus=2, cgroup="v2")
    try:
        machine.run(["mkdir", "-p", CG2])
        # nsdelegate as the guest's init mounts it: a cgroup2 mount sets the flags of the one hierarchy
        machine.run(["mount", "-t", "cgroup2", "-o", "nsdelegate", "cgroup2", CG2])
        cp = machine.run(
            [sys.executable, "-m", "tests.cgroup2guest"],
            env={
                "LAB_CGROUP_ROOT": CG2,
                "LAB_STATE_DIR": "/tmp/cg2-state",
                "LAB_RUN_DIR": "/tmp/cg2-run",
                "PYTHONPATH": str(REPO),
            },
            cwd=str(REPO),
            timeout=600,
        )
        leftover = machine.run(["find", f"{CG2}/lab", "-mindepth", "1", "-type", "d"], check=False)
    finally:
        machine.shutdown()
    out = json.loads(cp.stdout.strip().splitlines()[-1])
    out["leftover_groups"] = leftover.stdout.split()
    print(json.dumps(out, indent=1))  # shown with -s: every reading the assertions use
    return out


def _quota(cpu_max: str) -> float:
    quota, period = cpu_max.split()
    return int(quota) / int(period)


def test_threaded_groups_are_built_and_recorded(guest):
    assert guest["layout"] == {"version": 2, "root": CG2}
    assert guest["slots_supported"] is None and guest["probe_left"] == []
    cpu = guest["cpu"]
    assert cpu["cgroup"] == "v2-threaded" and "per_core_not_applied" not in cpu, cpu
    assert guest["status_cgroup"] == "v2-threaded"
    assert cpu["slots"] == 4 and len(guest["slots"]) == 4
    assert guest["node_type"] == "domain threaded" and "cpu" in guest["node_subtree_control"]
    assert guest["slot_type"] == ["threaded"] * 4
    for cm in guest["slot_cpu_max"]:
        assert _quota(cm) == pytest.approx(cpu["slot_cores"], abs=0.01)
        assert int(cm.split()[1]) == cpu["period_us"]
    assert _quota(guest["node_cpu_max"]) == pytest.approx(cpu["cores"], abs=0.01)
    assert guest["balancer"]["alive"]


def test_process_enters_one_core_group_and_threads_move_alone(guest):
    pid, busy = guest["pid"], guest["workers"]
    assert len(busy) == 2
    # the threaded domain lists the process; a threaded core group, the processes of its threads
    assert pid in guest["pids_node"]
    assert [pid in p for p in guest["pids_slots"]].count(True) >= 1
    # the monitor's view of the node: its threads in the threaded core groups too
    assert set(busy) <= set(guest["node_threads"])
    # the balancer split the two threads of one process onto two core groups
    spread = guest["spread"]
    assert spread and len({c[0] for c in spread.values()}) == 2, spread
    # move_thread put one thread where neither was, and the kernel says so
    mv = guest["move"]
    assert mv["returned"] is True and str(mv["tid"]) in mv["threads_file"], mv
    rel = guest["node_rel"]
    line = mv["proc_cgroup"][str(mv["tid"])]
    assert line == f"0::/{rel}/core{mv['to']}", mv
    other = busy[0] if busy[1] == mv["tid"] else busy[1]
    assert mv["proc_cgroup"][str(other)] == f"0::/{rel}/core{mv['other_thread_core'][0]}"
    assert mv["other_thread_core"] != [mv["to"]]
    assert guest["moved_still_there"] == [mv["to"]]
    assert guest["foreign_move"] == errno.EOPNOTSUPP, guest["foreign_move"]  # = ENOTSUP


@pytest.mark.parametrize("name", ["window_spread", "window_moved"])
def test_no_busy_thread_exceeds_its_groups_cpu_max(guest, name):
    w = guest[name]
    q = _quota(guest["slot_cpu_max"][0])
    period_s = guest["cpu"]["period_us"] / 1e6
    limit = q * (w["seconds"] * MARGIN + period_s)
    for tid, used in w["thread_cpu_s"].items():
        assert used <= limit, (tid, used, limit, w)
    for i, c in enumerate(w["cores"]):
        assert c["usage_usec"] / 1e6 <= limit, (i, c, limit, w)
    # the cap really bit: every core group holding a busy thread was throttled in the window
    held = {c for cores in w["where"].values() for c in cores}
    assert held and all(w["cores"][i]["nr_throttled"] > 0 for i in held), w


def test_teardown_removes_the_groups_and_the_balancer(guest):
    assert guest["teardown_left"] == []
    assert guest["slots_after"] == [False] * 4 and guest["node_after"] is False
    assert guest["balancer_after"] is False
    assert guest["leftover_groups"] == []
