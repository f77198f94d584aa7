"""One interface for a lab, whatever it runs on (issue 14): the CLI holds no substrate branches.

    bring_up(spec, ..., on="local" | "vm" | "boards")  -> LabHandle   build a lab (nothing left
                                                            on failure)
    open_lab(lab_id)                         -> LabHandle   a lab that is up, found by its ledger

A LabHandle answers `status()`, `exec(node, argv)`, `shell(node)`, `impair(action, ...)` and
`down(notes)`. Implementations:
  LocalLab  namespaces on this machine (lab.substrate.local.lab.Lab; objects, no strings in between)
  VmLab     a lab inside the full-kernel VM (lab.substrate.vm.lab): each call crosses into the guest as the
            guest's own `lab` command line through the VM's agent; JSON comes back
  BoardsLab boards over SSH (lab.substrate.boards.lab): every change recorded, restored at down
Nothing above this module asks what a lab runs on.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from abc import ABC, abstractmethod
from typing import Any

from lab.core.errors import CommandError, LabError
from lab.substrate.local.lab import Lab, resolve_id

#: the substrates `bring_up` knows, for --help and error messages
KINDS = ("local", "vm", "boards")


def choose(*, vm: bool = False, boards: str | None = None) -> str:
    """The substrate the command-line flags ask for (--vm, --boards INVENTORY)."""
    if vm and boards:
        from lab.core.errors import ConfigError

        raise ConfigError("--vm and --boards exclude each other", field="--boards")
    return "boards" if boards else "vm" if vm else "local"


class LabHandle(ABC):
    """A running lab, whatever it runs on."""

    kind: str

    def __init__(self, lab_id: str):
        self.id = lab_id

    def up_note(self, status: dict, seconds: float) -> str:
        """How the bring-up went, for the user: "in 0.41 s", "in a VM in 9.2 s (boot 4.1 s)"."""
        return f"in {seconds:.2f} s"

    @abstractmethod
    def status(self) -> dict:
        """`lab status --json` of this lab: id, state, topology, nodes, substrate, ..."""

    @abstractmethod
    def exec(self, node: str, argv: list[str]) -> int:
        """Run `argv` in host node `node` attached to this terminal (or these pipes); exit code."""

    @abstractmethod
    def shell(self, node: str) -> int:
        """An interactive shell in `node`; its exit code."""

    @abstractmethod
    def impair(self, action: str, spec: str = "", target: str | None = None) -> dict:
        """action "set" (tc-netem words on `target`: a link, NODE:IFACE, or None for all),
        "clear" or "show"; returns what the backend reports as applied (show_impairment)."""

    @abstractmethod
    def down(self, notes: list[str]) -> list[str]:
        """Remove exactly what the lab created; notes get what the user should know; returns
        what is left over."""


def impair_on(lab, action: str, spec: str = "", target: str | None = None) -> dict:
    """LabHandle.impair for a lab object this process drives itself (namespaces here, or
    boards over SSH): the runtime impairment calls, on that lab."""
    from lab.impair import runtime

    if action == "set":
        return runtime.set_impairment(lab, spec, target)
    if action == "clear":
        return runtime.clear_impairment(lab)
    return runtime.show_impairment(lab)


class LocalLab(LabHandle):
    """A lab of namespaces on this machine."""

    kind = "local"

    def __init__(self, lab_id: str, lab: Lab | None = None):
        super().__init__(lab_id)
        self._lab = lab

    @property
    def lab(self) -> Lab:
        if self._lab is None:
            self._lab = Lab.open(self.id)
        return self._lab

    def status(self) -> dict:
        try:
            return self.lab.status()
        except LabError as e:
            return {"id": self.id, "state": f"broken ({e}); run `lab clean`"}

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
            from lab.impair.runtime import check_request
            from lab.substrate.local.impair import ensure_points

            check_request(self.lab, spec, target)  # bad input changes nothing
            # a lab built without --impair gets its points now (the engine spliced in live)
            ensure_points(self.lab)
        return impair_on(self.lab, action, spec, target)

    def down(self, notes: list[str]) -> list[str]:
        from lab.core.teardown import teardown

        return teardown(self.id, notes)


class VmLab(LabHandle):
    """A lab inside the full-kernel VM; the host keeps the VM's ledger (lab.substrate.vm.lab)."""

    kind = "vm"

    def up_note(self, status: dict, seconds: float) -> str:
        return f"in a VM in {seconds:.2f} s (boot {(status.get('vm') or {}).get('boot_seconds')} s)"

    def _guest(self, argv: list[str], what: str) -> Any:
        """Run the guest's `lab ARGV --json`; its parsed JSON, or its error as a LabError."""
        from lab.substrate.vm import lab as vmlab

        cp = vmlab.forward(self.id, [*argv, "--json"])
        if cp.returncode != 0:
            raise CommandError(
                [f"lab {what} (in the VM of lab {self.id!r})"],
                cp.returncode,
                (cp.stderr or cp.stdout).strip().removeprefix("lab: error: "),
            )
        return json.loads(cp.stdout or "null")

    def status(self) -> dict:
        from lab.substrate.vm import lab as vmlab

        return vmlab.status(self.id)

    def exec(self, node: str, argv: list[str]) -> int:
        from lab.substrate.vm import lab as vmlab

        sys.stdout.flush()
        return vmlab.forward_interactive(self.id, ["exec", "--id", self.id, node, "--", *argv])

    def shell(self, node: str) -> int:
        from lab.substrate.vm import lab as vmlab

        sys.stdout.flush()
        return vmlab.forward_interactive(self.id, ["shell", "--id", self.id, node])

    def impair(self, action: str, spec: str = "", target: str | None = None) -> dict:
        argv = ["impair", action, "--id", self.id]
        if action == "set":
            argv += [target or "all", *spec.split()]
        return self._guest(argv, f"impair {action}")

    def down(self, notes: list[str]) -> list[str]:
        from lab.substrate.vm import lab as vmlab

        return vmlab.down(self.id, notes)


class BoardsLab(LabHandle):
    """A lab on boards over SSH; this machine keeps its ledger (lab.substrate.boards.lab)."""

    kind = "boards"

    def __init__(self, lab_id: str, lab=None):
        super().__init__(lab_id)
        self._lab = lab

    @property
    def lab(self):
        from lab.substrate.boards.lab import BoardLab

        if self._lab is None:
            self._lab = BoardLab.open(self.id)
        return self._lab

    def up_note(self, status: dict, seconds: float) -> str:
        return f"on {len(status.get('nodes') or {})} boards in {seconds:.2f} s"

    def status(self) -> dict:
        try:
            return self.lab.status()
        except LabError as e:
            return {"id": self.id, "state": f"broken ({e}); run `lab clean`"}

    def exec(self, node: str, argv: list[str]) -> int:
        from lab.substrate.boards.lab import interactive

        return interactive(self.lab.board(node), argv)

    def shell(self, node: str) -> int:
        return self.exec(node, ["sh", "-l"])

    def impair(self, action: str, spec: str = "", target: str | None = None) -> dict:
        if action == "set" and not self.lab.info.get("impair"):
            from lab.substrate.boards.impair import apply
            from lab.impair.runtime import check_request

            check_request(self.lab, spec, target)  # refused before anything changes
            # a board lab built without --impair gets its points now: netem qdiscs, or the
            # engine spliced into the live port on the board (lab.substrate.boards.impair)
            apply(self.lab, self.lab.spec, "", None, at_run_time=True)
        return impair_on(self.lab, action, spec, target)

    def down(self, notes: list[str]) -> list[str]:
        from lab.substrate.boards.restore import restore

        if self._lab is not None:
            self._lab.close()
        return restore(self.id, notes)


def open_lab(lab_id: str | None) -> LabHandle:
    """The lab `lab_id` names (without one: the only lab up), on whatever it runs."""
    from lab.substrate.vm import lab as vmlab
    from lab.substrate.boards.lab import is_board_lab

    lab_id = resolve_id(lab_id)
    if is_board_lab(lab_id):
        return BoardsLab(lab_id)
    return VmLab(lab_id) if vmlab.is_vm_lab(lab_id) else LocalLab(lab_id)


def removal_order(ids: list[str]) -> list[str]:
    """`lab clean`'s order: labs on boards first (they may run on an emulated board farm,
    itself a lab of this machine), then the rest."""
    from lab.substrate.boards.lab import is_board_lab

    return sorted(ids, key=lambda i: (not is_board_lab(i), i))


def remove(lab_id: str, notes: list[str]) -> list[str]:
    """Tear down lab `lab_id` from its ledger alone, whatever it runs on (`lab clean`; a lab
    whose lab.json is gone or half-written included). What is left over."""
    from lab.substrate.boards.lab import is_board_lab

    if is_board_lab(lab_id):
        from lab.substrate.boards.restore import restore

        return restore(lab_id, notes)
    from lab.core.teardown import teardown

    return teardown(lab_id, notes)


def bring_up(
    spec,
    *,
    on: str = "local",
    lab_id: str | None = None,
    vpn: str | None = None,
    impair: str | None = None,
    placement: str | None = None,
    impair_backend: str = "auto",
    topology_file: str | None = None,
    guest_args: list[str] | None = None,
    vm_mem_mb: int = 2048,
    inventory: str | None = None,
    mapping: list[str] | None = None,
) -> tuple[LabHandle, dict, list[str]]:
    """Build `spec` on substrate `on`; (handle, status, lines for the user's stderr). Bad input is refused before anything is
    created and a failure unwinds what was built (lab.substrate.local.lab.up, lab.substrate.vm.lab.up).

    `topology_file` and `guest_args` (the `-p`/`--topo`/... words a guest's `lab up` needs) are
    what crosses into a VM: the guest loads the same file itself. `inventory` (a boards.toml
    or Ansible inventory) and `mapping` (["client=pi-a", ...]) say which boards, for "boards".
    """
    if on == "boards":
        from lab.substrate.boards import build
        from lab.substrate.boards.inventory import load_inventory
        from lab.substrate.boards.mapping import parse_map_option

        inv = load_inventory(inventory)
        blab = build.up(
            spec,
            inv,
            mapping=parse_map_option(list(mapping or [])),
            lab_id=lab_id,
            vpn=vpn,
            impair=impair,
            placement=placement,
        )
        blab.close()
        notes = [f"lab: warning: {w}" for w in blab.info.get("warnings", [])]
        return BoardsLab(blab.id, blab), blab.status(), notes
    if on == "vm":
        from lab.substrate.vm import lab as vmlab

        rec = vmlab.up(
            spec,
            topology_file,
            lab_id,
            list(guest_args or []),
            vpn=vpn,
            impair=impair,
            placement=placement,
            mem_mb=vm_mem_mb,
        )
        status = {**rec["status"], "substrate": rec["substrate"], "vm": rec["vm"]}
        return VmLab(rec["id"]), status, rec.pop("guest_stderr", "").splitlines()
    if on != "local":
        from lab.core.errors import ConfigError

        raise ConfigError(f"unknown substrate {on!r}; known: {', '.join(KINDS)}", field="on")
    from lab.substrate.local.lab import up

    prepared = None
    if vpn:
        from lab.vpn.tunnel import prepare

        prepared = prepare(spec, vpn)  # bad profile or missing tool: nothing is created
    lab = up(
        spec,
        lab_id,
        vpn=prepared,
        impair=impair,
        placement=placement,
        impair_backend=impair_backend,
    )
    notes = [f"lab: warning: {w}" for w in lab.info.get("warnings", [])]
    return LocalLab(lab.id, lab), lab.status(), notes


def run_plan_on(on: str, plan, run, plan_path, **kw) -> tuple[int, list[str], list[str]]:
    """Run a whole plan on substrate `on` (a runner of its own there, results in `run`):
    "vm" boots a throwaway full-kernel VM (lab.substrate.vm.lab.run_plan). (exit code, left over, notes)."""
    if on == "vm":
        from lab.substrate.vm import lab as vmlab

        return vmlab.run_plan(plan, run, plan_path, **kw)
    from lab.core.errors import ConfigError

    raise ConfigError(f"a whole plan cannot be handed to substrate {on!r}", field="on")


def run_target(*, boards: str | None = None, mapping: list[str] | None = None, vm: bool = False):
    """Where `lab run` builds its labs when not on this machine's namespaces or in the VM:
    a lab.substrate.boards.target.BoardsTarget for --boards INVENTORY, else None."""
    if not boards:
        return None
    choose(vm=vm, boards=boards)  # --vm with --boards: refused
    from lab.substrate.boards.mapping import parse_map_option
    from lab.substrate.boards.target import BoardsTarget

    return BoardsTarget(boards, parse_map_option(list(mapping or [])))


def check_resume_target(run, target) -> None:
    """A run started on boards resumes on boards (and one started here, here)."""
    from lab.core.errors import ConfigError

    m = run.manifest() or {}
    kinds = {(s.get("substrate") or {}).get("kind") for s in m.get("sessions", [])}
    if "boards" in kinds and target is None:
        raise ConfigError(
            f"{run.path} ran on boards: resume it with --boards INVENTORY", field="--boards"
        )
    if target is not None and kinds and "boards" not in kinds:
        raise ConfigError(
            f"{run.path} ran on this machine: resume it without --boards", field="--boards"
        )


def plan_substrate(plan) -> str:
    """Where a plan's cases run: "vm" when it asks for the full-kernel VM (`vm = true`, `--vm`)
    and this process is not already inside one, else "local"."""
    from lab.substrate.local.lab import current_substrate

    return "vm" if plan.vm and current_substrate().get("kind") != "vm" else "local"


def substrate_line(status: dict) -> str | None:
    """One line on what a lab runs on, when it is not this machine's own kernel."""
    sub = status.get("substrate") or {}
    if sub.get("kind") != "vm":
        return None
    return (
        f"substrate: VM, kernel {sub.get('kernel')}, accelerator {sub.get('accelerator')} "
        f"(QEMU pid {sub.get('qemu_pid')}); {sub.get('note')}"
    )
