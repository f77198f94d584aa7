"""`lab up --boards`: the topology's addressing, routes, forwarding, impairment and VPN put on
boards, each change recorded in the ledger before it is made (lab.substrate.boards.lab explains the
ledger; lab.substrate.boards.restore undoes it)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from lab.core.errors import ConfigError, PreconditionError
from lab.core.state import Ledger, create_lab_dir, write_json_atomic
from lab.model.labspec import LabSpec
from lab.substrate import lifecycle
from lab.substrate.boards.lab import KIND, BoardLab
from lab.substrate.local.lab import ROUTER_SYSCTLS
from lab.substrate.boards.snapshot import run_sh, snapshot
from lab.substrate.boards.mapping import board_spec, check_management, map_nodes
from lab.substrate.boards.restore import restore
from lab.substrate.boards.types import BoardMap, Inventory
from lab.vpn.profiles import Profile
from lab.vpn.tunnel import plan as tunnel_plan
from lab.model.cpuprofile import OS_SYSCTLS
from lab.substrate.boards.impair import apply


class BoardsBuild(lifecycle.Build):
    """A lab being put on an inventory's boards."""

    #: validated against netem words: a board's kernel has netem or gets the lab's engine
    check_backend = "kernel-netem"

    def __init__(self, spec: LabSpec, inventory: Inventory, mapping: dict[str, str] | None):
        if spec.dilation not in ("auto", 1.0):
            # boards run at their own speed: slowing their links and tests would only mislead
            raise ConfigError(
                f'got {spec.dilation!r}; boards run in real time: accepted on boards 1 or "auto" '
                '(time dilation is for emulated labs, docs/cpu.md "Time dilation")',
                source=spec.source,
                field="dilation",
            )
        spec.dilation = 1.0
        self.inventory = inventory
        self.bmap = map_nodes(spec, inventory, mapping)
        super().__init__(board_spec(spec, self.bmap))

    def prepare_vpn(self, profile: str | Profile):
        return tunnel_plan(self.spec, profile)  # checked on the boards themselves once connected

    def create(self, lab_id: str) -> BoardLab:
        d = create_lab_dir(lab_id)
        for sub in ("logs", "secrets", "config"):
            (d / sub).mkdir(mode=0o700, exist_ok=True)
        boards = {}
        for node, bname in self.bmap.nodes.items():
            b = self.inventory.boards[bname]
            boards[node] = {
                "name": b.name, "host": b.host, "mgmt": b.mgmt, "data": list(b.data),
                "user": b.user, "port": b.port, "key": b.key, "become": b.become,
                "ssh_options": list(b.ssh_options),
            }  # fmt: skip
        info = {
            "id": lab_id,
            "state": "building",
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "spec": self.spec.to_json(),
            "topology_interfaces": {f"{n}:{i}": b for (n, i), b in self.bmap.interfaces.items()},
            "boards": boards,
            "warnings": [],
            "substrate": {"kind": KIND, "inventory": str(self.inventory.path)},
        }
        ledger = Ledger(d / "ledger.jsonl")
        ledger.record("boardlab", id=lab_id, inventory=str(self.inventory.path), boards=boards)
        write_json_atomic(d / "lab.json", info)
        return BoardLab(lab_id, info)

    def build(self, lab: BoardLab, impair: str | None, placement: str | None) -> BoardLab:
        _build(lab, self.spec, self.bmap, impair, placement)
        return lab

    def unwind(self, lab: BoardLab) -> list[str]:
        lab.close()
        return restore(lab.id)


def up(
    spec: LabSpec,
    inventory: Inventory,
    *,
    mapping: dict[str, str] | None = None,
    lab_id: str | None = None,
    vpn=None,
    impair: str | None = None,
    placement: str | None = None,
) -> BoardLab:
    """Build `spec` on the inventory's boards. On any failure every board is restored."""
    build = BoardsBuild(spec, inventory, mapping)
    return lifecycle.up(build, lab_id, vpn=vpn, impair=impair, placement=placement)


def _build(lab: BoardLab, spec: LabSpec, bmap: BoardMap, impair, placement) -> None:
    nodes = lab.nodes()  # connect to every board first: an unreachable one fails before changes
    mgmt_addrs = {}
    for name, node in nodes.items():
        board = lab.board(name)
        cp = node.run(["ip", "-j", "addr", "show"], timeout=20)
        present = {a["ifname"]: a for a in json.loads(cp.stdout)}
        missing = [i for i in (board.mgmt, *board.data) if i not in present]
        if missing:
            raise PreconditionError(
                f"board {board.name} ({board.host}): no interface {', '.join(missing)}; it has "
                f"{', '.join(sorted(present))} (inventory {lab.info['substrate']['inventory']})"
            )
        mgmt_addrs[board.name] = [
            f"{x['local']}/{x['prefixlen']}" for x in present[board.mgmt].get("addr_info", [])
        ]
    inventory = _inventory_of(lab)
    check_management(spec, bmap, inventory, mgmt_addrs)
    for name, node in nodes.items():  # the board OS's own TCP defaults, for the results
        lab.info["boards"][name]["os"] = _os_facts(node)

    # the reference everything is restored to, recorded before the first change
    for name, node in nodes.items():
        lab.ledger.record("board-snapshot", node=name, snapshot=snapshot(node, lab.board(name)))
    for name, node in nodes.items():
        lab.ledger.record("board-dir", node=name, path=str(lab.dir))
        run_sh(node, f"umask 077; mkdir -p '{lab.dir}/logs' '{lab.dir}/config' '{lab.dir}/secrets'")

    # data ports up (state and MTU recorded), then every cable verified before any address
    for name, node in nodes.items():
        for i in spec.nodes[name].interfaces:
            lk = spec.links[i.link]
            _link_up(lab, node, name, i.name, lk.mtu)
    _verify_cables(lab, spec, nodes)

    for name, node in nodes.items():
        n = spec.nodes[name]
        sysctls = dict(ROUTER_SYSCTLS) if n.router else {}
        for i in n.interfaces:
            sysctls[f"net.ipv6.conf.{i.name}.accept_dad"] = "0"  # addresses usable at once
        for k, v in sysctls.items():
            _sysctl(lab, node, name, k, v)
        for i in n.interfaces:
            for cidr in (i.ip, i.ip6):
                if cidr:
                    lab.ledger.record("board-addr", node=name, ifname=i.name, cidr=cidr)
                    node.run(["ip", "addr", "add", cidr, "dev", i.name, "nodad"] if ":" in cidr
                             else ["ip", "addr", "add", cidr, "dev", i.name])  # fmt: skip
        for r in n.routes:
            fam = "-6" if ":" in r["dst"] else "-4"
            lab.ledger.record("board-route", node=name, family=fam, dst=r["dst"], via=r["via"],
                              dev=r["dev"])  # fmt: skip
            node.run(["ip", fam, "route", "add", r["dst"], "via", r["via"], "dev", r["dev"]])
        if n.default_route:
            lab.info["warnings"].append(
                f"{name}: default route {n.default_route!r} not installed on board "
                f"{lab.board(name).name} (its default route stays on the management network; "
                "routes to every lab subnet are installed instead)"
            )
    if any(lk.bw for lk in spec.links):
        lab.info["warnings"].append(
            "link bandwidth (bw=) is not shaped on boards: the cable is the link"
        )
    lab.save()
    if impair is not None:
        apply(lab, spec, impair, placement)


def _os_facts(node) -> dict:
    """What shapes a board's TCP figures: its congestion control and buffer limits, read on
    it (the lab does not change them on a board; a local node gets its profile's, lab.model.cpuprofile
    OS_SYSCTLS)."""

    out = {}
    for key in [*OS_SYSCTLS.values(), "net.core.rmem_max", "net.core.wmem_max"]:
        cp = node.run(["cat", "/proc/sys/" + key.replace(".", "/")], check=False)
        out[key] = " ".join(cp.stdout.split()) if cp.returncode == 0 else None
    return out


def _inventory_of(lab: BoardLab) -> Inventory:
    boards = {b["name"]: lab.board(n) for n, b in lab.info["boards"].items()}
    return Inventory(path=Path(lab.info["substrate"]["inventory"]), boards=boards)


def _link_up(lab, node, name: str, ifname: str, mtu: int | None) -> None:
    cp = node.run(["ip", "-j", "link", "show", "dev", ifname])
    ln = json.loads(cp.stdout)[0]
    lab.ledger.record(
        "board-link", node=name, ifname=ifname, up="UP" in ln.get("flags", []), mtu=ln.get("mtu")
    )
    argv = ["ip", "link", "set", "dev", ifname, "up"]
    if mtu:
        argv += ["mtu", str(mtu)]
    node.run(argv)


def _sysctl(lab, node, name: str, key: str, value: str) -> None:
    path = "/proc/sys/" + key.replace(".", "/")
    prev = node.run(["cat", path]).stdout.strip()
    lab.ledger.record("board-sysctl", node=name, key=key, prev=prev)
    node.run(["sh", "-c", f"echo '{value}' > '{path}'"])


def _verify_cables(lab: BoardLab, spec: LabSpec, nodes: dict, timeout: float = 6.0) -> None:
    """Each link's two ports must reach each other: a ping from one end to the other end's
    IPv6 link-local address, out of that port only. Names the first link that fails."""
    lls = {}
    for name, node in nodes.items():
        cp = node.run(["ip", "-j", "-6", "addr", "show", "scope", "link"])
        for a in json.loads(cp.stdout):
            for x in a.get("addr_info", []):
                lls[(name, a["ifname"])] = x["local"]
    bad = []
    for lk in spec.links:
        peer_ll = lls.get((lk.node2, lk.intf2))
        b1, b2 = lab.board(lk.node1).name, lab.board(lk.node2).name
        what = f"cable {b1}:{lk.intf1} <-> {b2}:{lk.intf2} (link {lk.node1}-{lk.node2})"
        if peer_ll is None:
            bad.append(f"{what}: {b2}:{lk.intf2} has no IPv6 link-local address to probe")
            continue
        deadline = time.monotonic() + timeout
        while True:
            cp = nodes[lk.node1].run(
                ["ping", "-6", "-n", "-q", "-c", "1", "-W", "1", f"{peer_ll}%{lk.intf1}"],
                check=False,
                timeout=10,
            )
            if cp.returncode == 0:
                break
            if time.monotonic() > deadline:
                bad.append(f"{what}: no reply from {b2}:{lk.intf2} through {b1}:{lk.intf1} "
                           "(miscabled, unplugged or down)")  # fmt: skip
                break
            time.sleep(0.2)
    if bad:
        raise PreconditionError("; ".join(bad))
