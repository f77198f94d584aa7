"""Boards over SSH as a substrate (`BoardsSubstrate`) and a lab on them as a handle
(`BoardsLab`): lab.substrate.boards.build puts a lab on boards (every change recorded first),
lab.substrate.boards.restore puts them back, lab.substrate.boards.target holds the runner's half."""

from __future__ import annotations

from lab.impair.runtime import check_request
from lab.substrate.base import DrivenLab, LabHandle, Substrate, UpRequest, impair_on
from lab.substrate.boards import build
from lab.substrate.boards.farm import list_farms
from lab.substrate.boards.impair import apply
from lab.substrate.boards.mapping import parse_map_option
from lab.substrate.boards.lab import BoardLab, interactive
from lab.substrate.boards.restore import restore
from lab.substrate.boards.target import BoardsTarget


class BoardsLab(DrivenLab):
    """A lab on boards over SSH; this machine keeps its ledger (lab.substrate.boards.lab)."""

    opener = BoardLab

    def up_note(self, status: dict, seconds: float) -> str:
        return f"on {len(status.get('nodes') or {})} boards in {seconds:.2f} s"

    def exec(self, node: str, argv: list[str]) -> int:
        return interactive(self.lab.board(node), argv)

    def shell(self, node: str) -> int:
        return self.exec(node, ["sh", "-l"])

    def impair(self, action: str, spec: str = "", target: str | None = None) -> dict:
        if action == "set" and not self.lab.info.get("impair"):
            check_request(self.lab, spec, target)  # refused before anything changes
            # a board lab built without --impair gets its points now: netem qdiscs, or the
            # engine spliced into the live port on the board (lab.substrate.boards.impair)
            apply(self.lab, self.lab.spec, "", None, at_run_time=True)
        return impair_on(self.lab, action, spec, target)

    def down(self, notes: list[str]) -> list[str]:
        if self._lab is not None:
            self._lab.close()
        return restore(self.id, notes)


class BoardsSubstrate(BoardsTarget, Substrate):
    """Raspberry Pi boards (or an emulated farm) of an inventory, reached over SSH. The runner's
    half (preflight, up, down, tunnel_alive, monitor) is lab.substrate.boards.target's."""

    name = "boards"
    flag = "--boards INVENTORY"
    removal_rank = 0  # before the rest: a board lab may run on an emulated farm, a local lab

    def __init__(self, inventory: str, mapping: list[str] | None = None):
        BoardsTarget.__init__(self, inventory, parse_map_option(list(mapping or [])))

    @classmethod
    def open_lab(cls, lab_id: str) -> LabHandle:
        return BoardsLab(lab_id)

    @classmethod
    def remove_lab(cls, lab_id: str, notes: list[str]) -> list[str]:
        return restore(lab_id, notes)

    @classmethod
    def kept_by_clean(cls) -> dict[str, str]:
        return {
            f["id"]: (
                f"board farm {f['id']!r} kept: it stands in for hardware "
                f"(`lab boards emulate --down --id {f['id']}` or `lab clean --farms` removes it)"
            )
            for f in list_farms()
        }

    def bring_up(self, spec, request: UpRequest) -> tuple[LabHandle, dict, list[str]]:
        blab = build.up(
            spec,
            self.inventory,
            mapping=self.mapping,
            lab_id=request.lab_id,
            vpn=request.vpn,
            impair=request.impair,
            placement=request.placement,
        )
        blab.close()
        notes = [f"lab: warning: {w}" for w in blab.info.get("warnings", [])]
        return BoardsLab(blab.id, blab), blab.status(), notes

    def describe(self) -> dict:
        return self.substrate()

    def lab_record(self, lab) -> dict:
        # real boards: their own NICs carry the packets, nothing to emulate
        nic = lab.info.get("nic_latency") or {
            "mode": "boards",
            "applied": False,
            "directions": {},
            "backend": None,
            "why": "real boards: each board's own NIC is on the path",
            "text": "the boards' own NICs",
        }
        return {"boards": lab.info["boards"], "nic_latency": nic}

    def tool_nodes(self, lab) -> dict[str, str]:
        return {name: "own" for name in lab.info["boards"]}  # a board's tools are all its own
