"""The substrate layer (lab/substrate/registry.py): one interface for local and VM labs (issue 14).

Unit tests record the command lines a VM lab sends into its guest (the VM itself is exercised by
tests/test_vm_lab.py through the same CLI); the layer rule is checked on the imports.
"""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

import pytest

from lab.substrate import registry as substrates
from lab.substrate.vm import lab as vmlab
from lab.core.errors import CommandError
from lab.substrate.registry import LabHandle, LocalLab, VmLab, open_lab

LAB = Path(__file__).resolve().parent.parent / "lab"


def _imports_vm(path: Path) -> list[str]:
    """Where `path` imports the VM substrate (lab.substrate.vm...) or asks is_vm_lab."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lab.substrate.vm"):
            found.append(f"{path.name}:{node.lineno}")
        elif isinstance(node, ast.Import) and any(
            a.name.startswith("lab.substrate.vm") for a in node.names
        ):
            found.append(f"{path.name}:{node.lineno}")
        elif isinstance(node, ast.Attribute) and node.attr == "is_vm_lab":
            found.append(f"{path.name}:{node.lineno}")
    return found


def test_no_substrate_test_outside_the_substrate_layer():
    """Outside lab/substrate/ nothing imports the VM substrate or asks whether a lab is a VM lab."""
    offenders = []
    for path in sorted(LAB.rglob("*.py")):
        if path.relative_to(LAB).parts[0] == "substrate":
            continue
        offenders += _imports_vm(path)
    assert offenders == []
    # and the check can fail: the layer itself does import it
    assert _imports_vm(LAB / "substrate" / "registry.py")


def test_every_substrate_implements_the_whole_interface():
    abstract = set(LabHandle.__abstractmethods__)
    assert abstract == {"status", "exec", "shell", "impair", "down"}
    for cls in (LocalLab, VmLab):
        assert not cls.__abstractmethods__, cls
        assert cls.kind in substrates.KINDS


def _ledger(root: Path, lab_id: str, first_kind: str) -> None:
    d = root / lab_id
    d.mkdir(parents=True)
    (d / "ledger.jsonl").write_text(json.dumps({"kind": first_kind}) + "\n")
    (d / "lab.json").write_text(json.dumps({"id": lab_id}))


def test_open_lab_picks_the_substrate_from_the_ledger(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_STATE_DIR", str(tmp_path))
    _ledger(tmp_path, "loc1", "cgroup")
    _ledger(tmp_path, "vm1", "vm-lab")
    assert isinstance(open_lab("loc1"), LocalLab)
    assert isinstance(open_lab("vm1"), VmLab)
    with pytest.raises(Exception, match="several labs are up"):
        open_lab(None)


def test_vm_lab_sends_the_guest_its_own_command_lines(tmp_path, monkeypatch):
    sent: list[list[str]] = []

    def forward(lab_id, argv, timeout=None):
        sent.append([lab_id, *argv])
        if "bad" in argv:
            return subprocess.CompletedProcess(argv, 2, "", "lab: error: bad spec\n")
        return subprocess.CompletedProcess(argv, 0, json.dumps({"backend": "kernel-netem"}), "")

    def interactive(lab_id, argv):
        sent.append([lab_id, *argv])
        return 7

    monkeypatch.setattr(vmlab, "forward", forward)
    monkeypatch.setattr(vmlab, "forward_interactive", interactive)
    vm = VmLab("vm1")
    assert vm.impair("set", "delay 20ms loss 1%", "router-server") == {"backend": "kernel-netem"}
    assert vm.impair("show") == {"backend": "kernel-netem"}
    assert vm.exec("client", ["ping", "-c1", "10.0.2.2"]) == 7
    assert vm.shell("server") == 7
    with pytest.raises(CommandError, match="bad spec"):
        vm.impair("set", "bad", None)
    assert sent == [
        ["vm1", "impair", "set", "--id", "vm1", "router-server", "delay", "20ms", "loss", "1%",
         "--json"],
        ["vm1", "impair", "show", "--id", "vm1", "--json"],
        ["vm1", "exec", "--id", "vm1", "client", "--", "ping", "-c1", "10.0.2.2"],
        ["vm1", "shell", "--id", "vm1", "server"],
        ["vm1", "impair", "set", "--id", "vm1", "all", "bad", "--json"],
    ]  # fmt: skip


@pytest.mark.root
def test_local_lab_through_the_interface(lab_id):
    """bring_up -> exec -> impair -> status -> down on this machine, all through LabHandle."""
    from lab.model.topology import load_topology

    from .conftest import TOPOS, lab_traces

    lab, status, _ = substrates.bring_up(
        load_topology(TOPOS / "pi_pair_middlebox.py"), lab_id=lab_id, impair="none"
    )
    try:
        assert isinstance(lab, LocalLab) and status["id"] == lab_id
        assert lab.exec("client", ["ping", "-c1", "-W2", "10.0.2.2"]) == 0
        shown = open_lab(lab_id).impair("set", "delay 10ms", None)
        assert set(shown["requested"].values()) == {"delay 10ms"}
        assert open_lab(lab_id).status()["state"] == "up"
    finally:
        notes: list[str] = []
        assert open_lab(lab_id).down(notes) == []
    assert lab_traces(lab_id) == []
