"""A topology on boards: which board runs which node, which cable carries which link, the
topology renamed to the boards' interfaces, and the refusal of anything that would reach a
board's management network. Pure data over lab.substrate.boards.types and lab.model.topology.
"""

from __future__ import annotations

import dataclasses
import ipaddress

from lab.core.errors import ConfigError
from lab.model.labspec import LabSpec
from lab.substrate.boards.types import BoardMap, Cable, Inventory


def parse_map_option(values: list[str], source: str = "--map") -> dict[str, str]:
    """["client=pi-a", "server=pi-m,router=pi-r"] -> {node: board}."""
    out: dict[str, str] = {}
    for value in values:
        for item in value.split(","):
            node, sep, board = item.strip().partition("=")
            node, board = node.strip(), board.strip()
            if not sep or not node or not board or "=" in board:
                raise ConfigError(f"expected NODE=BOARD, got {item!r}", source=source)
            if node in out:
                raise ConfigError(
                    f"node {node} mapped twice ({node}={out[node]} and {item.strip()})",
                    source=source,
                )
            out[node] = board
    return out


def _cable_text(c: Cable) -> str:
    return f"{c.a}:{c.a_if}={c.b}:{c.b_if}"


def map_nodes(spec: LabSpec, inv: Inventory, overrides: dict[str, str] | None = None) -> BoardMap:
    """Put every host of the topology on its own board and every link on its own cable.

    Nodes go to the board of the same name unless `overrides` says otherwise. Links are taken in
    spec order and each gets the first unused inventory cable joining its two boards, so the same
    topology and inventory always give the same map.
    """
    overrides = dict(overrides or {})
    inv_src = str(inv.path)
    boards = ", ".join(inv.boards)
    for sw in (n for n in spec.nodes.values() if n.kind == "switch"):
        raise ConfigError(
            "boards connect point-to-point cables only; link the hosts directly",
            source=spec.source,
            field=f"switch {sw.name}",
        )
    for node, board in overrides.items():
        if node not in spec.nodes:
            raise ConfigError(
                f"names node {node!r}, which topology {spec.source} does not have;"
                f" nodes: {', '.join(spec.nodes)}",
                source="--map",
                field=f"{node}={board}",
            )
        if board not in inv.boards:
            raise ConfigError(
                f"unknown board {board!r}; boards in {inv_src}: {boards}",
                source="--map",
                field=f"{node}={board}",
            )
    nodes: dict[str, str] = {}
    unmapped = []
    for n in spec.hosts():
        board = overrides.get(n.name, n.name)
        if board in inv.boards:
            nodes[n.name] = board
        else:
            unmapped.append(n.name)
    if unmapped:
        free = [b for b in inv.boards if b not in nodes.values()]
        raise ConfigError(
            f"no board for node{'s' if len(unmapped) > 1 else ''} {', '.join(unmapped)} (no board"
            f" of that name in {inv_src}, no --map); free boards: {', '.join(free) or '(none)'};"
            f" map with --map {unmapped[0]}=BOARD",
            source=spec.source,
            field=f"node {unmapped[0]}",
        )
    by_board: dict[str, str] = {}
    for node, board in nodes.items():
        if board in by_board:
            raise ConfigError(
                f"nodes {by_board[board]} and {node} are both on board {board} ({inv_src});"
                " each node needs its own board",
                source=spec.source,
                field=f"node {node}",
            )
        by_board[board] = node
    interfaces: dict[tuple[str, str], str] = {}
    taken: dict[int, str] = {}  # cable index -> link that uses it
    for lk in spec.links:
        b1, b2 = nodes[lk.node1], nodes[lk.node2]
        where = f"link {lk.node1}-{lk.node2}"
        for i, c in enumerate(inv.cables):
            if i in taken or {c.a, c.b} != {b1, b2}:
                continue
            if1, if2 = (c.a_if, c.b_if) if c.a == b1 else (c.b_if, c.a_if)
            interfaces[(lk.node1, lk.intf1)] = if1
            interfaces[(lk.node2, lk.intf2)] = if2
            taken[i] = where
            break
        else:
            listing = "; ".join(
                _cable_text(c) + (f" (used by {taken[i]})" if i in taken else "")
                for i, c in enumerate(inv.cables)
            )
            raise ConfigError(
                f"no free cable between {b1} and {b2} in {inv_src}; cables: {listing or '(none)'}",
                source=spec.source,
                field=where,
            )
    return BoardMap(nodes=nodes, interfaces=interfaces)


def board_spec(spec: LabSpec, bmap: BoardMap) -> LabSpec:
    """A copy of `spec` whose interface names are the boards' (spec itself is left as it is)."""

    def rename(node: str, ifname: str) -> str:
        try:
            return bmap.interfaces[(node, ifname)]
        except KeyError:
            raise ValueError(f"board map has no interface for {node}:{ifname}") from None

    nodes = {}
    for name, n in spec.nodes.items():
        interfaces = [
            dataclasses.replace(
                i, name=rename(i.node, i.name), peer_name=rename(i.peer_node, i.peer_name)
            )
            for i in n.interfaces
        ]
        routes = [{**r, "dev": rename(name, r["dev"])} if "dev" in r else dict(r) for r in n.routes]
        default_route = n.default_route
        words = (default_route or "").split()
        if len(words) == 2 and words[0] == "dev":
            default_route = f"dev {rename(name, words[1])}"
        nodes[name] = dataclasses.replace(
            n, interfaces=interfaces, routes=routes, default_route=default_route
        )
    links = [
        dataclasses.replace(lk, intf1=rename(lk.node1, lk.intf1), intf2=rename(lk.node2, lk.intf2))
        for lk in spec.links
    ]
    segments = [dataclasses.replace(s, links=list(s.links)) for s in spec.segments]
    return dataclasses.replace(
        spec, params=dict(spec.params), nodes=nodes, links=links, segments=segments
    )


# --------------------------------------------------------------------------- management


def check_management(
    spec: LabSpec, bmap: BoardMap, inv: Inventory, mgmt_addrs: dict[str, list[str]]
) -> None:
    """Refuse a topology that could cut the controller off a board.

    `mgmt_addrs` holds each board's management addresses as read from the board ("10.0.1.5/24").
    No topology address, route destination or segment subnet may overlap the management subnet
    of any mapped board (link-local fe80::/10 excepted: every interface has its own), and no
    topology interface may be a board's management interface.
    """
    link_local = ipaddress.ip_network("fe80::/10")
    mgmt: list[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str]] = []
    for board in dict.fromkeys(bmap.nodes.values()):
        for addr in mgmt_addrs.get(board, []):
            net = ipaddress.ip_interface(addr).network
            if net.version == 6 and net.subnet_of(link_local):
                continue
            mgmt.append((net, f"{addr} on {board}:{inv.boards[board].mgmt}"))

    def check(value: str | None, field: str) -> None:
        if value is None:
            return
        net = ipaddress.ip_interface(value).network
        for m, desc in mgmt:
            if net.version == m.version and net.overlaps(m):
                raise ConfigError(
                    f"{value} overlaps the management network {m} ({desc}, inventory"
                    f" {inv.path}); choose topology subnets apart from the boards' management"
                    " network",
                    source=spec.source,
                    field=field,
                )

    for (node, ifname), bif in bmap.interfaces.items():
        board = inv.boards[bmap.nodes[node]]
        if bif == board.mgmt:
            raise ConfigError(
                f"interface {ifname} is mapped to {board.name}'s management interface {bif},"
                " which the lab never touches",
                source=spec.source,
                field=f"node {node}",
            )
    for node in bmap.nodes:
        n = spec.nodes[node]
        for i in n.interfaces:
            check(i.ip, f"node {node} interface {i.name} ip")
            check(i.ip6, f"node {node} interface {i.name} ip6")
        for r in n.routes:
            check(r.get("dst"), f"node {node} route dst")
    for s in spec.segments:
        where = "segment " + ", ".join(
            f"{spec.links[i].node1}-{spec.links[i].node2}" for i in s.links
        )
        check(s.v4, f"{where} v4")
        check(s.v6, f"{where} v6")
