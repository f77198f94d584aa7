"""Where a plan's labs are built on this machine (LocalTarget: namespaces through lab.substrate.local.lab) and
the impairment seam the runner and benches share: a lab built with its impairment points only
(up_lab), then a point put in place on the running lab (apply_impairment).
lab.substrate.boards.target.BoardsTarget is the same interface on boards; lab.campaign.runner only calls it."""

from __future__ import annotations

from typing import Any

from lab.core import proc
from lab.impair import runtime
from lab.substrate.local.lab import up
from lab.core.errors import PreconditionError
from lab.substrate.local.monitor import Monitor
from lab.model.impairment.points import ImpairmentPoint
from lab.substrate.local.preflight import preflight
from lab.vpn.profiles import Profile
from lab.vpn.record import daemons_of
from lab.vpn.tunnel import check_plan, place


# ---------------------------------------------------------------------- impairment seam


def up_lab(
    spec, lab_id: str, profile: Profile, point: ImpairmentPoint | None, placement: str | None
):
    """Build the lab with the profile's tunnel and, for an impaired group, its impairment points
    with nothing applied yet: the tunnel comes up and proves it passes traffic on a clean path,
    then the runner applies each point (a `loss 100%` point is a measured loss, not a failed
    bring-up). `profile` as the plan loaded it: placed and checked here, not read again."""
    kwargs: dict[str, Any] = {}
    if point is not None and point.impaired:
        kwargs = {"impair": "none", "placement": placement}
    return up(spec, lab_id, vpn=check_plan(spec, place(spec, profile)), **kwargs)


def apply_impairment(
    lab, point: ImpairmentPoint, *, built_impaired: bool, seed: int | None = None
) -> dict:
    """Put `point` in place on a running lab; returns what is really applied (show_impairment)."""
    if not built_impaired and not point.impaired:
        return {"requested": "", "applied": "none (lab built without impairment)"}
    # exactly the point's own impairment, whatever earlier points left (set_point, not the shell's
    # merge rule); what is recorded is read back from the engine or qdisc, not the request
    shown = runtime.set_point(lab, point.impairment, seed=seed)
    if not shown.get("in_force"):
        raise PreconditionError(
            f"impairment {point.name!r} is not in force: expected {shown.get('expected')}, "
            f"the {shown.get('backend')} backend reports {shown.get('applied')}"
        )
    return {"requested": point.spec, **shown}


# ---------------------------------------------------------------------- where labs are built


class LocalTarget:
    """The plan's labs as namespaces on this machine (lab.substrate.local.lab). lab.substrate.boards.target.BoardsTarget
    is the same on boards; the runner only calls these methods."""

    kind = "local"

    def substrate(self) -> dict:
        from lab.substrate.local.lab import current_substrate

        return current_substrate()

    def preflight(self, plan):
        return preflight(plan)

    def up(self, spec, lab_id: str, profile: Profile, point, placement):
        return up_lab(spec, lab_id, profile, point, placement)

    def down(self, lab_id: str) -> list[str]:
        from lab.core.teardown import teardown

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
