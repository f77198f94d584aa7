"""Privileged: a pi4 node's file writes are held to its profile's card (rate and dirty limit),
and teardown (or a failed `up`) leaves no loop device, mount, rate rule or image behind.

Mechanism checks, as ratios to the rate the lab set: every byte that reaches the node's file
system passes the block layer's limit, so a write with fsync can never beat it, and the dirty
limit decides how much of a write may finish before the card has it. Host speed only lowers a
rate, and the lower bounds are a generous half of the set rate."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from lab.core import blockdev, netops
from lab.core.errors import CommandError
from lab.core.state import Ledger, lab_dir
from lab.core.teardown import teardown
from lab.model.cpuprofile import load_cpu_profile
from lab.model.storageprofile import MIB, STORAGE_MARKER
from lab.model.topology import load_topology
from lab.substrate.local.build import up

from .conftest import TOPOS, lab_traces

pytestmark = pytest.mark.root


@pytest.fixture(autouse=True)
def storage_here():
    mechanism, why = blockdev.probe()
    if mechanism is None:
        pytest.skip(f"node storage cannot be modelled here: {why}")


def _dd(node, path: str, mib: int, *extra: str) -> float:
    """Seconds `dd` takes to write `mib` MiB to `path` in `node` (zeros: nothing to compute)."""
    argv = ["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={mib}", "status=none", *extra]
    t0 = time.monotonic()
    node.run(argv, timeout=60)
    return time.monotonic() - t0


def test_pi4_write_held_to_the_card_then_nothing_left(lab_id):
    lab = up(load_topology(TOPOS / "pi_pair.py"), lab_id)
    model = load_cpu_profile("pi4", merge_calibration=False).storage
    rt = lab.info["nodes"]["server"]
    rec = rt["cpu"]["storage"]
    assert rec["mechanism"] == "loop+blkio-v1"
    assert rec["rates_set"] == {"write": model.write_bps, "read": model.read_bps}
    assert rec["dirty_limit"]["strict_limit"] == 1
    node, target = lab.node("server"), rec["mount"]
    # the node's own file system where its files go; this machine sees none there
    assert blockdev.mounted_in(Path(rt["mntns"]), target)
    assert not netops.is_mountpoint(target)
    marker = json.loads(node.run(["cat", f"{target}/{STORAGE_MARKER}"]).stdout)
    assert marker["model"]["write_bps"] == model.write_bps and marker["node"] == "server"
    # the other node's directory is its own file system, this machine's a plain directory
    assert lab.node("client").run(["ls", "-a", target]).stdout.split() == [
        ".",
        "..",
        STORAGE_MARKER,
        "lost+found",
    ]
    assert not (Path(target) / STORAGE_MARKER).exists()
    status = lab.status()["nodes"]["server"]["cpu"]["storage"]
    assert status["mechanism"] == "loop+blkio-v1" and status["model"]["source"] == model.source
    w, limit, free = model.write_bps, model.dirty_limit_bytes, model.freerun_bytes

    # 1. a write the size of the dirty limit + 64 MiB, fsync'd: every byte through the card
    size = limit // MIB + 64
    t = _dd(node, f"{target}/a", size, "conv=fsync")
    ratio = size * MIB / t / w
    assert 0.5 < ratio < 1.1, f"{size} MiB fsync'd in {t:.2f} s: x{ratio:.2f} the card's rate"

    # 2. half the free-run ceiling, no fsync: the board's kernel keeps it all in its page cache
    small = free // MIB // 2
    t = _dd(node, f"{target}/b", small)
    assert t < 0.5 * small * MIB / w, f"{small} MiB waited {t:.2f} s for the card"
    node.run(["sync"], timeout=120)

    # 3. past the dirty limit, no fsync: all but the limit must reach the card first, yet the
    #    writer does not wait for the whole file
    t = _dd(node, f"{target}/c", size)
    assert t > 0.9 * (size * MIB - limit) / w, f"{size} MiB in {t:.2f} s: beyond the dirty limit"
    assert t < 0.8 * size * MIB / w, f"{size} MiB in {t:.2f} s: as if nothing stayed dirty"

    entries = [e for e in lab.ledger.entries() if e["kind"] in blockdev.KINDS]
    assert sorted({e["kind"] for e in entries}) == sorted(blockdev.KINDS)
    images = [e["path"] for e in entries if e["kind"] == "storage-image"]
    devs = [e["dev"] for e in entries if e["kind"] == "storage-limits"]
    assert teardown(lab_id) == []
    for e in entries:
        assert blockdev.leftover(e) == [], e
    for img in images:
        assert not Path(img).exists() and blockdev.loops_of(img) == []
    for devt in devs:
        assert blockdev.rates(devt) == {} and not blockdev.dirty_limit_set(devt)
    assert lab_traces(lab_id) == []


def test_failed_up_unwinds_the_storage(lab_id, monkeypatch):
    """The second node's mount fails: `up` removes the first node's storage and the second's
    image and loop device as well."""
    real, calls = blockdev.mount_in, []

    def failing(mntns, dev, target):
        calls.append(dev)
        if len(calls) == 2:
            raise CommandError(["mount"], 32, "injected by the test")
        real(mntns, dev, target)

    monkeypatch.setattr(blockdev, "mount_in", failing)
    with pytest.raises(CommandError, match="injected"):
        up(load_topology(TOPOS / "pi_pair.py"), lab_id)
    assert len(calls) == 2
    for node in ("client", "server"):
        img = lab_dir(lab_id) / "storage" / f"{node}.img"
        assert not img.exists() and blockdev.loops_of(img) == []
    for dev in calls:
        devt = blockdev.dev_t(dev)
        assert blockdev.rates(devt) == {} and not blockdev.dirty_limit_set(devt)
    assert lab_traces(lab_id) == []
    assert not Ledger(lab_dir(lab_id) / "ledger.jsonl").path.exists()
