"""Putting boards back: `lab down`, `lab clean` and the unwinding of a failed `lab up --boards`
walk the ledger newest first over fresh SSH sessions (lab.substrate.boards.lab explains what is
recorded)."""

from __future__ import annotations

import json

from lab.core.errors import LabError
from lab.core.node import Daemon
from lab.core.state import Ledger, lab_dir
from lab.substrate.boards.impair import remove_bump, unsplice
from lab.substrate.boards.lab import BoardLab
from lab.substrate.boards.snapshot import DEFAULT_QDISCS, diff, read_addrs, read_routes, snapshot
from lab.substrate.boards.types import Board
import shutil
from concurrent.futures import ThreadPoolExecutor


def restore(lab_id: str, notes: list[str] | None = None) -> list[str]:
    """Put every board back as the ledger says it was. Returns what is left (unreachable
    boards, changes that could not be undone); the lab's state stays until nothing is left."""

    d = lab_dir(lab_id)
    ledger = Ledger(d / "ledger.jsonl")
    entries = ledger.entries()
    head = next((e for e in entries if e["kind"] == "boardlab"), None)
    if head is None:
        return [f"lab {lab_id}: ledger has no boardlab entry"]
    info = {"spec": {"source": "", "topo_name": "", "params": {}, "nodes": {}, "links": [],
                     "segments": []}, "boards": head["boards"]}  # fmt: skip
    try:
        info = json.loads((d / "lab.json").read_text())
    except (OSError, ValueError):
        pass
    lab = BoardLab(lab_id, info)
    left: list[str] = []
    by_node: dict[str, list[dict]] = {}
    for e in entries:
        if e.get("node") in head["boards"]:
            by_node.setdefault(e["node"], []).append(e)

    def one(name: str, es: list[dict]) -> list[str]:
        bname = head["boards"][name]["name"]
        try:
            node = lab.node(name)
        except (LabError, OSError) as ex:
            return [f"board {bname}: unreachable ({str(ex).splitlines()[0]}); run `lab clean` "
                    "when it is back"]  # fmt: skip
        return [f"board {bname}: {x}" for x in _restore_node(node, es)]

    # boards are independent: restore them at once (each its own SSH session)
    with ThreadPoolExecutor(max_workers=len(by_node) or 1) as pool:
        for got in pool.map(lambda kv: one(*kv), list(by_node.items())):
            left += got
    lab.close()
    if not left:
        shutil.rmtree(d, ignore_errors=True)
    return left


def _restore_node(node, entries: list[dict]) -> list[str]:
    problems: list[str] = []
    stopped = {e["pid"] for e in entries if e["kind"] == "process-stopped"}
    for e in reversed(entries):
        if e["kind"] == "process" and e["pid"] not in stopped:
            d = Daemon(e["node"], e.get("name", "?"), e["pid"], e.get("start_time"), None)
            if not node.stop(d, grace=2.0):
                problems.append(f"process {e['pid']} ({e.get('name')}) still running")
    snap = next((e["snapshot"] for e in entries if e["kind"] == "board-snapshot"), None)
    if snap is not None:  # links the lab's drivers created (not there before), newest first
        known = {x[0] for x in snap["links"]}
        cp = node.run(["ip", "-j", "link", "show"], check=False)
        now = json.loads(cp.stdout) if cp.returncode == 0 else []
        for ln in sorted(now, key=lambda x: -x["ifindex"]):
            if ln["ifindex"] not in known:
                node.run(["ip", "link", "del", "dev", ln["ifname"]], check=False)
        for what, n in snap["xfrm"].items():
            if n == 0:
                node.run(["ip", "xfrm", what.rstrip("s"), "flush"], check=False)
    for e in reversed(entries):
        k = e["kind"]
        try:
            if k == "board-addr":
                node.run(["ip", "addr", "del", e["cidr"], "dev", e["ifname"]], check=False)
            elif k == "board-route":
                node.run(["ip", e["family"], "route", "del", e["dst"], "via", e["via"], "dev",
                          e["dev"]], check=False)  # fmt: skip
            elif k == "board-sysctl":
                path = "/proc/sys/" + e["key"].replace(".", "/")
                node.run(["sh", "-c", f"echo '{e['prev']}' > '{path}'"], check=False)
            elif k == "board-qdisc":
                prev = e["prev"]
                kind = prev[0].get("kind") if prev else None
                if kind is None or kind in DEFAULT_QDISCS | {e.get("default")}:
                    node.run(["tc", "qdisc", "del", "dev", e["ifname"], "root"], check=False)
                elif kind == "tbf":  # the board's shaping stays; the netem in its class goes
                    parent = f"{prev[0]['handle'].rstrip(':')}:1"
                    node.run(["tc", "qdisc", "del", "dev", e["ifname"], "parent", parent],
                             check=False)  # fmt: skip
                else:
                    problems.append(f"{e['ifname']}: root qdisc {kind} was there before; the "
                                    "lab's netem replaced it and it is not restored")  # fmt: skip
            elif k == "board-offloads":
                on = [x for kv in e["features"].items() for x in kv]
                if on:
                    node.run(["ethtool", "-K", e["ifname"], *on], check=False)
            elif k == "board-link":
                argv = ["ip", "link", "set", "dev", e["ifname"], "up" if e["up"] else "down"]
                if e.get("mtu"):
                    argv += ["mtu", str(e["mtu"])]
                node.run(argv, check=False)
            elif k == "board-splice":
                problems += unsplice(node, e)
            elif k == "board-netns":
                port = next((x["state"]["ifindex"] for x in entries if x["kind"] == "board-splice"
                             and x.get("netns") == e["name"]), None)  # fmt: skip
                problems += remove_bump(node, e["name"], port)
            elif k == "board-dir":
                node.run(["rm", "-rf", "--one-file-system", e["path"]], check=False)
        except LabError as ex:
            problems.append(f"{k}: {ex}")
    if snap is not None:
        board = _board_from(node)
        _remove_new_addresses_and_routes(node, board, snap)
        after = snapshot(node, board)
        problems += diff(snap, after)
    return problems


def _remove_new_addresses_and_routes(node, board: Board, snap: dict) -> None:
    """Addresses and routes that appeared on the board while the lab was up are the lab's (its
    drivers add tunnel addresses on lo, routes through tunnels): remove them, except on the
    management interface, which the lab never touches. Routes of the local table go with their
    addresses, and so do connected routes and routes via a gateway on a removed subnet: routes
    are read after the addresses are gone (a delete without gateway or metric could otherwise
    match a route that was there before). Only addresses and routes are read here, not a whole
    snapshot: restore's final snapshot compares everything."""
    for ifname, cidr in sorted(
        {tuple(x) for x in read_addrs(node)} - {tuple(x) for x in snap["addrs"]}
    ):
        if ifname != board.mgmt:
            node.run(["ip", "addr", "del", cidr, "dev", ifname], check=False)
    for text in sorted(set(read_routes(node)) - set(snap["routes"])):
        r = json.loads(text)
        if r.get("dev") == board.mgmt or r.get("table") == "local" or not r.get("dst"):
            continue
        argv = ["ip", "-6" if ":" in r["dst"] else "-4", "route", "del", r["dst"]]
        if r.get("gateway"):
            argv += ["via", r["gateway"]]
        if r.get("dev"):
            argv += ["dev", r["dev"]]
        if r.get("table"):
            argv += ["table", str(r["table"])]
        node.run(argv, check=False)


def _board_from(node):
    """The Board of a BoardNode (for snapshot's sysctl list)."""
    return node.conn.board
