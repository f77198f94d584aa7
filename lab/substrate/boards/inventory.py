"""Read and validate a board inventory, and map a topology onto its boards and cables.

An inventory is a TOML file (`boards.toml`, optionally drawing connection fields from an Ansible
inventory) or an Ansible inventory itself (YAML, INI or a directory, read by the real
`ansible-inventory`). Everything is checked once here, with errors naming the file, the board and
the field; the rest of the board code gets frozen `Board`/`Cable`/`Inventory` objects.

Pure data apart from running `ansible-inventory`: nothing here touches a board. See docs/boards.md.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

from lab.core import proc
from lab.core.errors import ConfigError, PreconditionError
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
TOP_KEYS = {
    "boards": "[boards.NAME] tables",
    "cables": '[[cables]] tables with a = "board:ifname", b = "board:ifname"',
    "ansible": "Ansible inventory to read connection fields from",
    "ansible_limit": "Ansible host pattern (ansible-inventory --limit)",
}
CABLE_KEYS = ("a", "b")
#: Ansible host vars read, and the boards.toml field each one fills
ANSIBLE_VARS = {
    "ansible_host": "host",
    "ansible_user": "user",
    "ansible_port": "port",
    "ansible_ssh_private_key_file": "key",
    "lab_mgmt": "mgmt",
    "lab_data": "data",
}
LAB_VARS = ("lab_mgmt", "lab_data", "lab_cables")
ANSIBLE_TOOL = "ansible-inventory"
ANSIBLE_PACKAGES = "Debian package 'ansible', or PyPI 'ansible-core' (./setup.sh installs it)"

# One field of one board as read: its value, the file it came from and the name it had there.
_Field = tuple[Any, str, str]


# --------------------------------------------------------------------------- loading


def load_inventory(path: str | Path) -> Inventory:
    """Read a boards.toml (any *.toml) or an Ansible inventory (anything else) and validate it."""
    path = Path(path)
    src = str(path)
    if not path.exists():
        raise ConfigError("inventory file not found", source=src)
    if path.suffix == ".toml":
        return _load_toml(path)
    raw, cables = _read_ansible(path, limit=None)
    return _build(path, raw, cables, (src,), toml=False)


def _load_toml(path: Path) -> Inventory:
    src = str(path)
    try:
        doc = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"not valid TOML: {e}", source=src)
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read: {e}", source=src)
    _reject_unknown(doc, TOP_KEYS, src, "top level")
    raw: dict[str, dict[str, _Field]] = {}
    cables: list[tuple[str, str, str, str]] = []  # (a, b, source, field)
    sources = [src]
    if "ansible" in doc:
        ans = doc["ansible"]
        if not isinstance(ans, str) or not ans:
            raise ConfigError(
                f"must be the path of an Ansible inventory, got {ans!r}",
                source=src,
                field="ansible",
            )
        ans_path = _relative_to(path, ans)
        if len(ans_path.name.encode()) > 255 or not ans_path.exists():  # ENAMETOOLONG
            raise ConfigError(
                f"Ansible inventory {ans_path} not found", source=src, field="ansible"
            )
        limit = doc.get("ansible_limit")
        if limit is not None and (not isinstance(limit, str) or not limit):
            raise ConfigError(
                f"must be an Ansible host pattern, got {limit!r}", source=src, field="ansible_limit"
            )
        raw, cables = _read_ansible(ans_path, limit=limit)
        sources.append(str(ans_path))
    elif "ansible_limit" in doc:
        raise ConfigError("needs ansible = FILE", source=src, field="ansible_limit")
    boards = doc.get("boards", {})
    if not isinstance(boards, dict):
        raise ConfigError("must be [boards.NAME] tables", source=src, field="boards")
    for name, table in boards.items():
        where = f"boards.{name}"
        if not isinstance(table, dict):
            raise ConfigError(
                f"must be a table with keys {', '.join(BOARD_KEYS)}", source=src, field=where
            )
        _reject_unknown(table, BOARD_KEYS, src, where)
        fields = raw.setdefault(name, {})
        for key, value in table.items():
            fields[key] = (value, src, f"{where}.{key}")
    toml_cables = doc.get("cables", [])
    if not isinstance(toml_cables, list):
        raise ConfigError("must be [[cables]] tables", source=src, field="cables")
    for i, c in enumerate(toml_cables):
        where = f"cables[{i}]"
        if not isinstance(c, dict):
            raise ConfigError(
                'must be a table: a = "board:ifname", b = "board:ifname"', source=src, field=where
            )
        _reject_unknown(c, {k: "board:ifname" for k in CABLE_KEYS}, src, where)
        missing = [k for k in CABLE_KEYS if k not in c]
        if missing:
            raise ConfigError(
                f'missing {", ".join(missing)}; a cable has a = "board:ifname" and b = "board:ifname"',
                source=src,
                field=where,
            )
        cables.append((c["a"], c["b"], src, where))
    return _build(path, raw, cables, tuple(sources), toml=True)


def _reject_unknown(table: dict, allowed: dict, src: str, where: str) -> None:
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise ConfigError(
            f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(str, unknown))};"
            f" accepted: {', '.join(allowed)}",
            source=src,
            field=where,
        )


def _relative_to(path: Path, name: str) -> Path:
    p = Path(name).expanduser()
    return p if p.is_absolute() else path.parent / p


# --------------------------------------------------------------------------- Ansible


def ansible_inventory_tool() -> str:
    """ansible-inventory from this Python's bin directory (the venv), else from PATH."""
    local = Path(sys.executable).parent / ANSIBLE_TOOL
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = proc.which(ANSIBLE_TOOL)
    if not found:
        raise PreconditionError(
            f"required tool '{ANSIBLE_TOOL}' not found (it reads Ansible inventories);"
            f" install the {ANSIBLE_PACKAGES}"
        )
    return found


def _read_ansible(
    path: Path, *, limit: str | None
) -> tuple[dict[str, dict[str, _Field]], list[tuple[Any, Any, str, str]]]:
    """Host fields and cables of an Ansible inventory, as parsed by `ansible-inventory --list`."""
    src = str(path)
    argv = [ansible_inventory_tool(), "-i", src, "--list"]
    if limit:
        argv += ["--limit", limit]
    # Without this, a file no inventory plugin can parse is only a warning and the output is an
    # empty inventory (ansible.cfg: inventory_unparsed_failed).
    env = {**os.environ, "ANSIBLE_INVENTORY_UNPARSED_FAILED": "True", "ANSIBLE_NOCOLOR": "1"}
    cp = proc.run(argv, check=False, env=env, timeout=120, where="controller")
    if cp.returncode != 0:
        tail = "\n".join(cp.stderr.strip().splitlines()[-12:])
        raise ConfigError(f"{ANSIBLE_TOOL} cannot read this inventory:\n{tail}", source=src)
    try:
        data = json.loads(cp.stdout)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{ANSIBLE_TOOL} printed no JSON ({e})", source=src)
    hostvars = data.get("_meta", {}).get("hostvars", {})
    raw: dict[str, dict[str, _Field]] = {}
    cables: list[tuple[Any, Any, str, str]] = []
    cables_from: tuple[str, Any] | None = None
    for name in _ansible_hosts(data, hostvars):
        hv = hostvars.get(name, {})
        where = f"host {name}"
        unknown = sorted(k for k in hv if k.startswith("lab_") and k not in LAB_VARS)
        if unknown:
            raise ConfigError(
                f"unknown lab variable{'s' if len(unknown) > 1 else ''} {', '.join(unknown)};"
                f" accepted: {', '.join(LAB_VARS)}",
                source=src,
                field=where,
            )
        fields: dict[str, _Field] = {"host": (name, src, f"{where}: inventory hostname")}
        for var, key in ANSIBLE_VARS.items():
            if var in hv:
                value = hv[var]
                if key == "port" and isinstance(value, str) and value.isdigit():
                    value = int(value)
                if key == "data" and isinstance(value, str):
                    value = [v.strip() for v in value.split(",") if v.strip()]
                fields[key] = (value, src, f"{where}: {var}")
        if "ansible_become" in hv:
            fields["become"] = _ansible_become(hv, src, where)
        raw[name] = fields
        # lab_cables belongs in `all` vars; --list copies group vars into every host.
        if "lab_cables" in hv:
            if cables_from is None:
                cables_from = (name, hv["lab_cables"])
            elif hv["lab_cables"] != cables_from[1]:
                raise ConfigError(
                    f"lab_cables differs from host {cables_from[0]}'s; set it once, in all vars",
                    source=src,
                    field=f"{where}: lab_cables",
                )
    if cables_from is not None:
        value = cables_from[1]
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise ConfigError(
                f'must be a list of "board:ifname=board:ifname" strings, got {value!r}',
                source=src,
                field="lab_cables",
            )
        for i, text in enumerate(value):
            fld = f"lab_cables[{i}]"
            if not isinstance(text, str) or text.count("=") != 1:
                raise ConfigError(
                    f'must be "board:ifname=board:ifname", got {text!r}', source=src, field=fld
                )
            a, b = text.split("=")
            cables.append((a.strip(), b.strip(), src, fld))
    return raw, cables


def _ansible_hosts(data: dict, hostvars: dict) -> list[str]:
    """Every host of the --list output, in inventory order (groups from `all` down)."""
    seen: dict[str, None] = {}
    visited: set[str] = set()

    def walk(group: str) -> None:
        if group in visited or not isinstance(data.get(group), dict):
            return
        visited.add(group)
        for h in data[group].get("hosts", []):
            seen.setdefault(h, None)
        for child in data[group].get("children", []):
            walk(child)

    walk("all")
    for h in hostvars:
        seen.setdefault(h, None)
    return list(seen)


def _ansible_become(hv: dict, src: str, where: str) -> _Field:
    value = hv["ansible_become"]
    label = f"{where}: ansible_become"
    if isinstance(value, str) and value.lower() in (
        "true",
        "yes",
        "on",
        "1",
        "false",
        "no",
        "off",
        "0",
    ):
        value = value.lower() in ("true", "yes", "on", "1")
    if not isinstance(value, bool):
        raise ConfigError(f"must be true or false, got {value!r}", source=src, field=label)
    method = hv.get("ansible_become_method", "sudo")
    if value and method != "sudo":
        raise ConfigError(
            f"the lab gets root with sudo only, got {method!r}; accepted: sudo",
            source=src,
            field=f"{where}: ansible_become_method",
        )
    become = "sudo" if value and hv.get("ansible_user") != "root" else "root"
    return (become, src, label)


# --------------------------------------------------------------------------- validation


def _build(
    path: Path,
    raw: dict[str, dict[str, _Field]],
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
    name: str, fields: dict[str, _Field], main_src: str, *, toml: bool, ansible: tuple[str, ...]
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
    key = _relative_to(Path(src), value)
    if not key.is_file():
        raise ConfigError(f"private key file {key} not found", source=src, field=fld)
    return str(key)


def _check_addresses(boards: dict[str, Board], raw: dict[str, dict[str, _Field]]) -> None:
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


# the mapping half lives in lab.substrate.boards.mapping; its names stay importable from here
from lab.substrate.boards.mapping import board_spec, check_management, map_nodes, parse_map_option  # noqa: E402,F401
