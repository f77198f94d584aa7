"""What a board of an inventory may say, and each value checked: the keys, a field as read (its
value, the file it came from, its name there), and the frozen Board/Cable/Inventory objects built
from them (build), with errors naming the file, the board and the field. The readers of the two
formats are lab.substrate.boards.inventory (boards.toml) and lab.substrate.boards.ansible.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from lab.core.errors import ConfigError
from lab.model.topology import IFNAMSIZ
from lab.substrate.boards.types import BECOME, Board, Cable, Inventory

BOARD_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")  # a DNS label's length
SSH_OPTION_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]*=\S.*$")

#: [boards.NAME] keys of boards.toml, with what they take
BOARD_KEYS = {
    "host": "address or ssh_config alias (required)",
    "user": "login name",
    "port": "SSH port 1..65535",
    "key": "private key file (~ expanded, relative to the inventory file)",
    "become": f"how the lab gets root: one of {', '.join(BECOME)}",
    "mgmt": "management interface, never touched (required)",
    "data": "list of data-plane interfaces (required, at least one)",
    "ssh_options": 'list of OpenSSH options, "Name=value" each',
}
#: Ansible host vars read, and the boards.toml field each one fills
ANSIBLE_VARS = {
    "ansible_host": "host",
    "ansible_user": "user",
    "ansible_port": "port",
    "ansible_ssh_private_key_file": "key",
    "lab_mgmt": "mgmt",
    "lab_data": "data",
}

# One field of one board as read: its value, the file it came from and the name it had there.
Field = tuple[Any, str, str]


def relative_to(path: Path, name: str) -> Path:
    """`name` (~ expanded) relative to the directory of file `path`, unless absolute."""
    p = Path(name).expanduser()
    return p if p.is_absolute() else path.parent / p


def build(
    path: Path,
    raw: dict[str, dict[str, Field]],
    cables: list[tuple[Any, Any, str, str]],
    sources: tuple[str, ...],
    *,
    toml: bool,
) -> Inventory:
    if not raw:
        raise ConfigError("defines no boards", source=str(path), field="boards")
    boards: dict[str, Board] = {}
    for name, fields in raw.items():
        boards[name] = _board(name, fields, str(path), toml=toml, ansible=sources[1:])
    _check_addresses(boards, raw)
    return Inventory(
        path=path, boards=boards, cables=_cables(boards, cables), sources=tuple(sources)
    )


_ANSIBLE_NAME = {key: var for var, key in ANSIBLE_VARS.items()} | {"become": "ansible_become"}


def _board(
    name: str, fields: dict[str, Field], main_src: str, *, toml: bool, ansible: tuple[str, ...]
) -> Board:
    def where(key: str) -> tuple[str, str]:
        """Where a field was read, or where it belongs when it is missing."""
        if key in fields:
            return fields[key][1], fields[key][2]
        if toml:
            return main_src, f"boards.{name}.{key}"
        return main_src, f"host {name}: {_ANSIBLE_NAME.get(key, key)}"

    if not isinstance(name, str) or not BOARD_NAME_RE.match(name):
        src, fld = where("host")
        raise ConfigError(
            f"board name {name!r} must match [A-Za-z0-9][A-Za-z0-9_.-]* (1..63 characters)",
            source=src,
            field=fld,
        )
    for key in ("host", "mgmt", "data"):
        if key not in fields:
            src, fld = where(key)
            hint = f" (or {_ANSIBLE_NAME[key]} in {ansible[0]})" if ansible else ""
            raise ConfigError(f"missing{hint}; {BOARD_KEYS[key]}", source=src, field=fld)
    values: dict[str, Any] = {}
    for key, (value, src, fld) in fields.items():
        values[key] = _field(key, value, src, fld)
    if values["mgmt"] in values["data"]:
        src, fld = where("data")
        raise ConfigError(
            f"the management interface {values['mgmt']} is listed among the data interfaces"
            f" {list(values['data'])}; the lab never touches it",
            source=src,
            field=fld,
        )
    if "key" in values:
        values["key"] = _key_path(values["key"], *where("key"))
    become, user = values.get("become", "root"), values.get("user")
    if become == "root" and user not in (None, "root"):
        src, fld = where("become")
        raise ConfigError(
            f"become = 'root' logs in as root, but user is {user!r}; set become = 'sudo' or"
            f" user = 'root' (accepted: {', '.join(BECOME)})",
            source=src,
            field=fld,
        )
    return Board(name=name, **values)


def _field(key: str, value: Any, src: str, fld: str) -> Any:
    def bad(what: str) -> ConfigError:
        return ConfigError(f"must be {what}, got {value!r}", source=src, field=fld)

    if key in ("host", "user"):
        if not isinstance(value, str) or not value or value.startswith("-"):
            raise bad("a non-empty string not starting with '-'")
        if any(c.isspace() for c in value) or (key == "user" and "@" in value):
            raise bad("a name without whitespace" + (" or '@'" if key == "user" else ""))
        return value
    if key == "port":
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
            raise bad("a port number 1..65535")
        return value
    if key == "key":
        if not isinstance(value, str) or not value:
            raise bad("the path of a private key file")
        return value
    if key == "become":
        if value not in BECOME:
            raise bad(f"one of {', '.join(BECOME)}")
        return value
    if key == "mgmt":
        return _ifname(value, src, fld)
    if key == "data":
        if not isinstance(value, list) or not value:
            raise bad('a non-empty list of interface names, e.g. ["eth1"]')
        names = [_ifname(v, src, fld) for v in value]
        dups = sorted({n for n in names if names.count(n) > 1})
        if dups:
            raise ConfigError(f"interface {', '.join(dups)} listed twice", source=src, field=fld)
        return tuple(names)
    if key == "ssh_options":
        if not isinstance(value, list) or not all(
            isinstance(v, str) and SSH_OPTION_RE.match(v) and "\n" not in v for v in value
        ):
            raise bad('a list of "Name=value" OpenSSH options, e.g. ["UserKnownHostsFile=/path"]')
        return tuple(value)
    raise bad(f"one of the keys {', '.join(BOARD_KEYS)}")  # unreachable: keys checked on reading


def _ifname(value: Any, src: str, fld: str) -> str:
    # Linux dev_valid_name(): 1..IFNAMSIZ-1 bytes, not "." or "..", no '/', ':' or whitespace.
    if (
        not isinstance(value, str)
        or not value
        or len(value.encode()) > IFNAMSIZ
        or value in (".", "..")
        or any(c in "/:" or c.isspace() for c in value)
    ):
        raise ConfigError(
            f"interface name must be 1..{IFNAMSIZ} bytes without '/', ':' or whitespace,"
            f" got {value!r}",
            source=src,
            field=fld,
        )
    return value


def _key_path(value: str, src: str, fld: str) -> str:
    key = relative_to(Path(src), value)
    if not key.is_file():
        raise ConfigError(f"private key file {key} not found", source=src, field=fld)
    return str(key)


def _check_addresses(boards: dict[str, Board], raw: dict[str, dict[str, Field]]) -> None:
    seen: dict[tuple[str, int], str] = {}
    for b in boards.values():
        dest = (b.host, b.port or 22)
        if dest in seen:
            _, src, fld = raw[b.name]["host"]
            raise ConfigError(
                f"board {b.name} has the same host and port ({b.host}:{dest[1]}) as board"
                f" {seen[dest]}; each board needs its own address",
                source=src,
                field=fld,
            )
        seen[dest] = b.name


def _cables(boards: dict[str, Board], raw: list[tuple[Any, Any, str, str]]) -> tuple[Cable, ...]:
    cables: list[Cable] = []
    used: dict[tuple[str, str], str] = {}
    for a, b, src, fld in raw:
        ends = [_cable_end(text, boards, src, f"{fld}.{k}") for k, text in (("a", a), ("b", b))]
        if ends[0] == ends[1]:
            raise ConfigError(
                f"both ends are {ends[0][0]}:{ends[0][1]}; a cable joins two interfaces",
                source=src,
                field=fld,
            )
        for end in ends:
            if end in used:
                raise ConfigError(
                    f"{end[0]}:{end[1]} is already the end of cable {used[end]}",
                    source=src,
                    field=fld,
                )
            used[end] = f"{fld} ({a}={b})"
        cables.append(Cable(ends[0][0], ends[0][1], ends[1][0], ends[1][1]))
    return tuple(cables)


def _cable_end(text: Any, boards: dict[str, Board], src: str, fld: str) -> tuple[str, str]:
    if not isinstance(text, str) or text.count(":") != 1:
        raise ConfigError(f'must be "board:ifname", got {text!r}', source=src, field=fld)
    board, ifname = text.split(":")
    if not BOARD_NAME_RE.match(board):
        raise ConfigError(
            f"board name {board!r} in {text!r} must match [A-Za-z0-9][A-Za-z0-9_.-]*",
            source=src,
            field=fld,
        )
    _ifname(ifname, src, fld)
    if board not in boards:
        raise ConfigError(
            f"unknown board {board!r} in {text!r}; boards: {', '.join(boards)}",
            source=src,
            field=fld,
        )
    if ifname not in boards[board].data:
        raise ConfigError(
            f"{ifname!r} in {text!r} is not a data interface of board {board};"
            f" its data interfaces: {', '.join(boards[board].data)}",
            source=src,
            field=fld,
        )
    return board, ifname
