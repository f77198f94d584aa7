"""Ansible inventories as a board inventory's source: `ansible-inventory --list` (the real tool,
so YAML, INI, directories and plugins read as Ansible reads them) turned into the fields of each
board (lab.substrate.boards.inventoryfields) and the cables of `lab_cables`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from lab.core import proc
from lab.core.errors import ConfigError, PreconditionError
from lab.substrate.boards.inventoryfields import ANSIBLE_VARS, Field

LAB_VARS = ("lab_mgmt", "lab_data", "lab_cables")
ANSIBLE_TOOL = "ansible-inventory"
ANSIBLE_PACKAGES = "Debian package 'ansible', or PyPI 'ansible-core' (./setup.sh installs it)"


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


def read_ansible(
    path: Path, *, limit: str | None
) -> tuple[dict[str, dict[str, Field]], list[tuple[Any, Any, str, str]]]:
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
    raw: dict[str, dict[str, Field]] = {}
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
        fields: dict[str, Field] = {"host": (name, src, f"{where}: inventory hostname")}
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


def _ansible_become(hv: dict, src: str, where: str) -> Field:
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
