"""A lab on real boards: the topology's addressing, routes, forwarding, impairment and VPN put on
boards over SSH, every change recorded on the controller before it is made, and restored.

The ledger (/var/lib/lab/<id>/ledger.jsonl, as for a local lab) gets, per board:
  board-snapshot  what the board's network looked like before the lab touched it (links by
                  ifindex, addresses, routes, qdiscs, xfrm), the reference `lab down` restores
  board-dir       the per-lab directory on the board (/var/lib/lab/<id>, the controller's path)
  board-link      an interface's state and MTU before the lab set it
  board-sysctl    a sysctl's value before the lab set it
  board-addr      an address the lab adds; board-route: a route it adds
  board-qdisc     a root qdisc before the lab replaced it; board-offloads: ethtool features
  process-intent / process   daemons, by PID + start time read on the board
Restoring (`lab down`, `lab clean`, the unwinding of a failed `lab up`) walks it newest first
over a fresh connection, so it works after the controller was SIGKILLed; an unreachable board
keeps its entries and is finished by the next `lab clean`. Interfaces that appear on a board
while a lab is up on it (a VPN driver's wg0, tun0, macsec0...) are the lab's: restore deletes
links whose ifindex is not in the snapshot, and xfrm states/policies when the board had none.
"""

from __future__ import annotations

import json

from lab.core.errors import ConfigError, PreconditionError
from lab.core.state import Ledger, lab_dir, write_json_atomic
from lab.model.labspec import LabSpec
from lab.substrate.boards.types import Board
import subprocess
import sys
from lab.substrate.boards.connection import ssh_argv
from lab.substrate.boards.connection import BoardConnection
from concurrent.futures import ThreadPoolExecutor
from lab.substrate.local.lab import lab_status
from lab.substrate.boards.node import BoardNode

KIND = "boards"


# ----------------------------------------------------------------------------- the lab object


class BoardLab:
    """A lab whose nodes are boards: what tunnel.bring_up and impair.runtime need of a lab
    (id, info, spec, dir, node(), nodes(), save()) with board nodes over SSH."""

    def __init__(self, lab_id: str, info: dict, *, connections: dict | None = None):
        self.id = lab_id
        self.info = info
        self.dir = lab_dir(lab_id)
        self.ledger = Ledger(self.dir / "ledger.jsonl")
        self.spec = LabSpec.from_json(info["spec"])
        self._conns: dict = connections if connections is not None else {}
        self._nodes: dict = {}

    @classmethod
    def open(cls, lab_id: str) -> BoardLab:
        path = lab_dir(lab_id) / "lab.json"
        try:
            info = json.loads(path.read_text())
        except FileNotFoundError:
            raise PreconditionError(f"lab {lab_id!r} is not up (no {path})")
        return cls(lab_id, info)

    def save(self) -> None:
        write_json_atomic(self.dir / "lab.json", self.info)

    def board(self, node: str) -> Board:
        b = self.info["boards"][node]
        return Board(
            name=b["name"], host=b["host"], mgmt=b["mgmt"], data=tuple(b["data"]),
            user=b.get("user"), port=b.get("port"), key=b.get("key"),
            become=b.get("become", "root"), ssh_options=tuple(b.get("ssh_options") or ()),
        )  # fmt: skip

    def connection(self, node: str):
        board = self.board(node)
        conn = self._conns.get(board.name)
        if conn is None or not conn.alive():
            (self.dir / "logs").mkdir(mode=0o700, exist_ok=True)
            conn = BoardConnection.open(board, log_path=self.dir / "logs" / f"ssh-{board.name}.log")
            self._conns[board.name] = conn
        return conn

    def node(self, name: str):
        if name not in self.info["boards"]:
            raise ConfigError(
                f"no node {name!r} in lab {self.id!r}; nodes: {', '.join(self.info['boards'])}",
                source="NODE",
            )
        n = self._nodes.get(name)
        if n is None or not n.conn.alive():
            n = BoardNode(
                name,
                self.connection(name),
                ledger=self.ledger,
                log_dir=self.dir / "logs",
                sync_dirs=(self.dir / "config", self.dir / "secrets", self.dir / "measure"),
            )
            self._nodes[name] = n
        return n

    def nodes(self) -> dict:
        """Every node, its board's SSH session opened in parallel (each takes ~0.3 s)."""

        names = list(self.info["boards"])
        with ThreadPoolExecutor(max_workers=len(names) or 1) as pool:
            list(pool.map(self.connection, names))
        return {n: self.node(n) for n in names}

    def close(self) -> None:
        for c in self._conns.values():
            c.close()
        self._conns.clear()
        self._nodes.clear()

    def status(self) -> dict:
        where = {
            name: {"kind": "board", "board": b["name"], "host": b["host"]}
            for name, b in self.info["boards"].items()
        }
        return lab_status(self.id, self.info, self.spec, where)


def interactive(board: Board, argv: list[str]) -> int:
    """Run argv on the board attached to this terminal (`lab exec`, `lab shell`): plain ssh
    with a tty when this process has one."""

    ssh = ssh_argv(board, argv)
    if sys.stdin.isatty():
        ssh[ssh.index("-T")] = "-t"
    sys.stdout.flush()
    return subprocess.call(ssh)


def is_board_lab(lab_id: str) -> bool:
    try:
        info = json.loads((lab_dir(lab_id) / "lab.json").read_text())
    except (OSError, ValueError):
        entries = Ledger(lab_dir(lab_id) / "ledger.jsonl").entries()
        return any(e["kind"] == "boardlab" for e in entries[:1])
    return (info.get("substrate") or {}).get("kind") == KIND
