"""The substrates, by name: the one place that lists the kinds a lab can run on.

    select(vm=..., boards=..., ...)  -> Substrate   the one the command line (or plan) asks for
    open_lab(lab_id)                 -> LabHandle   a lab that is up, found by its ledger
    clean_order(ids)                 -> ids in `lab clean`'s order; kept_by_clean()
    remove(lab_id, notes)            -> left over   `lab clean` of one lab, whatever it runs on
    status_line(status)              -> str | None  what a lab runs on, when worth a line
    report_rows(sub), report_warnings(sub)          what a run report says of it

A new substrate is a package under lab/substrate/ with a lab.substrate.base.Substrate subclass,
and one entry in SUBSTRATES here; nothing above lab/substrate/ asks which kind it holds.
"""

from __future__ import annotations

from lab.core.errors import ConfigError
from lab.substrate.base import LabHandle, Substrate
from lab.substrate.boards.substrate import BoardsSubstrate
from lab.substrate.local.lab import current_substrate, resolve_id
from lab.substrate.local.substrate import LocalSubstrate
from lab.substrate.vm.substrate import VmSubstrate

#: name -> class, in the order a lab's ledger is matched (local last: it takes what is left)
SUBSTRATES: dict[str, type[Substrate]] = {
    BoardsSubstrate.name: BoardsSubstrate,
    VmSubstrate.name: VmSubstrate,
    LocalSubstrate.name: LocalSubstrate,
}
#: substrate records written before the kinds had one spelling: "host" was this machine
_OLD_NAMES = {"host": "local"}


def get(name: str) -> type[Substrate]:
    cls = SUBSTRATES.get(_OLD_NAMES.get(name, name))
    if cls is None:
        raise ConfigError(f"unknown substrate {name!r}; known: {', '.join(SUBSTRATES)}", field="on")
    return cls


def select(
    *,
    vm: bool = False,
    boards: str | None = None,
    mapping: list[str] | None = None,
    vm_mem_mb: int = 2048,
    plan=None,
) -> Substrate:
    """The substrate the command line asks for (--vm, --boards INVENTORY [--map ...]) or the
    plan does (`vm = true`); this machine's namespaces otherwise. Inside the lab VM, a plan's
    `vm = true` is this VM: its cases run on the guest's own namespaces."""
    if vm and boards:
        raise ConfigError("--vm and --boards exclude each other", field="--boards")
    if boards:
        return BoardsSubstrate(boards, mapping)
    in_vm = current_substrate().get("kind") == VmSubstrate.name
    if vm or (plan is not None and plan.vm and not in_vm):
        return VmSubstrate(vm_mem_mb)
    return LocalSubstrate()


def kind_of(lab_id: str) -> type[Substrate]:
    """The substrate lab `lab_id` runs on, from its own records."""
    return next(cls for cls in SUBSTRATES.values() if cls.holds(lab_id))


def open_lab(lab_id: str | None) -> LabHandle:
    """The lab `lab_id` names (without one: the only lab up), on whatever it runs."""
    lab_id = resolve_id(lab_id)
    return kind_of(lab_id).open_lab(lab_id)


def clean_order(ids: list[str]) -> list[str]:
    """`lab clean`'s order: labs on boards first (they may run on an emulated board farm,
    itself a lab of this machine), then the rest."""
    return sorted(ids, key=lambda i: (kind_of(i).removal_rank, i))


def kept_by_clean() -> dict[str, str]:
    """{lab id: why} of labs `lab clean` keeps unless told otherwise (emulated board farms)."""
    out: dict[str, str] = {}
    for cls in SUBSTRATES.values():
        out.update(cls.kept_by_clean())
    return out


def remove(lab_id: str, notes: list[str]) -> list[str]:
    """Tear down lab `lab_id` from its ledger alone, whatever it runs on (`lab clean`; a lab
    whose lab.json is gone or half-written included). What is left over."""
    return kind_of(lab_id).remove_lab(lab_id, notes)


def _recorded(substrate: dict | None) -> tuple[type[Substrate] | None, dict]:
    sub = substrate or {}
    kind = sub.get("kind")
    return SUBSTRATES.get(_OLD_NAMES.get(kind, kind)), sub


def status_line(status: dict) -> str | None:
    """One line on what a lab (or a run's session) runs on, when the user should know it."""
    cls, sub = _recorded(status.get("substrate"))
    return cls.status_line(sub) if cls is not None else None


def report_rows(substrate: dict | None) -> list[list[str]]:
    """A run report's set-up rows on what it ran on (manifest `substrate`)."""
    cls, sub = _recorded(substrate)
    return cls.report_rows(sub) if cls is not None else []


def report_warnings(substrate: dict | None) -> list[str]:
    """A run report's warnings because of what it ran on (manifest `substrate`)."""
    cls, sub = _recorded(substrate)
    return cls.report_warnings(sub) if cls is not None else []


def check_resume(run, substrate: Substrate) -> None:
    """A run started on one substrate resumes on the same one."""
    kinds = {
        _OLD_NAMES.get(k, k)
        for s in (run.manifest() or {}).get("sessions", [])
        if (k := (s.get("substrate") or {}).get("kind"))
    }
    here = (substrate.describe() or {}).get("kind")
    if not kinds or _OLD_NAMES.get(here, here) in kinds:
        return
    was = get(sorted(kinds)[0])
    if was.flag:
        raise ConfigError(
            f"{run.path} ran on {was.name}: resume it with {was.flag}", field=was.flag.split()[0]
        )
    raise ConfigError(
        f"{run.path} ran on this machine: resume it without {substrate.flag.split()[0]}",
        field=substrate.flag.split()[0],
    )
