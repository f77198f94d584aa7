"""Starting the lab's userspace impairment engine (lab-impaird) in a bump namespace: the
impairment bumps (lab.substrate.local.build.start_engines) and the NICs' side path
(lab.substrate.local.nicside)."""

from __future__ import annotations

from lab.core import cgroups
from lab.core.errors import StartupError
from lab.impair.engine import EngineClient, engine_argv
from lab.substrate.local.lab import Lab
from lab.substrate.local.node import LocalNode


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
