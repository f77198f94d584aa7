"""Board profiles a test writes itself: the head every such profile needs (cores, a share, an
OpenSSL figure to fit the quota on, a board-kernel AEAD) and the loader that reads one from a
directory of the test's own."""

from __future__ import annotations

from lab.model.cpuprofile import CpuProfile, load_cpu_profile

BOARD_HEAD = """
cores = 4
core_share = 0.25
[reference.aes-256-cbc]
mbps = 60
source = "openssl on the board"
[reference.kernel-gcm-aes-128]
mbps = 20
source = "tcrypt on the board"
"""


def load_text(tmp_path, monkeypatch, text: str, name: str = "odd") -> CpuProfile:
    """Write `text` as profile NAME under tmp_path (calibrations there too) and load it."""
    (tmp_path / f"{name}.toml").write_text(text)
    monkeypatch.setenv("LAB_CPU_PROFILES", str(tmp_path))
    monkeypatch.setenv("LAB_CALIBRATION_DIR", str(tmp_path / "cal"))
    return load_cpu_profile(name)
