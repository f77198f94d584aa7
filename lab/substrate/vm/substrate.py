"""The full-kernel VM as a substrate (`VmSubstrate`) and a lab inside it as a handle (`VmLab`):
each call crosses into the guest as the guest's own `lab` command line through the VM's agent
(lab.substrate.vm.lab); JSON comes back. A whole plan runs inside a throwaway VM."""

from __future__ import annotations

import json
import sys
from typing import Any

from lab.core.errors import CommandError
from lab.core.teardown import teardown
from lab.substrate.base import LabHandle, Substrate, UpRequest
from lab.substrate.local.preflight import preflight
from lab.substrate.vm import lab as vmlab


class VmLab(LabHandle):
    """A lab inside the full-kernel VM; the host keeps the VM's ledger (lab.substrate.vm.lab)."""

    def up_note(self, status: dict, seconds: float) -> str:
        return f"in a VM in {seconds:.2f} s (boot {(status.get('vm') or {}).get('boot_seconds')} s)"

    def _guest(self, argv: list[str], what: str) -> Any:
        """Run the guest's `lab ARGV --json`; its parsed JSON, or its error as a LabError."""
        cp = vmlab.forward(self.id, [*argv, "--json"])
        if cp.returncode != 0:
            raise CommandError(
                [f"lab {what} (in the VM of lab {self.id!r})"],
                cp.returncode,
                (cp.stderr or cp.stdout).strip().removeprefix("lab: error: "),
            )
        return json.loads(cp.stdout or "null")

    def status(self) -> dict:
        return vmlab.status(self.id)

    def exec(self, node: str, argv: list[str]) -> int:
        sys.stdout.flush()
        return vmlab.forward_interactive(self.id, ["exec", "--id", self.id, node, "--", *argv])

    def shell(self, node: str) -> int:
        sys.stdout.flush()
        return vmlab.forward_interactive(self.id, ["shell", "--id", self.id, node])

    def impair(self, action: str, spec: str = "", target: str | None = None) -> dict:
        argv = ["impair", action, "--id", self.id]
        if action == "set":
            argv += [target or "all", *spec.split()]
        return self._guest(argv, f"impair {action}")

    def down(self, notes: list[str]) -> list[str]:
        return vmlab.down(self.id, notes)


class VmSubstrate(Substrate):
    """A stock Debian kernel under QEMU with the host root shared read-only: every kernel data
    plane this machine's kernel lacks. `lab up --vm`; `lab run --vm` runs the whole plan inside."""

    name = "vm"
    flag = "--vm"
    runs_whole_plan = True
    supports_shards = False

    def __init__(self, mem_mb: int = 2048):
        self.mem_mb = mem_mb

    @classmethod
    def open_lab(cls, lab_id: str) -> LabHandle:
        return VmLab(lab_id)

    @classmethod
    def remove_lab(cls, lab_id: str, notes: list[str]) -> list[str]:
        # QEMU is in the host lab's ledger by PID: the ordinary teardown stops it
        return teardown(lab_id, notes)

    @classmethod
    def status_line(cls, substrate: dict) -> str | None:
        return (
            f"substrate: VM, kernel {substrate.get('kernel')}, accelerator "
            f"{substrate.get('accelerator')} (QEMU pid {substrate.get('qemu_pid')}); "
            f"{substrate.get('note')}"
        )

    @classmethod
    def report_rows(cls, substrate: dict) -> list[list[str]]:
        rows = [
            [
                "substrate",
                f"full-kernel VM, kernel {substrate.get('kernel')}, accelerator "
                f"{str(substrate.get('accelerator')).upper()} on host kernel "
                f"{substrate.get('host_kernel')}",
            ]
        ]
        if substrate.get("evidence") == "functional":
            rows.append(["warning", str(substrate.get("note"))])
        return rows

    @classmethod
    def report_warnings(cls, substrate: dict) -> list[str]:
        if substrate.get("evidence") == "functional":
            return [f"Functional evidence only: {substrate.get('note')}"]
        return []

    def bring_up(self, spec, request: UpRequest) -> tuple[LabHandle, dict, list[str]]:
        rec = vmlab.up(
            spec,
            request.topology_file,
            request.lab_id,
            list(request.guest_args),
            vpn=request.vpn,
            impair=request.impair,
            placement=request.placement,
            mem_mb=self.mem_mb,
        )
        status = {**rec["status"], "substrate": rec["substrate"], "vm": rec["vm"]}
        return VmLab(rec["id"]), status, rec.pop("guest_stderr", "").splitlines()

    def preflight(self, plan):
        # tools and topology on this machine (the guest shares its root); the kernel's data
        # planes are the guest's, so they are not asked of this kernel
        return preflight(plan, kernel=False)

    def run_plan(self, plan, run, plan_path, **kw) -> tuple[int, list[str], list[str]]:
        return vmlab.run_plan(plan, run, plan_path, mem_mb=self.mem_mb, **kw)
