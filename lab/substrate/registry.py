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

import importlib
import json
from dataclasses import dataclass

from lab.core.errors import ConfigError
from lab.core.state import Ledger, lab_dir
from lab.substrate.base import LabHandle, Substrate
from lab.substrate.local.lab import current_substrate, resolve_id


@dataclass(frozen=True)
class Entry:
    """Where a substrate's class lives, and the marks its labs' own records carry: the kind of
    the ledger's first line, or of lab.json's substrate record."""

    path: str  # "module:Class", imported when a lab of it (or the kind) is asked for
    marks: frozenset[str] = frozenset()


#: name -> entry, in the order a lab's records are matched (local last: it takes what is left).
#: A substrate's module is imported only when it is needed: `lab status` of a local lab does not
#: load the boards' or the VM's code.
SUBSTRATES: dict[str, Entry] = {
    "boards": Entry(
        "lab.substrate.boards.substrate:BoardsSubstrate", frozenset({"boardlab", "boards"})
    ),
    "vm": Entry("lab.substrate.vm.substrate:VmSubstrate", frozenset({"vm-lab"})),
    "local": Entry("lab.substrate.local.substrate:LocalSubstrate"),
}
#: substrate records written before the kinds had one spelling: "host" was this machine
_OLD_NAMES = {"host": "local"}


def get(name: str) -> type[Substrate]:
    """The class of substrate `name` (imported now if it was not)."""
    entry = SUBSTRATES.get(_OLD_NAMES.get(name, name))
    if entry is None:
        raise ConfigError(f"unknown substrate {name!r}; known: {', '.join(SUBSTRATES)}", field="on")
    module, _, cls = entry.path.partition(":")
    return getattr(importlib.import_module(module), cls)


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
        return get("boards")(boards, mapping)
    in_vm = current_substrate().get("kind") == "vm"
    if vm or (plan is not None and plan.vm and not in_vm):
        return get("vm")(vm_mem_mb)
    return get("local")()


def _marks(lab_id: str) -> set[str]:
    """The kinds lab `lab_id`'s own records name: its ledger's first line, lab.json's substrate
    (either may be missing: a lab killed half-built)."""
    marks = set()
    entries = Ledger(lab_dir(lab_id) / "ledger.jsonl").entries()
    if entries:
        marks.add(entries[0].get("kind"))
    try:
        info = json.loads((lab_dir(lab_id) / "lab.json").read_text())
        marks.add((info.get("substrate") or {}).get("kind"))
    except (OSError, ValueError):
        pass
    return marks


def kind_of(lab_id: str) -> type[Substrate]:
    """The substrate lab `lab_id` runs on, from its own records."""
    marks = _marks(lab_id)
    return get(next(n for n, e in SUBSTRATES.items() if e.marks & marks or not e.marks))


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
    for name in SUBSTRATES:
        out.update(get(name).kept_by_clean())
    return out


def remove(lab_id: str, notes: list[str]) -> list[str]:
    """Tear down lab `lab_id` from its ledger alone, whatever it runs on (`lab clean`; a lab
    whose lab.json is gone or half-written included). What is left over."""
    return kind_of(lab_id).remove_lab(lab_id, notes)


def _recorded(substrate: dict | None) -> tuple[type[Substrate] | None, dict]:
    sub = substrate or {}
    kind = sub.get("kind")
    return (get(kind) if _OLD_NAMES.get(kind, kind) in SUBSTRATES else None), sub


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
