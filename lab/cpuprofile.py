"""CPU profiles: data files in cpu_profiles/ that say how to make a node behave like a board."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError

PROFILE_DIR = Path(__file__).resolve().parent.parent / "cpu_profiles"


def profile_dirs() -> list[Path]:
    extra = os.environ.get("LAB_CPU_PROFILES")
    return ([Path(extra)] if extra else []) + [PROFILE_DIR]


def known_profiles() -> list[str]:
    names = set()
    for d in profile_dirs():
        if d.is_dir():
            names.update(p.stem for p in d.glob("*.toml"))
    return sorted(names)


@dataclass
class CpuProfile:
    name: str
    cores: int  # 0 = no cap
    core_share: float  # share of one host core per board core
    calibrated: bool
    env: dict[str, str] = field(default_factory=dict)
    description: str = ""

    @property
    def quota_cores(self) -> float | None:
        """Host cores' worth of CPU time the whole board gets, None when uncapped."""
        return None if self.cores == 0 else self.cores * self.core_share


def load_profile(name: str) -> CpuProfile:
    for d in profile_dirs():
        p = d / f"{name}.toml"
        if p.is_file():
            break
    else:
        raise ConfigError(f"unknown CPU profile {name!r}; valid: {', '.join(known_profiles())}")
    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(str(e), source=str(p))
    try:
        return CpuProfile(
            name=name,
            cores=int(data["cores"]),
            core_share=float(data["core_share"]),
            calibrated=bool(data.get("calibrated", False)),
            env={str(k): str(v) for k, v in data.get("env", {}).items()},
            description=data.get("description", ""),
        )
    except KeyError as e:
        raise ConfigError(f"missing field {e.args[0]}", source=str(p))
