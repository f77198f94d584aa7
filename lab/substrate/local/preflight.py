"""Can a plan run on this machine's namespaces? Every profile prepared here (kernel data planes,
tools) and every test's tools on PATH, before anything is created."""

from __future__ import annotations

from lab import REPO
from lab.core import proc
from lab.core.errors import KernelFeatureMissing, PreconditionError
from lab.measure import TESTS
from lab.model.topology import load_topology
from lab.vpn.tunnel import check_plan, place


def preflight(plan, *, kernel: bool = True):
    """The plan's topology spec, once every profile can run here and every tool is on PATH;
    else PreconditionError listing every problem (and what to do about kernel data planes).
    Checked before the run directory or anything else is created. kernel=False: the plan will
    run in the full-kernel VM (tools and topology are checked, kernel features are not)."""
    spec = load_topology(REPO / plan.topology_file, plan.topo, plan.topology_params)
    problems, runnable, need_vm = [], [], []
    for p in plan.profiles:
        try:
            check_plan(spec, place(spec, plan.loaded[p]), kernel=kernel)
            runnable.append(p)
        except KernelFeatureMissing as e:
            problems.append(str(e))
            need_vm.append(p)
        except PreconditionError as e:
            problems.append(str(e))
    for t in plan.tests:
        test = TESTS[t.test]
        for tool in {*test.client_tools, *test.server_tools}:
            if not proc.which(tool):
                problems.append(f"test {t.label!r} needs {tool} (not on PATH)")
    if problems:
        hint = ""
        if need_vm:
            hint = (
                "\nrun the whole plan in the full-kernel VM with `lab run --vm` (kernel data "
                "planes), or leave those profiles out: -o 'profiles="
                + ",".join(runnable or ["..."])
                + "'"
            )
        raise PreconditionError("cannot run this plan here:\n  " + "\n  ".join(problems) + hint)
    return spec
