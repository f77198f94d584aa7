"""Read a board inventory: a boards.toml or an Ansible inventory, validated into an Inventory.

An inventory is a TOML file (`boards.toml`, optionally drawing connection fields from an Ansible
inventory) or an Ansible inventory itself (YAML, INI or a directory, read by the real
`ansible-inventory`). Everything is checked once here, with errors naming the file, the board and
the field; the rest of the board code gets frozen `Board`/`Cable`/`Inventory` objects. This module
reads boards.toml and chooses the format; lab.substrate.boards.ansible reads Ansible inventories,
lab.substrate.boards.inventoryfields checks every field and builds the objects, and
lab.substrate.boards.mapping puts a topology on the boards.

Pure data apart from running `ansible-inventory`: nothing here touches a board. See docs/boards.md.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from lab.core.errors import ConfigError, reject_unknown
from lab.substrate.boards.ansible import read_ansible
from lab.substrate.boards.inventoryfields import BOARD_KEYS, Field, build, relative_to
from lab.substrate.boards.types import Inventory

TOP_KEYS = {
    "boards": "[boards.NAME] tables",
    "cables": '[[cables]] tables with a = "board:ifname", b = "board:ifname"',
    "ansible": "Ansible inventory to read connection fields from",
    "ansible_limit": "Ansible host pattern (ansible-inventory --limit)",
}
CABLE_KEYS = ("a", "b")

# --------------------------------------------------------------------------- loading


def load_inventory(path: str | Path) -> Inventory:
    """Read a boards.toml (any *.toml) or an Ansible inventory (anything else) and validate it."""
    path = Path(path)
    src = str(path)
    if not path.exists():
        raise ConfigError("inventory file not found", source=src)
    if path.suffix == ".toml":
        return _load_toml(path)
    raw, cables = read_ansible(path, limit=None)
    return build(path, raw, cables, (src,), toml=False)


def _load_toml(path: Path) -> Inventory:
    src = str(path)
    try:
        doc = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"not valid TOML: {e}", source=src)
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read: {e}", source=src)
    reject_unknown(doc, TOP_KEYS, source=src)
    raw: dict[str, dict[str, Field]] = {}
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
        ans_path = relative_to(path, ans)
        if len(ans_path.name.encode()) > 255 or not ans_path.exists():  # ENAMETOOLONG
            raise ConfigError(
                f"Ansible inventory {ans_path} not found", source=src, field="ansible"
            )
        limit = doc.get("ansible_limit")
        if limit is not None and (not isinstance(limit, str) or not limit):
            raise ConfigError(
                f"must be an Ansible host pattern, got {limit!r}", source=src, field="ansible_limit"
            )
        raw, cables = read_ansible(ans_path, limit=limit)
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
        reject_unknown(table, BOARD_KEYS, source=src, where=where)
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
        reject_unknown(c, CABLE_KEYS, source=src, where=where)
        missing = [k for k in CABLE_KEYS if k not in c]
        if missing:
            raise ConfigError(
                f'missing {", ".join(missing)}; a cable has a = "board:ifname" and b = "board:ifname"',
                source=src,
                field=where,
            )
        cables.append((c["a"], c["b"], src, where))
    return build(path, raw, cables, tuple(sources), toml=True)
