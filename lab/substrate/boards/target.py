"""Where `lab run --boards` builds its labs: the plan's topology on the inventory's boards.

The runner asks a target to check the plan, build and remove each profile's lab, say whether the
tunnel still runs and give a monitor; lab.substrate.local.substrate.LocalSubstrate is this machine's namespaces,
this is the same on boards (lab.substrate.boards.lab). Tools the plan's tests need are checked on the boards
the test ends run on, not on this machine.
"""

from __future__ import annotations

from lab import REPO

from lab.core.errors import LabError, PreconditionError
from lab.vpn.profiles import Profile
from lab.vpn.record import TunnelRecord, daemons_of, half_up
from lab.vpn.tunnel import place
from lab.substrate.boards.inventory import load_inventory
from lab.substrate.boards.mapping import map_nodes
from lab.substrate.boards.monitor import BoardMonitor
from lab.model.topology import load_topology
from lab.measure import TESTS
from lab.substrate.boards.build import up
from lab.substrate.boards.restore import restore
from lab.substrate.boards.lab import is_board_lab


#: the project directory, which plan files name their topology relative to (as lab.campaign.load does)


class BoardsTarget:
    kind = "boards"

    def __init__(self, inventory: str, mapping: dict[str, str] | None = None):
        self.inventory_path = str(inventory)
        self.inventory = load_inventory(inventory)
        self.mapping = dict(mapping or {})
        self._labs: dict = {}  # lab id -> BoardLab this process built (its SSH sessions)
        self.client_tools: set[str] = set()
        self.server_tools: set[str] = set()

    def substrate(self) -> dict:
        return {
            "kind": self.kind,
            "inventory": self.inventory_path,
            "boards": sorted(self.inventory.boards),
        }

    def preflight(self, plan):
        """The plan's topology, once it maps onto the inventory and every profile is a valid
        profile for it (whether a board can run it is asked on the board at bring-up)."""

        spec = load_topology(REPO / plan.topology_file, plan.topo, plan.topology_params)
        map_nodes(spec, self.inventory, self.mapping)
        for t in plan.tests:
            self.client_tools |= set(TESTS[t.test].client_tools)
            self.server_tools |= set(TESTS[t.test].server_tools)
        problems = []
        for p in plan.loaded.values():
            try:
                place(spec, p)
            except LabError as e:
                problems.append(str(e))
        if problems:
            raise PreconditionError("cannot run this plan on boards:\n  " + "\n  ".join(problems))
        return spec

    def up(self, spec, lab_id: str, profile: Profile, point, placement):
        # points only: the runner applies each point once the tunnel is up and ready
        impair = "none" if point is not None and point.impaired else None
        lab = up(
            spec,
            self.inventory,
            mapping=self.mapping,
            lab_id=lab_id,
            vpn=profile,
            impair=impair,
            placement=placement if impair is not None else None,
        )
        missing = self._missing_tools(lab)
        if missing:
            lab.close()

            restore(lab.id)
            raise PreconditionError("; ".join(missing))
        self._labs[lab.id] = lab
        return lab

    def _missing_tools(self, lab) -> list[str]:
        """The plan's test tools missing on the boards the test ends run on."""
        rec = TunnelRecord.of(lab)
        traffic = rec.traffic if rec else None
        out = []
        for role, tools in (("client", self.client_tools), ("server", self.server_tools)):
            node = getattr(traffic, role) if traffic else None
            gone = lab.node(node).missing_tools(sorted(tools)) if node and tools else []
            if gone:
                out.append(
                    f"board {lab.board(node).name} (traffic {role} {node}) lacks "
                    f"{', '.join(gone)}: `lab boards prepare` installs them"
                )
        return out

    def down(self, lab_id: str) -> list[str]:
        lab = self._labs.pop(lab_id, None)
        if lab is not None:
            lab.close()
        return restore(lab_id)

    def tunnel_alive(self, lab) -> bool:
        """Every VPN daemon the lab started is still the process that was started (asked on
        its board)."""
        if half_up(lab):
            return False
        try:
            return all(lab.node(d.node).is_alive(d.pid, d.start_time) for d in daemons_of(lab))
        except LabError:
            return False

    def monitor(self, lab) -> BoardMonitor:
        return BoardMonitor(lab.nodes(), [d.to_dict() for d in daemons_of(lab)])

    def owns(self, lab_id: str) -> bool:
        return is_board_lab(lab_id)
