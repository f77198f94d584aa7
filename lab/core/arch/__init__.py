"""Foreign architectures: a board's own Debian 12 binaries, run on this machine under qemu-user.

A Raspberry Pi 4 runs Debian 12 for arm64 (or armhf). `lab arch fetch ARCH` (lab.core.arch.fetch)
unpacks that architecture's packages of the lab's tools into a root under
/var/cache/lab/arch/ARCH; a node with `arch="arm64"` (lab.core.arch.emulate) then runs those
binaries through qemu-<cpu>-static called explicitly (`-L ROOT`), so no binfmt_misc entry is
needed and none is registered. This module holds the architectures and where their roots live.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from lab.core.errors import ConfigError


@dataclass(frozen=True)
class Arch:
    """One foreign architecture: its Debian name, the qemu-user binary that runs it, and the
    environment that masks CPU features a Pi 4 lacks in every process run emulated."""

    name: str
    qemu: str
    machine: str  # what `uname -m` says on the board
    env: dict[str, str] = field(default_factory=dict)


# A Pi 4's Cortex-A72 (BCM2711) has NEON but not the ARMv8 crypto extensions (AES, PMULL,
# SHA1/SHA2) that QEMU's default "max" CPU offers. OPENSSL_armcap=0x1 is ARMV7_NEON only
# (OpenSSL crypto/arm_arch.h); tests/test_arch.py checks OpenSSL then executes no AESE/SHA256H
# instruction. Go reads its own mask: GODEBUG cpu.* (internal/cpu, arm64 options); the A72 is
# ARMv8.0, so no LSE atomics either.
ARCHES: dict[str, Arch] = {
    "arm64": Arch(
        "arm64",
        "qemu-aarch64-static",
        "aarch64",
        {
            "OPENSSL_armcap": "0x1",
            "GODEBUG": "cpu.aes=off,cpu.pmull=off,cpu.sha1=off,cpu.sha2=off,cpu.atomics=off",
        },
    ),
    # 32-bit Raspberry Pi OS (study A's word size): same core, AArch32 state, NEON only
    "armhf": Arch("armhf", "qemu-arm-static", "armv7l", {"OPENSSL_armcap": "0x1"}),
}


def get(name: str, *, source: str = "--arch", field: str | None = None) -> Arch:
    """The architecture called `name`, or a ConfigError listing the accepted ones."""
    if name not in ARCHES:
        raise ConfigError(
            f"unknown architecture {name!r}; accepted: {', '.join(ARCHES)}",
            source=source,
            field=field,
        )
    return ARCHES[name]


def cache_dir() -> Path:
    """Where roots live (LAB_ARCH_CACHE overrides, for tests)."""
    return Path(os.environ.get("LAB_ARCH_CACHE", "/var/cache/lab/arch"))


def root_dir(arch: Arch) -> Path:
    return cache_dir() / arch.name


MANIFEST = "lab-arch-manifest.json"
