"""Issue 32, item 17: a topology file that exits while it loads (sys.exit(0), raise SystemExit,
os._exit(0) at import or in build(), an exec, a signal) never passes for success: `lab up` and
`lab run`, through the real `lab` command, exit non-zero with a message naming the file, and
create nothing (no lab, no namespace, no run directory)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lab.core.errors import ConfigError
from lab.core.state import list_lab_ids
from lab.model.topology import load_topology

from .conftest import REPO, lab_traces, run_lab

GOOD = """from mininet.topo import Topo


class T(Topo):
    def build(self):
        {in_build}a = self.addHost("client", ip="10.0.1.1/24", vpn="client")
        b = self.addHost("server", ip="10.0.1.2/24", vpn="server")
        self.addLink(a, b)


topos = {{"t": T}}
"""

#: name -> file text; every one ends the loading before a topology exists
EXITS = {
    "sys_exit_0": "import sys\nsys.exit(0)\n" + GOOD.format(in_build=""),
    "raise_systemexit": "raise SystemExit\n" + GOOD.format(in_build=""),
    "os_exit_0": "import os\nos._exit(0)\n" + GOOD.format(in_build=""),
    "os_exit_0_in_build": GOOD.format(in_build="import os; os._exit(0)\n        "),
    "exec_true": 'import os\nos.execv("/bin/true", ["true"])\n' + GOOD.format(in_build=""),
    "sigkill_self": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"
    + GOOD.format(in_build=""),
}


def _write(tmp_path: Path, name: str) -> Path:
    f = tmp_path / f"{name}.py"
    f.write_text(EXITS[name])
    return f


#: load_topology in a process of its own: a file that ends the process running it (os._exit,
#: exec) must not end pytest's, which would pass for a green run (exit 0, nothing printed)
LOAD = """import sys
from lab.core.errors import ConfigError
from lab.model.topology import load_topology
try:
    load_topology(sys.argv[1])
except ConfigError as e:
    print(e, file=sys.stderr)
    sys.exit(2)
print("loaded, and this process lives on")
"""


@pytest.mark.parametrize("name", sorted(EXITS))
def test_load_topology_refuses_a_file_that_exits(tmp_path, name):
    """No root: a ConfigError naming the file, and the loading process goes on."""
    f = _write(tmp_path, name)
    r = subprocess.run(
        [sys.executable, "-c", LOAD, str(f)], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert str(f) in r.stderr, r.stderr
    assert "must not exit" in r.stderr, r.stderr


def test_a_good_file_still_loads_and_the_graph_comes_back(tmp_path):
    f = tmp_path / "good.py"
    f.write_text(GOOD.format(in_build=""))
    spec = load_topology(f)
    assert sorted(spec.nodes) == ["client", "server"]
    assert spec.endpoints("vpn") == ("client", "server")
    assert len(spec.links) == 1


def test_an_option_that_is_no_plain_data_is_a_config_error(tmp_path):
    f = tmp_path / "obj.py"
    f.write_text(
        "class Mark:\n    pass\n\n"
        + GOOD.format(in_build="").replace('vpn="client"', 'vpn="client", ip6=Mark()')
    )
    with pytest.raises(ConfigError, match="not plain data") as ei:
        load_topology(f)
    assert str(f) in str(ei.value)


@pytest.mark.root
@pytest.mark.parametrize("name", ["sys_exit_0", "raise_systemexit", "os_exit_0", "exec_true"])
def test_lab_up_with_a_topology_that_exits(tmp_path, lab_id, name):
    f = _write(tmp_path, name)
    r = run_lab("up", f, "--id", lab_id)
    assert r.returncode != 0, r.stdout + r.stderr
    assert r.returncode == 2, r.stderr  # bad input
    assert str(f) in r.stderr, r.stderr
    assert "must not exit" in r.stderr
    assert not lab_traces(lab_id)
    assert lab_id not in run_lab("status").stdout


@pytest.mark.root
@pytest.mark.parametrize("name", ["sys_exit_0", "raise_systemexit", "os_exit_0"])
def test_lab_run_with_a_topology_that_exits(tmp_path, name):
    f = _write(tmp_path, name)
    plan = tmp_path / "plan.toml"
    quick = (REPO / "plans" / "quick.toml").read_text()
    plan.write_text(quick.replace('file = "topologies/pi_pair.py"', f'file = "{f}"'))
    assert str(f) in plan.read_text()
    out = tmp_path / "run"
    before = set(list_lab_ids())  # the suite's own state root (conftest)
    r = run_lab("run", plan, "--out", out)
    assert r.returncode != 0, r.stdout + r.stderr
    assert r.returncode == 2, r.stderr
    assert str(f) in r.stderr, r.stderr
    assert "must not exit" in r.stderr
    assert not out.exists()
    assert set(list_lab_ids()) == before  # no lab was created
