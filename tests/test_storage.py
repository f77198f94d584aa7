"""A board profile's storage ([storage]): the table's validation, the board-kernel arithmetic,
the lab's plan for it, the scp test's destination on it, and the teardown of its kernel
objects against a fake sysfs. No root needed (tests/test_storage_root.py runs it for real)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lab.core import blockdev
from lab.core.errors import ConfigError
from lab.measure.scp import ScpTest, storage_of
from lab.measure.scp import card_record as scp_card
from lab.model.cpuprofile import load_cpu_profile, parse_profile
from lab.model.storageprofile import MIB, STORAGE_MARKER, board_write_seconds, parse_storage
from lab.model.topology import load_topology
from lab.substrate.local import storage

REPO = Path(__file__).resolve().parent.parent
GOOD = {
    "card": "a card",
    "write_mbps": 20,
    "source": "somewhere",
    "derivation": "somehow",
    "dirtyable_mib": 640,
    "dirty_source": "a kernel",
    "dirty_derivation": "arithmetic",
}


def _err(table) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        parse_storage(table, "x.toml")
    return e.value


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"speed": 1}, "storage.speed", "accepted: card, write_mbps"),
        ({"source": ""}, "storage.source", "missing"),
        ({"write_mbps": 0}, "storage.write_mbps", "above 0"),
        ({"write_mbps": True}, "storage.write_mbps", "MB/s"),
        ({"read_mbps": "fast"}, "storage.read_mbps", "MB/s"),
        ({"dirty_background_ratio": 20}, "storage.dirty_background_ratio", "below dirty_ratio"),
        ({"dirty_ratio": 0}, "storage.dirty_ratio", "from 1 to 100"),
        ({"ram_mib": 512}, "storage.dirtyable_mib", "more than the board's RAM"),
        ({"image_mib": 1}, "storage.image_mib", "from 64"),
        ({"card": 3}, "storage.card", "string"),
    ],
)
def test_bad_storage_tables_name_file_field_and_accepted(change, field, says):
    e = _err({**GOOD, **change})
    assert e.field == field and e.source == "x.toml"
    assert says in str(e)


def test_storage_table_errors_through_the_profile_loader():
    """parse_profile knows the table: an unknown field inside it names the profile's file."""
    data = {
        "cores": 0,
        "core_share": 1.0,
        "storage": {**GOOD, "oops": 1},
    }
    with pytest.raises(ConfigError) as e:
        parse_profile("p", data, "cpu_profiles/p.toml")
    assert e.value.field == "storage.oops" and e.value.source == "cpu_profiles/p.toml"
    assert parse_profile("p", {"cores": 0, "core_share": 1.0}, "p.toml").storage is None


def test_limits_follow_the_kernels_ratios():
    m = parse_storage(GOOD, "x.toml")
    assert m.write_bps == 20_000_000
    assert m.dirty_limit_bytes == 128 * MIB  # 20 % of 640 MiB
    assert m.dirty_background_bytes == 64 * MIB
    assert m.freerun_bytes == 96 * MIB  # halfway (dirty_freerun_ceiling)


@pytest.mark.parametrize("name", ["pi4", "pi4-64"])
def test_shipped_profiles_state_their_card_with_sources(name):
    m = load_cpu_profile(name, merge_calibration=False).storage
    assert m is not None and m.write_mbps > 0 and m.source and m.derivation
    assert m.dirty_source and m.dirty_derivation and m.card
    # every figure the file states is in the derivation it gives
    assert f"{m.write_mbps:g} MB/s" in m.source


def test_32_bit_board_dirties_less_than_the_64_bit_one():
    """pi4 (armv7l): only low memory is dirtyable, so a 256 MiB file outgrows the limit;
    pi4-64 (aarch64): it does not."""
    small = load_cpu_profile("pi4", merge_calibration=False).storage
    big = load_cpu_profile("pi4-64", merge_calibration=False).storage
    assert small.freerun_bytes < 256 * MIB < big.freerun_bytes


def test_board_write_seconds_between_memory_and_card_speed():
    m = parse_storage(GOOD, "x.toml")
    size, fast = 256 * MIB, 44e6
    t = board_write_seconds(m, size, fast)
    # never faster than the arrival rate, never slower than the card for every byte
    assert size / fast < t < size / m.write_bps
    # within the free-run ceiling the card is never waited for
    assert board_write_seconds(m, m.freerun_bytes // 2, fast) == pytest.approx(
        m.freerun_bytes / 2 / fast
    )
    # arriving slower than the card: never throttled
    assert board_write_seconds(m, size, m.write_bps / 2) == pytest.approx(size / (m.write_bps / 2))


# ---------------------------------------------------------------------- the lab's plan


def _plan():
    spec = load_topology(REPO / "topologies" / "pi_pair.py")
    cpu = {n.name: {"profile": "pi4", "env": {"GODEBUG": "x"}} for n in spec.hosts()}
    return spec, cpu


def test_storage_plan_records_model_mechanism_and_env(monkeypatch):
    monkeypatch.setattr(blockdev, "probe", lambda: ("loop+blkio-v1", ""))
    spec, cpu = _plan()
    assert storage.storage_plan(spec, cpu, "tabc") == []
    model = load_cpu_profile("pi4", merge_calibration=False).storage
    for plan in cpu.values():
        rec = plan["storage"]
        assert rec["mechanism"] == "loop+blkio-v1"
        assert rec["model"]["write_bps"] == model.write_bps
        assert rec["model"]["source"] == model.source
        assert rec["mount"].endswith("/tabc/measure")
        # nothing in the environment: a node's goes on to an emulated board farm's sshd
        assert plan["env"] == {"GODEBUG": "x"}


def test_storage_plan_says_why_none(monkeypatch):
    monkeypatch.setattr(blockdev, "probe", lambda: (None, "no loop device support (test)"))
    spec, cpu = _plan()
    warnings = storage.storage_plan(spec, cpu, "tabc")
    assert len(warnings) == 1 and "no loop device support (test)" in warnings[0]
    for plan in cpu.values():
        assert plan["storage"]["mechanism"] == "none"
        assert plan["storage"]["why_none"] == "no loop device support (test)"


def test_nodes_without_a_storage_table_get_nothing(monkeypatch):
    monkeypatch.setattr(blockdev, "probe", lambda: pytest.fail("probed without a [storage]"))
    spec, _ = _plan()
    cpu = {n.name: {"profile": None, "env": {}} for n in spec.hosts()}
    assert storage.storage_plan(spec, cpu, "tabc") == []
    assert all("storage" not in p for p in cpu.values())


def test_measure_dir_is_the_runners_state_dir():
    """The node's storage is mounted where the runner's tests keep their files."""
    src = (REPO / "lab" / "campaign" / "runner.py").read_text()
    assert re.search(rf'state_dir=lab\.dir / "{storage.MEASURE_DIR}"', src)


# ---------------------------------------------------------------------- scp's destination


class _Node:
    """A node whose files are `files` {path: text}."""

    def __init__(self, files: dict):
        self.files = files

    def run(self, argv, check=True, **kw):
        assert argv[0] == "cat"
        text = self.files.get(argv[1])

        class R:
            returncode = 0 if text is not None else 1
            stdout = text or ""

        return R()


def test_scp_writes_onto_the_servers_storage_when_it_has_one():
    assert ScpTest.schema["dest"].default == "storage"
    marker = {"mechanism": "loop+blkio-v1", "model": {"card": "c"}}
    node = _Node({f"/s/{STORAGE_MARKER}": json.dumps(marker)})
    assert storage_of(node, Path("/s")) == marker
    assert storage_of(node, Path("/elsewhere")) is None
    assert storage_of(_Node({f"/s/{STORAGE_MARKER}": "not json"}), Path("/s")) is None
    full = {"mechanism": "m", "model": {"card": "c", "write_mbps": 1.0, "dirty_limit_bytes": 2}}
    assert scp_card(full) == {
        "card": "c",
        "write_mbps": 1.0,
        "dirty_limit_bytes": 2,
        "mechanism": "m",
    }
    assert scp_card(None) is None


# ---------------------------------------------------------------------- teardown, fake sysfs


@pytest.fixture
def fake_sys(tmp_path, monkeypatch):
    blk = tmp_path / "blkio"
    blk.mkdir()
    for name in blockdev.THROTTLE.values():
        (blk / name).write_text("")
    monkeypatch.setattr(blockdev, "BLKIO_V1", blk)
    monkeypatch.setattr(blockdev, "SYS_DEV_BLOCK", tmp_path / "dev-block")
    monkeypatch.setattr(blockdev, "SYS_BDI", tmp_path / "bdi")
    return tmp_path


def _loop(root: Path, devt: str, backing: str | None) -> None:
    d = root / "dev-block" / devt
    d.mkdir(parents=True)
    if backing is not None:
        (d / "loop").mkdir()
        (d / "loop" / "backing_file").write_text(backing + "\n")
    bdi = root / "bdi" / devt
    bdi.mkdir(parents=True)
    for name, value in (("strict_limit", "1"), ("min_ratio", "3"), ("max_ratio", "3")):
        (bdi / name).write_text(value)


def test_limits_are_lifted_from_our_device_only(fake_sys):
    _loop(fake_sys, "7:3", "/img/a.img (deleted)")
    _loop(fake_sys, "7:4", "/img/someone-else.img")
    writes = []
    real = blockdev._write

    def record(path, value):
        writes.append((path.name, value))
        real(path, value)

    blockdev._write = record
    try:
        blockdev.remove(
            {"kind": "storage-limits", "image": "/img/a.img", "dev": "7:3", "groups": ["/"]}
        )
        blockdev.remove({"kind": "storage-limits", "image": "/img/b.img", "dev": "7:4"})
    finally:
        blockdev._write = real
    assert ("blkio.throttle.write_bps_device", "7:3 0") in writes
    assert (fake_sys / "bdi" / "7:3" / "strict_limit").read_text() == "0"
    assert (fake_sys / "bdi" / "7:3" / "max_ratio").read_text() == "100"
    # 7:4 is backed by another file now: its rules are not ours to lift
    assert not any(v.startswith("7:4") for _, v in writes)
    assert (fake_sys / "bdi" / "7:4" / "strict_limit").read_text() == "1"


def test_leftovers_name_rules_and_dirty_limits(fake_sys):
    _loop(fake_sys, "7:3", "/img/a.img")
    (fake_sys / "blkio" / "blkio.throttle.write_bps_device").write_text("7:3 21300000\n")
    e = {"kind": "storage-limits", "image": "/img/a.img", "dev": "7:3"}
    left = blockdev.leftover(e)
    assert any("7:3 write" in x for x in left) and any("strict dirty limit" in x for x in left)
    (fake_sys / "blkio" / "blkio.throttle.write_bps_device").write_text("")
    (fake_sys / "bdi" / "7:3" / "strict_limit").write_text("0")
    assert blockdev.leftover(e) == []


def test_image_entry_removes_the_file(tmp_path):
    img = tmp_path / "n.img"
    img.write_bytes(b"x")
    e = {"kind": "storage-image", "path": str(img)}
    assert blockdev.leftover(e) == [f"storage image {img}"]
    blockdev.remove(e)
    blockdev.remove(e)  # twice: harmless
    assert blockdev.leftover(e) == []


def test_rate_rules_go_into_every_recorded_group_and_come_out(fake_sys):
    """v1 throttling is flat: the rule sits in the root (the flusher's writeback) and in the
    lab process's own group (its children's fsync and direct I/O); teardown lifts both."""
    sub = fake_sys / "blkio" / "user.slice"
    sub.mkdir()
    for name in blockdev.THROTTLE.values():
        (sub / name).write_text("")
    _loop(fake_sys, "7:3", "/img/a.img")
    groups = ["/", "/user.slice"]
    blockdev.set_rate("7:3", 21_300_000, 46_050_000, groups)
    assert (sub / "blkio.throttle.write_bps_device").read_text() == "7:3 21300000"
    assert (sub / "blkio.throttle.read_bps_device").read_text() == "7:3 46050000"
    e = {"kind": "storage-limits", "image": "/img/a.img", "dev": "7:3", "groups": groups}
    assert any("in /user.slice" in x for x in blockdev.leftover(e))
    blockdev.remove(e)
    # a v1 file takes "7:3 0" as "delete the rule"; the fake keeps the last write
    assert (sub / "blkio.throttle.write_bps_device").read_text() == "7:3 0"
    assert blockdev.leftover(e) == [] or all("strict" in x for x in blockdev.leftover(e))
    assert blockdev.blkio_groups()[0] == "/"
