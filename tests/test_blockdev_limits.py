"""blockdev.set_dirty_limit on a reused loop device: the bdi outlives the device, so a minimum an
earlier user left is cleared before the maximum is written, and a maximum the kernel refuses is
"not applied" with the reason, not a crash of `lab up` (CI saw EINVAL there)."""

from __future__ import annotations

import errno

from lab.core import blockdev


def _bdi(tmp_path, monkeypatch, refuse=()):
    bdi = tmp_path / "7:5"
    bdi.mkdir()
    for name, value in (("max_bytes", "0"), ("min_bytes", "0"), ("min_ratio", "3"),
                        ("strict_limit", "0")):  # fmt: skip
        (bdi / name).write_text(value)
    monkeypatch.setattr(blockdev, "SYS_BDI", tmp_path)
    writes = []
    real = blockdev._write

    def write(path, value):
        writes.append((path.name, value))
        if path.name in refuse:
            raise OSError(errno.EINVAL, "Invalid argument")
        real(path, value)

    monkeypatch.setattr(blockdev, "_write", write)
    return bdi, writes


def test_a_stale_minimum_is_cleared_before_the_maximum(tmp_path, monkeypatch):
    bdi, writes = _bdi(tmp_path, monkeypatch)
    got = blockdev.set_dirty_limit("7:5", 128 << 20)
    assert [w[0] for w in writes] == ["min_ratio", "max_bytes", "min_bytes", "strict_limit"]
    assert writes[0] == ("min_ratio", "0")
    assert got == {"max_bytes": 128 << 20, "min_bytes": 128 << 20, "strict_limit": 1}


def test_a_refused_maximum_is_not_applied_with_the_reason(tmp_path, monkeypatch):
    bdi, writes = _bdi(tmp_path, monkeypatch, refuse=("max_bytes",))
    got = blockdev.set_dirty_limit("7:5", 128 << 20)
    assert "not_applied" in got and "max_bytes=134217728" in got["not_applied"]
    assert (bdi / "strict_limit").read_text() == "0"  # nothing half-set: no strict limit
