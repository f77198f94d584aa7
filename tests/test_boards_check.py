"""`lab boards check` and `lab boards prepare` (lab/substrate/boards/check.py, lab/cli/boards.py).

Unit tests parse what a board prints (golden text of a Raspberry Pi) and check the packages and
the apt-get command prepare would run, with a fake node. On an emulated farm (root): every board
is reachable with root and has this machine's arch and kernel (its boards are namespaces here),
a profile this kernel can run is ok and one it cannot says why; a board that cannot be reached
makes check exit 3 with that board marked and the others still checked; prepare lists, refuses
without a terminal or a yes, and would run apt-get with DEBIAN_FRONTEND=noninteractive; and
once for real: `prepare --yes` installs a package on a board given overlays where apt and dpkg
write (the emulated boards share this machine's file system, which stays untouched).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import tomllib
from pathlib import Path

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
def farm_record(tmp_path_factory):
    """An emulated farm of pi_pair_middlebox with a state root of this module's own:
    (inventory, `lab boards emulate --json` record)."""
    with board_farm(tmp_path_factory) as (inv, rec):
        yield inv, rec


@pytest.fixture(scope="module")
def farm(farm_record):
    return farm_record[0]


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


#: where apt-get and dpkg write when they install (apt.conf(5) Dir::*, dpkg(1) --admindir, the
#: package's files, conffiles and triggers); a board of this farm gets an overlay of each
APT_WRITES = ("/usr", "/etc", "/var/lib/dpkg", "/var/lib/apt", "/var/cache", "/var/log")
#: a tool the lab runs on every board (LAB_TOOLS), one small package nothing else depends on
PACKAGE = "ethtool"


def _one_board(inventory: Path, board: str, out: Path) -> Path:
    """`inventory` with only `board` (prepare asks every board of an inventory)."""
    entry = tomllib.loads(inventory.read_text())["boards"][board]
    # TOML's basic strings and arrays of them read as JSON does
    lines = [f"[boards.{board}]", *(f"{k} = {json.dumps(v)}" for k, v in entry.items())]
    out.write_text("\n".join(lines) + "\n")
    return out


def _sha256(path: str) -> str | None:
    p = Path(path)
    return hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None


@pytest.mark.root
def test_prepare_yes_installs_for_real_on_a_board(farm_record, tmp_path):
    """`lab boards prepare --yes`, nothing faked, on the farm's board "client".

    The farm's boards share this machine's file system, so the board first gets its own where
    apt and dpkg write: an overlay (upper directory under tmp_path) on each of APT_WRITES,
    mounted in the board's mount namespace only; there `dpkg --remove ethtool` makes it a board
    that lacks a tool the lab runs. The board's network reaches only this machine, so its apt
    archive gets ethtool's .deb from this machine's apt cache, else from `apt-get download` run
    here (a board behind an apt cache). Then prepare lists ethtool, runs apt-get on the board
    over SSH, and: the board runs ethtool again, of the version dpkg there records; the
    binary came into the board's overlay, byte for byte the package's; the board's apt history
    holds prepare's command line; this machine's dpkg status, apt history and ethtool are as
    they were; prepare then has nothing to install. Unmounting the overlays gives the board
    this machine's files back (prepare itself records nothing: docs/boards.md)."""
    inv, rec = farm_record
    for tool in ("apt-get", "dpkg", "dpkg-query"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} missing: the boards (this machine's namespaces) install with it")
    here = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}\t${Version}", PACKAGE], capture_output=True, text=True
    )
    if not here.stdout.startswith("install ok installed"):
        pytest.skip(f"{PACKAGE} is not installed here (./setup.sh installs it)")
    version = here.stdout.split("\t")[1]
    listed = subprocess.run(["dpkg-query", "-L", PACKAGE], capture_output=True, text=True)
    outside = [
        f
        for f in listed.stdout.split()
        if not any(os.path.realpath(f).startswith(d + "/") for d in APT_WRITES)
        and not os.path.isdir(f)
    ]
    if outside:  # e.g. /sbin not a link to /usr/sbin: dpkg would write this machine's
        pytest.skip(f"{PACKAGE}'s files outside the board's overlays: {outside}")
    debs = tmp_path / "debs"
    debs.mkdir()
    cached = sorted(Path("/var/cache/apt/archives").glob(f"{PACKAGE}_*.deb"))
    if cached:
        shutil.copy(cached[-1], debs)
    else:
        dl = subprocess.run(
            ["apt-get", "download", "-q", PACKAGE], capture_output=True, text=True, cwd=debs
        )
        if dl.returncode != 0:
            pytest.skip(
                f"no {PACKAGE} .deb in apt's cache and apt-get download failed: {dl.stderr}"
            )
    host_files = ("/var/lib/dpkg/status", "/var/log/apt/history.log", f"/usr/sbin/{PACKAGE}")
    host_before = {f: _sha256(f) for f in host_files}
    one = _one_board(inv, "client", tmp_path / "one.toml")

    def on_board(script: str) -> subprocess.CompletedProcess:
        r = run_lab("exec", "--id", rec["id"], "client", "--", "sh", "-c", script, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        return r

    upper = tmp_path / "overlay"
    mounts = " ".join(
        f"mkdir -p {upper}/u{d} {upper}/w{d} && mount -t overlay lab-prepare-test"
        f" -o lowerdir={d},upperdir={upper}/u{d},workdir={upper}/w{d} {d} &&"
        for d in APT_WRITES
    )
    try:
        on_board(
            f"set -e; {mounts} cp {debs}/*.deb /var/cache/apt/archives/"
            f" && dpkg --remove {PACKAGE} >/dev/null"
        )
        r = run_lab("boards", "prepare", one, "--profiles", "baseline", "--dry-run", "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        [plan] = json.loads(r.stdout)
        assert plan["packages"] == {PACKAGE: [PACKAGE]}, plan

        r = run_lab("boards", "prepare", one, "--profiles", "baseline", "--yes", timeout=150)
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"board client: missing {PACKAGE} ({PACKAGE})" in r.stdout
        assert "board client: installed" in r.stdout

        board = on_board(
            f"{PACKAGE} --version; dpkg-query -W -f='${{Status}}\t${{Version}}\\n' {PACKAGE};"
            " grep Commandline: /var/log/apt/history.log"
        ).stdout.splitlines()
        upstream = version.split(":")[-1].split("-")[0]  # 1:6.1-1 -> 6.1
        assert board[0] == f"{PACKAGE} version {upstream}", board
        assert board[1] == f"install ok installed\t{version}", board
        assert board[-1] == f"Commandline: apt-get install -y --no-install-recommends {PACKAGE}"
        installed = upper / "u/usr" / "sbin" / PACKAGE
        assert (
            installed.is_file() and _sha256(str(installed)) == host_before[f"/usr/sbin/{PACKAGE}"]
        )
        assert {f: _sha256(f) for f in host_files} == host_before  # this machine: untouched

        r = run_lab("boards", "prepare", one, "--profiles", "baseline", "--dry-run", "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        assert json.loads(r.stdout)[0]["packages"] == {}
    finally:
        # lazily: the shell doing it runs from the overlay on /usr
        left = on_board(
            "".join(f"umount -l {d}; " for d in reversed(APT_WRITES)) + "cat /proc/self/mountinfo"
        )
    assert "lab-prepare-test" not in left.stdout
