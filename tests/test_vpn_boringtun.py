"""boringtun (Cloudflare's userspace WireGuard in Rust) as the wireguard driver's third data plane
(issue 34): the command that starts it, the error naming `./setup.sh --with boringtun` when it is
not built, `lab profiles` saying so, and a real tunnel on pi_pair_middlebox under pi4 caps."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import lab.vpn.drivers.wireguard as wgmod
from lab.cli.main import main
from lab.core import proc
from lab.core.errors import KernelFeatureMissing, StartupError
from lab.core.proc import is_same_process
from lab.core.teardown import teardown
from lab.model.topology import load_topology
from lab.vpn import tunnel
from lab.vpn.profiles import load_profile
from tests.conftest import REPO, TOPOS, lab_traces
from tests.fakenode import RecordingNode
from tests.tunnelprobe import capture_marker

PROFILE = "wireguard-boringtun"


def _node(missing: str = "") -> RecordingNode:
    """A node whose `missing_tools` shell reports `missing`; every other command succeeds."""
    return RecordingNode({("sh", "-c"): (0, missing, "")}, default=(0, "", ""))


def _built() -> str:
    return str(wgmod.BORINGTUN_ROOT / "bin" / "boringtun-cli")


def test_start_command_runs_the_built_binary_in_the_foreground():
    prof = load_profile(f"{PROFILE}:boringtun_threads=2")
    node = _node()
    assert prof.driver.check(prof.params, node).ok
    assert wgmod.boringtun_argv(node, prof.params) == [
        _built(),
        "--foreground",
        "--disable-drop-privileges",
        "--threads",
        "2",
        "--verbosity",
        "error",
        "wg0",
    ]


def test_a_boringtun_cli_on_path_serves_when_setup_did_not_build_one():
    node = _node(missing=_built() + "\n")
    assert wgmod.boringtun_argv(node, load_profile(PROFILE).params)[0] == "boringtun-cli"


def test_missing_binary_names_the_setup_option_before_anything_is_built():
    prof = load_profile(PROFILE)
    node = _node(missing=f"{_built()}\nboringtun-cli\n")
    a = prof.driver.check(prof.params, node)
    assert not a.ok and a.path == "boringtun"
    assert "./setup.sh --with boringtun" in a.why and _built() in a.why
    with pytest.raises(StartupError, match=r"setup\.sh --with boringtun"):
        wgmod.boringtun_argv(node, prof.params)
    spec = load_topology(TOPOS / "pi_pair_middlebox.py", params={"cpu": None})
    nodes = {"client": _node(), "server": _node(missing=f"{_built()}\nboringtun-cli\n")}
    with pytest.raises(KernelFeatureMissing, match=r"setup\.sh --with boringtun"):
        tunnel.prepare(spec, PROFILE, nodes=nodes)
    # only questions were asked: no link, no process (RecordingNode refuses spawn outright)
    for n in nodes.values():
        assert {c[0] for c in n.calls} <= {"sh", "test", "unshare"}, n.calls


def test_cpu_dataplane_is_the_program_on_the_board_without_a_reference():
    prof = load_profile(PROFILE)
    dp = prof.driver.cpu_dataplane(prof.params, "boringtun")
    assert (dp.daemon, dp.board, dp.threads, dp.primitive) == (
        "boringtun",
        "userspace",
        "program",
        None,
    )
    assert "unreferenced" in dp.what


def test_unknown_implementation_lists_boringtun():
    with pytest.raises(Exception, match="boringtun") as e:
        load_profile("wireguard:implementation=boringtunn")
    assert "params.implementation" in str(e.value)


@pytest.mark.parametrize("built", [False, True], ids=["not-built", "built"])
def test_lab_profiles_says_whether_it_runs_here(built, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(wgmod, "BORINGTUN_ROOT", tmp_path / "boringtun")
    monkeypatch.setenv("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")  # no boringtun-cli of the host's
    if built:
        exe = tmp_path / "boringtun" / "bin" / "boringtun-cli"
        exe.parent.mkdir(parents=True)
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    assert main(["profiles", "--json"]) == 0
    row = next(r for r in json.loads(capsys.readouterr().out) if r["profile"] == PROFILE)
    assert row["path"] == "boringtun"
    if built:
        assert row["ok"] is os.path.exists("/dev/net/tun"), row
    else:
        assert row["ok"] is False and "./setup.sh --with boringtun" in row["why"], row


def test_setup_sh_rejects_an_unknown_with_naming_the_accepted_ones():
    cp = subprocess.run(
        ["bash", str(REPO / "setup.sh"), "--with", "nosuch"], capture_output=True, text=True
    )
    assert cp.returncode == 2 and "accepted: boringtun" in cp.stderr


# ------------------------------------------------------------------------ a real tunnel


@pytest.mark.root
def test_boringtun_tunnel_on_pi_pair_middlebox_under_pi4_caps(lab_id):
    from lab.substrate.local.build import up

    binary = Path(_built())
    if not (os.access(binary, os.X_OK) or proc.which("boringtun-cli")):
        pytest.skip(f"boringtun-cli not built ({binary}): sudo ./setup.sh --with boringtun")
    if not all(proc.which(t) for t in ("wg", "tcpdump")):
        pytest.skip("needs wireguard-tools (wg) and tcpdump")
    spec = load_topology(TOPOS / "pi_pair_middlebox.py")  # cpu="pi4": the boards' caps
    lab = up(spec, lab_id, vpn=PROFILE)
    v = lab.info["vpn"]
    daemons = [(d["pid"], d["start_time"]) for d in v["daemons"]]
    try:
        nodes = lab.status()["nodes"]
        assert {nodes[n]["cpu"]["profile"] for n in ("client", "server")} == {"pi4"}
        d = v["describe"]
        assert (d["implementation"], d["path"], d["interface"]) == ("boringtun", "boringtun", "wg0")
        assert d["version"].startswith("boringtun")
        assert sorted(dm["name"] for dm in v["daemons"]) == ["boringtun", "boringtun"]
        client = lab.node("client")
        # boringtun, not a kernel link: the interface is a TUN device
        link = json.loads(client.run(["ip", "-d", "-j", "link", "show", "wg0"]).stdout)[0]
        assert link.get("linkinfo", {}).get("info_kind") == "tun", link
        client.run(["test", "-S", "/run/wireguard/wg0.sock"])  # its UAPI socket, node-private
        t4, t6 = v["traffic"]["v4"], v["traffic"]["v6"]
        for addr in (t4, t6):
            client.run(["ping", "-c", "2", "-i", "0.2", "-W", "2", addr])
            assert json.loads(client.run(["ip", "-j", "route", "get", addr]).stdout)[0]["dev"] == (
                "wg0"
            )
        seen, size = capture_marker(lab, t4)
        assert size > 200 and not seen, "plaintext marker on the router's wire"
        transfer = client.run(["wg", "show", "wg0", "transfer"]).stdout.split()
        assert int(transfer[1]) > 0 and int(transfer[2]) > 0
    finally:
        assert teardown(lab_id) == []
    assert lab_traces(lab_id) == []
    for pid, start_time in daemons:
        assert not is_same_process(pid, start_time), f"boringtun {pid} survived"
