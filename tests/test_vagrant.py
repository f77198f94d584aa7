"""The Vagrantfile: `vagrant validate` of the one-VM lab and of the three-board variant, the
refusal of other board counts, and the boards inventory the three-board variant writes, read by
the lab's own inventory reader and mapped onto pi_pair_middlebox. No VM boots here (no provider
on this machine): docs/vagrant.md says what that leaves untested."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from .conftest import REPO, TOPOS


def vagrant(tmp_path, *args, boards: str | None = None):
    if not shutil.which("vagrant"):
        pytest.skip("vagrant missing (./setup.sh installs it)")
    shutil.copy(REPO / "Vagrantfile", tmp_path / "Vagrantfile")
    env = {**os.environ, "VAGRANT_CWD": str(tmp_path), "VAGRANT_HOME": str(tmp_path / "home")}
    env.pop("LAB_BOARDS", None)
    if boards is not None:
        env["LAB_BOARDS"] = boards
    return subprocess.run(
        ["vagrant", *args], capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path
    )


def test_one_lab_vm_validates(tmp_path):
    r = vagrant(tmp_path, "validate", "--ignore-provider")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "validated successfully" in r.stdout
    assert not (tmp_path / ".vagrant" / "lab-boards.toml").exists()


def test_other_board_counts_are_refused(tmp_path):
    r = vagrant(tmp_path, "validate", "--ignore-provider", boards="2")
    assert r.returncode != 0
    assert "LAB_BOARDS=2" in r.stdout + r.stderr and "accepted values" in r.stdout + r.stderr


def test_three_boards_validate_and_their_inventory_maps_the_topology(tmp_path):
    from lab.substrate.boards.inventory import load_inventory
    from lab.substrate.boards.mapping import board_spec, map_nodes
    from lab.model.topology import load_topology

    r = vagrant(tmp_path, "validate", "--ignore-provider", boards="3")
    assert r.returncode == 0, r.stdout + r.stderr
    inv_path = tmp_path / ".vagrant" / "lab-boards.toml"
    # the keys Vagrant creates at `vagrant up`: stand-ins, so the reader's checks can run
    for name in ("client", "router", "server"):
        key = tmp_path / ".vagrant" / "machines" / name / "virtualbox" / "private_key"
        key.parent.mkdir(parents=True)
        key.write_text("stand-in\n")
    inv = load_inventory(inv_path)
    assert sorted(inv.boards) == ["client", "router", "server"]
    assert all(b.become == "sudo" and b.mgmt == "eth1" for b in inv.boards.values())
    assert len({b.host for b in inv.boards.values()}) == 3
    spec = load_topology(TOPOS / "pi_pair_middlebox.py")
    bmap = map_nodes(spec, inv)
    bspec = board_spec(spec, bmap)
    for n in bspec.hosts():  # every topology port lands on one of that board's data ports
        assert {i.name for i in n.interfaces} <= set(inv.boards[bmap.nodes[n.name]].data)
