"""This machine's namespaces as a substrate (`LocalSubstrate`) and a lab of them as a handle
(`LocalLab`): lab.substrate.local.lab builds and opens the lab, lab.core.teardown removes it,
the runner's half is here too (a profile's lab with its impairment points; a point is applied by
lab.substrate.base.Substrate.apply_point)."""

from __future__ import annotations

import os
import shutil
import sys

from lab.core import proc
from lab.core.teardown import teardown
from lab.impair.runtime import check_request
from lab.substrate.base import DrivenLab, LabHandle, Substrate, UpRequest, impair_on
from lab.substrate.local.impair import ensure_points
from lab.substrate.local.build import up
from lab.substrate.local.lab import Lab, current_substrate
from lab.substrate.local.monitor import Monitor
from lab.substrate.local.nicside import steering
from lab.substrate.local.preflight import preflight
from lab.vpn.record import daemons_of, half_up
from lab.vpn.tunnel import prepare


class LocalLab(DrivenLab):
    """A lab of namespaces on this machine."""

    opener = Lab

    def exec(self, node: str, argv: list[str]) -> int:
        n = self.lab.node(node)
        sys.stdout.flush()
        return n.interactive(argv)

    def shell(self, node: str) -> int:
        n = self.lab.node(node)
        sh = os.environ.get("SHELL") or shutil.which("bash") or "/bin/sh"
        n.env.update({"PS1": f"[{self.id}:{node}] \\w# "})
        sys.stdout.flush()
        return n.interactive([sh, "--norc"] if sh.endswith("bash") else [sh])

    def impair(self, action: str, spec: str = "", target: str | None = None) -> dict:
        if action == "set":
            check_request(self.lab, spec, target)  # bad input changes nothing
            # a lab built without --impair gets its points now (the engine spliced in live)
            ensure_points(self.lab)
        return impair_on(self.lab, action, spec, target)

    def down(self, notes: list[str]) -> list[str]:
        return teardown(self.id, notes)


class LocalSubstrate(Substrate):
    """Network namespaces, mount namespaces and cgroups on this machine (or, inside the lab VM,
    on the guest's kernel: `describe()` says which)."""

    name = "local"
    supports_jobs = True

    @classmethod
    def open_lab(cls, lab_id: str) -> LabHandle:
        return LocalLab(lab_id)

    @classmethod
    def remove_lab(cls, lab_id: str, notes: list[str]) -> list[str]:
        return teardown(lab_id, notes)

    def bring_up(self, spec, request: UpRequest) -> tuple[LabHandle, dict, list[str]]:
        prepared = None
        if request.vpn:
            prepared = prepare(spec, request.vpn)  # bad profile or missing tool: nothing created
        lab = up(
            spec,
            request.lab_id,
            vpn=prepared,
            impair=request.impair,
            placement=request.placement,
            impair_backend=request.impair_backend,
        )
        notes = [f"lab: warning: {w}" for w in lab.info.get("warnings", [])]
        return LocalLab(lab.id, lab), lab.status(), notes

    # ------------------------------------------------------------------ lab run
    def preflight(self, plan):
        return preflight(plan)

    def describe(self) -> dict:
        return current_substrate()

    def up(self, spec, lab_id: str, profile: str, point, placement):
        """The lab with the profile's tunnel and, for an impaired group, its impairment points
        with nothing applied yet: the tunnel comes up and proves it passes traffic on a clean
        path, then the runner applies each point (a `loss 100%` point is a measured loss, not a
        failed bring-up)."""
        if point is not None and point.impaired:
            return up(spec, lab_id, vpn=profile, impair="none", placement=placement)
        return up(spec, lab_id, vpn=profile)

    def down(self, lab_id: str) -> list[str]:
        return teardown(lab_id)

    def owns(self, lab_id: str) -> bool:
        return True

    def tunnel_alive(self, lab) -> bool:
        """The lab still exists, its tunnel came up, and every VPN daemon is the process that
        was started."""
        if not (lab.dir / "lab.json").is_file() or half_up(lab):
            return False
        return all(proc.is_same_process(d.pid, d.start_time) for d in daemons_of(lab))

    def monitor(self, lab) -> Monitor:
        return Monitor.for_lab(lab)

    def nic_steering(self, lab, test):
        """The NICs' side path steered on around a latency test (lab.substrate.local.nicside)."""
        return steering(lab, test)
