"""A board whose login user is not root and gets root with sudo (`become = "sudo"`), for real:
an emulated farm of pi_pair whose client board logs in as `pi` (`lab boards emulate --sudo
client`: copies of /etc/passwd, group, shadow and sudoers bound in that board's mount namespace
only), a WireGuard lab up across it, a ping through the tunnel, and `lab down` leaving the
board as it was (read over SSH through sudo by the test itself)."""

from __future__ import annotations

import dataclasses
import json
import subprocess

import pytest

from .conftest import TOPOS, board_farm, run_lab
from .test_boards import board_state

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def sudo_farm(tmp_path_factory):
    passwd = open("/etc/passwd").read()
    with board_farm(
        tmp_path_factory, ("sudo", "wireguard-go"), "pi_pair.py", ("--sudo", "client")
    ) as farm:
        yield farm
    assert open("/etc/passwd").read() == passwd  # this machine's /etc never changed


def test_unknown_sudo_board_is_refused(tmp_path):
    r = run_lab("boards", "emulate", TOPOS / "pi_pair.py", "--out", tmp_path / "f.toml",
                "--sudo", "nosuch")  # fmt: skip
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--sudo" in r.stderr and "client, server" in r.stderr, r.stderr
    assert not (tmp_path / "f.toml").exists()


def test_sudo_board_up_ping_down(sudo_farm, tmp_path):
    from lab.substrate.boards.inventory import load_inventory
    from lab.substrate.boards.connection import ssh_argv

    inv, rec = sudo_farm
    client = load_inventory(inv).boards["client"]
    assert (client.user, client.become) == ("pi", "sudo")
    # the login itself is not root: the same ssh without sudo
    plain = subprocess.run(
        ssh_argv(dataclasses.replace(client, become="root"), ["id", "-u"]),
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.strip() not in ("", "0"), plain.stdout
    before = board_state(inv, tmp_path)
    r = run_lab("up", TOPOS / "pi_pair.py", "--boards", inv, "--vpn", "wireguard", "--id", "ts1",
                "--json")  # fmt: skip
    try:
        assert r.returncode == 0, r.stderr
        peer = json.loads(r.stdout)["vpn"]["traffic"]["v4"]
        p = run_lab("exec", "--id", "ts1", "client", "--", "ping", "-c", "3", "-i", "0.2", "-W",
                    "2", peer)  # fmt: skip
        assert p.returncode == 0, p.stdout + p.stderr
        during = board_state(inv, tmp_path)
        assert any(ln[1] == "wg0" for ln in during["client"]["links"])  # root's work, via sudo
        assert ["eth1", "10.0.1.1/24"] in during["client"]["addrs"], during["client"]["addrs"]
    finally:
        d = run_lab("down", "--id", "ts1")
    assert d.returncode == 0, d.stdout + d.stderr
    assert board_state(inv, tmp_path) == before
