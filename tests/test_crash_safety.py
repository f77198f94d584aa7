"""Privileged: `lab up` SIGKILLed at every step of the build, and node daemons killed behind the
lab's back; `lab clean` must then remove everything of that lab."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time

import pytest

from lab.substrate.local.build import up
from lab.core.state import Ledger, lab_dir
from lab.model.topology import load_topology

from .conftest import LAB, REPO, TOPOS, lab_traces, run_lab

pytestmark = pytest.mark.root


@pytest.fixture(autouse=True)
def private_state_root(tmp_path, monkeypatch):
    """`lab clean` removes every lab it finds: give these tests a state root of their own so
    they never touch labs of other tests or users running on the same machine."""
    monkeypatch.setenv("LAB_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("LAB_RUN_DIR", f"/run/lab-test-{os.getpid()}")


def _records_of_full_up(topo, lab_id) -> int:
    r = run_lab("up", TOPOS / topo, "--id", lab_id)
    assert r.returncode == 0, r.stderr
    n = len(Ledger(lab_dir(lab_id) / "ledger.jsonl").entries())
    assert run_lab("down", "--id", lab_id).returncode == 0
    return n


@pytest.mark.parametrize("topo", ["pi_pair_middlebox.py", "site_to_site.py"])
def test_sigkill_at_every_build_step_then_clean(lab_id, topo):
    total = _records_of_full_up(topo, lab_id)
    assert total >= 19, total
    for k in range(1, total + 1):
        r = run_lab("up", TOPOS / topo, "--id", lab_id, env={"LAB_KILL_AT_RECORD": str(k)})
        assert r.returncode == -signal.SIGKILL, (k, r.returncode, r.stderr)
        c = run_lab("clean")
        assert c.returncode == 0, (k, c.stdout, c.stderr)
        assert lab_traces(lab_id) == [], f"after kill at record {k}/{total}"


def test_sigkill_at_random_times_then_clean(lab_id):
    rng = random.Random(1234)
    for _ in range(6):
        p = subprocess.Popen(
            [*LAB, "up", str(TOPOS / "site_to_site.py"), "--id", lab_id],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(0.2, 0.8))
        p.send_signal(signal.SIGKILL)
        p.wait()
        c = run_lab("clean")
        assert c.returncode == 0, c.stdout + c.stderr
        assert lab_traces(lab_id) == []


def test_node_daemons_killed_behind_the_labs_back(lab_id):
    lab = up(load_topology(TOPOS / "pi_pair_middlebox.py"), lab_id)
    daemons = [
        lab.node(n).spawn(f"d{n}", ["sleep", "1000"]) for n in ("client", "router", "server")
    ]
    survivor = lab.node("server").spawn("survivor", ["sleep", "1000"])
    for d in daemons:
        os.kill(d.pid, signal.SIGKILL)
        d.popen.wait()
    # a process the lab did not start, in the same netns, is reported but never signalled
    stranger = subprocess.Popen(["ip", "netns", "exec", f"{lab_id}-client", "sleep", "1000"])
    try:
        c = run_lab("clean")
        assert c.returncode == 0, c.stdout + c.stderr
        assert f"process {stranger.pid} (sleep), not started by the lab" in c.stderr
        assert not survivor.alive()
        assert stranger.poll() is None, "clean must not kill a process the lab did not start"
        assert lab_traces(lab_id) == []
    finally:
        stranger.kill()
        stranger.wait()


def _system_part(snap: dict) -> dict:
    """What of machine_snapshot() belongs to the machine, not to a lab (of this or another test
    running meanwhile): lab objects are named after their lab (netns `<id>-<node>`, cgroups under
    lab/, mounts under a run root or netns)."""
    return {
        "netns": [],  # every netns here may be another test's lab
        "links": [x for x in snap["links"] if "-" not in x.split("@")[0]],
        "cgroups": [x for x in snap["cgroups"] if "/lab" not in x],
        "mounts": [x for x in snap["mounts"] if "/lab" not in x and "netns" not in x],
    }


def test_clean_is_harmless_twice_and_with_nothing_up(tmp_path):
    """With nothing recorded, `lab clean` removes nothing: not the machine's own namespaces,
    links, cgroups and mounts, and not objects named like a lab's that no ledger of its state
    root names (another root's lab: a netns, a root-namespace veth pair, cgroups, a state
    directory with a ledger elsewhere)."""
    from lab.core import cgroups

    from .conftest import machine_snapshot

    fake = "hz" + os.urandom(2).hex()
    layout = cgroups.probe()
    cg = layout.dirs(f"lab/{fake}")
    other_root = tmp_path / "other-state" / fake
    other_root.mkdir(parents=True)
    (other_root / "ledger.jsonl").write_text("")
    made = []
    try:
        subprocess.run(["ip", "netns", "add", f"{fake}-client"], check=True)
        made.append("netns")
        subprocess.run(
            ["ip", "link", "add", f"{fake}-a", "type", "veth", "peer", "name", f"{fake}-b"],
            check=True,
        )
        made.append("link")
        for d in cg:
            d.mkdir(parents=True)
        before = machine_snapshot()
        for _ in range(2):
            c = run_lab("clean")
            assert c.returncode == 0, c.stdout + c.stderr
            assert "no labs recorded; nothing to do" in c.stdout, c.stdout
        after = machine_snapshot()
        # nothing the machine had is gone (other work here may add things meanwhile)
        sys_before, sys_after = _system_part(before), _system_part(after)
        gone = {k: sorted(set(sys_before[k]) - set(sys_after[k])) for k in sys_before}
        assert not any(gone.values()), gone
        assert sys_before["links"] and sys_before["mounts"]  # the filter left something to compare
        assert f"{fake}-client" in after["netns"]
        assert {f"{fake}-a", f"{fake}-b"} <= {x.split("@")[0] for x in after["links"]}
        assert all(d.is_dir() for d in cg) and (other_root / "ledger.jsonl").exists()
    finally:
        if "link" in made:
            subprocess.run(["ip", "link", "del", f"{fake}-a"], check=False)
        if "netns" in made:
            subprocess.run(["ip", "netns", "del", f"{fake}-client"], check=False)
        for d in cg:
            if d.is_dir():
                d.rmdir()


def test_sigkill_during_up_with_engine_and_vpn_then_clean(lab_id):
    """Kill points that fall among impairment engines and VPN daemons starting."""
    args = [
        "up",
        TOPOS / "pi_pair_middlebox.py",
        "--id",
        lab_id,
        "--impair",
        "delay 1ms",
        "--impair-backend",
        "userspace",
        "--vpn",
        "wireguard",
    ]
    r = run_lab(*args)
    assert r.returncode == 0, r.stderr
    total = len(Ledger(lab_dir(lab_id) / "ledger.jsonl").entries())
    assert run_lab("down", "--id", lab_id).returncode == 0
    base = _records_of_full_up("pi_pair_middlebox.py", lab_id)
    for k in range(base - 4, total + 1, 2):  # the steps past the plain build
        r = run_lab(*args, env={"LAB_KILL_AT_RECORD": str(k)})
        assert r.returncode == -signal.SIGKILL, (k, r.returncode, r.stderr)
        c = run_lab("clean")
        assert c.returncode == 0, (k, c.stdout, c.stderr)
        assert lab_traces(lab_id) == [], f"after kill at record {k}/{total}"
