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
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.core.errors import ConfigError, did_you_mean
from lab.core.paths import is_path, locate, shipped
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
    return shipped("profile")


def find_profile(name: str, *, where: str = "--vpn") -> Path:
    """A profile file: a .toml path (relative to the current directory, else to the
    installation) or a name in $LAB_VPN_PROFILES or vpn_profiles/ (lab.core.paths says the
    rule). `where`: where the name was given, for the error (`--vpn`, a plan's profiles[0])."""
    if not is_path("profile", name) and not NAME_RE.match(name):
        shown = name if len(name) <= 60 else name[:60] + "..."
        raise ConfigError(
            f"{shown!r} is not a profile name (lowercase letters, digits, '.', '_', '-', "
            f"at most 64) nor a .toml path{did_you_mean(name.lower(), known_profiles())}; "
            f"valid: {', '.join(known_profiles())}",
            source=where,
        )
    return locate("profile", name, source=where)


def split_spec(spec: str, *, where: str = "--vpn") -> tuple[str, dict[str, str]]:
    """'wireguard:mtu=1280,listen_port=51821' -> ('wireguard', {'mtu': '1280', ...})."""
    name, colon, rest = spec.partition(":")
    if not name.strip():
        raise ConfigError(f"expected PROFILE[:key=value,...], got {spec!r}", source=where)
    if colon and not rest.strip():
        raise ConfigError(
            f"nothing after ':' in {spec!r}; give PROFILE or PROFILE:key=value,...", source=where
        )
    overrides: dict[str, str] = {}
    for item in rest.split(",") if colon else []:
        key, eq, value = (s.strip() for s in item.partition("="))
        if not eq or not key or not value:
            raise ConfigError(
                f"override {item!r} must be key=value (PROFILE:key=value,key=value)", source=where
            )
        if not (key + value).isascii():
            raise ConfigError(
                f"override {item!r}: accepted ASCII only (a look-alike character is not the value "
                "it resembles)",
                source=where,
                field=f"params.{key}",
            )
        if key in overrides:
            raise ConfigError(
                f"given twice in {spec!r}; give each parameter once",
                source=where,
                field=f"params.{key}",
            )
        overrides[key] = value
    return name, overrides


def load_profile(spec: str, *, where: str = "--vpn") -> Profile:
    """Load, override and validate a profile spec `NAME[:k=v,...]`. `where`: where the spec was
    given (`--vpn`, or a plan's "FILE: profiles[0]"), the source of the errors in the spec."""
    name, overrides = split_spec(spec, where=where)
    path = find_profile(name, where=where)
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
        typed[key] = coerce(driver, key, raw, where=where)
    params = validate_params(driver, {**params, **typed}, source=where)
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


def coerce(driver: Driver, key: str, raw: str, *, where: str = "--vpn") -> Any:
    """A command-line override string converted to the parameter's type."""
    p = driver.params.get(key)
    if p is None:
        validate(
            driver.params, {key: raw}, source=where, owner=_owner(driver), field_prefix="params."
        )
    try:
        return p.from_text(raw)
    except ValueError:
        raise value_error(
            p,
            f"got {raw!r}",
            name=key,
            source=where,
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
