"""Issue 32, item 15: the README's `lab exec ... ping` goes through the tunnel (the address `lab
up` prints for it), the status heading of the default lab does not read "lab lab (up)", and
`lab --help` lists the shipped topologies with their `-p` keys and the shipped plans."""

from __future__ import annotations

import importlib.util
import inspect
import json
import re
import shlex

import pytest

from lab.cli.help import EXAMPLES
from lab.cli.printing import out, print_status
from lab.core import proc

from .conftest import REPO, TOPOS, lab_traces, run_lab

README = REPO / "README.md"


def _build_keys(path) -> dict[str, object]:
    """{parameter: default} of the build() of every Topo class the file's `topos` names (the
    shipped files are data: importing them here is safe)."""
    spec = importlib.util.spec_from_file_location(f"shipped_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    keys = {}
    for cls in module.topos.values():
        for name, p in inspect.signature(cls.build).parameters.items():
            if name != "self":
                keys[name] = p.default
    return keys


def _row(text: str, filename: str) -> str:
    m = re.search(rf"^  {re.escape(filename)}\s+(.*)$", text, re.M)
    assert m, f"{filename} not listed in:\n{text}"
    return m.group(1)


def test_help_lists_shipped_topologies_with_their_p_keys_and_plans():
    top = run_lab("--help")
    assert top.returncode == 0, top.stderr
    up = run_lab("up", "--help").stdout
    run = run_lab("run", "--help").stdout
    topologies = sorted(TOPOS.glob("*.py"))
    assert topologies
    for f in topologies:
        for text in (top.stdout, up):
            row = _row(text, f.name)
            words = row.removeprefix("-p ").split()
            for key, default in _build_keys(f).items():
                want = key if default is None else f"{key}={default}"
                assert want in words, f"{f.name}: -p {want} missing from {row!r}"
    for f in sorted((REPO / "plans").glob("*.toml")):
        for text in (top.stdout, run):
            assert _row(text, f.name).strip(), f"{f.name} listed without a word on what it is"
    assert "dilation=" in top.stdout and "nic_latency=" in top.stdout  # on any topology


def test_status_heading_quotes_the_lab_id():
    status = {
        "id": "lab",
        "state": "up",
        "topology": "topologies/pi_pair.py",
        "nodes": {
            "client": {
                "kind": "host",
                "netns": "lab-client",
                "interfaces": [{"name": "client-eth0", "ip": "10.0.1.1/24"}],
            }
        },
    }
    with out.capture() as cap:
        print_status(status)
    text = cap.get()
    assert "lab 'lab' (up)" in text, text
    assert "lab lab" not in text
    with out.capture() as cap:
        print_status({"id": "lab", "state": "broken"})
    assert cap.get().startswith("lab 'lab': broken")


def _readme_ping() -> list[str]:
    lines = [
        line
        for line in README.read_text().splitlines()
        if re.match(r"sudo lab exec \w+ -- ping", line)
    ]
    assert len(lines) == 1, lines
    return shlex.split(lines[0].split("#")[0])[1:]  # without sudo


@pytest.mark.root
@pytest.mark.skipif(not proc.which("wg"), reason="needs wireguard-tools (wg)")
def test_readme_ping_goes_through_the_tunnel(lab_id):
    """`lab up` of the README's topology with a tunnel: the address it prints for the traffic is
    the one the README and `lab exec --help` ping, and that ping is answered."""
    readme = _readme_ping()
    up_line = next(
        line
        for line in README.read_text().splitlines()
        if line.startswith("sudo lab up topologies/")
    )
    topology = up_line.split()[3]
    r = run_lab("up", REPO / topology, "--vpn", "wireguard", "-p", "cpu=host", "--id", lab_id)
    assert r.returncode == 0, r.stderr
    try:
        m = re.search(r"traffic\s+(\w+)\s+->\s+(\S+)", r.stdout)
        assert m, r.stdout  # what lab up prints for the tunnel
        node, address = m.groups()
        status = json.loads(run_lab("status", "--id", lab_id, "--json").stdout)[0]
        assert status["vpn"]["traffic"]["v4"] == address
        tunnel_v4 = {e["v4"].split("/")[0] for e in status["vpn"]["tunnel"].values()}
        assert address in tunnel_v4  # a tunnel address, not an underlay one
        assert readme[:2] == ["lab", "exec"] and readme[2] == node
        assert readme[-1] == address, f"README pings {readme[-1]}, the tunnel is {address}"
        example = shlex.split(EXAMPLES["exec"][0][0])
        assert example[-1] == address, example
        ping = run_lab(*readme[1:3], "--id", lab_id, *readme[3:])
        assert ping.returncode == 0, ping.stdout + ping.stderr
        assert re.search(r"3 packets transmitted, 3 received", ping.stdout), ping.stdout
    finally:
        assert run_lab("down", "--id", lab_id).returncode == 0
    assert not lab_traces(lab_id)
