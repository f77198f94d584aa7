"""The inventory's data: boards, how to reach them, and the cables between their interfaces.

Pure data, shared by the inventory reader (inventory.py), the SSH node (sshnode.py) and the board
lab (boardlab.py). Everything is validated by inventory.load_inventory before one is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

#: how the lab gets root on a board: log in as root, or run `sudo -n` after logging in
BECOME = ("root", "sudo")


@dataclass(frozen=True)
class Board:
    name: str
    #: address or ssh_config alias the controller connects to (OpenSSH resolves it)
    host: str
    #: the management interface: never touched, and no topology address or route may reach its
    #: subnet
    mgmt: str
    #: the data-plane interfaces the lab may configure (topology links are mapped onto these)
    data: tuple[str, ...]
    user: str | None = None  # None: OpenSSH's choice (ssh_config, then the local user)
    port: int | None = None
    key: str | None = None  # private key file (IdentityFile)
    become: str = "root"  # one of BECOME
    #: extra OpenSSH options, "Name=value" each (ssh -o), e.g. UserKnownHostsFile=...
    ssh_options: tuple[str, ...] = ()


@dataclass(frozen=True)
class Cable:
    """A physical link: board a's interface a_if is cabled to board b's interface b_if."""

    a: str
    a_if: str
    b: str
    b_if: str

    def ends(self) -> tuple[tuple[str, str], tuple[str, str]]:
        return (self.a, self.a_if), (self.b, self.b_if)


@dataclass(frozen=True)
class Inventory:
    path: Path
    boards: dict[str, Board]
    cables: tuple[Cable, ...] = ()
    #: where each field came from, for error messages ("farm.toml", "hosts.yml")
    sources: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class BoardMap:
    """Which board runs which topology node, and which board interface is which topology
    interface (every interface of every mapped node is on a cable of the inventory)."""

    nodes: dict[str, str]  # topology node -> board name
    interfaces: dict[tuple[str, str], str]  # (topology node, topology ifname) -> board ifname
