"""Kernel data planes and kernel netem on boards, through the same SSH path: an emulated board
farm inside the full-kernel VM (this machine's kernel has neither WireGuard nor netem), driven by
the guest's own `lab up --boards` (tests/boardsguest.py)."""

from __future__ import annotations

import json
import re
import sys

import pytest

from lab.core import proc

from .conftest import REPO, vm_kernel_or_skip

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.vm]


@pytest.mark.timeout(600)
def test_kernel_wireguard_and_netem_on_vm_boards_over_ssh(tmp_path):
    from lab.substrate.vm import boot

    vm_kernel_or_skip()
    vm = boot(tmp_path / "state", mem_mb=2048)
    try:
        cp = vm.run(
            [sys.executable, str(REPO / "tests" / "boardsguest.py")],
            check=False,
            timeout=540,
            cwd=str(REPO),
        )
    finally:
        vm.shutdown()
        assert not proc.is_same_process(vm.pid, vm.record["start_time"])
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-3000:]
    r = json.loads(cp.stdout.strip().splitlines()[-1])
    print(f"boot {vm.boot_seconds} s; in the guest:", r.get("seconds"))
    assert "error" not in r, r["error"]
    assert r["vpn_path"] == "kernel"  # the guest kernel's WireGuard, configured over SSH
    assert "wireguard" in r["links_up"]
    assert r["impair_backend"] == "kernel-netem"
    # the farm's cable is a 1 Gbit/s tbf (the topology's bw): the netem goes in its class,
    # shaping and impairment stacked, as in a local lab
    for port in ("eth1", "eth2"):
        assert re.search(rf"qdisc tbf (\S+) dev {port} root .*rate 1Gbit", r["qdiscs"]), r["qdiscs"]
        assert re.search(
            rf"qdisc netem \S+ dev {port} parent \S+ .*delay 20ms loss 1%", r["qdiscs"]
        ), r["qdiscs"]
    m = re.search(r"(\d+) packets transmitted, (\d+) received.*\n.*= ([\d.]+)/([\d.]+)/", r["ping"])
    assert m, r["ping"]
    sent, got, rtt_min = int(m[1]), int(m[2]), float(m[3])
    assert got >= sent * 0.8, r["ping"]  # 1% loss each way: losing a fifth has p < 1e-9
    assert rtt_min >= 40.0, r["ping"]  # 20 ms on each way through the router board
    assert r["down_rc"] == 0, r["down_err"]
    assert r["after"] == r["before"]
