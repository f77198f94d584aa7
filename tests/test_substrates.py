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
from lab.core.errors import CommandError, ConfigError
from lab.substrate.base import LabHandle, Substrate, UpRequest
from lab.substrate.boards.substrate import BoardsLab
from lab.substrate.local.substrate import LocalLab, LocalSubstrate
from lab.substrate.registry import open_lab
from lab.substrate.vm.substrate import VmLab, VmSubstrate

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
    assert _imports_vm(LAB / "substrate" / "vm" / "substrate.py")


def test_every_substrate_implements_the_whole_interface():
    abstract = set(LabHandle.__abstractmethods__)
    assert abstract == {"status", "exec", "shell", "impair", "down"}
    for cls in (LocalLab, VmLab, BoardsLab):
        assert not cls.__abstractmethods__, cls
    assert set(Substrate.__abstractmethods__) == {"open_lab", "remove_lab", "bring_up"}
    assert list(substrates.SUBSTRATES) == ["boards", "vm", "local"]  # local takes what is left
    for name in substrates.SUBSTRATES:
        cls = substrates.get(name)
        assert not cls.__abstractmethods__, cls
        assert issubclass(cls, Substrate) and cls.name == name
    assert substrates.get("host") is LocalSubstrate  # records written before one spelling
    with pytest.raises(ConfigError, match="unknown substrate 'nope'; known: boards, vm, local"):
        substrates.get("nope")


#: the names of the substrates, as their records and ledgers spell them ("host" is left out: it
#: is also a topology node's kind, and the registry reads old "host" records as "local")
KIND_WORDS = {"local", "vm", "vm-lab", "boards", "boardlab"}


def _kind_branches(path: Path) -> list[str]:
    """Comparisons with a substrate's name (`x == "vm"`, `"boards" in lab.info`, ...)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            words = [node.left, *node.comparators]
            if any(isinstance(w, ast.Constant) and w.value in KIND_WORDS for w in words):
                found.append(f"{path.relative_to(LAB)}:{node.lineno}")
    return found


def test_no_branch_on_the_kind_of_substrate_outside_lab_substrate(tmp_path):
    """The CLI, the runner, the report and compare hold a Substrate or a LabHandle and ask it;
    only lab/substrate/ knows the kinds."""
    offenders = []
    for path in sorted(LAB.rglob("*.py")):
        if path.relative_to(LAB).parts[0] != "substrate":
            offenders += _kind_branches(path)
    assert offenders == []
    # and the check can fail
    probe = LAB / "substrate" / "_probe_kind.py"
    try:
        probe.write_text('def f(lab):\n    return "boards" in lab.info or lab.kind == "vm"\n')
        assert _kind_branches(probe) == ["substrate/_probe_kind.py:2"] * 2
    finally:
        probe.unlink()


def test_select_picks_by_flags_and_plan(monkeypatch):
    class P:
        vm = True

    monkeypatch.delenv("LAB_SUBSTRATE", raising=False)
    assert isinstance(substrates.select(), LocalSubstrate)
    assert isinstance(substrates.select(vm=True), VmSubstrate)
    assert isinstance(substrates.select(plan=P()), VmSubstrate)
    with pytest.raises(ConfigError, match="--vm and --boards exclude each other"):
        substrates.select(vm=True, boards="boards.toml")
    # inside the lab VM a plan's `vm = true` is this VM: its cases run on the guest's namespaces
    monkeypatch.setenv("LAB_SUBSTRATE", json.dumps({"kind": "vm"}))
    assert isinstance(substrates.select(plan=P()), LocalSubstrate)


def test_a_run_resumes_on_the_substrate_it_started_on(tmp_path):
    class Run:
        path = tmp_path

        def __init__(self, kind):
            self.kind = kind

        def manifest(self):
            return {"sessions": [{"substrate": {"kind": self.kind}}]}

    substrates.check_resume(Run("host"), LocalSubstrate())  # an old record: this machine
    substrates.check_resume(Run("local"), LocalSubstrate())
    substrates.check_resume(Run("vm"), VmSubstrate())
    with pytest.raises(ConfigError, match="ran on vm: resume it with --vm"):
        substrates.check_resume(Run("vm"), LocalSubstrate())
    with pytest.raises(ConfigError, match="ran on this machine: resume it without --vm"):
        substrates.check_resume(Run("local"), VmSubstrate())


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

    lab, status, _ = LocalSubstrate().bring_up(
        load_topology(TOPOS / "pi_pair_middlebox.py"), UpRequest(lab_id=lab_id, impair="none")
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
