"""Where a plan's labs are built on this machine (LocalTarget: namespaces through lab.lab) and
the impairment seam the runner and benches share: a lab built with its impairment points only
(up_lab), then a point put in place on the running lab (apply_impairment).
lab.boards.runtarget.BoardsTarget is the same interface on boards; lab.runner only calls it."""

from __future__ import annotations

import inspect
from typing import Any

from . import proc
from .errors import PreconditionError
from .monitor import Monitor
from .plan import ImpairmentPoint, Plan
from .runsetup import preflight
from .vpn.record import daemons_of


# ---------------------------------------------------------------------- impairment seam


def impairment_runtime():
    """lab.impair.runtime when this build has it, else None (impaired points then fail)."""
    try:
        from .impair import runtime
    except ImportError:
        return None
    return runtime


def up_lab(spec, lab_id: str, profile: str, point: ImpairmentPoint | None, placement: str | None):
    """Build the lab with the profile's tunnel and, for an impaired group, its impairment points
    with nothing applied yet: the tunnel comes up and proves it passes traffic on a clean path,
    then the runner applies each point (a `loss 100%` point is a measured loss, not a failed
    bring-up)."""
    from .lab import up

    kwargs: dict[str, Any] = {}
    if point is not None and point.impaired and "impair" in inspect.signature(up).parameters:
        kwargs = {"impair": "none", "placement": placement}
    return up(spec, lab_id, vpn=profile, **kwargs)


def apply_impairment(
    lab, point: ImpairmentPoint, *, built_impaired: bool, seed: int | None = None
) -> dict:
    """Put `point` in place on a running lab; returns what is really applied (show_impairment)."""
    rt = impairment_runtime()
    if not built_impaired and not point.impaired:
        return {"requested": "", "applied": "none (lab built without impairment)"}
    if rt is None:
        raise PreconditionError(
            "impairment at run time needs lab.impair.runtime, which this build lacks; "
            "run the unimpaired points only (-o impairments=none)"
        )
    # exactly the point's own spec, whatever earlier points left (set_point, not the shell's
    # merge rule); what is recorded is read back from the engine or qdisc, not the request
    shown = rt.set_point(lab, point.spec, seed=seed)
    if not shown.get("in_force"):
        raise PreconditionError(
            f"impairment {point.name!r} is not in force: expected {shown.get('expected')}, "
            f"the {shown.get('backend')} backend reports {shown.get('applied')}"
        )
    return {"requested": point.spec, **shown}


# ---------------------------------------------------------------------- where labs are built


class LocalTarget:
    """The plan's labs as namespaces on this machine (lab.lab). lab.boards.runtarget.BoardsTarget
    is the same on boards; the runner only calls these methods."""

    kind = "local"

    def substrate(self) -> dict:
        from .lab import current_substrate

        return current_substrate()

    def preflight(self, plan: Plan):
        return preflight(plan)

    def up(self, spec, lab_id: str, profile: str, point, placement):
        return up_lab(spec, lab_id, profile, point, placement)

    def down(self, lab_id: str) -> list[str]:
        from .teardown import teardown

        return teardown(lab_id)

    def tunnel_alive(self, lab) -> bool:
        """The lab still exists and every VPN daemon is the process that was started."""
        if not (lab.dir / "lab.json").is_file():
            return False
        return all(proc.is_same_process(d.pid, d.start_time) for d in daemons_of(lab))

    def monitor(self, lab) -> Monitor:
        return Monitor.for_lab(lab)

    def owns(self, lab_id: str) -> bool:
        return True
