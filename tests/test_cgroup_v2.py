"""lab.core.cgroups' per-core groups on both hierarchies, against fake directory trees: the
writes each operation makes (recorded in order), the files threads are read from and moved
through, the refusal a kernel without threaded cpu groups gives, and what a node's cpu record
and `lab status` say. The fake tree plays the kernel's part (the files a new group gets) before
each call; that the kernel really behaves so is tests/test_cgroup2_vm.py's job."""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path

import pytest
from rich.console import Console

import lab.cli.printing as cliprint
from lab.core import cgroups
from lab.core.errors import PreconditionError
from lab.substrate.local import coreslots
from lab.substrate.local.dataplane import group_rel

NODE = "lab/l1/client"


@pytest.fixture
def writes(monkeypatch):
    """Every file write lab.core.cgroups makes, as (path, value), in order (and still done)."""
    done: list[tuple[str, str]] = []
    real = cgroups._write

    def record(path, value):
        done.append((str(path), value))
        real(path, value)

    monkeypatch.setattr(cgroups, "_write", record)
    return done


def _group(d: Path, files: dict[str, str]) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name).write_text(text)
    return d


def _v2(tmp_path: Path, node_controllers: str = "cpu cpuset") -> cgroups.CgroupLayout:
    """A cgroup2 tree with node group NODE as the kernel leaves it after ensure_dir."""
    root = _group(
        tmp_path / "cg2",
        {"cgroup.controllers": "cpuset cpu io memory pids\n", "cgroup.subtree_control": ""},
    )
    _group(
        root / NODE,
        {
            "cgroup.controllers": node_controllers + "\n",
            "cgroup.subtree_control": "\n",
            "cgroup.type": "domain\n",
            "cgroup.procs": "",
            "cgroup.threads": "",
            "cpu.max": "max 100000\n",
        },
    )
    return cgroups.CgroupLayout(2, root)


def _v2_child(layout: cgroups.CgroupLayout, name: str) -> Path:
    """What the kernel creates with a child of NODE once NODE enables cpu for its children."""
    return _group(
        layout.root / NODE / name,
        {"cgroup.type": "domain\n", "cgroup.threads": "", "cpu.max": "max 100000\n"},
    )


def _v1(tmp_path: Path) -> cgroups.CgroupLayout:
    root = tmp_path / "cg1"
    for c in cgroups.V1_CONTROLLERS:
        _group(root / c / NODE, {"cgroup.procs": "", "tasks": ""})
    return cgroups.CgroupLayout(1, root)


def _rel(layout, done):
    return [(str(Path(p).relative_to(layout.root)), v) for p, v in done]


def test_v2_slot_is_a_threaded_child_capped_in_cpu_max(tmp_path, writes):
    layout = _v2(tmp_path)
    _v2_child(layout, "core0")
    d = cgroups.ensure_slot(layout, NODE, 0, 0.25, period_us=10_000)
    assert d == str(layout.root / NODE / "core0")
    # the cpu controller for the node's children, then threaded (only while empty), then the cap
    assert _rel(layout, writes) == [
        (f"{NODE}/cgroup.subtree_control", "+cpu"),
        (f"{NODE}/core0/cgroup.type", "threaded"),
        (f"{NODE}/core0/cpu.max", "2500 10000"),
    ]
    assert not (layout.root / "cpu").exists()
    # again (the kernel now shows what was written): only the cap is written
    (layout.root / NODE / "cgroup.subtree_control").write_text("cpu\n")
    writes.clear()
    cgroups.ensure_slot(layout, NODE, 0, 0.3, period_us=10_000)
    assert _rel(layout, writes) == [(f"{NODE}/core0/cpu.max", "3000 10000")]


def test_v2_data_plane_group_beside_the_cores_is_threaded_too(tmp_path, writes):
    layout = _v2(tmp_path)
    _v2_child(layout, "dp0")
    dp_rel = group_rel(NODE, 0)
    d = cgroups.ensure_slot(layout, NODE, 0, 0.5, period_us=10_000, rel_of=dp_rel)
    assert d == str(layout.root / NODE / "dp0")
    assert (f"{d}/cgroup.type", "threaded") in writes and (f"{d}/cpu.max", "5000 10000") in writes
    assert cgroups.slot_rel(NODE, 3) == f"{NODE}/core3"


def test_v2_slot_without_the_cpu_controller_is_refused_before_anything_exists(tmp_path, writes):
    layout = _v2(tmp_path, node_controllers="cpuset")
    with pytest.raises(PreconditionError, match="no cpu controller"):
        cgroups.ensure_slot(layout, NODE, 0, 0.25)
    assert writes == [] and not (layout.root / NODE / "core0").exists()


def test_v1_slot_is_unchanged_a_cpu_hierarchy_child(tmp_path, writes):
    layout = _v1(tmp_path)
    d = cgroups.ensure_slot(layout, NODE, 1, 0.25, period_us=10_000)
    assert d == str(layout.root / "cpu" / NODE / "core1")
    assert _rel(layout, writes) == [
        (f"cpu/{NODE}/core1/cpu.cfs_period_us", "10000"),
        (f"cpu/{NODE}/core1/cpu.cfs_quota_us", "2500"),
    ]
    assert not (layout.root / "cpuacct" / NODE / "core1").exists()


def test_cpu_dir_and_set_cpu_write_the_hierarchys_files(tmp_path, writes):
    v1, v2 = _v1(tmp_path), _v2(tmp_path)
    assert cgroups.cpu_dir(v1, NODE) == v1.root / "cpu" / NODE
    assert cgroups.cpu_dir(v2, NODE) == v2.root / NODE
    cgroups.set_cpu(v2, NODE, None)
    cgroups.set_cpu(v1, NODE, 1.0, period_us=20_000)
    assert [(Path(p).name, v) for p, v in writes] == [
        ("cpu.max", "max 100000"),
        ("cpu.cfs_period_us", "20000"),
        ("cpu.cfs_quota_us", "20000"),
    ]


@pytest.mark.parametrize("version", [1, 2])
def test_threads_are_read_and_moved_through_the_hierarchys_file(tmp_path, writes, version):
    layout = _v1(tmp_path) if version == 1 else _v2(tmp_path)
    threads = "tasks" if version == 1 else "cgroup.threads"
    slots = []
    for i, tids in enumerate(["11\n12\n", "13\n", "14\n15\n16\n"]):
        d = Path(cgroups.cpu_dir(layout, cgroups.slot_rel(NODE, i)))
        _group(d, {threads: tids, "cgroup.procs": ""})
        slots.append(str(d))
    assert cgroups.thread_ids(slots[0]) == [11, 12]
    assert coreslots.least_populated(slots) == slots[1]
    assert cgroups.move_thread(slots[1], 12) is True
    assert writes == [(f"{slots[1]}/{threads}", "12")]
    # a whole process enters a core group through its cgroup.procs on both
    assert cgroups.procs_file(slots[1]) == f"{slots[1]}/cgroup.procs"
    assert cgroups.thread_ids(str(tmp_path / "gone")) == []


def test_a_v2_nodes_threads_include_its_threaded_core_groups(tmp_path):
    from lab.core.hostreadings import node_thread_sched

    layout = _v2(tmp_path)
    (layout.root / NODE / "cgroup.threads").write_text("101\n")
    _v2_child(layout, "core0").joinpath("cgroup.threads").write_text("102\n103\n")
    _v2_child(layout, "core1").joinpath("cgroup.threads").write_text("104\n")
    assert sorted(cgroups.node_threads(layout, NODE)) == [101, 102, 103, 104]
    proc = tmp_path / "proc"
    for tid in (101, 103, 104):  # 102 has exited
        _group(proc / str(tid), {"schedstat": f"{tid} {tid + 1} 1\n"})
    assert node_thread_sched(layout, NODE, proc) == {t: (t, t + 1) for t in (101, 103, 104)}
    assert node_thread_sched(layout, "lab/l1/gone", proc) == {}
    v1 = _v1(tmp_path)
    (v1.root / "cpuacct" / NODE / "tasks").write_text("7\n8\n")
    assert cgroups.node_threads(v1, NODE) == [7, 8]


def test_move_thread_gone_is_false_refused_is_raised(tmp_path, monkeypatch):
    d = _group(tmp_path / "g", {"cgroup.threads": ""})

    def refuse(code):
        def w(path, value):
            raise OSError(code, os.strerror(code))

        return w

    monkeypatch.setattr(cgroups, "_write", refuse(errno.ESRCH))
    assert cgroups.move_thread(str(d), 7) is False
    # v2: a thread of a process outside the group's threaded domain
    monkeypatch.setattr(cgroups, "_write", refuse(errno.EOPNOTSUPP))
    with pytest.raises(OSError) as e:
        cgroups.move_thread(str(d), 7)
    assert e.value.errno == errno.EOPNOTSUPP


def test_threaded_probe_refused_by_the_kernel_removes_what_it_made(tmp_path, monkeypatch):
    layout = _v2(tmp_path)
    rel = f"lab-threaded-probe-{os.getpid()}"
    # the kernel's part: the probe group and its child as mkdir leaves them
    _group(layout.root / rel, {"cgroup.controllers": "cpu cpuset\n", "cgroup.subtree_control": ""})
    _group(layout.root / rel / "core0", {"cgroup.type": "domain\n", "cpu.max": "max 100000\n"})
    real = cgroups._write

    def kernel(path, value):
        if Path(path).name == "cgroup.type":  # a kernel without threaded cpu groups
            raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))
        real(path, value)

    monkeypatch.setattr(cgroups, "_write", kernel)
    monkeypatch.setattr(cgroups, "_SLOTS_PROBED", {})
    monkeypatch.setattr(Path, "rmdir", _rmdir_like_cgroupfs)
    why = cgroups.slots_supported(layout)
    assert why and "refused" in why and os.strerror(errno.EOPNOTSUPP) in why, why
    assert not (layout.root / rel).exists()
    # asked once per root: the answer is kept
    assert cgroups.slots_supported(layout) == why
    assert cgroups.slots_supported(cgroups.CgroupLayout(1, layout.root)) is None


def _rmdir_like_cgroupfs(self: Path) -> None:
    """cgroupfs removes a group with its interface files; a plain directory needs them gone."""
    if self.is_dir():
        for f in self.iterdir():
            if f.is_file():
                f.unlink()
    os.rmdir(self)


def test_the_cgroup_record_names_the_mechanism(tmp_path):
    v1, v2 = cgroups.CgroupLayout(1, tmp_path), cgroups.CgroupLayout(2, tmp_path)
    assert cgroups.cgroup_record(v1, slots=4) == "v1"
    assert cgroups.cgroup_record(v1, slots=0) == "v1"
    assert cgroups.cgroup_record(v2, slots=4) == "v2-threaded"
    assert cgroups.cgroup_record(v2, slots=0) == "v2"
    assert cgroups.cgroup_record(v2, slots=0, refused="kernel said no") == "v2-one-core"


def test_a_refused_kernel_keeps_one_board_core_and_says_so(tmp_path, monkeypatch):
    from lab.model.topology import load_topology
    from lab.substrate.local.cpuplan import cpu_plan

    from .conftest import TOPOS

    layout = cgroups.CgroupLayout(2, tmp_path)
    monkeypatch.setattr(cgroups, "slots_supported", lambda _layout: "cgroup v2: refused (test)")
    spec = load_topology(TOPOS / "pi_pair.py")
    plan, warnings = cpu_plan(spec, layout, {"kind": "local", "kernel": "test"})
    p = plan["client"]
    assert p["slots"] == 0 and p["emulated_cores"] == 1.0, p
    assert p["per_core_not_applied"] == "cgroup v2: refused (test)"
    assert any("refused (test)" in w for w in warnings)
    record = cgroups.cgroup_record(layout, slots=p["slots"], refused=p["per_core_not_applied"])
    assert record == "v2-one-core"
    # and where the kernel takes threaded groups, every core
    monkeypatch.setattr(cgroups, "slots_supported", lambda _layout: None)
    plan, _ = cpu_plan(load_topology(TOPOS / "pi_pair.py"), layout, {"kind": "local"})
    assert plan["client"]["slots"] == 4 and "per_core_not_applied" not in plan["client"]


def test_lab_status_prints_the_mechanism_in_the_cpu_column(monkeypatch):
    buf = io.StringIO()
    monkeypatch.setattr(cliprint, "out", Console(file=buf, width=250))
    node = {"kind": "host", "netns": "l1-client", "router": False, "interfaces": []}
    cliprint.print_status(
        {
            "id": "l1",
            "state": "up",
            "topology": "topologies/pi_pair.py",
            "nodes": {
                "client": {
                    **node,
                    "cpu": {"profile": "pi4", "cores": 0.9, "cgroup": "v2-threaded"},
                },
                "server": {**node, "cpu": {"profile": "pi4", "cores": 0.3, "cgroup": "v1"}},
                "router": {**node, "cpu": {"profile": None, "cores": None, "cgroup": "v2"}},
            },
        }
    )
    rows = {
        ln.split("│")[1].strip().split()[0]: ln for ln in buf.getvalue().splitlines() if "│" in ln
    }
    assert "cgroup v2-threaded" in rows["client"]
    assert "cgroup v1" in rows["server"]
    assert "cgroup" not in rows["router"]  # uncapped: nothing to model
