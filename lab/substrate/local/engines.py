"""Starting the lab's userspace impairment engine (lab-impaird) in a bump namespace: the
impairment bumps (lab.substrate.local.build.start_engines) and the NICs' side path
(lab.substrate.local.nicside)."""

from __future__ import annotations

from lab.core import cgroups, netops
from lab.core.errors import StartupError
from lab.core.state import Ledger
from lab.impair.engine import EngineClient, engine_argv
from lab.substrate.local.lab import CGROUP_PARENT, Lab
from lab.substrate.local.node import LocalNode


def bump_cgroup(lab_id: str, name: str) -> str:
    """The cgroup (relative path) of engine bump `name` of lab `lab_id`."""
    return f"{CGROUP_PARENT}/{lab_id}/{name}"


def create_bump(ledger: Ledger, layout, lab_id: str, name: str, ns: str, all_cpus: str) -> str:
    """The cgroup (on every CPU of the lab) and network namespace `ns` of engine bump `name`,
    each recorded in the ledger before it is created: the impairment bumps
    (lab.substrate.local.build) and the NICs' side bumps (lab.substrate.local.nicside). Returns
    the cgroup's relative path."""
    rel = bump_cgroup(lab_id, name)
    ledger.record("cgroup", rel=rel, node=name)
    cgroups.ensure_dir(layout, rel)
    cgroups.set_cpu(layout, rel, None, all_cpus)
    ledger.record("netns", name=ns, node=name)
    netops.create_netns(ns)
    return rel


def spawn_engine(lab: Lab, eng: dict, a: str, b: str) -> None:
    """Start the engine of bump record `eng` (its netns and cgroup made) between its interfaces
    `a` and `b` as pass-through; record its control socket and pid in `eng`; wait until it
    answers (also the NICs' side path, lab.substrate.local.nicside)."""

    idir = lab.dir / "impair"
    idir.mkdir(mode=0o700, exist_ok=True)
    procs = cgroups.procs_files(lab.cg, eng["cgroup"])
    if lab.cg.version == 1:
        # v1 child cpu groups get no realtime budget (cpu.rt_runtime_us = 0), and the engine
        # times delays with SCHED_FIFO threads: keep it in the root cpu group. It still joins
        # the cpuacct (accounting) and cpuset groups, by which teardown finds it.
        procs = [p for p in procs if not p.startswith(str(lab.cg.root / "cpu") + "/")]
    node = LocalNode(
        lab.id,
        eng["name"],
        netns=eng["netns"],
        mntns=None,
        procs_files=procs,
        ledger=lab.ledger,
        log_dir=lab.dir / "logs",
    )
    control = idir / f"{eng['name']}.sock"
    eng["control"] = str(control)
    d = node.spawn("lab-impaird", engine_argv(a, b, str(control)))
    eng["pid"], eng["start_time"] = d.pid, d.start_time
    try:
        EngineClient(control).wait_ready(5.0, proc=d.popen)
    except Exception as e:
        raise StartupError(f"{e}\n{d.log_tail()}") from e
