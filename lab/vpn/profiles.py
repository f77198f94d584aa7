"""VPN profiles: TOML data files in vpn_profiles/ that pick a driver and its parameters.

    driver = "wireguard"
    description = "..."
    study = "A"
    [params]
    listen_port = 51820

A profile spec on the command line is `NAME[:key=value,...]` (or a path to a .toml file instead
of NAME); the overrides go through the same validation as the file's [params]. Every problem is a
ConfigError naming the file (or --vpn), the field and the accepted values, raised before anything
is created.
"""

from __future__ import annotations

from lab import REPO
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.core.errors import ConfigError
from lab.vpn import get_driver
from lab.model.params import validate, value_error
from lab.vpn import tunneladdr
from lab.vpn.userconfig import UserConfig, hashes, load_configs
from lab.vpn.base import Driver

PROFILE_DIR = REPO / "vpn_profiles"
TOP_KEYS = {
    "driver": str,
    "description": str,
    "study": str,
    "params": dict,
    "configs": dict,
    "tunnel": dict,
}
#: a profile name: a file name in vpn_profiles/ without .toml
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._\-]{0,63}\Z")


def profile_dirs() -> list[Path]:
    extra = os.environ.get("LAB_VPN_PROFILES")
    return ([Path(extra)] if extra else []) + [PROFILE_DIR]


@dataclass
class Profile:
    name: str
    path: Path
    driver_name: str
    description: str
    study: str
    params: dict[str, Any]  # complete: defaults filled in, overrides applied, validated
    overrides: dict[str, Any] = field(default_factory=dict)
    #: role -> the user's own config file ([configs], lab.vpn.userconfig; docs/byoc.md)
    configs: dict[str, UserConfig] = field(default_factory=dict)
    #: role -> (v4, v6 or ""): the tunnel addresses of the user's files ([tunnel],
    #: lab.vpn.tunneladdr); empty: the lab's layout
    tunnel: dict[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def driver(self) -> Driver:
        return get_driver(self.driver_name, source=str(self.path))

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "file": str(self.path),
            "driver": self.driver_name,
            "description": self.description,
            "study": self.study,
            "params": dict(self.params),
            "overrides": dict(self.overrides),
            **({"configs": hashes(self.configs)} if self.configs else {}),
            **({"tunnel": dict(self.tunnel)} if self.tunnel else {}),
        }


def known_profiles() -> list[str]:
    names: set[str] = set()
    for d in profile_dirs():
        if d.is_dir():
            names.update(p.stem for p in d.glob("*.toml"))
    return sorted(names)


def find_profile(name: str) -> Path:
    if name.endswith(".toml") or "/" in name:
        p = Path(name)
        if max(len(part.encode()) for part in name.split("/")) > 255:
            raise ConfigError(
                "path too long (a name may have 255 bytes)", source=name[:60] + "...", field="--vpn"
            )
        if p.is_dir():
            raise ConfigError("is a directory, not a profile file (.toml)", source=name)
        if not p.is_file():
            raise ConfigError("profile file not found", source=name, field="--vpn")
        return p
    if not NAME_RE.match(name):
        shown = name if len(name) <= 60 else name[:60] + "..."
        raise ConfigError(
            f"{shown!r} is not a profile name (lowercase letters, digits, '.', '_', '-', "
            f"at most 64) nor a .toml path; valid: {', '.join(known_profiles())}",
            source="--vpn",
        )
    for d in profile_dirs():
        p = d / f"{name}.toml"
        if p.is_file():
            return p
    raise ConfigError(
        f"unknown VPN profile {name!r}; valid: {', '.join(known_profiles())}", source="--vpn"
    )


def split_spec(spec: str) -> tuple[str, dict[str, str]]:
    """'wireguard:mtu=1280,listen_port=51821' -> ('wireguard', {'mtu': '1280', ...})."""
    name, colon, rest = spec.partition(":")
    if not name.strip():
        raise ConfigError(f"expected PROFILE[:key=value,...], got {spec!r}", source="--vpn")
    if colon and not rest.strip():
        raise ConfigError(
            f"nothing after ':' in {spec!r}; give PROFILE or PROFILE:key=value,...", source="--vpn"
        )
    overrides: dict[str, str] = {}
    for item in rest.split(",") if colon else []:
        key, eq, value = (s.strip() for s in item.partition("="))
        if not eq or not key or not value:
            raise ConfigError(
                f"override {item!r} must be key=value (PROFILE:key=value,key=value)", source="--vpn"
            )
        if not (key + value).isascii():
            raise ConfigError(
                f"override {item!r}: accepted ASCII only (a look-alike character is not the value "
                "it resembles)",
                source="--vpn",
                field=f"params.{key}",
            )
        if key in overrides:
            raise ConfigError(
                f"given twice in {spec!r}; give each parameter once",
                source="--vpn",
                field=f"params.{key}",
            )
        overrides[key] = value
    return name, overrides


def load_profile(spec: str) -> Profile:
    """Load, override and validate a profile spec `NAME[:k=v,...]`."""
    name, overrides = split_spec(spec)
    path = find_profile(name)
    src = str(path)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"not valid TOML: {e}", source=src)
    except UnicodeDecodeError as e:
        raise ConfigError(f"not UTF-8 text (byte {e.start}): not a TOML file", source=src)
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror}", source=src)
    for key, value in data.items():
        if key not in TOP_KEYS:
            raise ConfigError(
                f"unknown key {key!r}; valid: {', '.join(TOP_KEYS)}", source=src, field=key
            )
        if not isinstance(value, TOP_KEYS[key]):
            raise ConfigError(
                f"must be a {TOP_KEYS[key].__name__}, got {value!r}", source=src, field=key
            )
    if "driver" not in data:
        raise ConfigError("missing (which driver runs this profile)", source=src, field="driver")
    driver = get_driver(data["driver"], source=src)
    params = validate_params(driver, data.get("params", {}), source=src)
    typed = {}
    for key, raw in overrides.items():
        typed[key] = coerce(driver, key, raw)
    params = validate_params(driver, {**params, **typed}, source="--vpn")
    return Profile(
        name=path.stem,
        path=path,
        driver_name=driver.name,
        description=data.get("description", ""),
        study=data.get("study", ""),
        params=params,
        overrides=typed,
        configs=load_configs(driver.name, data["configs"], path) if "configs" in data else {},
        tunnel=tunneladdr.load(data["tunnel"], src) if "tunnel" in data else {},
    )


def _owner(driver: Driver) -> str:
    return f"driver {driver.name!r}"


def coerce(driver: Driver, key: str, raw: str) -> Any:
    """A command-line override string converted to the parameter's type."""
    p = driver.params.get(key)
    if p is None:
        validate(
            driver.params, {key: raw}, source="--vpn", owner=_owner(driver), field_prefix="params."
        )
    try:
        return p.from_text(raw)
    except ValueError:
        raise value_error(
            p,
            f"got {raw!r}",
            name=key,
            source="--vpn",
            owner=_owner(driver),
            field_prefix="params.",
        ) from None


def validate_params(driver: Driver, given: dict[str, Any], *, source: str) -> dict[str, Any]:
    """Check type, choices and range of every parameter (lab.model.params), then the driver's checks
    across them; returns them with defaults filled in."""
    out = validate(
        driver.params, given, source=source, owner=_owner(driver), field_prefix="params."
    )
    driver.validate(out, source=source)
    return out
