"""Tool versions asked on a node (a board over SSH, a node of another architecture) rather than
on this machine: lab.campaign.setup.node_tool_versions / arch_tool_versions."""

from __future__ import annotations

import os
import subprocess

from lab.campaign import setup as runsetup


class ShellNode:
    """Runs argv here with PATH = `bindir` only (plus what sh and grep need): a node whose tools
    are exactly the scripts in bindir."""

    def __init__(self, bindir):
        self.env = {**os.environ, "PATH": f"{bindir}:/usr/bin:/bin"}
        self.calls = []

    def run(self, argv, *, check=True, timeout=None):
        self.calls.append(list(argv))
        return subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=timeout)


def tool(bindir, name, body):
    p = bindir / name
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(0o755)


def test_node_tool_versions_asks_the_node_once_and_reads_each_tools_first_line(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(
        runsetup,
        "TOOL_VERSIONS",
        {
            "fake-a": ["fake-a", "--version"],
            "fake-b": ["fake-b", "-V"],  # prints to stderr after a blank line, exits 1
            "fake-c": ["fake-c", "-v"],  # prints nothing
            "absent": ["no-such-tool-on-this-node", "--version"],
        },
    )
    tool(tmp_path, "fake-a", 'echo "fake-a 9.9 (board build)"; echo second line')
    tool(tmp_path, "fake-b", 'echo >&2; echo "fake-b version 1.2" >&2; exit 1')
    tool(tmp_path, "fake-c", "exit 0")
    node = ShellNode(tmp_path)
    got = runsetup.node_tool_versions(node)
    assert got == {
        "fake-a": "fake-a 9.9 (board build)",
        "fake-b": "fake-b version 1.2",
        "fake-c": None,
        "absent": None,
    }
    assert len(node.calls) == 1 and node.calls[0][:2] == ["sh", "-c"]  # one round trip


def test_arch_tool_versions_asks_only_the_board_tools_each_through_the_node(tmp_path, monkeypatch):
    monkeypatch.setattr(
        runsetup,
        "TOOL_VERSIONS",
        {"openvpn": ["openvpn", "--version"], "tc": ["tc", "-V"]},  # tc is this machine's
    )
    tool(tmp_path, "openvpn", 'echo "OpenVPN 2.6.14 aarch64-unknown-linux-gnu"')
    node = ShellNode(tmp_path)
    assert runsetup.arch_tool_versions(node) == {
        "openvpn": "OpenVPN 2.6.14 aarch64-unknown-linux-gnu"
    }
    assert node.calls == [["openvpn", "--version"]]
