"""One declaration of every tool and package (issue 29): each VPN driver's `Driver.requires` and
`Driver.packages`, each measurement's `Test.requires` and lab.core.tools feed setup.sh's package
list. packages.txt must be exactly what lab.substrate.tools derives from them, setup.sh must
read it and repeat none of it in its own list, and two declarations of one tool must agree.
(`lab arch fetch` and the arch nodes' tool map: tests/test_arch.py.)"""

from __future__ import annotations

import re

import pytest

from lab.core.tools import LAB_TOOLS, NODE_TOOLS, Tool
from lab.measure import declared_tools as declared_test_tools
from lab.substrate import tools as lab_tools
from lab.substrate.tools import PACKAGE_FILE, declarations, package_file_text, packages
from lab.vpn import driver_classes
from tests.conftest import REPO

DRIVERS = sorted(driver_classes())


def setup_own_packages() -> set[str]:
    """The words of setup.sh's own APT_PACKAGES=( ... ) array, comments dropped."""
    text = (REPO / "setup.sh").read_text()
    m = re.search(r"^APT_PACKAGES=\((.*?)^\)", text, re.MULTILINE | re.DOTALL)
    assert m, "setup.sh has no APT_PACKAGES=( ... ) array"
    return {w for line in m.group(1).splitlines() for w in line.split("#", 1)[0].split()}


def package_file_packages() -> set[str]:
    """The packages packages.txt lists, read as setup.sh reads it (first word, # comments)."""
    out = set()
    for line in PACKAGE_FILE.read_text().splitlines():
        words = line.split()
        if words and not words[0].startswith("#"):
            out.add(words[0])
    return out


def test_package_file_is_derived_from_the_declarations():
    regenerate = "regenerate it: lab.substrate.tools.write_package_file()"
    assert PACKAGE_FILE.read_text() == package_file_text(), f"packages.txt is stale; {regenerate}"


def test_setup_installs_the_package_file_and_repeats_none_of_it():
    text = (REPO / "setup.sh").read_text()
    assert re.search(r"^done < packages\.txt$", text, re.MULTILINE), "setup.sh reads packages.txt"
    repeated = setup_own_packages() & set(packages())
    assert not repeated, f"declared packages listed again in setup.sh: {sorted(repeated)}"


@pytest.mark.parametrize("name", DRIVERS)
def test_declared_packages_are_in_the_package_file(name):
    drv = driver_classes()[name]
    missing = {t.package for t in drv.requires} | set(drv.packages)
    missing -= package_file_packages()
    assert not missing, f"{name}: packages not in packages.txt: {sorted(missing)}"


def test_node_and_measurement_tool_packages_are_in_the_package_file():
    tools = (*NODE_TOOLS, *LAB_TOOLS, *declared_test_tools())
    assert {t.package for t in tools} <= package_file_packages()


def test_two_declarations_of_one_tool_must_agree(monkeypatch):
    # a tool declared twice (openssl: openvpn and tinc) is one tool: same package, version
    # command and board flag, or the derived lists would depend on the order
    assert declarations()
    monkeypatch.setattr(lab_tools, "LAB_TOOLS", (*LAB_TOOLS, Tool("openssl", "libssl3")))
    with pytest.raises(TypeError, match="tool 'openssl': driver openvpn declares .* lab Tool"):
        declarations()
