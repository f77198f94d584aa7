"""Every tool and Debian package the lab and its plug-ins declare, gathered in one place.

The declarations live with their owners: each VPN driver's `Driver.requires` and
`Driver.packages`, each measurement's `Test.requires`, and lab.core.tools (the commands every
node runs, the lab's own ip/tc/ethtool). Everything else that lists tools or packages is
derived from them here:
  packages.txt        setup.sh's package list for all of those (PACKAGE_FILE, below)
  board_packages()    what `lab arch fetch` unpacks into a board's root
  board_tools()       which commands an arch node runs from that root (lab.core.arch.emulate)
  version_commands()  the run manifest's version commands (lab.campaign.setup.TOOL_VERSIONS)
and the board checks use the same Tool declarations (lab.substrate.boards.check).

setup.sh reads packages.txt, a file generated from the declarations and checked against them
by tests/test_vpn_conformance.py, rather than asking Python: setup.sh installs its apt packages
before the virtualenv exists (python3 itself is one of them), and the plug-in modules import
jinja2 and the lab's other dependencies, so the declarations cannot be read there; plain text
needs nothing but bash. Regenerate it with write_package_file() after changing a declaration.
"""

from __future__ import annotations

from pathlib import Path

from lab import REPO
from lab.core.tools import LAB_TOOLS, NODE_TOOLS, Tool
from lab.measure import TESTS
from lab.vpn import driver_classes

#: setup.sh's list of the declared packages (the lab's host-only packages stay in setup.sh)
PACKAGE_FILE = REPO / "packages.txt"
#: fetched into every board root besides the declared packages: its ldconfig writes the root's
#: ld.so.cache (lab.core.arch.fetch); Essential on a board, so it is there too
ROOT_PACKAGES = ("libc-bin",)


def declarations() -> list[tuple[str, Tool]]:
    """(who declares it, tool) for every declaration, in order: the node commands, the lab's
    own, the drivers', the tests' (registry order). TypeError when two declarations of one
    tool name disagree (package, version command, label or board)."""
    out: list[tuple[str, Tool]] = [("node", t) for t in NODE_TOOLS]
    out += [("lab", t) for t in LAB_TOOLS]
    for name in sorted(driver_classes()):
        out += [(f"driver {name}", t) for t in driver_classes()[name].requires]
    for name, test in TESTS.items():
        out += [(f"test {name}", t) for t in test.requires]
    first: dict[str, tuple[str, Tool]] = {}
    for who, t in out:
        seen = first.setdefault(t.name, (who, t))
        if seen[1] != t:
            raise TypeError(f"tool {t.name!r}: {who} declares {t}, {seen[0]} {seen[1]}")
    return out


def all_tools() -> list[Tool]:
    """Every declared tool, once each, in declaration order."""
    out: dict[str, Tool] = {}
    for _, t in declarations():
        out.setdefault(t.name, t)
    return list(out.values())


def driver_packages() -> dict[str, list[str]]:
    """{package: [drivers]} of the packages the drivers declare besides their tools'."""
    out: dict[str, list[str]] = {}
    for name in sorted(driver_classes()):
        for p in driver_classes()[name].packages:
            out.setdefault(p, []).append(name)
    return out


def packages() -> dict[str, list[str]]:
    """{Debian package: what needs it (its tools' names, or "driver X" for a package a driver
    declares besides its tools')}, packages sorted."""
    out: dict[str, list[str]] = {}
    for _, t in declarations():
        needs = out.setdefault(t.package, [])
        if t.basename not in needs:
            needs.append(t.basename)
    for pkg, drivers in driver_packages().items():
        out.setdefault(pkg, []).append(f"driver {', '.join(drivers)}")
    return dict(sorted(out.items()))


def package_file_text() -> str:
    """packages.txt as the declarations make it: one package a line, what needs it after #."""
    lines = [
        "# Debian packages of the tools the lab and its plug-ins declare (lab.core.tools,",
        "# Driver.requires/packages, Test.requires), read by setup.sh. Generated: do not edit;",
        "# after changing a declaration run",
        "#   .venv/bin/python -c 'from lab.substrate.tools import write_package_file as w; w()'",
        "# (tests/test_vpn_conformance.py checks this file against the declarations).",
    ]
    for pkg, needs in packages().items():
        lines.append(f"{pkg}  # {', '.join(needs)}")
    return "\n".join(lines) + "\n"


def write_package_file(path: Path = PACKAGE_FILE) -> None:
    path.write_text(package_file_text())


def board_tools() -> frozenset[str]:
    """The board software under test (Tool.board), by basename: an arch node runs these from
    the board's root under qemu-user, everything else as this machine's binary."""
    return frozenset(t.basename for t in all_tools() if t.board)


def board_packages() -> dict[str, str]:
    """{package: why} of what `lab arch fetch` unpacks: the board tools' packages, the
    drivers' other packages (charon's plug-ins) and ROOT_PACKAGES; sorted."""
    out: dict[str, str] = {}
    for t in all_tools():
        if t.board:
            out[t.package] = ", ".join(filter(None, (out.get(t.package), t.basename)))
    for pkg, drivers in driver_packages().items():
        out.setdefault(pkg, f"driver {', '.join(drivers)}")
    for pkg in ROOT_PACKAGES:
        out.setdefault(pkg, "ldconfig: the root's ld.so.cache")
    return dict(sorted(out.items()))


def version_commands() -> dict[str, list[str]]:
    """{manifest key: version argv} of every declared tool that has a version command."""
    out: dict[str, list[str]] = {}
    for t in all_tools():
        if t.version:
            out.setdefault(t.key, list(t.version))
    return out
