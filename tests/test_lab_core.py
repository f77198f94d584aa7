"""Privileged: labs really come up, pass packets, and leave nothing behind."""

from __future__ import annotations

import json

import pytest

from lab.substrate.local.lab import Lab
from lab.substrate.local.build import up
from lab.core.teardown import teardown
from lab.model.topology import load_topology

from .conftest import TOPOS, lab_traces, machine_snapshot, run_lab

pytestmark = pytest.mark.root


def test_up_ping_down_leaves_machine_as_before(lab_id, suite_state_roots):
    before = machine_snapshot()
    r = run_lab("up", TOPOS / "pi_pair_middlebox.py", "--id", lab_id)
    assert r.returncode == 0, r.stderr
    # recorded under the suite's own roots: the `lab clean` below sees only the suite's labs
    assert (suite_state_roots["LAB_STATE_DIR"] / lab_id / "ledger.jsonl").exists()
    assert (suite_state_roots["LAB_RUN_DIR"] / lab_id).is_dir()
    assert f"{lab_id}-client" in machine_snapshot()["netns"]
    for addr in ("10.0.2.2", "fd00:2::2"):
        r = run_lab("exec", "--id", lab_id, "client", "--", "ping", "-c2", "-i0.2", "-W1", addr)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "ttl=63" in r.stdout  # one hop: through the router
    st = json.loads(run_lab("status", "--id", lab_id, "--json").stdout)[0]
    assert st["nodes"]["router"]["router"] is True
    r = run_lab("down", "--id", lab_id)
    assert r.returncode == 0, r.stderr
    after = machine_snapshot()
    for key in before:
        new = set(after[key]) - set(before[key])
        assert not [x for x in new if lab_id in x or x.endswith("/lab")], (key, new)
    assert lab_traces(lab_id) == []
    # twice is harmless
    assert run_lab("down", "--id", lab_id).returncode == 0
    assert run_lab("clean").returncode == 0


@pytest.mark.parametrize("topo", ["pi_pair", "router_under_test", "site_to_site"])
def test_every_shipped_topology_passes_traffic_end_to_end(lab_id, topo):
    spec = load_topology(TOPOS / f"{topo}.py")
    lab = up(spec, lab_id)
    try:
        a, b = spec.endpoints("traffic")
        dst = spec.nodes[b].interfaces[0]
        node = lab.node(a)
        for addr in (dst.ip, dst.ip6):
            node.run(["ping", "-c1", "-W2", addr.split("/")[0]])
    finally:
        assert teardown(lab_id) == []
    assert lab_traces(lab_id) == []


def test_two_labs_side_by_side(lab_id):
    other = lab_id + "b"
    spec = load_topology(TOPOS / "pi_pair_middlebox.py")
    try:
        a = up(spec, lab_id)
        b = up(spec, other)
        # same addresses, separate namespaces: each reaches its own server
        a.node("client").run(["ping", "-c1", "-W1", "10.0.2.2"])
        b.node("client").run(["ping", "-c1", "-W1", "10.0.2.2"])
        assert teardown(other) == []
        a.node("client").run(["ping", "-c1", "-W1", "10.0.2.2"])  # untouched by the other's down
    finally:
        teardown(other)
    assert lab_traces(other) == []


def test_same_id_twice_is_refused_and_leaves_first_intact(lab_id):
    spec = load_topology(TOPOS / "pi_pair.py")
    up(spec, lab_id)
    r = run_lab("up", TOPOS / "pi_pair.py", "--id", lab_id)
    assert r.returncode != 0 and "already" in r.stderr
    Lab.open(lab_id).node("client").run(["ping", "-c1", "-W1", "10.0.1.2"])


def test_node_has_private_run_and_own_sys(lab_id):
    lab = up(load_topology(TOPOS / "pi_pair_middlebox.py"), lab_id)
    c, s = lab.node("client"), lab.node("server")
    c.run(["sh", "-c", "echo client > /run/who"])
    assert c.run(["cat", "/run/who"]).stdout.strip() == "client"
    assert s.run(["sh", "-c", "cat /run/who 2>/dev/null || echo none"]).stdout.strip() == "none"
    # its own interfaces only: the topology's, and the side interface of the boards' NICs
    # where the lab built that side path (lab.substrate.local.nicside; recorded in lab.json)
    side = (lab.info.get("nic_latency") or {}).get("side_path") or {}
    own = [e["side"] for lk in side.get("links", []) for e in lk["ends"] if e["node"] == "client"]
    assert sorted(c.run(["ls", "/sys/class/net"]).stdout.split()) == sorted(
        ["client-eth0", "lo", *own]
    )
    # every process started in a node is inside the node's cgroup
    cg = c.run(["cat", "/proc/self/cgroup"]).stdout
    assert f"/lab/{lab_id}/client" in cg


def test_daemons_are_stopped_by_pid_on_down(lab_id):
    lab = up(load_topology(TOPOS / "pi_pair.py"), lab_id)
    d = lab.node("server").spawn("sleeper", ["sleep", "1000"])
    assert d.alive()
    assert teardown(lab_id) == []
    assert not d.alive()  # how fast `lab down` is belongs to bench/up_down.py
