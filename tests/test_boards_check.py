"""`lab boards check` and `lab boards prepare` (lab/substrate/boards/check.py, lab/cli/boards.py).

Unit tests parse what a board prints (golden text of a Raspberry Pi) and check the packages and
the apt-get command prepare would run, with a fake node. On an emulated farm (root): every board
is reachable with root and has this machine's arch and kernel (its boards are namespaces here),
a profile this kernel can run is ok and one it cannot says why; a board that cannot be reached
makes check exit 3 with that board marked and the others still checked; prepare lists, refuses
without a terminal or a yes, and would run apt-get with DEBIAN_FRONTEND=noninteractive. No test
installs a package: the emulated boards share this machine's filesystem.
"""

from __future__ import annotations

import io
import json
import platform
import subprocess

import pytest

from lab.substrate.boards import check as bc
from lab.core.tools import Tool

from .conftest import board_farm, run_lab

PI_FACTS = """
==> uid <==
0

==> model <==
Raspberry Pi 4 Model B Rev 1.5

==> dmi <==

==> serial <==
10000000abcdef01

==> arch <==
aarch64

==> kernel <==
6.6.31+rpt-rpi-v8

==> os-release <==
PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"
NAME="Debian GNU/Linux"

==> governor <==
ondemand

==> thermal <==
51121

==> vcgencmd <==
/usr/bin/vcgencmd

==> get_throttled <==
throttled=0x20000

==> measure_temp <==
temp=51.6'C

==> timedatectl <==
yes
"""


def test_facts_of_a_pi():
    f = bc.parse_facts(PI_FACTS)
    assert f["root"] is True
    assert f["model"] == "Raspberry Pi 4 Model B Rev 1.5"
    assert f["model_source"] == "/proc/device-tree/model"
    assert (f["arch"], f["os"], f["kernel"]) == (
        "aarch64", "Debian GNU/Linux 12 (bookworm)", "6.6.31+rpt-rpi-v8"
    )  # fmt: skip
    assert f["governor"] == "ondemand"
    assert (f["temperature_c"], f["temperature_source"]) == (51.6, "vcgencmd measure_temp")
    assert f["throttled"] == {"raw": "0x20000", "words": ["arm_freq_capped_occurred"]}
    assert f["clock_sync"] == "yes"


def test_facts_of_a_pc_without_firmware_or_clock_sync():
    f = bc.parse_facts(
        "==> uid <==\n1000\n==> model <==\n\n==> dmi <==\nThinkCentre M720q\n"
        "==> thermal <==\n40000\n45500\n"
    )
    assert f["root"] is False and f["uid"] == "1000"
    assert (f["model"], f["model_source"]) == ("ThinkCentre M720q", "DMI product_name")
    assert (f["temperature_c"], f["temperature_source"]) == (45.5, "/sys/class/thermal")
    assert f["throttled"] is None and "vcgencmd not on PATH" in f["throttled_why"]
    assert f["clock_sync"] == "unknown"
    assert f["clock_sync_source"] == "neither timedatectl nor chronyc on the board"


@pytest.mark.parametrize(
    ("sections", "expect"),
    [
        ({"timedatectl": "no"}, "no"),
        ({"timedatectl": "Failed to connect to bus", "chronyc": "Leap status     : Normal"}, "yes"),
        ({"chronyc": "Leap status     : Not synchronised"}, "no"),
        ({"chronyc": "506 Cannot talk to daemon"}, "unknown"),
    ],
)
def test_clock_sync(sections, expect):
    assert bc.clock_sync(sections)[0] == expect


class FakeNode:
    """missing_tools answers from a set; run records argv and env."""

    def __init__(self, missing=()):
        self.missing = set(missing)
        self.ran = []

    def missing_tools(self, tools):
        return [t for t in tools if t in self.missing]

    def run(self, argv, *, check=True, timeout=60, input=None, env=None):
        self.ran.append((list(argv), dict(env or {})))
        return subprocess.CompletedProcess(argv, 0, "", "")


def test_missing_packages_and_the_apt_get_it_would_run():
    tools = [
        Tool("ip", "iproute2"),
        Tool("tc", "iproute2"),
        Tool("wg", "wireguard-tools"),
        Tool("iperf3", "iperf3"),
    ]
    node = FakeNode(missing={"tc", "iperf3", "ip"})
    pkgs = bc.missing_packages(node, tools)
    assert pkgs == {"iperf3": ["iperf3"], "iproute2": ["ip", "tc"]}
    bc.install(node, list(pkgs))
    assert node.ran == [
        (["apt-get", "install", "-y", "--no-install-recommends", "iperf3", "iproute2"],
         {"DEBIAN_FRONTEND": "noninteractive"})
    ]  # fmt: skip
    node = FakeNode()
    bc.install(node, [])
    assert node.ran == []  # nothing missing: nothing run


def test_board_tools_are_the_labs_then_the_profiles():
    from lab.vpn.profiles import load_profile

    names = [t.name for t in bc.board_tools([load_profile("wireguard")])]
    assert names[:5] == ["ip", "tc", "ping", "iperf3", "ethtool"]
    assert "wg" in names
    with_node = [t.name for t in bc.board_tools([], node_tools=True)]
    assert "unshare" in with_node and "iperf3" in with_node


# ----------------------------------------------------------------------------- on a farm


@pytest.fixture(scope="module")
def farm(tmp_path_factory):
    """An emulated farm of pi_pair_middlebox with a state root of this module's own."""
    with board_farm(tmp_path_factory) as (inv, _):
        yield inv


def _here(profiles: list[str]) -> dict[str, dict]:
    """`lab profiles --json` on this machine, for the given profiles."""
    r = run_lab("profiles", "--json")
    assert r.returncode == 0, r.stderr
    return {p["profile"]: p for p in json.loads(r.stdout) if p["profile"] in profiles}


#: one userspace profile and kernel-only data planes (MACsec, GRE) this machine may lack
PROFILES = ["wireguard", "macsec-gcm-aes-128", "gre"]


@pytest.mark.root
def test_check_on_a_farm(farm):
    r = run_lab("boards", "check", farm, "--profiles", ",".join(PROFILES), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    records = json.loads(r.stdout)
    assert [x["board"] for x in records] == ["client", "server", "router"]
    here = _here(PROFILES)
    for x in records:
        assert x["reachable"] is True and x["root"] is True, x
        assert 0 < x["connect_s"] < 20
        assert x["arch"] == platform.machine()
        assert x["kernel"] == platform.release()
        assert x["os"]
        assert x["clock_sync"] in ("yes", "no", "unknown") and x["clock_sync_source"]
        assert x["tools"]["iperf3"]["present"] and x["tools"]["iperf3"]["version"]
        assert x["profiles"]["wireguard"]["ok"] is True
        # kernel netem where this kernel has it, else the engine this machine built (a farm
        # board sees this machine's files)
        imp = x["impairment"]
        assert imp["ok"] is True and imp["path"] in ("kernel-netem", "userspace"), imp
        if imp["path"] == "userspace":
            assert "lab-impaird" in imp["why"] and "netem" in imp["why"], imp
        # the boards are namespaces of this machine: same kernel, same answer, same reason
        for name in PROFILES:
            assert x["profiles"][name]["ok"] == here[name]["ok"], (name, x["profiles"][name])
            if not here[name]["ok"]:
                assert x["profiles"][name]["why"], name
    lacking = [n for n in PROFILES if not here[n]["ok"]]
    if not lacking:
        pytest.skip("this kernel has MACsec and GRE: no profile to see refused")
    assert "kernel" in records[0]["profiles"][lacking[0]]["why"]


@pytest.mark.root
def test_check_table_and_an_unreachable_board(farm, tmp_path):
    inv = tmp_path / "with-ghost.toml"
    inv.write_text(
        farm.read_text()
        + '\n[boards.ghost]\nhost = "127.0.0.1"\nport = 1\nmgmt = "eth0"\ndata = ["eth1"]\n'
    )
    r = run_lab("boards", "check", inv, "--profiles", "wireguard", "--json")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "ghost" in r.stderr
    by = {x["board"]: x for x in json.loads(r.stdout)}
    assert by["ghost"]["reachable"] is False and by["ghost"]["root"] is False
    assert "127.0.0.1" in by["ghost"]["error"]
    for name in ("client", "server", "router"):
        assert by[name]["reachable"] and by[name]["root"], by[name]
        assert by[name]["profiles"]["wireguard"]["ok"]
    # the table: every board, the unreachable one marked
    r = run_lab("boards", "check", inv, "--profiles", "wireguard")
    assert r.returncode == 3
    for text in (
        "board client",
        "board ghost",
        "reachable",
        "NO",
        "profile wireguard",
        "clock",
        "impairment",
    ):
        assert text in r.stdout, text


@pytest.mark.root
def test_prepare_lists_and_would_run(farm):
    r = run_lab("boards", "prepare", farm, "--profiles", "wireguard", "--dry-run", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    for x in json.loads(r.stdout):
        assert x["reachable"] and x["root"]
        # whatever this machine lacks, the boards (namespaces here) lack too
        if x["packages"]:
            assert x["argv"] == [*bc.APT_INSTALL, *x["packages"]]
            assert x["env"] == {"DEBIAN_FRONTEND": "noninteractive"}
        else:
            assert x["argv"] is None


@pytest.fixture
def pretend_missing(monkeypatch):
    """Boards that lack iperf3 (and never really install: install() records instead)."""
    installed = []
    monkeypatch.setattr(bc, "missing_packages", lambda node, tools: {"iperf3": ["iperf3"]})
    monkeypatch.setattr(
        bc, "install", lambda node, pkgs: installed.append((node.conn.board.name, pkgs))
    )
    return installed


@pytest.mark.root
def test_prepare_refuses_without_a_terminal_or_a_yes(farm, pretend_missing, monkeypatch, capsys):
    from lab.cli.main import main

    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert main(["boards", "prepare", str(farm), "--profiles", "wireguard"]) == 3
    cap = capsys.readouterr()
    assert "stdin is not a terminal" in cap.err and "--yes" in cap.err
    assert "board client: missing iperf3 (iperf3)" in cap.out
    assert "DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends iperf3" in (
        cap.out
    )
    assert pretend_missing == []

    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr("sys.stdin", Tty("n\n"))
    assert main(["boards", "prepare", str(farm), "--profiles", "wireguard"]) == 1
    assert "nothing installed" in capsys.readouterr().out
    assert pretend_missing == []

    assert main(["boards", "prepare", str(farm), "--profiles", "wireguard", "--yes"]) == 0
    assert sorted(pretend_missing) == [(b, ["iperf3"]) for b in ("client", "router", "server")]
