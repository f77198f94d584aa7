"""VPN drivers: the registry that maps a driver name to its class.

Drivers are discovered, not listed: every module in this package that defines a `Driver`
subclass with a `name` registers it, so adding a technology means adding one module (plus its
profiles in vpn_profiles/, and packages.txt regenerated from what it declares, which
tests/test_vpn_conformance.py checks) and touching nothing else.
"""

from __future__ import annotations

import importlib
import pkgutil

from lab.core.errors import ConfigError, did_you_mean
from lab.vpn import drivers as drivers_pkg
from lab.vpn.base import Driver
from lab.core.tools import NODE_TOOLS, Tool

_registry: dict[str, type[Driver]] | None = None


def driver_classes() -> dict[str, type[Driver]]:
    """{driver name: class} for every module of lab.vpn.drivers (imported once)."""
    global _registry
    if _registry is None:
        found: dict[str, type[Driver]] = {}
        for mod in sorted(pkgutil.iter_modules(drivers_pkg.__path__), key=lambda m: m.name):
            if mod.name.startswith("_"):
                continue
            module = importlib.import_module(f"{drivers_pkg.__name__}.{mod.name}")
            for obj in vars(module).values():
                if (
                    isinstance(obj, type)
                    and issubclass(obj, Driver)
                    and obj is not Driver
                    and obj.name
                    and obj.__module__ == module.__name__
                ):
                    found[obj.name] = obj
        _registry = found
    return _registry


def declared_tools(*, node_tools: bool = False) -> list[Tool]:
    """Every tool the drivers declare (Driver.requires), once each, in registry order; with
    node_tools, the commands the probes run on any node (lab.core.tools.NODE_TOOLS) first.
    lab.substrate.tools gathers these with the measurements' tools."""
    out: dict[str, Tool] = {}
    for t in NODE_TOOLS if node_tools else ():
        out.setdefault(t.name, t)
    for name in sorted(driver_classes()):
        for t in driver_classes()[name].requires:
            out.setdefault(t.name, t)
    return list(out.values())


def get_driver(name: str, *, source: str | None = None) -> Driver:
    """An instance of driver `name`; ConfigError listing the valid drivers when unknown."""
    cls = driver_classes().get(name)
    if cls is None:
        raise ConfigError(
            f"unknown driver {name!r}{did_you_mean(name, driver_classes())}; valid: "
            f"{', '.join(sorted(driver_classes()))}",
            source=source,
            field="driver",
        )
    return cls()


def declared_packages() -> list[str]:
    """The Debian packages the drivers declare besides their tools' (Driver.packages), once
    each, in registry order."""
    out: dict[str, None] = {}
    for name in sorted(driver_classes()):
        out.update(dict.fromkeys(driver_classes()[name].packages))
    return list(out)
