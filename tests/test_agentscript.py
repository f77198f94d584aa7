"""The agent as it ships (lab.substrate.vm.agentscript): one standard-library-only script made of
agent.py and agentcommands.py, runnable with the system python3 -I -S and no lab package."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

from lab.substrate.vm import agentscript
from lab.substrate.vm.agentscript import agent_source

PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable


def test_the_shipped_script_is_one_stdlib_only_file():
    tree = ast.parse(agent_source())
    mods = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any(m == "lab" or m.startswith("lab.") for m in mods)
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    assert {"Agent", "Port", "main", "Stream", "run_request"} <= defined
    future = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    assert len(future) == 1


def test_the_shipped_script_runs_without_lab(tmp_path):
    script = tmp_path / "agent.py"
    script.write_bytes(agent_source())
    code = (
        f"import runpy; g = runpy.run_path({str(script)!r}, run_name='not_main'); "
        "r = g['run_request']({'argv': ['sh', '-c', 'echo ok']}); print(r['rc'], r['stdout'])"
    )
    cp = subprocess.run(
        [PYTHON, "-I", "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path
    )
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.split() == ["0", "ok"]


def test_a_lab_import_in_agentcommands_is_refused(tmp_path, monkeypatch):
    bad = tmp_path / "agentcommands.py"
    bad.write_text(agentscript.COMMANDS.read_text() + "\nfrom lab.core import proc\n")
    monkeypatch.setattr(agentscript, "COMMANDS", bad)
    with pytest.raises(RuntimeError, match="imports lab"):
        agent_source()
