"""Impairment on boards, against an emulated board farm: on a board whose kernel has no
sch_netem (this machine's), the lab's engine runs on the board in a bump namespace spliced into
its data port, at `lab up --impair` and at the first `lab impair set` on a lab built without
it; either way the delay is measured through the tunnel, and `lab down` leaves every board as
it was (state read over SSH by the test itself, tests/test_boards.py's board_state).
"""

from __future__ import annotations

import json
import re

import pytest

from .conftest import TOPOS, board_farm, run_lab
from .test_boards import board_state

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def farm(tmp_path_factory):
    with board_farm(tmp_path_factory, tools=("wireguard-go",)) as (inv, rec):
        yield inv, rec


def _expected_backend(inv, tmp_path) -> str:
    """kernel-netem where the router board's kernel has netem, else the engine (the path this
    machine's kernel takes)."""
    from lab.substrate.boards.inventory import load_inventory
    from lab.substrate.boards.connection import BoardConnection
    from lab.substrate.boards.node import BoardNode
    from lab.impair.kernel import probe_netem

    b = load_inventory(inv).boards["router"]
    conn = BoardConnection.open(b, log_path=tmp_path / "ssh-probe.log")
    try:
        return "kernel-netem" if probe_netem(BoardNode("router", conn)).ok else "userspace"
    finally:
        conn.close()


def _min_rtt_ms(lab_id: str, peer: str) -> float:
    p = run_lab("exec", "--id", lab_id, "client", "--", "ping", "-c", "4", "-i", "0.2", "-W", "2",
                peer)  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    return float(re.search(r"= ([\d.]+)/", p.stdout).group(1))


def _procs(state: dict, board: str, name: str) -> list[str]:
    return [x for x in state[board]["procs"] if name in x]


def test_up_with_delay_on_a_board_without_netem_then_down(farm, tmp_path):
    """Then the same `lab up` SIGKILLed right after the engine's PID is recorded (bump made,
    port spliced, engine running): `lab clean` alone restores the router board."""
    from lab.core.state import Ledger, lab_dir

    inv, rec = farm
    backend = _expected_backend(inv, tmp_path)
    before = board_state(inv, tmp_path)
    args = ["up", TOPOS / "pi_pair_middlebox.py", "--boards", inv, "--vpn", "wireguard",
            "--impair", "delay 20ms", "--id", "ti1"]  # fmt: skip
    r = run_lab(*args, "--json")
    try:
        assert r.returncode == 0, r.stderr
        entries = Ledger(lab_dir("ti1") / "ledger.jsonl").entries()
        peer = json.loads(r.stdout)["vpn"]["traffic"]["v4"]
        # 20 ms each way on the router board, measured through the tunnel client -> server
        assert _min_rtt_ms("ti1", peer) >= 40.0
        shown = json.loads(run_lab("impair", "show", "--id", "ti1", "--json").stdout)
        assert shown["backend"] == backend, shown
        if backend == "userspace":
            assert "router" in shown["why"] and "kernel netem unavailable" in shown["why"]
            during = board_state(inv, tmp_path)
            assert during["router"]["netns"] == ["ti1-imp1"]  # the bump, on the router board
            # the router's eth2 is now the veth; the port itself (same ifindex) is in the bump
            idx = {ln[1]: ln[0] for ln in during["router"]["links"]}
            assert idx["eth2"] != {ln[1]: ln[0] for ln in before["router"]["links"]}["eth2"]
            counts = shown["engines"]["imp1"]
            assert counts["a2b"]["counters"]["forwarded"] > 0, counts
            assert counts["b2a"]["counters"]["forwarded"] > 0, counts
    finally:
        d = run_lab("down", "--id", "ti1")
    assert d.returncode == 0, d.stdout + d.stderr
    assert board_state(inv, tmp_path) == before
    if backend != "userspace":
        return
    k = next(i + 1 for i, e in enumerate(entries) if e["kind"] == "process"
             and e.get("name") == "lab-impaird")  # fmt: skip
    r = run_lab(*args, env={"LAB_KILL_AT_RECORD": str(k)})
    assert r.returncode == -9, (k, r.returncode, r.stderr)
    assert board_state(inv, tmp_path)["router"]["netns"] == ["ti1-imp1"]  # killed mid-way
    c = run_lab("clean")
    assert c.returncode == 0, c.stdout + c.stderr
    assert not lab_dir("ti1").exists()
    assert board_state(inv, tmp_path) == before


def test_impair_set_on_a_board_lab_built_without_impair(farm, tmp_path):
    """The first `lab impair set` adds the points on the live lab; the tunnel's endpoint boards
    are not touched (same wireguard-go processes, same interfaces)."""
    inv, rec = farm
    before = board_state(inv, tmp_path)
    r = run_lab("up", TOPOS / "pi_pair_middlebox.py", "--boards", inv, "--vpn", "wireguard",
                "--id", "ti2", "--json")  # fmt: skip
    try:
        assert r.returncode == 0, r.stderr
        peer = json.loads(r.stdout)["vpn"]["traffic"]["v4"]
        bad = run_lab("impair", "set", "--id", "ti2", "all", "delay", "20ms", "bogus", "3")
        assert bad.returncode == 2, bad.stdout + bad.stderr
        assert "bogus" in bad.stderr
        up = board_state(inv, tmp_path)
        assert up["router"]["netns"] == []  # refused before anything changed
        s = run_lab("impair", "set", "--id", "ti2", "all", "delay", "20ms")
        assert s.returncode == 0, s.stdout + s.stderr
        assert _min_rtt_ms("ti2", peer) >= 40.0
        after = board_state(inv, tmp_path)
        for board in ("client", "server"):
            assert _procs(after, board, "wireguard-go") == _procs(up, board, "wireguard-go")
            assert after[board]["links"] == up[board]["links"]
        shown = json.loads(run_lab("impair", "show", "--id", "ti2", "--json").stdout)
        assert shown["requested"] == {"router:eth1": "delay 20ms", "router:eth2": "delay 20ms"}
    finally:
        d = run_lab("down", "--id", "ti2")
    assert d.returncode == 0, d.stdout + d.stderr
    assert board_state(inv, tmp_path) == before
